"""Backend selection, the C++ kernels' instruction sets and conversions, and the plan cache."""

from __future__ import annotations

import gc
import json
import math
import weakref

import pytest
import torch

import fastnorm
import reference
from fastnorm import _partial, backends
from fastnorm._partial import Mode
from fastnorm.backends import BackendUnavailableError, cpp, torch_backend
from helpers import INTERPRETED, refused, run_python, use_backend

# ----------------------------------------------------------------------------
# Selection
# ----------------------------------------------------------------------------


def test_auto_picks_cpp_on_cpu(monkeypatch):
    monkeypatch.delenv("FASTNORM_BACKEND", raising=False)
    (row,) = fastnorm.backend_report([torch.device("cpu")])
    assert row["selected"] == "cpp" and row["backends"]["cpp"] == []


def test_unknown_request_is_a_value_error(monkeypatch):
    monkeypatch.setenv("FASTNORM_BACKEND", "cuda-magic")
    with pytest.raises(ValueError, match="FASTNORM_BACKEND"):
        fastnorm.total_norm([torch.randn(3)])


def test_forced_backend_that_cannot_run_raises_with_reasons(monkeypatch):
    monkeypatch.setenv("FASTNORM_BACKEND", "cpp")
    monkeypatch.setattr(cpp, "_C", None)
    monkeypatch.setattr(cpp, "_IMPORT_ERROR", ImportError("no compiler"))
    with pytest.raises(BackendUnavailableError, match="no compiler"):
        fastnorm.total_norm([torch.randn(3)])


def test_missing_fast_backend_warns_once_and_stays_correct(monkeypatch):
    monkeypatch.delenv("FASTNORM_BACKEND", raising=False)
    monkeypatch.setattr(cpp, "_C", None)
    monkeypatch.setattr(cpp, "_IMPORT_ERROR", ImportError("not built"))
    monkeypatch.setattr(backends, "_WARNED", set())
    fastnorm.clear_cache()
    tensors = [torch.randn(100), torch.randn(7)]
    with pytest.warns(RuntimeWarning, match="cpp backend cannot serve cpu tensors.*not built"):
        got = fastnorm.total_norm(tensors)
    assert got.item() == pytest.approx(reference.norm(tensors, 2.0), rel=1e-6)
    with _no_warnings():
        fastnorm.total_norm(tensors)


class _no_warnings:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def test_request_is_read_at_every_call(monkeypatch):
    tensors = [torch.randn(1000)]
    seen = []
    names = ("cpp", "torch", "triton") if INTERPRETED else ("cpp", "torch")
    for name in names:
        monkeypatch.setenv("FASTNORM_BACKEND", name)
        chosen = backends.backends()[name]
        original = chosen.reduce
        monkeypatch.setattr(
            chosen, "reduce", lambda *a, _n=name, _o=original, **k: seen.append(_n) or _o(*a, **k)
        )
        fastnorm.total_norm(tensors)
    assert seen == list(names)


@pytest.mark.slow
def test_info_command_lists_every_backend(monkeypatch, capsys):
    from fastnorm.cli import main

    monkeypatch.setenv("TRITON_INTERPRET", "0")  # as users run it: the interpreter is for tests
    assert main(["info", "--json"]) == 0
    (cpu,) = json.loads(capsys.readouterr().out)
    assert cpu["selected"] == "cpp"
    assert set(cpu["backends"]) == {"triton", "cpp", "torch"}
    assert any("TRITON_INTERPRET" in reason for reason in cpu["backends"]["triton"])
    assert main(["info"]) == 0
    assert "cpu (FASTNORM_BACKEND=auto): runs cpp" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main([])  # a subcommand is required
    assert exited.value.code != 0


# ----------------------------------------------------------------------------
# The C++ kernels: both instruction sets, exhaustive 16-bit rounding
# ----------------------------------------------------------------------------


