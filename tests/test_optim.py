"""StepClipper: the clip and the non-finite skip folded into torch's fused step.

The reference is always what StepClipper replaces: ``fastnorm.clip_`` followed
by ``optimizer.step()`` (skipped on the host when the norm is not finite, for
the skip policy), on the same fresh random gradients.
"""

from __future__ import annotations

import copy
import io
import math
import re
import warnings
from pathlib import Path

import pytest
import torch

import fastnorm
from fastnorm.monitoring.command import diagnose_series
from fastnorm.optim import StepClipper, not_supported_reasons

SHAPES = [(33, 17), (123,), (4097,), (5, 7, 3), (1,)]

OPTIMIZERS = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, fused=True),
    "adam-amsgrad": lambda ps: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, weight_decay=0.01, fused=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, fused=True),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, fused=True),
    "sgd-dampening": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.3, fused=True),
    "sgd-nesterov": lambda ps: torch.optim.SGD(
        ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3, fused=True
    ),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.05, fused=True),
}


def _params(seed: int = 1, dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g, dtype=dtype)) for s in SHAPES]


def _fill_grads(params, g: torch.Generator, step: int, bad: dict[int, float]) -> None:
    """Fresh gradients as new tensors (as after zero_grad(set_to_none=True)); the
    second parameter has none every fifth step; ``bad[step]`` goes into one element."""
    for i, p in enumerate(params):
        if i == 1 and step % 5 == 4:
            p.grad = None
            continue
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype) * 3
    if step in bad:
        params[2].grad.view(-1)[17] = bad[step]


def _state_tensors(opt) -> list[torch.Tensor]:
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def _run(name, max_norm, bad, *, folded, skip_nonfinite=True, steps=50, dtype=torch.float32):
    params = _params(dtype=dtype)
    opt = OPTIMIZERS[name](params)
    clipper = StepClipper(opt, max_norm, skip_nonfinite=skip_nonfinite) if folded else None
    g = torch.Generator().manual_seed(2)
    norms, skipped = [], []
    for step in range(steps):
        _fill_grads(params, g, step, bad)
        if folded:
            norm = clipper.arm()
            opt.step()
            skipped.append(clipper.skipped.item())
        else:
            norm = fastnorm.clip_(params, max_norm)
            if not skip_nonfinite or math.isfinite(norm.item()):
                opt.step()
        norms.append(norm.item())
    return params, opt, norms, skipped


def _assert_close(ours, theirs, exact):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        if a is None or b is None:
            assert a is b
        elif exact:
            assert torch.equal(a, b) or torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("clipping", [True, False], ids=["clip", "noclip"])
def test_parity_over_50_steps_skipping_nonfinite(name, clipping):
    # NaN at the first step too: torch's fused SGD leaves uninitialized momentum there.
    bad = {0: math.nan, 7: math.nan, 8: math.inf, 31: -math.inf}
    max_norm = 1.0 if clipping else 1e9
    ours, opt, norms, skipped = _run(name, max_norm, bad, folded=True)
    theirs, ref, ref_norms, _ = _run(name, max_norm, bad, folded=False)
    assert all(torch.isfinite(p).all() for p in ours)
    assert norms == pytest.approx(ref_norms, nan_ok=True)
    assert skipped == [1.0 if s in bad else 0.0 for s in range(50)]
    if clipping:
        assert sum(n > max_norm for n in norms if math.isfinite(n)) > 40  # clipping really was active
    # Without clipping the step divides by exactly 1: the same bits.
    _assert_close(ours, theirs, exact=not clipping)
    _assert_close([p.grad for p in ours], [p.grad for p in theirs], exact=not clipping)
    _assert_close(_state_tensors(opt), _state_tensors(ref), exact=not clipping)


def test_the_folded_coefficient_is_torchs_at_small_norms():
    # 1 / min(1, max_norm / (norm + 1e-6)): at a norm of 1e-3 the + 1e-6 is 0.1% of
    # the coefficient, far above float32's rounding.
    g = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in [*SHAPES, (70001,)]]  # over one C++ task
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * 3e-6
    norm = torch.linalg.vector_norm(torch.cat([p.grad.double().flatten() for p in params])).item()
    assert 1e-4 < norm < 1e-3
    expected = [p.grad.double() * (1e-4 / (norm + 1e-6)) for p in params]
    opt = torch.optim.SGD(params, lr=1.0, fused=True)
    clipper = StepClipper(opt, max_norm=1e-4)
    assert clipper.arm().item() == pytest.approx(norm, rel=1e-6)
    opt.step()  # p = 0 - lr * clipped gradient
    for p, e in zip(params, expected):
        torch.testing.assert_close(-p.detach().double(), e, rtol=1e-5, atol=0)


