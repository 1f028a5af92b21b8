"""A cached or new plan's kernel never reads memory freed by Python code that runs during the call.

A ``TorchFunctionMode`` runs Python code on every tensor attribute read, the
reads of a plan's check and of a new plan's preparation included; so does a
gradient that is a tensor subclass with a ``__torch_function__``. Code that
calls ``set_()`` or ``resize_()`` on a gradient checked already frees the
memory the plan's addresses point to. Each case runs in a child process, so
that a read of freed memory (4 MiB, given back to the system) fails the test
instead of killing pytest.
"""

import json

import pytest

from fastnorm.backends import cpp
from helpers import cpp_env, run_python

_MOVED = """
import itertools, json, sys
import torch
from torch.overrides import TorchFunctionMode
import fastnorm

numel, count = int(sys.argv[1]), 8
torch.set_num_threads(2)
WATCH = {"params": None, "watched": None, "calls": 0, "how": None}


def move_the_first(func, args):
    # When the middle gradient's address is read, the first one, checked already, gets new memory and
    # its old memory is freed: set_() to an empty storage, or resize_() to a larger one.
    WATCH["calls"] += 1
    if func is torch.Tensor.data_ptr and args and args[0] is WATCH["watched"]:
        first = WATCH["params"][0].grad
        with torch._C.DisableTorchFunction():
            first.set_() if WATCH["how"] == "set_" else first.resize_(2 * numel)
            first.fill_(1.0)


class Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        move_the_first(func, args)
        return func(*args, **(kwargs or {}))


class Grad(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        move_the_first(func, args)
        return super().__torch_function__(func, types, args, kwargs or {})


results = {}
for fn, how, via, cached in itertools.product(
    ("total_norm", "clip_"), ("set_", "resize_"), ("mode", "subclass"), (True, False)  # cached: its check
):
    fastnorm.clear_cache()
    params = [torch.nn.Parameter(torch.zeros(numel)) for _ in range(count)]
    for p in params:
        p.grad = torch.ones(numel) if via == "mode" else torch.ones(numel).as_subclass(Grad)
    call = {"total_norm": lambda: fastnorm.total_norm(params), "clip_": lambda: fastnorm.clip_(params, 1e30)}[fn]
    if cached:
        call()
        call()
    WATCH.update(params=params, watched=params[count // 2].grad, calls=0, how=how)
    if via == "mode":
        with Mode():
            got = call()
            torch.Tensor.data_ptr(got)  # the mode is live around the call
    else:
        got = call()
    with torch._C.DisableTorchFunction():
        now = sum(p.grad.double().square().sum() for p in params).sqrt().item()  # as they are now
        results[f"{fn} {how} {via} {'cached' if cached else 'new'}"] = [got.item(), now, WATCH["calls"] > 0]
print(json.dumps(results))
"""


@pytest.mark.skipif(cpp._C is None, reason="the C++ kernels are not built")
@pytest.mark.parametrize("pool", ["openmp", "own"])
@pytest.mark.slow
def test_a_gradient_moved_during_the_call_is_never_read_freed(pool):
    """Python code moves a gradient while the call reads the others: the call does not crash, and its
    norm is that of the gradients as they are after it (the moved one's new memory read, never its
    old): a cached plan whose gradients moved during its check is rebuilt, and a new plan's addresses
    are read after the last Python code has run."""
    result = run_python(["-c", _MOVED, str(1 << 20)], **cpp_env(pool))
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    for case, (got, now, ran) in json.loads(result.stdout).items():
        assert got == pytest.approx(now, rel=1e-6) and ran, case
