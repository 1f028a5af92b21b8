"""PyTorch's own clip tests, ported, run on torch and on fastnorm side by side.

A port of ``test_clip_grad_norm``, ``test_clip_grad_norm_error_if_nonfinite``
and ``test_clip_grad_norm_multi_device`` from PyTorch's ``test/test_nn.py``.
Every test takes ``impl``: torch's own functions, fastnorm's on each
backend, or torch's names inside ``fastnorm.patch()``. fastnorm passes them
all except where docs/rules.md lists a deliberate difference; each of those has
its own test at the end of this file, which also shows that torch differs there.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import fastnorm
import reference
from helpers import refused, serves, use_backend

inf, nan = math.inf, math.nan


@dataclass(frozen=True)
class Impl:
    name: str
    clip_grad_norm_: Callable[..., torch.Tensor]
    get_total_norm: Callable[..., torch.Tensor]
    clip_grads_with_norm_: Callable[..., Any]
    backend: str = "auto"

    def serves(self, norm_type: float) -> bool:
        """Whether the norm type is computed here: a forced fused backend refuses
        0, negative p and -inf (auto hands those to torch's ops, as users get)."""
        return self.name == "torch" or serves(self.backend, float(norm_type))


def _fastnorm_clip_with_norm(parameters, max_norm, total_norm, foreach=None):
    fastnorm.clip_(parameters, max_norm, foreach=foreach, total_norm=total_norm)


TORCH = Impl(
    "torch",
    torch.nn.utils.clip_grad_norm_,
    torch.nn.utils.get_total_norm,
    torch.nn.utils.clip_grads_with_norm_,
)
FASTNORM = Impl("fastnorm", fastnorm.clip_, fastnorm.total_norm, _fastnorm_clip_with_norm)


# fastnorm as users get it (auto: the C++ kernels, torch's ops for what they do not
# compute), the Triton kernels forced (in the interpreter), the torch backend forced,
# and torch's own names inside fastnorm.patch() (auto).
@pytest.fixture(params=["torch", "fastnorm-auto", "fastnorm-triton", "fastnorm-torch", "patched"])
def impl(request, monkeypatch) -> Impl:
    if request.param == "torch":
        return TORCH
    if request.param == "patched":
        request.addfinalizer(fastnorm.patch().undo)
        utils = torch.nn.utils
        return Impl("patched", utils.clip_grad_norm_, utils.get_total_norm, utils.clip_grads_with_norm_)
    backend = use_backend(request.param.split("-")[1], monkeypatch)
    return replace(FASTNORM, backend=backend)


def assert_equal(actual, expected):
    """``TestCase.assertEqual`` for tensors and numbers: the tolerance of the tensors' dtype."""
    dtype = next(x.dtype for x in (actual, expected) if isinstance(x, torch.Tensor))
    actual, expected = (torch.as_tensor(x).to(dtype).cpu() for x in (actual, expected))
    torch.testing.assert_close(actual, expected)


# ----------------------------------------------------------------------------
# test_clip_grad_norm
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("norm_type", [0.5, 1.5, 2, 4, "inf"])
def test_clip_grad_norm(impl, norm_type, foreach):
    layer = torch.nn.Linear(10, 10)
    max_norm = 2

    def compute_norm(norm_type):
        norm_type = float(norm_type)
        if norm_type != inf:
            total = 0
            for p in layer.parameters():
                total += p.grad.data.abs().pow(norm_type).sum()
            return pow(total, 1.0 / norm_type)
        return max(p.grad.data.abs().max() for p in layer.parameters())

    def compare_scaling(grads):
        p_scale = [p.grad.data.div(g).view(-1) for p, g in zip(layer.parameters(), grads)]
        scale = torch.cat(p_scale)
        assert_equal(scale.std(), 0)
        return scale[0]

    def set_large_grads():
        grads = torch.arange(1.0, 101).view(10, 10), torch.ones(10).div(1000)
        for p, g in zip(layer.parameters(), grads):
            p._grad = g.clone().view_as(p)
        return grads

    def check_clipped(norm, norm_before, norm_after, grads):
        assert_equal(norm, norm_before)
        assert_equal(norm_after, max_norm)
        assert norm_after <= norm_before
        compare_scaling(grads)

    grads = set_large_grads()
    norm_before = compute_norm(norm_type)
    norm = impl.clip_grad_norm_(layer.parameters(), max_norm, norm_type=norm_type, foreach=foreach)
    check_clipped(norm, norm_before, compute_norm(norm_type), grads)

    # The decomposed functions
    set_large_grads()
    norm_before = compute_norm(norm_type)
    grads = [p.grad for p in layer.parameters()]
    total_norm = impl.get_total_norm(grads, norm_type=norm_type, foreach=foreach)
    impl.clip_grads_with_norm_(layer.parameters(), max_norm, total_norm, foreach=foreach)
    check_clipped(total_norm, norm_before, compute_norm(norm_type), grads)

    # Small gradients are left unchanged
    grads = torch.rand(10, 10).div(10000), torch.ones(10).div(500)
    for p, g in zip(layer.parameters(), grads):
        p.grad.data.copy_(g)
    norm_before = compute_norm(norm_type)
    norm = impl.clip_grad_norm_(layer.parameters(), max_norm, norm_type=norm_type, foreach=foreach)
    norm_after = compute_norm(norm_type)
    assert_equal(norm, norm_before)
    assert_equal(norm_before, norm_after)
    assert norm_after <= max_norm
    scale = compare_scaling(grads)
    assert_equal(scale, 1)

    # A single Tensor (here a plain one, with a .grad) is accepted
    p1, p2 = torch.randn(10, 10), torch.randn(10, 10)
    g = torch.arange(1.0, 101).view(10, 10)
    p1._grad = g.clone()
    p2._grad = g.clone()
    impl.clip_grad_norm_(p1, max_norm, norm_type=norm_type, foreach=foreach)
    impl.clip_grad_norm_([p2], max_norm, norm_type=norm_type, foreach=foreach)
    assert_equal(p1.grad, p2.grad)
    assert not torch.equal(p1.grad, g)

    # An exhausted generator warns
    params = layer.parameters()
    for _ in params:
        pass
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        impl.clip_grad_norm_(params, max_norm, norm_type=norm_type, foreach=foreach)
    assert len(w) == 1
    assert str(w[0].message) == "`parameters` is an empty generator, no gradient clipping will occur."


def test_clip_grads_with_norm_of_an_empty_generator_is_silent(impl):
    # clip_grad_norm_ warns of an empty generator (above); clip_grads_with_norm_, given the norm, does not.
    params = (p for p in [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert impl.clip_grads_with_norm_(params, 1.0, torch.tensor(2.0)) is None


# ----------------------------------------------------------------------------
# test_clip_grad_norm_error_if_nonfinite
# ----------------------------------------------------------------------------

NORMS_POS = [0.1, 1, 2, 3.5, inf]
NORMS_NEG = [-0.1, -1, -2, -3.5]
NORMS_EXCEPT_0 = NORMS_POS + NORMS_NEG
NORMS_ALL = NORMS_EXCEPT_0 + [0]

# (grad_only_one_elem, prefix_finite_grad_param, scalars, torch's non-finite norm
# types, torch's finite norm types), as in PyTorch's table.
CASES = [
    # an infinite gradient
    (False, False, [inf, -inf], NORMS_EXCEPT_0, [0]),
    (False, True, [inf, -inf], NORMS_POS, NORMS_NEG + [0]),
    (True, False, [inf, -inf], NORMS_POS, NORMS_NEG + [0]),
    (True, True, [inf, -inf], NORMS_POS, NORMS_NEG + [0]),
    # a NaN gradient
    (False, False, [nan], NORMS_EXCEPT_0, [0]),
    (False, True, [nan], NORMS_EXCEPT_0, [0]),
    (True, False, [nan], NORMS_EXCEPT_0, [0]),
    (True, True, [nan], NORMS_EXCEPT_0, [0]),
    # a gradient that never errors
    (False, False, [2e22, -2e22], [], NORMS_ALL),
    (False, True, [2e22, -2e22], [], NORMS_ALL),
    (True, False, [2e22, -2e22], [], NORMS_ALL),
    (True, True, [2e22, -2e22], [], NORMS_ALL),
    # a gradient whose powers overflow (or vanish) in torch for some norm types
    (False, False, [2e200, -2e200], [3.5, 2, -2, -3.5], [inf, 1, 0.1, 0, -1, -0.1]),
    (False, True, [2e200, -2e200], [3.5, 2], NORMS_NEG + [inf, 1, 0.1, 0]),
    (True, False, [2e200, -2e200], [3.5, 2], NORMS_NEG + [inf, 1, 0.1, 0]),
    (True, True, [2e200, -2e200], [3.5, 2], NORMS_NEG + [inf, 1, 0.1, 0]),
]


def _nonfinite_parameters(scalar, grad_only_one_elem, prefix_finite_grad_param):
    param = torch.ones(10, dtype=torch.float64, requires_grad=True)
    if grad_only_one_elem:
        param[1].mul(scalar).sum().backward()
    else:
        param.mul(scalar).sum().backward()
    if not prefix_finite_grad_param:
        return [param]
    prefix_param = torch.ones(1, dtype=torch.float64, requires_grad=True)
    prefix_param.mul(1).sum().backward()
    return [prefix_param, param]


def finite_where_torch_overflows(case: tuple, norm_type: float) -> bool:
    """The deliberate difference: torch's norm is inf though the true norm is finite
    (fastnorm's powers do not overflow), so fastnorm neither errors nor returns inf."""
    grad_only_one_elem, prefix, scalars, _, _ = case
    grads = [p.grad for p in _nonfinite_parameters(scalars[0], grad_only_one_elem, prefix)]
    return math.isfinite(reference.total_norm(grads, float(norm_type)))


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_clip_grad_norm_error_if_nonfinite(impl, case):
    grad_only_one_elem, prefix_finite_grad_param, scalars, norms_nonfinite, norms_finite = case

    def run_test_case(norm_type, error_if_nonfinite, scalar, is_norm_nonfinite):
        msg = (
            f"norm_type: {norm_type}, error_if_nonfinite: {error_if_nonfinite}, scalar: {scalar}, "
            f"grad_only_one_elem: {grad_only_one_elem}, prefix_finite_grad_param: "
            f"{prefix_finite_grad_param}, is_norm_nonfinite: {is_norm_nonfinite}"
        )
        parameters = _nonfinite_parameters(scalar, grad_only_one_elem, prefix_finite_grad_param)
        # Only raises when the total norm is non-finite and error_if_nonfinite=True
        if is_norm_nonfinite and error_if_nonfinite:
            error_msg = f"The total norm of order {float(norm_type)} for gradients"
            grads_before = [p.grad.clone() for p in parameters]
            with pytest.raises(RuntimeError, match=error_msg):
                impl.clip_grad_norm_(parameters, 1, norm_type=norm_type, error_if_nonfinite=True)
            # No gradient changes when it raises
            for before, p in zip(grads_before, parameters):
                torch.testing.assert_close(p.grad, before, equal_nan=True, msg=msg)
        else:
            norm = impl.clip_grad_norm_(
                parameters, 1, norm_type=norm_type, error_if_nonfinite=error_if_nonfinite
            )
            if not is_norm_nonfinite:
                assert math.isfinite(norm.item()), msg

    for error_if_nonfinite in [False, True]:
        for norm_type, scalar in product(norms_nonfinite, scalars):
            if impl.serves(norm_type):
                nonfinite = not (impl is not TORCH and finite_where_torch_overflows(case, norm_type))
                run_test_case(norm_type, error_if_nonfinite, scalar, nonfinite)
        for norm_type, scalar in product(norms_finite, scalars):
            if impl.serves(norm_type):
                run_test_case(norm_type, error_if_nonfinite, scalar, False)


# ----------------------------------------------------------------------------
# test_clip_grad_norm_multi_device (needs two devices: CUDA and the CPU, or two GPUs)
# ----------------------------------------------------------------------------


def _device_pairs() -> list[tuple[str, str]]:
    pairs = []
    if torch.cuda.is_available():
        pairs.append(("cuda:0", "cpu"))
        if torch.cuda.device_count() >= 2:
            pairs.append(("cuda:0", "cuda:1"))
    return pairs or [pytest.param(None, marks=pytest.mark.skip(reason="needs two devices"))]


@pytest.mark.parametrize("devices", _device_pairs())
@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("impl", [TORCH, FASTNORM], ids=["torch", "fastnorm"])
def test_clip_grad_norm_multi_device(impl, devices, foreach):
    class TestModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer1 = torch.nn.Linear(10, 10)
            self.layer2 = torch.nn.Linear(10, 10)

    test_model = TestModel()
    test_model.layer1.to(devices[0])
    test_model.layer2.to(devices[1])
    ref_model = TestModel().to(devices[0])
    for norm_type in [2.0, math.inf]:
        for p in test_model.parameters():
            p.grad = torch.ones_like(p)
        for p in ref_model.parameters():
            p.grad = torch.ones_like(p)
        norm = impl.clip_grad_norm_(test_model.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
        expected = impl.clip_grad_norm_(ref_model.parameters(), 0.5, norm_type=norm_type, foreach=foreach)
        assert_equal(norm, expected)
        assert norm.device == torch.device(devices[0])
        for p, pe in zip(test_model.parameters(), ref_model.parameters()):
            assert_equal(p.grad.to(devices[0]), pe.grad)


# ----------------------------------------------------------------------------
# The deliberate differences (docs/rules.md), one test each
# ----------------------------------------------------------------------------


@pytest.fixture(params=["auto", "triton", "torch"])
def fastnorm_backend(request, monkeypatch):
    return use_backend(request.param, monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_difference_16bit_gradients_give_a_float32_norm(fastnorm_backend, dtype):
    grads = [torch.full((3,), 60000.0, dtype=dtype), torch.full((5,), 2.0, dtype=dtype)]
    theirs = torch.nn.utils.get_total_norm(grads)
    ours = fastnorm.total_norm(grads)
    assert theirs.dtype == dtype and ours.dtype == torch.float32
    assert reference.rel_err(ours.item(), reference.norm(grads, 2.0)) <= 1e-6
    if dtype == torch.float16:
        assert theirs.item() == inf  # past 65504


@pytest.mark.parametrize(
    "grads, p",
    [
        ([torch.full((10,), 2e200, dtype=torch.float64)], 2.0),
        ([torch.full((10,), 2e200, dtype=torch.float64)], 3.5),
        ([torch.full((10,), 2e200, dtype=torch.float64)], -2.0),
        ([torch.full((10,), 1e20)], 2.0),
        ([torch.full((10,), 1e20)], 100.0),
        ([torch.full((10,), 1e-310, dtype=torch.float64)], 2.0),
    ],
    ids=["f64-2e200-p2", "f64-2e200-p3.5", "f64-2e200-p-2", "f32-1e20-p2", "f32-1e20-p100", "f64-1e-310-p2"],
)
def test_difference_a_finite_norm_where_torchs_overflows(fastnorm_backend, grads, p):
    if not serves(fastnorm_backend, p):
        with refused(fastnorm_backend):
            fastnorm.total_norm(grads, p)
        return
    theirs = torch.nn.utils.get_total_norm(grads, p).item()
    ours = fastnorm.total_norm(grads, p).item()
    assert theirs in (inf, 0.0)  # an overflow, or a sum of squares that vanished
    expected = reference.total_norm(grads, p)
    tolerance = 1e-12 if grads[0].dtype == torch.float64 else 1e-6
    assert math.isfinite(ours) and reference.rel_err(ours, expected) <= tolerance


@pytest.mark.parametrize("max_norm", [-1.0, nan])
def test_difference_a_negative_or_nan_max_norm_raises(fastnorm_backend, max_norm):
    def params():
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.tensor([3.0, -4.0, 0.0, 12.0])
        return [p]

    theirs = params()
    torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    flipped = theirs[0].grad  # torch flips (negative) or poisons (NaN) every gradient
    assert bool(flipped.isnan().all()) or bool((flipped * params()[0].grad <= 0).all())
    ours = params()
    with pytest.raises(ValueError, match="max_norm"):
        fastnorm.clip_(ours, max_norm)
    assert torch.equal(ours[0].grad, params()[0].grad)


def test_difference_a_repeated_tensor_counts_once(fastnorm_backend):
    def params():
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.tensor([3.0, -4.0, 0.0, 12.0])  # norm 13
        return [p, p]

    theirs = params()
    assert torch.nn.utils.clip_grad_norm_(theirs, 1.0).item() == pytest.approx(13 * 2**0.5)
    ours = params()
    assert fastnorm.clip_(ours, 1.0).item() == pytest.approx(13.0)
    assert fastnorm.total_norm(ours[0].grad).item() == pytest.approx(1.0, rel=1e-5)  # scaled once
    # torch scales the same gradient twice: 13 / (13 * sqrt(2))^2
    assert torch.nn.utils.get_total_norm([theirs[0].grad]).item() == pytest.approx(1 / 26, rel=1e-4)


def test_difference_items_without_a_gradient_warn(fastnorm_backend):
    def params():
        return list(torch.nn.Linear(3, 2).parameters())  # before any backward()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.nn.utils.clip_grad_norm_(params(), 1.0).item() == 0.0
    with pytest.warns(fastnorm.NoGradientWarning, match="before loss.backward"):
        assert fastnorm.clip_(params(), 1.0).item() == 0.0


@pytest.mark.parametrize("max_norm", ["1.0", True, torch.tensor(1.0)], ids=["str", "bool", "tensor"])
def test_difference_a_max_norm_that_is_not_a_number_raises(fastnorm_backend, max_norm):
    def params():
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.tensor([3.0, -4.0, 0.0, 12.0])
        return [p]

    theirs = params()
    torch.nn.utils.clip_grad_norm_(theirs, max_norm)  # converted with float()
    assert theirs[0].grad.norm().item() == pytest.approx(1.0, rel=1e-5)
    ours = params()
    with pytest.raises(TypeError, match="max_norm must be a number"):
        fastnorm.clip_(ours, max_norm)
    assert torch.equal(ours[0].grad, params()[0].grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_difference_a_16bit_total_norm_is_widened(fastnorm_backend, dtype):
    def params():
        p = torch.nn.Parameter(torch.zeros(3))
        p.grad = torch.tensor([0.1234, -7.77, 3.3])
        return [p]

    norm = torch.linalg.vector_norm(params()[0].grad).to(dtype)
    theirs, widened, ours = params(), params(), params()
    torch.nn.utils.clip_grads_with_norm_(theirs, 0.5, norm)  # the coefficient in 16 bits
    torch.nn.utils.clip_grads_with_norm_(widened, 0.5, norm.float())
    fastnorm.clip_(ours, 0.5, total_norm=norm)
    assert torch.equal(ours[0].grad, widened[0].grad)
    assert not torch.equal(ours[0].grad, theirs[0].grad)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool])
def test_difference_an_integer_or_bool_gradient_is_a_type_error(fastnorm_backend, dtype):
    def params():
        p = torch.zeros(3, dtype=dtype)  # only a manual assignment gives a tensor an integer .grad
        p.grad = torch.ones(3, dtype=dtype)
        return [p, torch.nn.Parameter(torch.zeros(2))]

    with pytest.raises(RuntimeError, match="Expected a floating point or complex tensor"):
        torch.nn.utils.clip_grad_norm_(params(), 1.0)
    with pytest.raises(RuntimeError, match="Expected a floating point or complex tensor"):
        torch.nn.utils.get_total_norm([torch.ones(3, dtype=dtype)])
    ours = params()
    ours[1].grad = torch.full((2,), 5.0)
    with pytest.raises(TypeError, match=f"item 0 has dtype {dtype}; gradients must be float16"):
        fastnorm.clip_(ours, 1.0)
    with pytest.raises(TypeError, match=f"item 0 has dtype {dtype}"):
        fastnorm.total_norm([torch.ones(3, dtype=dtype)])
    assert torch.equal(ours[1].grad, torch.full((2,), 5.0))  # nothing written


def test_difference_gradients_on_the_meta_device_raise(fastnorm_backend):
    def params():
        p = torch.nn.Parameter(torch.zeros(4, device="meta"))
        p.grad = torch.ones(4, device="meta")
        return [p]

    theirs = torch.nn.utils.clip_grad_norm_(params(), 1.0)  # a norm without a value
    assert theirs.device.type == "meta" and theirs.shape == ()
    assert torch.nn.utils.get_total_norm([torch.ones(4, device="meta")]).device.type == "meta"
    with pytest.raises(ValueError, match="on the meta device, which holds no values"):
        fastnorm.clip_(params(), 1.0)
    with pytest.raises(ValueError, match="on the meta device"):
        fastnorm.total_norm([torch.ones(4, device="meta")])


@pytest.mark.parametrize("p", [inf, -inf, -1.0])
def test_difference_an_empty_gradient_contributes_nothing_at_inf_and_negative_p(fastnorm_backend, p):
    grads = [torch.empty(0), torch.tensor([3.0, -4.0])]
    with pytest.raises(RuntimeError, match="on an empty tensor because the operation does not have an identity"):
        torch.nn.utils.get_total_norm(grads, p)
    if not serves(fastnorm_backend, p):
        with refused(fastnorm_backend):
            fastnorm.total_norm(grads, p)
        return
    assert fastnorm.total_norm(grads, p).item() == pytest.approx(reference.total_norm(grads[1:], p))
    assert fastnorm.total_norm(grads[:1], p).item() == 0.0  # nothing to reduce


def test_difference_total_norm_of_parameters_is_their_gradients_norm(fastnorm_backend):
    model = torch.nn.Linear(3, 2)
    model(torch.randn(4, 3)).square().sum().backward()
    weights = reference.total_norm([p.detach() for p in model.parameters()], 2.0)
    grads = reference.total_norm([p.grad for p in model.parameters()], 2.0)
    # torch's get_total_norm is given the tensors to reduce: parameters are their own values
    assert torch.nn.utils.get_total_norm(model.parameters()).item() == pytest.approx(weights, rel=1e-6)
    assert fastnorm.total_norm(model.parameters()).item() == pytest.approx(grads, rel=1e-6)
    assert fastnorm.total_norm(model.parameters(), gradients=True).item() == pytest.approx(weights, rel=1e-6)
    with fastnorm.patch():  # torch's name keeps torch's meaning
        assert torch.nn.utils.get_total_norm(model.parameters()).item() == pytest.approx(weights, rel=1e-6)


def test_the_rules_page_lists_each_deliberate_difference_tested_here():
    rules = (Path(__file__).resolve().parents[1] / "docs" / "rules.md").read_text()
    section = rules[rules.index("\n## Deliberate differences from torch\n") :]
    end = section.find("\n## ", 1)
    listed = re.findall(r"^\d+\. \*\*(.+?)\*\*", section[: end if end != -1 else None], flags=re.M)
    tested = [name for name in globals() if name.startswith("test_difference_")]
    assert len(listed) == len(tested) == 11, (listed, tested)