@pytest.mark.parametrize("name", ["adamw", "sgd-momentum", "adagrad"])
def test_parity_keeping_torch_behaviour(name):
    # An inf norm clips by 0 (the inf element turns NaN), a NaN norm poisons all: as torch does.
    bad = {7: math.inf, 20: -math.inf, 45: math.nan}
    ours, opt, _, skipped = _run(name, 1.0, bad, folded=True, skip_nonfinite=False)
    theirs, ref, _, _ = _run(name, 1.0, bad, folded=False, skip_nonfinite=False)
    assert skipped == [0.0] * 50
    assert all(torch.isnan(p).all() for p in ours)
    ours, opt, _, _ = _run(name, 1.0, bad, folded=True, skip_nonfinite=False, steps=40)
    theirs, ref, _, _ = _run(name, 1.0, bad, folded=False, skip_nonfinite=False, steps=40)
    assert any(torch.isnan(p).any() for p in ours) and not all(torch.isnan(p).all() for p in ours)
    _assert_close(ours, theirs, exact=False)
    _assert_close(_state_tensors(opt), _state_tensors(ref), exact=False)


def test_parity_float64_parameters():
    bad = {3: math.nan}
    ours, opt, _, _ = _run("adamw", 1.0, bad, folded=True, dtype=torch.float64, steps=20)
    theirs, ref, _, _ = _run("adamw", 1.0, bad, folded=False, dtype=torch.float64, steps=20)
    # grad_scale is float32 in torch's contract: the coefficient carries float32 rounding.
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_no_gradient_byte_is_written():
    params = _params()
    opt = torch.optim.AdamW(params, fused=True)
    clipper = StepClipper(opt, 0.1)
    g = torch.Generator().manual_seed(3)
    _fill_grads(params, g, 0, {})
    grads = [p.grad for p in params]
    before = [(t.data_ptr(), t._version, t.clone()) for t in grads]
    norm = clipper.arm()
    assert norm.item() > 1.0  # a clip_ here would rewrite every gradient
    for t, p, (ptr, version, saved) in zip(grads, params, before):
        assert p.grad is t and t.data_ptr() == ptr and t._version == version
        assert torch.equal(t.view(torch.uint8), saved.view(torch.uint8))
    # The control: the same gradients through fastnorm.clip_ do change.
    fastnorm.clip_([c for _, _, c in before], 0.1, gradients=True)
    assert not torch.equal(before[0][2], grads[0])


