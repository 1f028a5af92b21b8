"""fastnorm.patch(): what it replaces, with which meaning, how it undoes, what it hands the monitor."""

from __future__ import annotations

import inspect
import json
import sys
import types
import warnings

import pytest
import torch

import fastnorm
import reference
from fastnorm.integrations import patch as patching
from helpers import NoMemoryWrapper
from stack_harness import TORCH, Monitor, one_rank

ORIGINALS = {
    "clip_grad_norm_": torch.nn.utils.clip_grad_norm_,
    "get_total_norm": torch.nn.utils.get_total_norm,
    "clip_grads_with_norm_": torch.nn.utils.clip_grads_with_norm_,
    "clip_grad_norm": torch.nn.utils.clip_grad_norm,
}
IN_CLIP_GRAD = {
    "clip_grad_norm_": "clip_grad_norm_",
    "get_total_norm": "_get_total_norm",
    "clip_grads_with_norm_": "_clip_grads_with_norm_",
    "clip_grad_norm": "clip_grad_norm",
}


def grads_of(shapes, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    params = []
    for s in shapes:
        p = torch.nn.Parameter(torch.randn(s, generator=g))
        p.grad = torch.randn(s, generator=g) * scale
        params.append(p)
    return params


def clones(params):
    out = []
    for p in params:
        q = torch.nn.Parameter(p.detach().clone())
        q.grad = p.grad.clone()
        out.append(q)
    return out


@pytest.fixture(autouse=True)
def nothing_left_patched():
    yield
    live = list(patching._State.handles)
    for handle in live:
        handle.undo()
    assert not live, "a test left a patch live"
    for name, original in ORIGINALS.items():
        assert getattr(torch.nn.utils, name) is original
        assert getattr(torch.nn.utils.clip_grad, IN_CLIP_GRAD[name]) is original


def assert_torchs(present: bool = True) -> None:
    for name, original in ORIGINALS.items():
        for owner, attr in ((torch.nn.utils, name), (torch.nn.utils.clip_grad, IN_CLIP_GRAD[name])):
            assert (getattr(owner, attr) is original) is present, (owner.__name__, attr)


# -- what is replaced, and the undo ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(ORIGINALS))
def test_each_replacement_has_torchs_signature(name):
    ours = inspect.signature(getattr(patching, name)).parameters.values()
    theirs = inspect.signature(ORIGINALS[name]).parameters.values()
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in theirs]


def test_patch_replaces_torchs_names_and_undo_puts_the_same_objects_back():
    handle = fastnorm.patch()
    assert handle.active
    for name in ORIGINALS:
        assert getattr(torch.nn.utils, name) is getattr(patching, name)
        assert getattr(torch.nn.utils.clip_grad, IN_CLIP_GRAD[name]) is getattr(patching, name)
        assert f"torch.nn.utils.{name}" in handle.reached
        assert f"torch.nn.utils.clip_grad.{IN_CLIP_GRAD[name]}" in handle.reached
    handle.undo()
    assert not handle.active
    assert_torchs()


def test_names_bound_at_import_are_rebound_and_restored(monkeypatch):
    bound = types.ModuleType("bound_at_import")
    bound.clip_grad_norm_ = torch.nn.utils.clip_grad_norm_  # from torch.nn.utils import clip_grad_norm_
    bound.norm = torch.nn.utils.get_total_norm  # ... import get_total_norm as norm
    monkeypatch.setitem(sys.modules, "bound_at_import", bound)
    with fastnorm.patch() as handle:
        assert bound.clip_grad_norm_ is patching.clip_grad_norm_
        assert bound.norm is patching.get_total_norm
        assert {"bound_at_import.clip_grad_norm_", "bound_at_import.norm"} <= set(handle.reached)
        later = types.ModuleType("imported_while_patched")
        later.clip = torch.nn.utils.clip_grad_norm_  # binds the replacement
        monkeypatch.setitem(sys.modules, "imported_while_patched", later)
    assert bound.clip_grad_norm_ is ORIGINALS["clip_grad_norm_"]
    assert bound.norm is ORIGINALS["get_total_norm"]
    assert later.clip is ORIGINALS["clip_grad_norm_"]  # as if it had been imported without the patch


def test_patching_twice_is_harmless_and_the_last_undo_restores():
    first = fastnorm.patch()
    second = fastnorm.patch()
    assert torch.nn.utils.clip_grad_norm_ is patching.clip_grad_norm_  # not wrapped twice
    assert second.reached == first.reached
    first.undo()
    first.undo()
    assert torch.nn.utils.clip_grad_norm_ is patching.clip_grad_norm_  # the second one is live
    second.remove()
    assert_torchs()
    second.undo()
    assert_torchs()


