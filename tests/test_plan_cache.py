"""The plan cache: the facts it checks, read in the extension or in Python, catch
every change to a gradient that a plan depends on; many lists stay cached."""

from __future__ import annotations

import pytest
import torch

import fastnorm
import reference
from fastnorm import _plan
from fastnorm.backends import cpp


@pytest.fixture(params=["extension", "python"])
def snapshot(request, monkeypatch):
    """Each way of reading the facts, on the cpp backend, with an empty cache."""
    if request.param == "extension" and cpp._C is None:
        pytest.skip("the C++ kernels are not built")
    if request.param == "python":
        monkeypatch.setattr(_plan, "_snapshot", _plan._PySnapshot)
    monkeypatch.setenv("FASTNORM_BACKEND", "cpp" if cpp._C is not None else "torch")
    fastnorm.clear_cache()
    yield request.param
    fastnorm.clear_cache()


@pytest.fixture
def builds(monkeypatch):
    """How many plans were built (cache misses of cacheable lists)."""
    count = [0]
    build = _plan.build

    def counting(*args, **kwargs):
        count[0] += 1
        return build(*args, **kwargs)

    monkeypatch.setattr(_plan, "build", counting)
    return count


def _params(n=4, size=64):
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(size)) for _ in range(n)]
    for p in params:
        p.grad = torch.randn(size, generator=g)
    return params


def _check(items):
    grads = [getattr(t, "grad", None) if isinstance(t, torch.nn.Parameter) else t for t in items]
    want = reference.norm([g.to_dense() for g in grads if g is not None], 2.0)
    assert fastnorm.total_norm(items).item() == pytest.approx(want, rel=1e-6)