def _ulp16(x: torch.Tensor) -> torch.Tensor:
    """The spacing of a 16-bit tensor's dtype above each |x| (subnormals included), in float64."""
    top = torch.full_like(x, math.inf)
    return (torch.nextafter(x.abs(), top).double() - x.abs().double()).abs()


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a - b| in 16-bit ulps of the larger magnitude, or of 1 below 1."""
    unit = _ulp16(torch.maximum(a.abs(), b.abs()).clamp_min(1))
    return ((a.double() - b.double()).abs() / unit).max().item()


@pytest.mark.parametrize(
    "dtype, max_norm",
    # float16 clipped to 1.0 squares gradients into its subnormals in AdamW's
    # exp_avg_sq (kept in the parameter's dtype): torch's own rounding rules there.
    [(torch.bfloat16, 1.0), (torch.float16, 10.0)],
    ids=["bf16", "fp16"],
)
def test_16bit_parameters_folded_or_clipped_first_differ_by_16bit_rounding(monkeypatch, dtype, max_norm):
    """clip_ rounds each clipped gradient to 16 bits, as torch does; the folded
    step divides the 16-bit gradient by the coefficient in float32. The
    gradient each step consumes differs by at most half a 16-bit ulp of the
    clipped value; from the same state a step's parameters differ by at most one
    16-bit ulp (of the parameter, or of 1 for parameters below 1), and five steps
    of fused AdamW by at most two."""
    import torch.optim.adam as adam_module

    consumed = []  # (grads, grad_scale) of every fused step
    original = adam_module._fused_adam

    def spy(params, grads, *args, **kwargs):
        consumed.append(([g.clone() for g in grads], kwargs["grad_scale"]))
        return original(params, grads, *args, **kwargs)

    monkeypatch.setattr(adam_module, "_fused_adam", spy)

    def run(seed, same_state):
        g = torch.Generator().manual_seed(seed)
        theirs = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]
        ours = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
        ref = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1, fused=True)
        opt = torch.optim.AdamW(ours, lr=1e-2, weight_decay=0.1, fused=True)
        clipper = StepClipper(opt, max_norm)
        worst = []
        for step in range(5):
            if same_state and step:
                with torch.no_grad():
                    for p, q in zip(ours, theirs):
                        p.copy_(q)
                        opt.state[p] = {k: v.clone() for k, v in ref.state[q].items()}
            for p, q in zip(ours, theirs):
                p.grad = (torch.randn(p.shape, generator=g) * 3).to(dtype)
                q.grad = p.grad.clone()
            fastnorm.clip_(theirs, max_norm)
            ref.step()
            clipper.arm()
            opt.step()
            (clipped, none), (raw, grad_scale) = consumed[-2:]
            assert none is None and grad_scale is not None
            for c, r in zip(clipped, raw):
                folded = r.float() / grad_scale  # what the fused kernel computes
                bound = _ulp16(c) / 2 + folded.double().abs() * 2.0**-23
                assert ((folded.double() - c.double()).abs() <= bound).all()
            worst.append(max(_ulps_apart(a.detach(), b.detach()) for a, b in zip(ours, theirs)))
        return worst

    per_step = [max(steps) for steps in zip(*(run(seed, True) for seed in range(20)))]
    five_steps = max(run(seed, False)[-1] for seed in range(20))
    assert max(per_step) == 1.0 and 1.0 <= five_steps <= 2.0, (per_step, five_steps)


def _spy_fused(monkeypatch):
    """Records the grad_scale and found_inf each fused Adam step receives."""
    import torch.optim.adam as adam_module

    seen = []
    original = adam_module._fused_adam

    def spy(*args, **kwargs):
        seen.append((kwargs["grad_scale"], kwargs["found_inf"]))
        return original(*args, **kwargs)

    monkeypatch.setattr(adam_module, "_fused_adam", spy)
    return seen


def test_attributes_live_only_inside_one_step(monkeypatch):
    seen = _spy_fused(monkeypatch)
    params = _params()
    opt = torch.optim.AdamW(params, fused=True)
    clipper = StepClipper(opt, 0.5)
    g = torch.Generator().manual_seed(4)
    _fill_grads(params, g, 0, {})
    norm = clipper.arm()
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
    opt.step()
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
    grad_scale, found_inf = seen[-1]
    assert grad_scale.dtype == found_inf.dtype == torch.float32
    assert grad_scale.item() == pytest.approx((norm.item() + 1e-6) / 0.5, rel=1e-6)
    assert found_inf.item() == 0.0
    opt.step()  # no clip_ before it: nothing folded
    assert seen[-1] == (None, None)
    # Two clip_ calls before one step: the last one is used, once.
    _fill_grads(params, g, 1, {})
    clipper.arm()
    _fill_grads(params, g, 2, {})
    norm = clipper.arm()
    opt.step()
    opt.step()
    assert seen[-2][0].item() == pytest.approx((norm.item() + 1e-6) / 0.5, rel=1e-6)
    assert seen[-1] == (None, None)


def _raising_step(opt) -> None:
    def closure():
        raise ZeroDivisionError("in the closure")

    with pytest.raises(ZeroDivisionError):
        opt.step(closure)  # after the pre-hooks, before the post-hooks


@pytest.mark.parametrize("skip_nonfinite", [True, False])
def test_a_step_that_raises_leaks_nothing(monkeypatch, skip_nonfinite):
    seen = _spy_fused(monkeypatch)
    params = _params()
    opt = torch.optim.Adam(params, fused=True)
    clipper = StepClipper(opt, 0.5, skip_nonfinite=skip_nonfinite)
    g = torch.Generator().manual_seed(5)
    _fill_grads(params, g, 0, {})
    clipper.arm()
    _raising_step(opt)
    opt.step()
    assert seen[-1] == (None, None)
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")

    # The same with a GradScaler stepping next (after unscale_, without clip_):
    # the scaler copies the stale grad_scale and later deletes the attribute.
    scaler = torch.amp.GradScaler("cpu")
    _fill_grads(params, g, 1, {})
    clipper.arm()
    _raising_step(opt)
    scaler.scale(torch.ones(()))
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    grad_scale, found_inf = seen[-1]
    assert grad_scale is None and found_inf.item() == 0.0
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")

    # And with clip_ before the next step, as in a loop: a normal step.
    _fill_grads(params, g, 2, {})
    norm = clipper.arm()
    _raising_step(opt)
    norm = clipper.arm()
    opt.step()
    assert seen[-1][0].item() == pytest.approx((norm.item() + 1e-6) / 0.5, rel=1e-6)
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")


def _two_group_run(folded: bool, steps: int = 30):
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32))
    head = torch.nn.Linear(32, 3)
    decay = [p for p in body.parameters() if p.dim() > 1]
    no_decay = [p for p in body.parameters() if p.dim() <= 1]
    opt_body = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0, "lr": 3e-3}],
        lr=1e-2,
        fused=True,
    )
    opt_head = torch.optim.SGD(head.parameters(), lr=0.1, momentum=0.9, fused=True)
    opts = [opt_body, opt_head]
    params = [*body.parameters(), *head.parameters()]
    clipper = StepClipper(opts, 0.3) if folded else None
    g = torch.Generator().manual_seed(6)
    for step in range(steps):
        x = torch.randn(8, 16, generator=g) * (math.inf if step == 11 else 1.0)
        head(body(x)).pow(2).mean().backward()
        if folded:
            clipper.arm()
            for opt in opts:
                opt.step()
        else:
            norm = fastnorm.clip_(params, 0.3)
            if math.isfinite(norm.item()):
                for opt in opts:
                    opt.step()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
    return params, opts


def test_param_groups_and_several_optimizers():
    ours, opts = _two_group_run(folded=True)
    theirs, refs = _two_group_run(folded=False)
    _assert_close(ours, theirs, exact=False)
    for o, r in zip(opts, refs):
        _assert_close(_state_tensors(o), _state_tensors(r), exact=False)


def _checkpointed_run(stop_at: int | None, steps: int = 30):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    clipper = StepClipper(opt, 0.2)
    g = torch.Generator().manual_seed(7)
    for step in range(steps):
        if step == stop_at:
            # Saved between clip_ and step would be the worst moment: save there.
            model(torch.randn(4, 8, generator=g)).sum().backward()
            clipper.arm()
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
            saved = opt.state_dict()
            assert "grad_scale" not in repr(saved) and "found_inf" not in repr(saved)
            clipper.remove()
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(1)  # a fresh process: other initial weights
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
            buffer.seek(0)
            checkpoint = torch.load(buffer)
            model.load_state_dict(checkpoint["model"])
            opt.load_state_dict(checkpoint["opt"])
            clipper = StepClipper(opt, 0.2)
            g = torch.Generator().manual_seed(7)
            for _ in range(step):
                torch.randn(4, 8, generator=g)
        model(torch.randn(4, 8, generator=g) * (math.nan if step == 4 else 1.0)).sum().backward()
        clipper.arm()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return list(model.parameters()), opt


def test_checkpoint_save_and_load():
    ours, opt = _checkpointed_run(stop_at=13)
    theirs, ref = _checkpointed_run(stop_at=None)
    _assert_close(ours, theirs, exact=True)
    _assert_close(_state_tensors(opt), _state_tensors(ref), exact=True)
    assert all(torch.isfinite(p).all() for p in ours)


# ----------------------------------------------------------------------------
# Optimizers that cannot fold: the fallback, and strict
# ----------------------------------------------------------------------------


class _OwnStep(torch.optim.AdamW):
    """A third-party AdamW that rewrites step(): it may ignore grad_scale."""

    def step(self, closure=None):
        return super().step(closure)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=True), "not fused"),
        (lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False), "not fused"),
        (lambda ps: torch.optim.RMSprop(ps, lr=1e-2), "RMSprop.step() does not take"),
        (lambda ps: _OwnStep(ps, lr=1e-2, fused=True), "_OwnStep.step() does not take"),
    ],
    ids=["foreach", "for-loop", "rmsprop", "own-step"],
)
def test_unsupported_optimizers_fall_back_with_one_note(make, reason):
    params, ref_params = _params(), _params()
    opt, ref = make(params), make(ref_params)
    assert any(reason in r for r in not_supported_reasons(opt))
    with pytest.warns(UserWarning, match="separate pass") as notes:
        clipper = StepClipper(opt, 0.5)
    assert len(notes) == 1
    g, g_ref = torch.Generator().manual_seed(8), torch.Generator().manual_seed(8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the note is not repeated per step
        for step in range(10):
            _fill_grads(params, g, step, {})
            _fill_grads(ref_params, g_ref, step, {})
            norm = clipper.arm()
            opt.step()
            assert torch.equal(norm, fastnorm.clip_(ref_params, 0.5))
            ref.step()
    _assert_close(params, ref_params, exact=True)
    with pytest.raises(ValueError, match=reason.split("(")[0]):
        StepClipper(make(_params()), 0.5, strict=True)


def test_strict_refuses_before_touching_anything():
    fused = torch.optim.AdamW(_params(), fused=True)
    plain = torch.optim.AdamW(_params())
    with pytest.raises(ValueError, match="not fused"):
        StepClipper([fused, plain], 1.0, strict=True)
    assert not fused._optimizer_step_pre_hooks and not fused._optimizer_step_post_hooks
    StepClipper(fused, 1.0, strict=True).remove()


def test_mixed_optimizers_fold_where_they_can():
    params = _params()
    folding = torch.optim.AdamW(params[:3], fused=True)
    separate = torch.optim.SGD(params[3:], lr=0.1)
    with pytest.warns(UserWarning, match="SGD: param groups \\[0\\] are not fused"):
        clipper = StepClipper([folding, separate], 0.5)
    _fill_grads(params, torch.Generator().manual_seed(9), 0, {})
    grads = [p.grad.clone() for p in params]
    norm = clipper.arm()
    coef = 0.5 / (norm + 1e-6)
    assert all(torch.equal(p.grad, g) for p, g in zip(params[:3], grads[:3]))  # folded: untouched
    for p, g in zip(params[3:], grads[3:]):  # clipped now, by the norm of all
        torch.testing.assert_close(p.grad, g * coef)


def test_skipped_says_0_once_an_optimizer_that_cannot_fold_applied_its_step():
    # Only the folding steps skip a NaN norm; the others apply it (as torch does),
    # so the steps were not all skipped, whatever order they run in.
    for order in ("folding first", "separate first"):
        params = _params()
        folding = torch.optim.AdamW(params[:3], fused=True)
        separate = torch.optim.SGD(params[3:], lr=0.1)
        with pytest.warns(UserWarning, match="separate pass"):
            clipper = StepClipper([folding, separate], 0.5)
        _fill_grads(params, torch.Generator().manual_seed(11), 0, {0: math.nan})
        clipper.arm()
        assert clipper.skipped.item() == 1.0  # armed: the folding step will skip
        for opt in (folding, separate) if order == "folding first" else (separate, folding):
            opt.step()
        assert clipper.skipped.item() == 0.0, order
        assert torch.isnan(params[3]).all() and torch.isfinite(params[0]).all()
        clipper.remove()


def test_skipped_stays_1_when_a_scaler_skips_the_step_of_an_optimizer_that_cannot_fold():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    with pytest.warns(UserWarning, match="separate pass"):
        clipper = StepClipper(opt, 1.0)
    scaler = torch.amp.GradScaler("cpu")
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(model(torch.full((2, 4), math.inf)).sum()).backward()
    scaler.unscale_(opt)
    clipper.arm()
    scaler.step(opt)  # found an inf: never calls opt.step()
    scaler.update()
    assert clipper.skipped.item() == 1.0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    model.zero_grad(set_to_none=True)
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    scaler.unscale_(opt)
    clipper.arm()
    scaler.step(opt)
    assert clipper.skipped.item() == 0.0
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_changes_after_construction_and_removal():
    params = _params()
    opt = torch.optim.AdamW(params[:3], fused=True)
    clipper = StepClipper(opt, 0.5)
    with pytest.raises(ValueError, match="already has a StepClipper"):
        StepClipper(opt, 1.0)
    opt.add_param_group({"params": params[3:], "fused": False})
    _fill_grads(params, torch.Generator().manual_seed(10), 0, {})
    with pytest.raises(RuntimeError, match="param groups \\[1\\] are not fused"):
        clipper.arm()
    clipper.remove()
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    with pytest.raises(RuntimeError, match="removed"):
        clipper.arm()
    with pytest.warns(UserWarning):
        again = StepClipper(opt, 1.0)  # a removed clipper frees its optimizer
    again.remove()
    with pytest.raises(RuntimeError, match="removed"):
        again.arm()  # nothing folds there, but a removed clipper clips nothing either


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((lambda ps: [], 1.0), ValueError, "empty"),
        ((lambda ps: [ps], 1.0), TypeError, "must be torch Optimizers"),
        ((lambda ps: torch.optim.AdamW(ps, fused=True), -1.0), ValueError, "max_norm must be >= 0"),
        ((lambda ps: torch.optim.AdamW(ps, fused=True), math.nan), ValueError, "max_norm"),
        ((lambda ps: torch.optim.AdamW(ps, fused=True), 1.0, math.nan), ValueError, "norm_type"),
    ],
)
def test_bad_arguments(args, error, match):
    make, *rest = args
    with pytest.raises(error, match=match):
        StepClipper(make(_params()), *rest)
    opt = torch.optim.AdamW(_params(), fused=True)
    with pytest.raises(ValueError, match="twice"):
        StepClipper([opt, opt], 1.0)
    with StepClipper(opt, 1.0) as clipper:
        with pytest.raises(TypeError, match="total_norm must be a Tensor"):
            clipper.arm(total_norm=1.0)
        with pytest.raises(ValueError, match="one value"):
            clipper.arm(total_norm=torch.ones(2))


def test_a_norm_given_is_used_as_is(monkeypatch):
    seen = _spy_fused(monkeypatch)
    params = _params()
    opt = torch.optim.Adam(params, fused=True)
    clipper = StepClipper(opt, 2.0)
    _fill_grads(params, torch.Generator().manual_seed(11), 0, {})
    total, per_param = fastnorm.tensor_norms(params)
    assert clipper.arm(total_norm=total) is not None
    opt.step()
    assert seen[-1][0].item() == pytest.approx((total.item() + 1e-6) / 2.0, rel=1e-6)
    assert per_param.numel() == len(params)


# ----------------------------------------------------------------------------
# AMP: GradScaler's unscale, the clip and the skip compose
# ----------------------------------------------------------------------------


def _amp_lockstep(dtype, mode, skip_nonfinite=True, steps=24):
    """torch's documented AMP recipe with clipping on a model, and StepClipper on
    its twin ("unscale": the same recipe; "scaled": without ``unscale_``).

    Only the model runs forward and backward; the twin receives copies of its
    scaled gradients. Each twin running its own fp16 forward would turn the
    last-bit differences of the two clips into different activations, and
    those into different gradients: the comparison would measure chaos.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    twin = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, fused=True)
    # A large first scale overflows fp16; an inf input at step 9 makes every
    # dtype's gradients non-finite: steps the scaler skips.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=4)
    twin_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=4)
    clipper = StepClipper(twin_opt, 0.02, skip_nonfinite=skip_nonfinite)
    g = torch.Generator().manual_seed(3)
    traces, norms = ([], []), ([], [])
    for step in range(steps):
        x = torch.randn(8, 16, generator=g) * (math.inf if step == 9 else 1.0)
        with torch.autocast("cpu", dtype=dtype):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        twin_scaler.scale(loss.detach())  # the twin's scaler follows the same loss
        for p, q in zip(model.parameters(), twin.parameters()):
            q.grad = p.grad.clone()

        scaler.unscale_(opt)
        norms[0].append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.02).item())
        scaler.step(opt)
        scaler.update()

        if mode == "unscale":
            twin_scaler.unscale_(twin_opt)
        norms[1].append(clipper.arm().item())
        twin_scaler.step(twin_opt)
        twin_scaler.update()

        for trace, s, o, m in ((traces[0], scaler, opt, model), (traces[1], twin_scaler, twin_opt, twin)):
            trace.append((s.get_scale(), o.state[m[0].weight]["step"].item()))
            o.zero_grad(set_to_none=True)
    return (list(model.parameters()), list(twin.parameters())), traces, norms


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("mode", ["unscale", "scaled"])
def test_amp_recipe_with_grad_scaler(dtype, mode):
    (theirs, ours), (their_trace, our_trace), (their_norms, our_norms) = _amp_lockstep(dtype, mode)
    assert our_trace == their_trace  # the same scales, the same steps skipped
    steps = [s for _, s in their_trace]
    assert steps[-1] < len(steps) - (dtype == torch.float16)  # the scaler skipped steps
    finite = [n for n in their_norms if math.isfinite(n)]
    assert sum(n > 0.02 for n in finite) > 0.8 * len(finite)  # and clipping was active
    if mode == "unscale":
        assert our_norms == pytest.approx(their_norms, rel=1e-5, nan_ok=True)
    _assert_close(ours, theirs, exact=False)