def test_leaving_a_with_block_by_an_exception_undoes():
    with pytest.raises(KeyError), fastnorm.patch():
        assert_torchs(present=False)
        raise KeyError("the training loop died")
    assert_torchs()


def test_a_framework_not_imported_is_reported_not_reached(monkeypatch):
    for name in [m for m in sys.modules if m == "lightly_train" or m.startswith("lightly_train.")]:
        monkeypatch.delitem(sys.modules, name)
    with fastnorm.patch() as handle:
        assert handle.not_reached["lightly_train._torch_helpers.total_gradient_norm"] in (
            "not installed",
            "not imported (import it before patch())",
        )
        assert not any(name.startswith("lightly_train") for name in handle.reached)


def test_a_monitor_without_update_is_refused():
    with pytest.raises(TypeError, match="monitor must be a GradNormMonitor"):
        fastnorm.patch(monitor=[])
    assert_torchs()


def test_info_lists_what_patch_reaches():
    rows = patching.targets()
    assert [r["name"] for r in rows][:4] == [f"torch.nn.utils.{n}" for n in ORIGINALS]
    assert rows[0]["version"] == torch.__version__ and not rows[0]["patched"]
    with fastnorm.patch():
        rows = patching.targets()
        assert rows[0]["patched"] and "torch.nn.utils.clip_grad_norm_" in rows[0]["reached"]


def test_info_command_prints_the_patch_section(capsys):
    from fastnorm import cli

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "fastnorm.patch() replaces" in out
    assert f"torch.nn.utils.clip_grad_norm_ (torch {torch.__version__})" in out
    assert cli.main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert isinstance(report, list) and report[0]["device"] == "cpu"


# -- each replacement means what torch's does ---------------------------------------------------------


def test_get_total_norm_reads_the_tensors_as_given():
    params = grads_of([(5, 7), (3,)], seed=1)
    with fastnorm.patch():
        weights = torch.nn.utils.get_total_norm(params)
        grads = torch.nn.utils.get_total_norm([p.grad for p in params], 3.0)
    assert weights.item() == pytest.approx(reference.norm([p.detach() for p in params], 2.0), rel=1e-6)
    assert grads.item() == pytest.approx(reference.norm([p.grad for p in params], 3.0), rel=1e-6)
    assert TORCH["get_total_norm"](params).item() == pytest.approx(weights.item(), rel=1e-6)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, "inf", 0.5])
@pytest.mark.parametrize("max_norm", [0.25, 1e6])
def test_clip_grad_norm_clips_as_torch_does(norm_type, max_norm):
    ours = grads_of([(123,), (4097,), (7, 9), (1,)], seed=2, scale=2.0)
    theirs = clones(ours)
    with fastnorm.patch():
        norm = torch.nn.utils.clip_grad_norm_(ours, max_norm, norm_type)
    expected = TORCH["clip_grad_norm_"](theirs, max_norm, norm_type)
    assert norm.item() == pytest.approx(expected.item(), rel=1e-5)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