def _attacks():
    """In-place changes that keep the gradient object, each breaking a cached plan."""

    def resize(g):
        g.resize_(g.numel() // 2)  # same address, fewer elements

    def set_storage(g):
        g.set_(torch.randn(g.numel() * 3)[::3].clone())

    def gaps(g):
        g.as_strided_((g.numel() // 2,), (2,))  # same address, same storage, now with gaps

    def new_dtype(g):
        # Same address, same bytes, same layout: only the dtype tells.
        g.data = g.data.view(torch.bfloat16)
        g.copy_(torch.randn(g.numel(), generator=torch.Generator().manual_seed(1)).to(torch.bfloat16))

    def fewer_bytes_of_a_new_dtype(g):
        g.data = g.data.view(torch.int32).view(torch.float32)[: g.numel() // 2].view(torch.bfloat16)

    def transposed(g):
        g.data = g.data.reshape(8, -1).t()  # dense, no longer contiguous

    return [resize, set_storage, gaps, new_dtype, fewer_bytes_of_a_new_dtype, transposed]


@pytest.mark.parametrize("attack", _attacks(), ids=lambda f: f.__name__)
def test_a_gradient_changed_in_place_rebuilds_the_plan(snapshot, builds, attack):
    params = _params()
    _check(params)
    _check(params)
    assert builds[0] == 1
    attack(params[2].grad)
    _check(params)
    assert builds[0] == 2


def test_replaced_missing_and_new_gradients_rebuild(snapshot, builds):
    params = _params()
    _check(params)
    params[1].grad = torch.randn(64) * 5  # a new tensor
    _check(params)
    params[1].grad = None
    _check(params)
    params[1].grad = torch.randn(64)
    _check(params)
    assert builds[0] == 4


def test_plain_tensors_that_start_requiring_grad_rebuild(snapshot, builds):
    grads = [torch.randn(64) for _ in range(3)]
    _check(grads)
    grads[0].requires_grad_(True)  # now a parameter without a .grad: contributes nothing
    assert fastnorm.total_norm(grads).item() == pytest.approx(reference.norm(grads[1:], 2.0), rel=1e-6)
    assert builds[0] == 2


def test_the_same_ends_with_other_items_in_between_rebuild(snapshot, builds):
    params = _params(5)
    _check(params)
    swapped = [params[0], params[2], params[1], params[3], params[4]]
    _check(swapped)
    assert builds[0] == 2


def test_channels_last_gradients_keep_their_strides(snapshot, builds):
    param = torch.nn.Parameter(torch.zeros(2, 3, 4, 5))
    param.grad = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    _check([param])
    _check([param])
    assert builds[0] == 1
    param.grad.data = param.grad.data.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2).transpose(2, 3)
    _check([param])
    assert builds[0] == 2


def test_a_gradient_that_cannot_be_read_is_a_miss_not_an_error(snapshot, builds):
    params = _params()
    _check(params)
    params[0].grad = torch.randn(64).to_sparse()
    _check(params)  # sparse: read through torch, not cached
    assert builds[0] == 2


def test_64_lists_alternating_every_step_stay_cached(snapshot, builds):
    """Per-group (or per-expert) clipping: every list keeps its plan."""
    groups = [_params(3, 16) for _ in range(64)]
    for _ in range(3):
        for group in groups:
            fastnorm.clip_(group, 1e9)
    assert builds[0] == 64


def test_clipping_through_a_cached_plan_scales_the_current_gradients(snapshot):
    params = _params()
    fastnorm.clip_(params, 1e9)
    for p in params:
        p.grad = torch.randn(64) * 10  # new tensors, maybe at the old addresses
    norm = reference.norm([p.grad for p in params], 2.0)
    before = [p.grad.clone() for p in params]
    got = fastnorm.clip_(params, 1.0)
    assert got.item() == pytest.approx(norm, rel=1e-6)
    for p, b in zip(params, before):
        torch.testing.assert_close(p.grad, b * (1.0 / (norm + 1e-6)), rtol=1e-5, atol=0)


def test_gradients_read_by_the_caller_are_the_ones_checked(snapshot):
    params = _params()
    fastnorm.total_norm(params)
    key = ("cpp" if cpp._C is not None else "torch", id(None), 4, id(params[0]), id(params[-1]))
    grads = [p.grad for p in params]
    assert _plan._CACHE.lookup(key, params, grads) is not None
    moved = list(grads)
    moved[2] = torch.randn(64)  # what the caller read differs from the plan
    assert _plan._CACHE.lookup(key, params, moved) is None
    missing = list(grads)
    missing[1] = None
    assert _plan._CACHE.lookup(key, params, missing) is None


def test_plain_tensors_that_get_a_grad_rebuild(snapshot, builds):
    grads = [torch.randn(64) for _ in range(3)]
    _check(grads)
    grads[1].grad = torch.randn(64)  # now a parameter: its .grad counts, not itself
    assert fastnorm.total_norm(grads).item() == pytest.approx(
        reference.norm([grads[0], grads[1].grad, grads[2]], 2.0), rel=1e-6
    )
    assert builds[0] == 2


@pytest.fixture
def swap_on_conversion():
    """nn.Module.to swaps parameters in place (torch.utils.swap_tensors), as it
    always does for DTensor parameters."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    yield
    torch.__future__.set_swap_module_params_on_conversion(before)


def test_a_cached_plan_lets_module_to_swap_the_parameters(snapshot, builds, swap_on_conversion):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 2))
    model(torch.randn(3, 6)).square().sum().backward()
    fastnorm.clip_(model.parameters(), 1e9)
    fastnorm.clip_(model.parameters(), 1e9)  # from the cached plan
    weight = model[0].weight
    model.to(torch.float64)  # swaps each parameter and each .grad in place
    assert model[0].weight is weight and weight.dtype == weight.grad.dtype == torch.float64
    _check(list(model.parameters()))
    assert builds[0] == 2


def test_the_cache_keeps_no_item_or_gradient_alive(snapshot):
    import gc
    import weakref

    params = _params()
    fastnorm.clip_(params, 1e9)
    fastnorm.clip_(params, 1e9)
    alive = [weakref.ref(params[0]), weakref.ref(params[0].grad)]
    del params
    gc.collect()
    assert [ref() for ref in alive] == [None, None]


def test_an_item_of_another_type_at_the_same_address_rebuilds(snapshot, builds):
    class Tagged(torch.nn.Parameter):
        pass

    params = _params()
    _check(params)
    params[1].__class__ = Tagged  # the same object (so the same id), another type
    _check(params)
    assert builds[0] == 2