def _all_patterns(dtype: torch.dtype, copies: int = 1) -> torch.Tensor:
    """Every 16-bit pattern (``copies`` times), then some again so a loop tail sees them too."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    every = bits.view(dtype)
    return torch.cat([every] * copies + [every[:4103]])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["cpp", "triton"])
def test_scaling_rounds_every_16bit_value_like_torch(monkeypatch, dtype, name):
    use_backend(name, monkeypatch)
    values = _all_patterns(dtype, copies=2 if name == "cpp" else 1)  # over one C++ task (256 KiB)
    ours = values.clone()
    param = torch.nn.Parameter(torch.zeros_like(values))
    param.grad = values.clone()
    norm = torch.tensor(2.7182817)
    fastnorm.clip_([ours], 1.0, total_norm=norm, gradients=True)
    torch.nn.utils.clip_grads_with_norm_([param], 1.0, norm)
    theirs = param.grad
    same = (ours.view(torch.int16) == theirs.view(torch.int16)) | (ours.isnan() & theirs.isnan())
    assert bool(same.all()), values[~same][:5]


# ----------------------------------------------------------------------------
# The plan cache: reused while nothing changed, never stale
# ----------------------------------------------------------------------------


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.Linear(30, 5))
    model(torch.randn(8, 20)).square().sum().backward()
    return model


def _grads(model):
    return [p.grad for p in model.parameters() if p.grad is not None]


def test_cache_reads_values_afresh(fused):
    model = _model()
    params = list(model.parameters())
    first = fastnorm.total_norm(params)
    params[1].grad.mul_(10)
    assert fastnorm.total_norm(params).item() != first.item()
    assert fastnorm.total_norm(params).item() == pytest.approx(reference.norm(_grads(model), 2.0), rel=1e-6)


def test_cache_does_not_keep_gradients_alive(backend):
    model = _model()
    params = list(model.parameters())
    fastnorm.clip_(params, 1.0)
    ref = weakref.ref(params[0].grad)
    model.zero_grad(set_to_none=True)
    gc.collect()
    assert ref() is None


@pytest.mark.slow
def test_own_pool_and_torch_openmp_threads_agree():
    code = """