def test_clip_grads_with_norm_scales_by_the_norm_given_and_returns_none():
    ours = grads_of([(50,), (3, 3)], seed=3)
    theirs = clones(ours)
    norm = torch.tensor(40.0)
    with fastnorm.patch():
        assert torch.nn.utils.clip_grads_with_norm_(ours, 2.0, norm) is None
    TORCH["clip_grads_with_norm_"](theirs, 2.0, norm)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_the_deprecated_clip_grad_norm_warns_as_torchs_and_clips():
    ours = grads_of([(30,)], seed=4, scale=3.0)
    theirs = clones(ours)
    with fastnorm.patch(), pytest.warns(FutureWarning, match="in favor of `torch.nn.utils.clip_grad_norm_`"):
        norm = torch.nn.utils.clip_grad_norm(ours, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        expected = ORIGINALS["clip_grad_norm"](theirs, 1.0)
    assert norm.item() == pytest.approx(expected.item(), rel=1e-6)
    torch.testing.assert_close(ours[0].grad, theirs[0].grad, rtol=1e-6, atol=0)


def test_the_replacements_record_no_autograd_graph():
    x = torch.randn(20, requires_grad=True)
    grad = x * 2  # a gradient that is part of a graph, as with create_graph=True
    with fastnorm.patch():
        norm = torch.nn.utils.get_total_norm([grad])
    assert not norm.requires_grad


# -- no tensor a framework passes crashes the process --------------------------------------------------


BAD_NORMS = {
    "meta": (lambda: torch.empty((), device="meta"), ValueError, "meta"),
    "sparse": (lambda: torch.tensor([[5.0]]).to_sparse(), TypeError, "dense"),
    "integer": (lambda: torch.tensor(5), TypeError, "floating-point"),
    "two-values": (lambda: torch.tensor([5.0, 5.0]), ValueError, "one value"),
    "complex": (lambda: torch.tensor(5.0 + 0j), TypeError, "floating-point"),
    "wrapper-subclass": (lambda: NoMemoryWrapper(torch.tensor(5.0)), TypeError, "torch.Tensor or a DTensor"),
    "a-float": (lambda: 5.0, TypeError, "must be a Tensor"),
}


@pytest.mark.parametrize("case", list(BAD_NORMS))
def test_a_total_norm_that_cannot_be_one_raises_and_writes_nothing(case):
    make, error, match = BAD_NORMS[case]
    params = grads_of([(10,), (4, 4)], seed=5)
    before = [p.grad.clone() for p in params]
    monitor = Monitor()
    with fastnorm.patch(monitor=monitor), pytest.raises(error, match=match):
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, make())
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before))
    assert monitor.norms == []


GOOD_NORMS = {
    "0-dim": lambda n: n,
    "1-element": lambda n: n.reshape(1),
    "1x1": lambda n: n.reshape(1, 1),
    "float64": lambda n: n.double(),
    "bfloat16": lambda n: n.bfloat16(),
    "a-view-off-its-start": lambda n: torch.stack([n * 7, n])[1:],
    "requires-grad": lambda n: n.clone().requires_grad_(),
}


@pytest.mark.parametrize("case", list(GOOD_NORMS))
def test_any_norm_of_one_float_value_clips_as_torchs(case):
    ours = grads_of([(10,), (4, 4)], seed=6, scale=5.0)
    theirs = clones(ours)
    norm = GOOD_NORMS[case](TORCH["get_total_norm"]([p.grad for p in ours]))
    with fastnorm.patch():
        torch.nn.utils.clip_grads_with_norm_(ours, 1.0, norm)
    # torch's value of it: torch's foreach path refuses a norm that is not 0-dim, and computes a
    # 16-bit norm's coefficient in 16 bits; fastnorm takes the one value, widened first.
    value = norm.detach().reshape(())
    TORCH["clip_grads_with_norm_"](theirs, 1.0, value.float() if value.dtype == torch.bfloat16 else value)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


def test_a_dtensor_norm_and_dtensor_gradients_clip_as_torchs():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    with one_rank():
        mesh = init_device_mesh("cpu", (1,))
        g = torch.Generator().manual_seed(7)
        plain = [torch.randn(8, 6, generator=g), torch.randn(5, generator=g)]

        def sharded():
            out = []
            for value, placement in zip(plain, (Shard(0), Replicate())):
                p = torch.nn.Parameter(distribute_tensor(value.clone(), mesh, [placement]))
                p.grad = distribute_tensor(value * 3.0, mesh, [placement])
                out.append(p)
            return out

        ours, theirs = sharded(), sharded()
        norm = TORCH["get_total_norm"]([p.grad for p in theirs])  # a DTensor, as torch returns it
        monitor = Monitor()
        with fastnorm.patch(monitor=monitor):
            total = torch.nn.utils.get_total_norm([p.grad for p in ours])
            torch.nn.utils.clip_grads_with_norm_(ours, 1.0, norm)
        TORCH["clip_grads_with_norm_"](theirs, 1.0, norm)
        assert type(total) is torch.Tensor  # the global norm, as a plain tensor
        assert total.item() == pytest.approx(norm.full_tensor().item(), rel=1e-6)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a.grad.full_tensor(), b.grad.full_tensor(), rtol=0, atol=0)
        assert [n.item() for n in monitor.norms] == [pytest.approx(norm.full_tensor().item())]


def odd_layouts():
    g = torch.Generator().manual_seed(8)
    base = torch.randn(6, 8, generator=g)
    cases = {
        "transposed": base.t(),
        "strided-slice": torch.randn(6, 16, generator=g)[:, ::2],
        "channels-last": torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
        "0-dim": torch.tensor(3.0),
        "empty": torch.empty(0, 4),
        "offset-view": torch.randn(100, generator=g)[37:81],
        "sparse-coo": torch.randn(5, 5, generator=g).relu().to_sparse(),
        "complex": torch.randn(7, generator=g, dtype=torch.complex64),
    }
    return cases


