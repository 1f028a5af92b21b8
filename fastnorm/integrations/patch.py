"""``fastnorm.patch()``: torch's clip functions, and the names frameworks bound to them, served by fastnorm.

Trainers call torch's functions in one of two ways. Most look them up at call
time (``torch.nn.utils.clip_grad_norm_(...)``: HF Trainer through accelerate,
Lightning, Fabric, timm, torchtitan): replacing the attribute in
``torch.nn.utils`` and ``torch.nn.utils.clip_grad`` reaches them. Others bound
a function at import (``from torch.nn.utils import clip_grad_norm_``, or a
framework's own helper such as LightlyTrain's ``total_gradient_norm``, imported
by name into a dozen modules): no attribute of torch reaches those, so every
module in ``sys.modules`` that holds the exact function object gets fastnorm's
equivalent in its place. Undoing puts the original object back wherever a
replacement sits, including in modules imported while the patch was on.

Each replacement keeps its original's signature and meaning; the deliberate
differences are fastnorm's own (docs/trainers.md): float32 results for 16-bit
gradients, accumulated in float64; a plain tensor (the global norm) where
torch returns a DTensor; a negative or NaN ``max_norm`` refused.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import inspect
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fastnorm import distributed
from fastnorm._collect import TensorOrTensors
from fastnorm.norm import clip_, tensor_norms, total_norm

__all__ = ["patch", "Patch", "targets"]

# -- the replacements ------------------------------------------------------------------------------


@torch.no_grad()
def clip_grad_norm_(
    parameters: TensorOrTensors,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """:func:`torch.nn.utils.clip_grad_norm_`, computed by :func:`fastnorm.clip_`."""
    parameters, measured = _measured(parameters, norm_type, error_if_nonfinite, gradients=False)
    norm = clip_(parameters, max_norm, norm_type, error_if_nonfinite, foreach, total_norm=measured)
    _to_monitor(norm)
    return norm


@torch.no_grad()
def get_total_norm(
    tensors: TensorOrTensors,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """:func:`torch.nn.utils.get_total_norm`: the norm of the tensors given, as given
    (a parameter's values, not its ``.grad``), computed by :func:`fastnorm.total_norm`.

    Not handed to the monitor: a framework may call it for one group of
    gradients (one device mesh) and combine the groups itself. A monitor that
    measures the step itself is asked first (see :func:`_measured`).
    """
    tensors, measured = _measured(tensors, norm_type, error_if_nonfinite, gradients=True)
    if measured is not None:
        return measured
    return total_norm(tensors, norm_type, error_if_nonfinite, foreach, gradients=True)


@torch.no_grad()
def clip_grads_with_norm_(
    parameters: TensorOrTensors,
    max_norm: float,
    total_norm: Tensor,
    foreach: bool | None = None,
) -> None:
    """:func:`torch.nn.utils.clip_grads_with_norm_`, computed by :func:`fastnorm.clip_`.

    ``total_norm`` may be a DTensor (accelerate passes one per device mesh): its
    full value is used, as torch uses it.
    """
    if isinstance(total_norm, Tensor) and distributed.is_dtensor(total_norm):
        total_norm = total_norm.full_tensor()
    clip_(parameters, max_norm, foreach=foreach, total_norm=total_norm)
    _to_monitor(total_norm, once_per_step=True)


_DEPRECATED = (
    "`torch.nn.utils.clip_grad_norm` is now deprecated in favor of `torch.nn.utils.clip_grad_norm_`."
)


def clip_grad_norm(
    parameters: TensorOrTensors,
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> Tensor:
    """The deprecated :func:`torch.nn.utils.clip_grad_norm`: warns as torch does, then clips."""
    warnings.warn(_DEPRECATED, FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def grad_norm(module: torch.nn.Module, norm_type: float | int | str, group_separator: str = "/") -> dict:
    """Lightning's ``grad_norm``: each parameter's gradient norm and their total, from one fused pass.

    Lightning's reads every parameter's norm back to the host to build the
    total; this computes all of them with :func:`fastnorm.tensor_norms`. The
    values are float32 device scalars (float64 for float64 gradients), the
    keys Lightning's.
    """
    norm_type = float(norm_type)
    if norm_type <= 0:
        raise ValueError(f"`norm_type` must be a positive number or 'inf' (infinity norm). Got {norm_type}")
    named = [(name, p) for name, p in module.named_parameters() if p.grad is not None]
    if not named:
        return {}
    total, each = tensor_norms([p for _, p in named], norm_type)
    norms = {f"grad_{norm_type}_norm{group_separator}{name}": n for (name, _), n in zip(named, each.unbind())}
    norms[f"grad_{norm_type}_norm_total"] = total
    return norms


@torch.no_grad()
def total_gradient_norm(parameters: Iterable[Tensor]) -> Tensor:
    """LightlyTrain's ``total_gradient_norm``: the L2 norm of the parameters' gradients, in one
    fused pass instead of one reduction per parameter. ``tensor(0.)`` when none has a gradient.

    LightlyTrain computes it at every step when it does not clip: it is the
    step's norm, handed to the monitor.
    """
    present = [p for p in parameters if p.grad is not None]
    if not present:
        return torch.tensor(0.0)
    norm = total_norm(present)
    _to_monitor(norm)
    return norm


# -- where each replacement goes ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """A function fastnorm replaces: where it is defined, how users know it, and the package it needs."""

    module: str
    name: str
    public: str
    replacement: Callable[..., Any]

    @property
    def package(self) -> str:
        return self.module.partition(".")[0]


def _own_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The same function as another object: each replacement must stand for one original only,
    so that undoing knows what to put back (the two Lightning packages each have a grad_norm)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__doc__, copy.__qualname__, copy.__annotations__ = fn.__doc__, fn.__qualname__, fn.__annotations__
    return copy


_CLIP = "torch.nn.utils.clip_grad"
_TARGETS = (
    _Target(_CLIP, "clip_grad_norm_", "torch.nn.utils.clip_grad_norm_", clip_grad_norm_),
    _Target(_CLIP, "_get_total_norm", "torch.nn.utils.get_total_norm", get_total_norm),
    _Target(_CLIP, "_clip_grads_with_norm_", "torch.nn.utils.clip_grads_with_norm_", clip_grads_with_norm_),
    _Target(_CLIP, "clip_grad_norm", "torch.nn.utils.clip_grad_norm", clip_grad_norm),
    _Target(
        "lightning.pytorch.utilities.grads", "grad_norm", "lightning.pytorch.utilities.grad_norm", grad_norm
    ),
    _Target(
        "pytorch_lightning.utilities.grads",
        "grad_norm",
        "pytorch_lightning.utilities.grad_norm",
        _own_copy(grad_norm),
    ),
    _Target(
        "lightly_train._torch_helpers",
        "total_gradient_norm",
        "lightly_train._torch_helpers.total_gradient_norm",
        total_gradient_norm,
    ),
)
_REPLACEMENTS = {id(t.replacement) for t in _TARGETS}


class _State:
    """What is patched now: the live handles (newest last) and each target's original.

    Read and changed only under ``lock``: two threads patching and undoing at once would otherwise
    interleave a restore with an apply, and leave torch patched with no live handle.
    """

    handles: list[Patch] = []
    originals: dict[_Target, Any] = {}
    lock = threading.RLock()


def _scan(swap: dict[int, tuple[Any, Any]]) -> dict[str, Any]:
    """Puts ``swap[id(v)] = (v, new)``'s ``new`` in place of every module global ``v``; returns
    ``module.name`` of every global that then holds a replacement, sorted, with what it holds.

    One pass over every global of every loaded module (a few thousand modules
    with a framework loaded: a fraction of a second), this module's own excepted.
    """
    ids = _REPLACEMENTS | swap.keys()
    found = {}
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType) or name == __name__:
            continue
        namespace = vars(module)
        for key in [k for k, v in list(namespace.items()) if id(v) in ids]:
            value = namespace[key]
            old, new = swap.get(id(value), (None, None))
            if old is value:
                namespace[key] = value = new  # not setattr: a module class may intercept it
            if _is_replacement(value):
                found[f"{name}.{key}"] = value
    return dict(sorted(found.items()))


def _apply() -> dict[str, Any]:
    """Every module global that is one of the originals becomes its replacement (see ``_scan``)."""
    return _scan({id(original): (original, t.replacement) for t, original in _State.originals.items()})


def _restore() -> None:
    """Every module global that holds a replacement gets back its original."""
    _scan({id(t.replacement): (t.replacement, original) for t, original in _State.originals.items()})
    _State.originals = {}


def _is_replacement(value: Any) -> bool:
    return id(value) in _REPLACEMENTS and any(value is t.replacement for t in _TARGETS)


def _resolve() -> dict[_Target, str]:
    """Finds each target's original where its package is loaded; returns why the others are not.

    A framework's defining module is imported when the framework is loaded
    (cheap then), so that its modules imported later bind the replacement.
    """
    missing = {}
    for t in _TARGETS:
        if t in _State.originals:
            continue
        if t.package not in sys.modules:
            installed = importlib.util.find_spec(t.package) is not None
            missing[t] = "not imported (import it before patch())" if installed else "not installed"
            continue
        try:
            module = importlib.import_module(t.module)
        except ImportError as exc:
            missing[t] = f"its module does not import ({exc})"
            continue
        original = vars(module).get(t.name)
        if not callable(original):
            missing[t] = f"{t.module} has no {t.name} in this version"
            continue
        if _is_replacement(original):  # never taken for the original: undoing would put it back
            missing[t] = f"{t.module}.{t.name} holds fastnorm's replacement already, not torch's original"
            continue
        _State.originals[t] = original
    return missing


# -- the monitor -------------------------------------------------------------------------------------


def _check_monitor(monitor: Any) -> Any:
    if monitor is not None and not callable(getattr(monitor, "update", None)):
        raise TypeError(
            "patch: monitor must be a GradNormMonitor (or any object with update(norm)), "
            f"got {monitor!r} ({type(monitor).__name__})"
        )
    return monitor


def _shares_memory(a: Tensor, b: Tensor) -> bool:
    if a is b:
        return True
    if a.device != b.device or a.device.type == "meta" or type(a) is not Tensor or type(b) is not Tensor:
        return False
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.storage_offset() == b.storage_offset()
    )


def _handle() -> Patch | None:
    """The newest live patch that has a monitor."""
    return next((h for h in reversed(_State.handles) if h.monitor is not None), None)


def _measured(tensors: Any, norm_type: Any, error_if_nonfinite: bool, gradients: bool) -> tuple[Any, Any]:
    """Asks a monitor that measures the step itself for the norm of ``tensors``, before any is computed.

    A monitor with ``measure(tensors, norm_type, gradients)`` (the HF callback's:
    it knows the model, so it recognises the model's own gradients, and gives
    their norm with the per-layer norms and statistics of the same pass) returns
    the norm, which the replacement then uses as is, or None to leave the call
    to fastnorm as usual. ``gradients``: the tensors are the gradients
    (``get_total_norm``), not the parameters (``clip_grad_norm_``). Not asked
    where the call reads the norm on the host (``error_if_nonfinite``).

    Returns:
        (tensors, norm): the tensors (an iterator made a list when the monitor
        was asked; an empty generator stays one, for torch's warning) and the
        measured norm or None.
    """
    handle = _handle()
    measure = getattr(handle.monitor, "measure", None) if handle is not None else None
    if not callable(measure) or error_if_nonfinite or isinstance(tensors, Tensor):
        return tensors, None
    listed = list(tensors)
    if not listed:
        return ((t for t in listed) if isinstance(tensors, types.GeneratorType) else listed), None
    return listed, measure(listed, norm_type, gradients)


def _to_monitor(norm: Tensor, once_per_step: bool = False) -> None:
    """Hands a step's pre-clip norm to the newest live patch's monitor: a device copy, no sync.

    With ``once_per_step`` (``clip_grads_with_norm_``), a norm that is the one
    handed last (the same tensor, or a view of it: accelerate wraps one norm in
    a DTensor per device mesh and clips each mesh with it) is the same step's
    and is not handed again. The handle keeps that last norm alive, so no later
    norm can be allocated at its address.
    """
    handle = _handle()
    if handle is None:
        return
    if once_per_step and handle._last is not None and _shares_memory(norm, handle._last):
        return
    handle._last = norm
    if not handle._numbered:
        handle.monitor.update(norm)
        return
    handle._steps += 1
    handle.monitor.update(norm, handle._steps)


def _takes_step(monitor: Any) -> bool:
    """Whether ``monitor.update`` takes a step after the norm, as GradNormMonitor's does."""
    try:
        params = list(inspect.signature(monitor.update).parameters.values())
    except (TypeError, ValueError):
        return False
    return any(p.name == "step" for p in params) or any(p.kind is p.VAR_POSITIONAL for p in params)


# -- the public API ----------------------------------------------------------------------------------


class Patch:
    """What :func:`patch` did; undo it with :meth:`undo` (or leave a ``with`` block).

    Attributes:
        reached (tuple of str): every ``module.name`` that held a fastnorm
            function when :func:`patch` returned: torch's own names, and each
            module that had bound one of the replaced functions at import.
        not_reached (dict): for each function :func:`patch` knows but could
            not replace, why (its framework not installed, or not imported yet).
        monitor (GradNormMonitor, optional): where each step's norm goes.
    """

    def __init__(self, monitor: Any, reached: tuple[str, ...], not_reached: dict[str, str]) -> None:
        self.monitor = monitor
        self.reached = reached
        self.not_reached = not_reached
        self._last: Tensor | None = None
        self._numbered = monitor is not None and _takes_step(monitor)
        self._steps = 0  # steps handed to the monitor, numbered from 1

    @property
    def active(self) -> bool:
        """True until :meth:`undo`."""
        return any(h is self for h in _State.handles)

    def undo(self) -> None:
        """Ends this patch. When no other patch is live, every replaced name gets back
        the object it held before (modules imported meanwhile included). Twice is harmless."""
        with _State.lock:
            if not self.active:
                return
            _State.handles = [h for h in _State.handles if h is not self]
            self._last = None
            if not _State.handles:
                _restore()

    remove = undo  # torch's name for undoing a hook

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.undo()

    def __repr__(self) -> str:
        state = "active" if self.active else "undone"
        return f"<fastnorm.Patch {state}, reached {len(self.reached)} names, monitor={self.monitor!r}>"


def patch(monitor: Any = None) -> Patch:
    r"""Makes torch's clip functions, and the frameworks' names bound to them, run fastnorm.

    Replaces, each with torch's signature and meaning,
    ``torch.nn.utils.clip_grad_norm_`` (with :func:`fastnorm.clip_`),
    ``get_total_norm`` (with :func:`fastnorm.total_norm` reading the tensors
    as given), ``clip_grads_with_norm_`` (a DTensor norm included) and the
    deprecated ``clip_grad_norm``, in ``torch.nn.utils`` and
    ``torch.nn.utils.clip_grad``; and, where their framework is imported,
    Lightning's ``grad_norm`` and LightlyTrain's ``total_gradient_norm`` (with
    one-pass equivalents). Every module that bound one of these functions at
    import gets the replacement too. Call it after importing the framework.

    Patching again while a patch is live is harmless (nothing is wrapped
    twice); the names are restored when the last live patch is undone.

    Args:
        monitor (GradNormMonitor, optional): receives every step's norm before
            clipping, as a device scalar (no sync): the norm of each
            ``clip_grad_norm_`` call, the norm given to ``clip_grads_with_norm_``
            (once per step, however many groups it clips), LightlyTrain's
            per-step ``total_gradient_norm``. ``get_total_norm`` and
            ``grad_norm`` hand nothing: a framework calls them for parts of
            the model. With patches nested, the newest one's monitor. Its
            steps are numbered from 1 (the n-th norm handed is step n): the
            number of optimizer steps taken once the step is applied, the step
            at which HF's Trainer and torchtitan log that step's loss and
            learning rate, so that the norm's log lines up with theirs.

    Returns:
        Patch: a handle that says what it reached; ``undo()`` (or ``remove()``,
        or leaving a ``with`` block) restores what was there.

    Example::

        >>> monitor = fastnorm.GradNormMonitor(50, [fastnorm.JsonlLogger("run/norms.jsonl")])
        >>> with fastnorm.patch(monitor=monitor), monitor:
        ...     trainer.train()  # its clip runs fastnorm; every step's norm is logged
    """
    monitor = _check_monitor(monitor)
    with _State.lock:
        missing = _resolve()
        handle = Patch(monitor, tuple(_apply()), {t.public: why for t, why in missing.items()})
        _State.handles.append(handle)
    return handle


def targets() -> list[dict[str, Any]]:
    """What :func:`patch` replaces, and where it stands in this process (``fastnorm info``).

    Returns:
        list of dict: for each function, ``name`` (how users know it),
        ``package`` and its ``version`` (None when not installed), ``patched``
        (whether a fastnorm function stands in its place now) and ``reached``
        (with a live patch, every ``module.name`` that holds its replacement).
    """
    with _State.lock:
        live = _scan({}) if _State.handles else {}
    rows = []
    for t in _TARGETS:
        try:
            version = importlib.metadata.version(t.package.replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            version = None
        rows.append(
            {
                "name": t.public,
                "package": t.package,
                "version": version,
                "patched": t in _State.originals,
                "reached": [name for name, value in live.items() if value is t.replacement],
            }
        )
    return rows