def test_amp_scaler_skips_even_when_keeping_torch_behaviour():
    (theirs, ours), (their_trace, our_trace), _ = _amp_lockstep(
        torch.float16, "unscale", skip_nonfinite=False
    )
    assert our_trace == their_trace
    _assert_close(ours, theirs, exact=False)


def test_both_flags_skip_once():
    # The scaler and the norm both find the inf: found_inf must stay 1 (a sum
    # of 2 would not skip and would step the step counter back).
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    clipper = StepClipper(opt, 1.0)
    scaler = torch.amp.GradScaler("cpu")
    before = [p.detach().clone() for p in model.parameters()]
    scaler.scale(model(torch.full((2, 4), math.inf)).sum()).backward()
    scaler.unscale_(opt)
    clipper.arm()
    scaler.step(opt)
    scaler.update()
    assert clipper.skipped.item() == 1.0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    assert all(s["step"].item() == 0 for s in opt.state.values())
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")


@pytest.mark.parametrize(
    "case, max_norm, magnitude",
    [
        # The scaled gradients' norm fits float32, the scale over the coefficient does not.
        ("grad_scale overflows", 0.05, 0.02),
        # The scaled gradients are finite, their float32 norm is not.
        ("norm overflows", 1.0, 0.2),
    ],
)
def test_a_grad_scaler_near_the_top_of_float32_without_unscale_steps_as_torch_does(
    monkeypatch, case, max_norm, magnitude
):
    """A GradScaler's scale near 2^127 and no ``unscale_``: step by step, the same
    scales, the same steps taken, close parameters as torch's recipe
    (``unscale_``, ``clip_grad_norm_``, ``scaler.step``); every folded
    ``grad_scale`` of a step taken finite. At step 3 a scaled gradient is inf: both skip."""
    seen = _spy_fused(monkeypatch)
    shapes = [(64, 32), (32,), (1000,)]
    g = torch.Generator().manual_seed(1)
    ours = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    opt = torch.optim.AdamW(ours, lr=1e-2, fused=True)
    ref = torch.optim.AdamW(theirs, lr=1e-2, fused=True)
    scaler, ref_scaler = (torch.amp.GradScaler("cpu", init_scale=2.0**126, growth_interval=1) for _ in "ab")
    clipper = StepClipper(opt, max_norm)
    for step in range(8):
        scale = scaler.get_scale()
        assert scale == ref_scaler.get_scale() and scale >= 2.0**125
        scaler.scale(torch.ones(()))  # the scalers' scale tensors, as a scaled loss makes them
        ref_scaler.scale(torch.ones(()))
        for p, q, s in zip(ours, theirs, shapes):
            p.grad = torch.randn(s, generator=g).clamp(-4, 4) * magnitude * scale  # finite
            if step == 3:
                p.grad[0] = math.inf
            q.grad = p.grad.clone()
        ref_scaler.unscale_(ref)
        torch.nn.utils.clip_grad_norm_(theirs, max_norm)
        ref_scaler.step(ref)
        ref_scaler.update()
        clipper.arm()
        scaler.step(opt)
        scaler.update()
        assert opt.state[ours[0]]["step"].item() == ref.state[theirs[0]]["step"].item() == step + (step < 3)
        assert clipper.skipped.item() == float(step == 3), step
        assert step == 3 or torch.isfinite(seen[-1][0]).all(), step
        _assert_close(ours, theirs, exact=False)