@pytest.mark.parametrize("case", list(odd_layouts()))
def test_gradients_of_odd_layouts_through_the_patched_functions(case):
    grad = odd_layouts()[case]
    dense = grad.to_dense() if grad.is_sparse else grad
    expected = reference.norm([torch.view_as_real(dense) if grad.is_complex() else dense], 2.0)
    param = torch.nn.Parameter(torch.zeros(grad.shape, dtype=grad.dtype))
    param.grad = grad.clone()
    with fastnorm.patch():
        assert torch.nn.utils.get_total_norm([grad]).item() == pytest.approx(expected, rel=1e-6, abs=1e-12)
        norm = torch.nn.utils.clip_grad_norm_([param], 0.5)
    assert norm.item() == pytest.approx(expected, rel=1e-6, abs=1e-12)
    # torch's coefficient (torch's own clip_grad_norm_ cannot take a sparse gradient)
    coefficient = min(1.0, 0.5 / (expected + 1e-6))
    clipped = param.grad.to_dense() if grad.is_sparse else param.grad
    torch.testing.assert_close(clipped, dense * coefficient, rtol=1e-6, atol=1e-7)


def test_an_integer_tensor_raises_a_clear_error():
    with fastnorm.patch(), pytest.raises(TypeError, match="dtype torch.int64"):
        torch.nn.utils.get_total_norm([torch.randn(3), torch.arange(4)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device (CUDA)")
def test_a_norm_on_another_device_clips_as_torchs():
    ours = grads_of([(10,), (4, 4)], seed=9, scale=5.0)
    theirs = clones(ours)
    norm = TORCH["get_total_norm"]([p.grad for p in ours]).cuda()
    with fastnorm.patch():
        torch.nn.utils.clip_grads_with_norm_(ours, 1.0, norm)
    TORCH["clip_grads_with_norm_"](theirs, 1.0, norm)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


# -- the monitor -----------------------------------------------------------------------------------


def test_the_monitor_gets_each_steps_norm_once():
    params = grads_of([(20,), (5, 5)], seed=10, scale=4.0)
    monitor = Monitor()
    with fastnorm.patch(monitor=monitor):
        first = torch.nn.utils.clip_grad_norm_(params, 1.0)  # one step
        torch.nn.utils.get_total_norm([p.grad for p in params])  # a part of a step: not handed
        total = torch.nn.utils.get_total_norm([p.grad for p in params])
        for group in (params[:1], params[1:]):  # one norm, clipping two groups: one step
            torch.nn.utils.clip_grads_with_norm_(group, 1.0, total)
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, total.view(1))  # a view of it: the same step
        again = torch.nn.utils.get_total_norm([p.grad for p in params])  # a new norm: the next step
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, again)
    assert monitor.norms[0] is first
    assert monitor.norms[1] is total and monitor.norms[2] is again
    assert len(monitor.norms) == 3


class Measuring(Monitor):
    """A monitor that measures the step itself (the HF callback's protocol): it answers with a norm of
    its own for the tensors it knows, None for others."""

    def __init__(self, known, norm):
        super().__init__()
        self.known, self.norm, self.asked = {id(t) for t in known}, norm, []

    def measure(self, tensors, norm_type, gradients):
        self.asked.append((list(tensors), norm_type, gradients))
        return self.norm if all(id(t) in self.known for t in tensors) else None


def test_a_measuring_monitor_is_asked_first_and_its_norm_is_used_as_is():
    params = grads_of([(20,), (5, 5)], seed=12, scale=4.0)
    expected = [p.grad * (1.0 / (3.0 + 1e-6)) for p in params]
    own = torch.tensor(3.0)  # not the gradients' norm: what is used shows where it came from
    monitor = Measuring(params + [p.grad for p in params], own)
    with fastnorm.patch(monitor=monitor):
        returned = torch.nn.utils.clip_grad_norm_(iter(params), 1.0)  # an iterator: listed once, then read
        grads = [p.grad for p in params]
        assert torch.nn.utils.get_total_norm(grads) is own
        other = grads_of([(7,)], seed=13)
        assert torch.nn.utils.get_total_norm([other[0].grad]).item() == pytest.approx(
            other[0].grad.double().norm().item(), rel=1e-6
        )  # a None answer: computed as usual
        torch.nn.utils.clip_grad_norm_(params, 1e9, error_if_nonfinite=True)  # a host read: not asked
    assert returned is own and monitor.norms[0] is own
    for p, e in zip(params, expected):
        torch.testing.assert_close(p.grad, e)
    assert [(len(t), n, g) for t, n, g in monitor.asked] == [(2, 2.0, False), (2, 2.0, True), (1, 2.0, True)]
    assert monitor.asked[0][0][0] is params[0]


