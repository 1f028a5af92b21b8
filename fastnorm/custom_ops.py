"""fastnorm's operations as torch.library custom ops, for torch.compile.

A pointer table is not traceable, and an honest opaque op beats a graph break:
under ``torch.compile``, ``total_norm``, ``clip_`` and ``tensor_norms`` gather
the gradients with traceable Python (type checks, ``.grad``) and call one of
these ops, which inductor calls in place on the real gradients (no copy). Each
op's fake implementation gives the result's shape, dtype and device without
reading anything. Their eager implementations are fastnorm's eager stages
(``fastnorm/_eager.py``) on gradients checked already: they never come back
through the public functions.

Ops: ``fastnorm::total_norm``, ``fastnorm::clip_`` (mutates its gradients),
``fastnorm::scale_`` (clip with a given norm; mutates) and
``fastnorm::tensor_norms`` and ``fastnorm::tensor_stats``. Under compile, DTensors, ``group=``, sparse
gradients and ``error_if_nonfinite=True`` are not supported (each raises a
clear error); call those eagerly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fastnorm import _eager, _stats, distributed
from fastnorm._collect import Items, gradient_of


def _result(grads: list[Tensor]) -> Tensor:
    """An empty 0-dim tensor of the result's dtype and device."""
    wide = any(g.dtype in (torch.float64, torch.complex128) for g in grads)
    device = grads[0].device if grads else torch.device("cpu")
    return torch.empty((), dtype=torch.float64 if wide else torch.float32, device=device)


@torch.library.custom_op("fastnorm::total_norm", mutates_args=())
def total_norm_op(grads: list[Tensor], norm_type: float) -> Tensor:
    return _eager.total_norm(Items(grads, gradients=True), norm_type, None, False)[0]


@total_norm_op.register_fake
def _(grads: list[Tensor], norm_type: float) -> Tensor:
    return _result(grads)


@torch.library.custom_op("fastnorm::clip_", mutates_args=("grads",))
def clip_op(grads: list[Tensor], max_norm: float, norm_type: float) -> Tensor:
    return _eager.clip(Items(grads, gradients=True), max_norm, norm_type, None, False, None)[0]


@clip_op.register_fake
def _(grads: list[Tensor], max_norm: float, norm_type: float) -> Tensor:
    return _result(grads)


@torch.library.custom_op("fastnorm::scale_", mutates_args=("grads",))
def scale_op(grads: list[Tensor], norm: Tensor, max_norm: float) -> None:
    _eager.clip(Items(grads, gradients=True), max_norm, 2.0, None, False, norm)


@scale_op.register_fake
def _(grads: list[Tensor], norm: Tensor, max_norm: float) -> None:
    return None


@torch.library.custom_op("fastnorm::tensor_norms", mutates_args=())
def tensor_norms_op(grads: list[Tensor], norm_type: float) -> tuple[Tensor, Tensor]:
    total, per_item, _ = _eager.tensor_norms(Items(grads, gradients=True), norm_type, None)
    return total, per_item


@tensor_norms_op.register_fake
def _(grads: list[Tensor], norm_type: float) -> tuple[Tensor, Tensor]:
    total = _result(grads)
    return total, total.new_empty((len(grads),))


def limit_codes(limits: list[torch.dtype | None]) -> list[int]:
    """Limit dtypes as the op's schema takes them: an index into ``_stats.LIMIT_DTYPES``, -1 for None."""
    return [-1 if limit is None else _stats.LIMIT_DTYPES.index(limit) for limit in limits]


@torch.library.custom_op("fastnorm::tensor_stats", mutates_args=())
def tensor_stats_op(grads: list[Tensor], norm_type: float, limits: list[int]) -> tuple[Tensor, Tensor]:
    dtypes = [None if code < 0 else _stats.LIMIT_DTYPES[code] for code in limits]
    total, stats, _ = _eager.tensor_stats(Items(grads, gradients=True), norm_type, None, dtypes)
    return total, stats


@tensor_stats_op.register_fake
def _(grads: list[Tensor], norm_type: float, limits: list[int]) -> tuple[Tensor, Tensor]:
    total = _result(grads)
    return total, total.new_empty((len(grads), len(_stats.COLUMNS)), dtype=torch.float64)


def traced_gradients(items: list[Any], fn: str, *, keep_missing: bool = False) -> list[Tensor]:
    """The gradients of ``items`` with traceable Python only (for torch.compile).

    The item rule as in eager calls (``clip_`` passes its parameters only, or
    its ``gradients=True`` list, see ``fastnorm._collect.Items``). Drops missing
    gradients (or, with ``keep_missing``, stands a 0-element tensor in for them,
    so that per-item results keep their positions) and repeats of the same
    tensor.
    """
    as_gradients = isinstance(items, Items) and items.gradients
    grads: list[Tensor] = []
    for position, item in enumerate(items):
        grad = gradient_of(item, position, fn, as_gradients)
        if grad is None:
            if keep_missing:
                grads.append(torch.empty(0, device=item.device))
            continue
        if distributed.is_dtensor(grad) or grad.layout != torch.strided or grad.is_complex():
            raise NotImplementedError(
                f"{fn} under torch.compile takes dense real gradients; item {position} is "
                f"{type(grad).__name__} with layout {grad.layout} and dtype {grad.dtype}. "
                "Call it outside the compiled region."
            )
        if keep_missing or not any(grad is seen for seen in grads):
            grads.append(grad)
    return grads


def check_compilable(fn: str, group: Any, error_if_nonfinite: bool = False) -> None:
    """Raises for the arguments that only eager calls support."""
    for unsupported, what in ((group is not None, "group="), (error_if_nonfinite, "error_if_nonfinite=True")):
        if unsupported:
            raise NotImplementedError(f"{fn}: {what} is not supported under torch.compile; call it eagerly")