# ----------------------------------------------------------------------------
# torch.compile, and no host reads
# ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("what", ["step", "clip-and-step"])
def test_compiled_step_matches_eager(what):
    torch._dynamo.reset()

    def make():
        params = _params()
        opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
        return params, opt, StepClipper(opt, 0.5)

    eager, eager_opt, eager_clipper = make()
    ours, opt, clipper = make()
    if what == "step":
        step = torch.compile(opt.step)

        def train_step():
            clipper.arm()
            step()
    else:

        @torch.compile
        def train_step():
            clipper.arm()
            opt.step()

    g = torch.Generator().manual_seed(12)
    for i in range(5):
        _fill_grads(eager, g, i, {3: math.nan})
        for p, q in zip(ours, eager):
            p.grad = None if q.grad is None else q.grad.clone()
        eager_clipper.arm()
        eager_opt.step()
        train_step()
        assert torch.equal(clipper.skipped, eager_clipper.skipped)
    _assert_close(ours, eager, exact=True)
    _assert_close(_state_tensors(opt), _state_tensors(eager_opt), exact=True)


def test_no_value_is_read_on_the_host(monkeypatch):
    params = _params()
    opt = torch.optim.AdamW(params, fused=True)
    clipper = StepClipper(opt, 0.5)
    g = torch.Generator().manual_seed(13)
    for step in range(2):  # plans and optimizer state built
        _fill_grads(params, g, step, {})
        clipper.arm()
        opt.step()

    def read(*args, **kwargs):
        raise AssertionError("a tensor value was read on the host")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
            m.setattr(torch.Tensor, name, read)
        for step in range(2, 5):
            _fill_grads(params, g, step, {3: math.nan})
            clipper.arm()
            opt.step()
    assert clipper.skipped.item() == 0.0 and torch.isfinite(params[0]).all()