def test_a_measuring_monitor_keeps_torchs_warning_for_an_empty_generator():
    monitor = Measuring([], torch.tensor(1.0))
    with fastnorm.patch(monitor=monitor), pytest.warns(UserWarning, match="empty generator"):
        torch.nn.utils.clip_grad_norm_((p for p in ()), 1.0)
    assert monitor.asked == []


def test_nested_patches_hand_norms_to_the_newest_monitor():
    params = grads_of([(20,)], seed=11)
    outer, inner = Monitor(), Monitor()
    with fastnorm.patch(monitor=outer):
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        with fastnorm.patch(monitor=inner):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            with fastnorm.patch():  # no monitor: the newest that has one keeps receiving
                torch.nn.utils.clip_grad_norm_(params, 1.0)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
    assert (len(outer.norms), len(inner.norms)) == (2, 2)


def test_a_gradnormmonitor_logs_every_step_inside_the_patch(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = fastnorm.GradNormMonitor(4, [fastnorm.JsonlLogger(tmp_path / "m.jsonl")], max_norm=0.5)
    norms = []
    with fastnorm.patch(monitor=monitor), monitor:
        for _ in range(10):
            model(torch.randn(8, 6)).square().mean().backward()
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5).item())
            optimizer.step()
            optimizer.zero_grad()
    series = fastnorm.read_series(tmp_path / "m.jsonl")
    assert series.steps == tuple(range(1, 11))
    assert list(series.values) == pytest.approx(norms, rel=1e-7)


@pytest.mark.cuda
def test_the_patched_clip_and_its_monitor_never_synchronize():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10)).cuda()
    monitor = fastnorm.GradNormMonitor(16, diagnose=False)
    with fastnorm.patch(monitor=monitor), monitor:
        for step in range(5):  # the first two compile kernels, pin host memory, allocate the buffer
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            if step >= 2:
                torch.cuda.set_sync_debug_mode("error")
            try:
                norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
                torch.nn.utils.clip_grads_with_norm_(model.parameters(), 1.0, norm)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            model.zero_grad(set_to_none=True)
    assert monitor.transfers == 1  # ten norms, one window, at close


# -- the frameworks' own helpers --------------------------------------------------------------------


def test_lightning_grad_norm_is_rebound_with_the_same_keys_and_values():
    grads = pytest.importorskip("lightning.pytorch.utilities.grads")
    import lightning.pytorch.utilities as utilities

    original = grads.grad_norm
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 2, bias=False))
    model(torch.randn(3, 5)).sum().backward()
    model[0].bias.grad = None  # a parameter without a gradient is left out, as Lightning does
    with fastnorm.patch() as handle:
        assert utilities.grad_norm is grads.grad_norm is not original
        assert "lightning.pytorch.utilities.grad_norm" in handle.reached
        for norm_type in (2, "inf", 1.5):
            ours, theirs = utilities.grad_norm(model, norm_type), original(model, norm_type)
            assert list(ours) == list(theirs)
            for key in theirs:
                assert ours[key].item() == pytest.approx(theirs[key].item(), rel=1e-6), key
        with pytest.raises(ValueError, match="`norm_type` must be a positive number"):
            utilities.grad_norm(model, 0)
        assert utilities.grad_norm(torch.nn.Linear(2, 2), 2) == {}
    assert utilities.grad_norm is grads.grad_norm is original


def _lightly_helpers():
    """LightlyTrain's helper as it ships (lightly_train/_torch_helpers.py), and a model module
    that imported it by name."""

    def total_gradient_norm(parameters):
        total_sq = None
        for p in parameters:
            if p.grad is not None:
                sq = p.grad.detach().pow(2).sum()
                total_sq = sq if total_sq is None else total_sq + sq
        if total_sq is None:
            return torch.tensor(0.0)
        return total_sq.sqrt()

    names = ("lightly_train", "_torch_helpers", "train_model")
    package, helpers, model = (types.ModuleType(n) for n in names)
    helpers.total_gradient_norm = total_gradient_norm
    model.total_gradient_norm = total_gradient_norm  # from lightly_train._torch_helpers import ...
    return package, helpers, model