import torch, fastnorm
from fastnorm.backends import cpp
g = torch.Generator().manual_seed(3)
tensors = [torch.randn(n, generator=g) for n in (3_000_001, 65_537, 17)]
norms = [fastnorm.total_norm(tensors, p).item() for p in (2.0, 3.0)]
print(cpp.threads_source().split(" (")[0], *norms)
"""
    runs = [
        run_python(["-c", code], FASTNORM_BACKEND="cpp", **env) for env in ({}, {"FASTNORM_OWN_THREADS": "1"})
    ]
    torch_threads, own = (r.stdout.split() for r in runs)
    assert own[0] == "fastnorm's" and torch_threads[0] == "the"  # "the OpenMP runtime torch loaded"
    assert torch_threads[-2:] == own[-2:]  # bit for bit: the task split does not depend on the threads


def test_cache_notices_a_gradient_resized_or_restrided_in_place(fused):
    g = torch.arange(1.0, 11.0)
    fastnorm.total_norm([g])
    g.resize_(2)  # same object, same address, fewer elements
    assert fastnorm.total_norm([g]).item() == pytest.approx(reference.norm([g], 2.0), rel=1e-6)
    h = torch.arange(1.0, 11.0)
    fastnorm.total_norm([h])
    h.as_strided_((5,), (2,))  # same address, every other element: noticed, so refused (not dense)
    with refused(fused):
        fastnorm.total_norm([h])


def test_cache_notices_a_new_dtype_at_the_same_address(fused):
    g = torch.randn(128, dtype=torch.float16).view(torch.float32)  # 64 floats over 128 halves
    fastnorm.total_norm([g])
    g.data = g.data.view(torch.float16)  # the same bytes read as the 128 halves
    assert fastnorm.total_norm([g]).item() == pytest.approx(reference.norm([g], 2.0), rel=1e-5)


def test_cache_notices_a_parameter_reshaped_under_its_gradient(fused):
    buffer = torch.randn(100)
    p = torch.nn.Parameter(torch.zeros(10))
    p.grad = buffer[:10]
    fastnorm.total_norm([p])
    p.data = torch.zeros(100)  # pruning, shard swapping: a new shape for the same Parameter
    p.grad = buffer  # a legal gradient at the old address
    assert fastnorm.total_norm([p]).item() == pytest.approx(reference.norm([buffer], 2.0), rel=1e-6)


def test_clip_after_a_resize_writes_inside_the_tensor_only(fused):
    base = torch.full((10,), 4.0)
    g = base[:10].clone()
    fastnorm.clip_([g], 1.0, gradients=True)
    g.fill_(4.0)
    storage_tail = g.untyped_storage()
    g.resize_(2)
    fastnorm.clip_([g], 1.0, gradients=True)
    whole = torch.tensor([], dtype=g.dtype).set_(storage_tail, 0, (10,))
    assert torch.equal(whole[2:], torch.full((8,), 4.0))  # untouched past the tensor's end
    torch.testing.assert_close(g, torch.full((2,), 4.0 / (32**0.5 + 1e-6)))  # clipped inside


# ----------------------------------------------------------------------------
# The partial contract (fastnorm._partial), which every backend emits
# ----------------------------------------------------------------------------

TWO = 2.0


def _l2(m, s):
    return torch.tensor([m, s], dtype=torch.float64)


def test_unscaled_l2_partials_merge_into_the_plain_sum_bit_for_bit():
    g = torch.Generator().manual_seed(40)
    sums = torch.rand(9, generator=g, dtype=torch.float64) * 1e3
    partials = [_l2(0.0, s) for s in sums.tolist()]
    merged = _partial.combine(partials, Mode.L2, TWO)
    assert merged[0].item() == 0.0 and torch.equal(merged[1], torch.stack([p[1] for p in partials]).sum())
    assert torch.equal(_partial.root(merged, Mode.L2, TWO, torch.float64), merged[1].sqrt())


def test_scaled_l2_partials_merge_at_the_largest_scale():
    big, small = 2.0**600, 2.0**-600
    merged = _partial.combine(
        [_l2(big, 3.0), _l2(0.0, 5.0), _l2(small, 7.0), _l2(2.0**900, 0.0)], Mode.L2, TWO
    )
    # The empty partial (s == 0) does not choose the scale, whatever its m.
    assert merged[0].item() == big
    assert merged[1].item() == 3.0 + 5.0 * 2.0**-1200 + 0.0  # 7 * 2^-2400 is below float64's range
    norm = _partial.root(merged, Mode.L2, TWO, torch.float64).item()
    assert norm == pytest.approx(3.0**0.5 * big, rel=1e-15)
    tiny = _partial.combine([_l2(small, 3.0), _l2(2.0**-500, 0.0), _l2(2.0**-610, 4.0)], Mode.L2, TWO)
    assert tiny[0].item() == small and tiny[1].item() == 3.0 + 4.0 * 2.0**-20


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_l2_sums_stay_non_finite_when_moved(bad):
    merged = _partial.combine([_l2(0.0, bad), _l2(2.0**700, 1.0)], Mode.L2, TWO)  # bad * 2^-1400, not inf * 0
    norm = _partial.root(merged, Mode.L2, TWO, torch.float32).item()
    assert norm == bad or (math.isnan(bad) and math.isnan(norm))


@pytest.mark.parametrize("exponent", [-1070, -600, -300, 0, 300, 600, 1000])
def test_scaled_l2_partials_give_the_norm_of_any_magnitude(exponent):
    g = torch.Generator().manual_seed(41 + exponent)
    pieces = [
        (torch.rand(50, generator=g, dtype=torch.float64) + 0.5) * 2.0**exponent * k for k in (1, 7, 1e-3)
    ]
    rows = [torch_backend._rows([t], Mode.L2, TWO, torch.float64)[0] for t in pieces]
    got = _partial.root(_partial.combine(rows, Mode.L2, TWO), Mode.L2, TWO, torch.float64).item()
    assert reference.rel_err(got, reference.norm(pieces, 2.0)) <= 1e-13


def test_torch_backend_float64_sums_of_squares_keep_their_bits():
    # Scaling by a power of two is exact: in float64's plain range the scaled sum,
    # unscaled again, is the plain sum bit for bit (an unscaled partial, m = 0).
    g = torch.Generator().manual_seed(42)
    for scale in (1e-100, 1e-3, 1.0, 3e5, 1e100):
        tensors = [torch.randn(n, generator=g, dtype=torch.float64) * scale for n in (1, 7, 1000, 4097)]
        rows = torch_backend._rows(tensors, Mode.L2, TWO, torch.float64)
        plain = torch.stack(torch._foreach_norm(tensors, 2.0)).square()
        assert torch.equal(rows[:, 0], torch.zeros(len(tensors), dtype=torch.float64))
        assert torch.equal(rows[:, 1], plain)