@pytest.mark.cuda
def test_cuda_no_host_sync():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10)).cuda()
    opts = [
        torch.optim.AdamW(model[0].parameters(), fused=True),
        torch.optim.SGD(model[1].parameters(), lr=0.1, momentum=0.9, fused=True),
    ]
    clipper = StepClipper(opts, 0.5)
    for _ in range(2):  # kernels compiled, state and momentum buffers made
        model(torch.randn(64, 256, device="cuda")).sum().backward()
        clipper.arm()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            clipper.arm()
            for opt in opts:
                opt.step()
                opt.zero_grad(set_to_none=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert clipper.skipped.item() == 0.0


def test_the_clipping_page_loop_runs(capsys, tmp_path, monkeypatch):
    page = Path(__file__).resolve().parents[1] / "docs" / "clipping.md"
    text = page.read_text()
    start = text.index("\n## A training loop\n")
    section = text[start : text.index("\n## ", start + 1)]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.S)[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(page), "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == ["step 0", "step 1", "step 2"]
    assert all(line.endswith("skipped=0") for line in printed)
    series = fastnorm.read_series(tmp_path / "run" / "metrics.jsonl")
    assert series.values == pytest.approx(
        [float(line.split("=")[1].split()[0]) for line in printed], rel=1e-3
    )
    assert series.skipped.pair() == ((0, 1, 2), (0.0, 0.0, 0.0))


# ----------------------------------------------------------------------------
# With the monitor: the pre-clip norm logged, the skipped steps counted
# ----------------------------------------------------------------------------


class _Collect(fastnorm.Logger):
    def __init__(self):
        self.windows = []

    def log_window(self, window):
        self.windows.append(window)


def _monitored_run(path, bad, *, skip_nonfinite=True, max_norm=0.8, steps=50):
    """A real 50-step training loop, fused AdamW + StepClipper + GradNormMonitor, with a NaN or inf
    put into one gradient at the steps of ``bad``. Per step: the norm fastnorm.total_norm gives
    before the clip, a float64 reference of it, the norm of the gradients after the step, and
    whether the step moved the parameters."""
    torch.manual_seed(20)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-2, fused=True)
    clipper = StepClipper(opt, max_norm, skip_nonfinite=skip_nonfinite)
    collect = _Collect()
    g = torch.Generator().manual_seed(21)
    seen = []
    with fastnorm.GradNormMonitor(10, [collect, fastnorm.JsonlLogger(path)], max_norm=max_norm) as monitor:
        for step in range(steps):
            x, y = torch.randn(64, 16, generator=g), torch.randn(64, 4, generator=g) * (1 + step % 3)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            if step in bad:
                params[2].grad[3, 5] = bad[step]
            before_clip = fastnorm.total_norm(params).item()
            reference = torch.linalg.vector_norm(
                torch.cat([p.grad.double().flatten() for p in params])
            ).item()
            before = [p.detach().clone() for p in params]
            norm = clipper.arm()
            opt.step()
            monitor.update(norm, loss=loss, skipped=clipper.skipped)
            after_step = fastnorm.total_norm(params).item()
            moved = not all(torch.equal(a, p) for a, p in zip(before, params))
            seen.append((before_clip, reference, after_step, moved))
            opt.zero_grad(set_to_none=True)
    return monitor, collect.windows, seen, params