def test_lightlytrains_total_gradient_norm_is_rebound_in_every_module_that_imported_it(monkeypatch):
    package, helpers, model = _lightly_helpers()
    original = helpers.total_gradient_norm
    monkeypatch.setitem(sys.modules, "lightly_train", package)
    monkeypatch.setitem(sys.modules, "lightly_train._torch_helpers", helpers)
    monkeypatch.setitem(sys.modules, "lightly_train._task_models.x.train_model", model)
    params = grads_of([(30,), (6, 6)], seed=12)
    monitor = Monitor()
    with fastnorm.patch(monitor=monitor) as handle:
        assert "lightly_train._task_models.x.train_model.total_gradient_norm" in handle.reached
        assert "lightly_train._torch_helpers.total_gradient_norm" in handle.reached
        ours = model.total_gradient_norm(params)
        assert model.total_gradient_norm([torch.nn.Parameter(torch.ones(2))]).item() == 0.0
    assert model.total_gradient_norm is helpers.total_gradient_norm is original
    assert ours.item() == pytest.approx(original(params).item(), rel=1e-6)
    assert ours.item() == pytest.approx(reference.norm([p.grad for p in params], 2.0), rel=1e-6)
    assert [n.item() for n in monitor.norms] == [ours.item()]  # LightlyTrain's per-step norm


def test_no_gradient_warning_points_at_the_frameworks_line_not_the_patch():
    params = list(torch.nn.Linear(3, 2).parameters())  # before any backward()
    with fastnorm.patch(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # a framework calling torch's name
    [warning] = [w for w in caught if issubclass(w.category, fastnorm.NoGradientWarning)]
    assert warning.filename == __file__


# -- threads and step numbers ---------------------------------------------------------------------


def originals():
    return {name: getattr(torch.nn.utils, name) for name in ("clip_grad_norm_", "get_total_norm")} | {
        f"clip_grad.{name}": getattr(torch.nn.utils.clip_grad, name)
        for name in ("clip_grad_norm_", "_get_total_norm", "_clip_grads_with_norm_")
    }


def test_patch_and_undo_from_several_threads_leave_torchs_originals():
    """Threads that patch and undo at the same moments (a barrier per round, a short switch interval to
    interleave them inside patch() and undo()): once every handle is undone, torch's names hold their
    originals by identity, and a new patch and undo still restore them."""
    import threading

    before = originals()
    rounds, threads = 25, 4
    barrier = threading.Barrier(threads, timeout=60)
    errors = []

    def work():
        try:
            for _ in range(rounds):
                barrier.wait()
                handle = fastnorm.patch()
                barrier.wait()
                handle.undo()
        except Exception as exc:  # reported below, with the thread's failure
            errors.append(exc)
            barrier.abort()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        workers = [threading.Thread(target=work) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not errors and not any(w.is_alive() for w in workers)
    assert {k: v is before[k] for k, v in originals().items()} == dict.fromkeys(before, True)
    with fastnorm.patch():
        assert torch.nn.utils.clip_grad_norm_ is not before["clip_grad_norm_"]
    assert torch.nn.utils.clip_grad_norm_ is before["clip_grad_norm_"]


def test_a_replacement_is_never_taken_for_the_original(monkeypatch):
    """A replacement left in torch's name (by a patch state lost on the way) is not what undo restores."""
    true = torch.nn.utils.clip_grad.clip_grad_norm_
    with fastnorm.patch():
        stray = torch.nn.utils.clip_grad.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils.clip_grad, "clip_grad_norm_", stray)
    handle = fastnorm.patch()
    assert "torch.nn.utils.clip_grad_norm_" in handle.not_reached
    assert "replacement" in handle.not_reached["torch.nn.utils.clip_grad_norm_"]
    handle.undo()
    monkeypatch.setattr(torch.nn.utils.clip_grad, "clip_grad_norm_", true)


def test_the_monitor_under_patch_numbers_steps_as_the_trainers_do(tmp_path):
    """The n-th step's norm is logged at step n, as HF's Trainer and torchtitan number the steps."""
    params = grads_of([(20,)], seed=12)
    monitor = fastnorm.GradNormMonitor(3, [fastnorm.JsonlLogger(tmp_path / "m.jsonl")], diagnose=False)
    with fastnorm.patch(monitor=monitor), monitor:
        for _ in range(5):
            torch.nn.utils.clip_grad_norm_(params, 1.0)
    assert fastnorm.read_series(tmp_path / "m.jsonl").steps == (1, 2, 3, 4, 5)