def test_monitor_logs_the_pre_clip_norm_and_counts_the_skipped_steps(tmp_path):
    bad = {7: math.nan, 8: math.inf, 23: math.nan, 49: -math.inf}  # the last step too
    max_norm = 0.8
    monitor, windows, seen, params = _monitored_run(tmp_path / "metrics.jsonl", bad, max_norm=max_norm)
    before_clip, reference, after_step, moved = (list(c) for c in zip(*seen))
    assert all(torch.isfinite(p).all() for p in params)
    assert moved == [s not in bad for s in range(50)]  # skipped steps left the weights alone
    # What is logged is the norm before the clip, as total_norm computes it on its own, bit for bit.
    logged = [v for w in windows for v in w.values]
    assert logged == pytest.approx(before_clip, rel=0, abs=0, nan_ok=True)
    assert logged == pytest.approx(reference, rel=1e-6, nan_ok=True)
    clipped = [s for s in range(50) if s not in bad and before_clip[s] > max_norm]
    assert 10 < len(clipped) < 40  # clipping was active, and not at every step
    for s in clipped:  # after the step the gradients are the clipped ones: not what was logged
        assert after_step[s] == pytest.approx(max_norm, rel=1e-5) and logged[s] > max_norm
    # The window statistics: skipped steps counted, the clipped share taken over the applied steps.
    assert [s for w in windows for s, f in zip(w.steps, w.skipped) if f] == sorted(bad)
    for w in windows:
        in_window = [s for s in w.steps if s in bad]
        applied = [s for s in w.steps if s not in bad]
        assert w.stats["skipped_steps"] == w.stats["nonfinite_steps"] == len(in_window)
        share = sum(max_norm < before_clip[s] + 1e-6 for s in applied) / len(applied)
        assert w.stats["clipped_fraction"] == share
    # The diagnosis, online and from the file: skipped steps, not a collapse.
    assert monitor.diagnosis.verdict != "nonfinite" and monitor.diagnosis.skipped_steps == 4
    series = fastnorm.read_series(tmp_path / "metrics.jsonl")
    offline = diagnose_series(series)
    assert offline.verdict != "nonfinite" and offline.skipped_steps == 4
    assert series.skipped.pair() == (tuple(range(50)), tuple(float(s in bad) for s in range(50)))


def test_monitor_reports_a_nonfinite_step_applied_at_the_end_as_a_collapse(tmp_path):
    # skip_nonfinite=False: the NaN reaches the weights at the last step, while the loss logged
    # there is still finite (computed before the step).
    with pytest.warns(fastnorm.UnstableGradientWarning, match="non-finite values appeared"):
        monitor, windows, seen, params = _monitored_run(
            tmp_path / "metrics.jsonl", {49: math.nan}, skip_nonfinite=False
        )
    assert seen[-1][3] and all(torch.isnan(p).all() for p in params)
    assert windows[-1].stats["skipped_steps"] == 0 and windows[-1].stats["nonfinite_steps"] == 1
    assert monitor.diagnosis.verdict == "nonfinite"
    d = diagnose_series(fastnorm.read_series(tmp_path / "metrics.jsonl"))
    assert d.verdict == "nonfinite" and "the optimizer applied 1 of these steps" in d.events[-1].detail


def test_monitor_update_with_the_skip_flag_reads_nothing_on_the_host(monkeypatch):
    params = _params()
    opt = torch.optim.AdamW(params, fused=True)
    clipper = StepClipper(opt, 0.5)
    collect = _Collect()
    monitor = fastnorm.GradNormMonitor(5, [collect], max_norm=0.5)
    g = torch.Generator().manual_seed(15)
    for step in range(2):  # plans, optimizer state and the monitor's buffer made
        _fill_grads(params, g, step, {})
        monitor.update(clipper.arm(), skipped=clipper.skipped)
        opt.step()
    transfers = []

    def read(*args, **kwargs):
        raise AssertionError("a tensor value was read on the host")

    with monkeypatch.context() as m:
        for name in ("item", "__bool__", "__float__", "__int__", "__index__"):
            m.setattr(torch.Tensor, name, read)
        tolist = torch.Tensor.tolist
        m.setattr(torch.Tensor, "tolist", lambda t: transfers.append(t.numel()) or tolist(t))
        for step in range(2, 12):
            _fill_grads(params, g, step, {4: math.nan, 9: math.inf})
            norm = clipper.arm()
            opt.step()
            monitor.update(norm, skipped=clipper.skipped)
    assert len(transfers) == 2  # the two windows that filled, one transfer each
    monitor.close()
    assert [s for w in collect.windows for s, f in zip(w.steps, w.skipped) if f] == [4, 9]


@pytest.mark.cuda
def test_cuda_monitor_with_the_skip_flag_never_synchronizes():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    clipper = StepClipper(opt, 0.5)
    collect = _Collect()
    monitor = fastnorm.GradNormMonitor(4, [collect], max_norm=0.5)
    for _ in range(2):  # kernels compiled, state made, the monitor's buffers allocated
        model(torch.randn(64, 256, device="cuda")).sum().backward()
        norm = clipper.arm()
        opt.step()
        monitor.update(norm, skipped=clipper.skipped)
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(2, 11):
            model(torch.randn(64, 256, device="cuda")).sum().backward()
            if step in (5, 6):
                model[0].weight.grad[3, 7] = math.nan
            norm = clipper.arm()
            opt.step()
            monitor.update(norm, skipped=clipper.skipped)
            opt.zero_grad(set_to_none=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    monitor.close()
    assert [s for w in collect.windows for s, f in zip(w.steps, w.skipped) if f] == [5, 6]
    assert sum(w.stats["skipped_steps"] for w in collect.windows) == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_dropped_clipper_lets_its_optimizer_and_parameters_be_collected():
    import gc
    import weakref

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    clipper = StepClipper(optimizer, max_norm=1.0)
    model(torch.randn(4, 64)).square().mean().backward()
    clipper.arm()
    optimizer.step()
    gone = weakref.ref(optimizer), weakref.ref(model.weight)
    del model, optimizer, clipper
    gc.collect()
    assert [r() for r in gone] == [None, None]


def test_a_live_clipper_still_refuses_a_second_one_on_its_optimizer():
    optimizer = torch.optim.AdamW(torch.nn.Linear(4, 4).parameters(), fused=True)
    clipper = StepClipper(optimizer, max_norm=1.0)
    with pytest.raises(ValueError, match="already has a StepClipper"):
        StepClipper(optimizer, max_norm=1.0)
    clipper.remove()
    StepClipper(optimizer, max_norm=1.0).remove()
