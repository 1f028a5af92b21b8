"""Backends compute the local partial of a norm and the conditional scale.

A backend sees the gradients of one device, already validated and
deduplicated by the front (``fastnorm/norm.py`` and ``fastnorm/_collect.py``),
and implements three steps:

* ``prepare(tensors)``: what it needs to read them (a pointer table, a task
  split), its *prepared* state; the front caches it (``fastnorm/_plan.py``)
  while the gradients' addresses do not change, if the backend is ``cacheable``;
* ``reduce(prepared, mode, p, result_dtype, per_tensor)``: the partial, the
  local root and, on request, each tensor's partial from the same pass;
* ``scale_(prepared, norm, max_norm)``: ``x *= min(1, max_norm / (norm + 1e-6))``
  in place, decided on the device, touching no memory when it is 1;
* ``reduce_stats(prepared, mode, p, result_dtype, limits)``: ``reduce`` plus
  each tensor's statistics (``fastnorm._stats``) from the same pass.

A backend may also read a cached plan's tensors while the cache checks them
(``CheckedReduce``), so that the check of many small gradients and the read
of their memory overlap.

Selection: each backend says what it cannot serve (``not_supported_reasons``:
a device, a norm type, a tensor with gaps); ``FASTNORM_BACKEND=auto`` takes the
first that can (triton on CUDA, cpp on the CPU, torch everywhere, never
Triton's interpreter: it is for tests); ``triton``, ``cpp`` or ``torch``
forces one, read at every call, and a forced backend that cannot serve the
call raises with every reason: it never hands the work to another backend.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from fastnorm._partial import Mode

ENV_VAR = "FASTNORM_BACKEND"
CHOICES = ("auto", "triton", "cpp", "torch")


class Backend(Protocol):
    """What every backend provides (see the module docstring)."""

    name: str
    # Whether a prepared state holds no reference to its tensors and stays valid
    # while they keep their addresses, sizes, dtypes and layouts (then it is cached).
    cacheable: bool

    def not_supported_reasons(
        self, device: torch.device, mode: Mode | None = None, dense: bool = True
    ) -> list[str]:
        """Why this backend cannot serve tensors on ``device`` (and, when given, the
        reduction ``mode``, tensors that are not ``dense``); empty when it can."""
        ...

    def prepare(self, tensors: list[torch.Tensor]) -> Any:
        """The prepared state for ``tensors`` (one device, float16/bfloat16/float32/float64)."""
        ...

    def reduce(
        self,
        prepared: Any,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        per_tensor: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Returns ``(partial, root, per_tensor)`` on the tensors' device, without a host sync.

        ``partial`` is a float64 tensor ``[m, s]`` (float32 where the device has no
        float64), in the forms ``fastnorm._partial`` defines: L1 ``s = sum |x|``;
        LINF ``m = max |x|``; LP the norm^p is ``m^p * s``; L2 the norm^2 is
        ``scale^2 * s`` with ``scale = m`` when ``m > 0``, else 1 (``m = 0``, a plain
        sum of squares, wherever that sum is exact enough; a power of two near the
        largest |x| where float64 squares would overflow or underflow). NaN
        anywhere makes the partial NaN. ``root`` is the norm of
        these tensors alone, a 0-dim tensor of ``result_dtype``. With
        ``per_tensor``, ``per_tensor`` holds each tensor's own partial (shape
        ``(n, 2)``, in the order given to ``prepare``), from the same pass; else None.
        """
        ...

    def reduce_stats(
        self,
        prepared: Any,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
        limits: list[torch.dtype | None],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(partial, root, stats)``: ``partial`` and ``root`` as ``reduce`` gives them,
        bit for bit, and ``stats`` a float64 tensor ``(n, 6)`` (float32 where the
        device has no float64) of each tensor's statistics, the columns of
        ``fastnorm._stats.COLUMNS``, judged against ``limits[i]`` (one dtype per
        tensor, in the order given to ``prepare``; None: the tensor's own). No host sync."""
        ...

    def scale_(self, prepared: Any, norm: torch.Tensor, max_norm: float) -> None:
        """Scales the tensors by ``min(1, max_norm / (norm + 1e-6))`` (torch's formula).
        ``norm``: a 0-dim float32 or float64 tensor on the tensors' device."""
        ...


@runtime_checkable
class CheckedReduce(Protocol):
    """Optional: ``reduce`` run while the plan cache checks the items of a cached plan.

    The cache (``fastnorm/_plan.py``) checks the items in order on the calling
    thread; such a backend already reads every tensor whose items are
    confirmed, and never one that is not, so the check and the read overlap.
    """

    def gate(self, prepared: Any, first_item: list[int]) -> bool:
        """Records, for each tensor of ``prepared``, the first item that gives it, so
        that it is read once the items up to that one are confirmed. False where
        this prepared state cannot be read while checking."""
        ...

    def reduce_checked(
        self,
        prepared: Any,
        snapshot: Any,
        items: list[Any],
        written: list[torch.Tensor] | None,
        mode: Mode,
        p: float,
        result_dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, None] | None:
        """``reduce`` of a gated ``prepared`` while ``snapshot`` (the extension's
        ``Snapshot``) checks ``items``; with ``written`` (a list), also fills it
        with the tensors ``clip_`` writes. None where the items no longer match:
        then nothing was read at an address that failed the check."""
        ...


@dataclass(frozen=True)
class Choice:
    """The backend that serves one device, and why."""

    backend: Backend
    forced: bool
    skipped: dict[str, list[str]]  # faster backends passed over, with their reasons


class BackendUnavailableError(RuntimeError):
    """FASTNORM_BACKEND asked for a backend that cannot serve the tensors."""


def _registry() -> dict[str, Backend]:
    from fastnorm.backends import cpp, torch_backend, triton_backend

    return {
        "triton": triton_backend.BACKEND,
        "cpp": cpp.BACKEND,
        "torch": torch_backend.BACKEND,
    }


_BACKENDS: dict[str, Backend] | None = None


def backends() -> dict[str, Backend]:
    """Every backend by name, fastest first."""
    global _BACKENDS
    if _BACKENDS is None:
        _BACKENDS = _registry()
    return _BACKENDS


def requested() -> str:
    """The value of FASTNORM_BACKEND (``auto`` when unset), validated."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_VAR}={value!r} is not one of {', '.join(CHOICES)}")
    return value


def expected_fast(device: torch.device) -> str | None:
    """The fused backend a user would expect on ``device``, if any."""
    if device.type == "cpu":
        return "cpp"
    if device.type == "cuda":
        return "triton"
    return None


def _auto_order(device: torch.device) -> tuple[str, ...]:
    fast = expected_fast(device)
    return (fast, "torch") if fast else ("torch",)


def choose(device: torch.device, request: str, mode: Mode | None = None, dense: bool = True) -> Choice:
    """The backend for tensors on ``device`` under ``request`` (a CHOICES value),
    for the reduction ``mode`` (None: any) of tensors that are ``dense`` or not."""
    table = backends()
    if request != "auto":
        backend = table[request]
        reasons = backend.not_supported_reasons(device, mode, dense)
        if reasons:
            raise BackendUnavailableError(
                f"{ENV_VAR}={request} cannot serve these {device.type} tensors: " + "; ".join(reasons)
            )
        return Choice(backend, True, {})
    skipped: dict[str, list[str]] = {}
    for name in _auto_order(device):
        backend = table[name]
        reasons = backend.not_supported_reasons(device, mode, dense)
        if not reasons:
            return Choice(backend, False, skipped)
        skipped[name] = reasons
    raise AssertionError("the torch backend serves every device")  # pragma: no cover


_WARNED: set[tuple[str, str]] = set()


def warn_if_slow(device: torch.device, choice: Choice) -> None:
    """Warns once per device type when the fused backend expected there is missing
    (not when it only passes on a norm type or a layout it does not compute)."""
    fast = expected_fast(device)
    if choice.forced or fast is None or choice.backend.name == fast:
        return
    key = (device.type, choice.backend.name)
    missing = backends()[fast].not_supported_reasons(device)
    if key in _WARNED or not missing:
        return
    _WARNED.add(key)
    warnings.warn(
        f"fastnorm: the {fast} backend cannot serve {device.type} tensors ({'; '.join(missing)}); "
        f"using the {choice.backend.name} backend, which is correct but slower. "
        f"`python -m fastnorm info` shows every backend and why.",
        RuntimeWarning,
        stacklevel=5,
    )


def report(devices: list[torch.device] | None = None) -> list[dict[str, Any]]:
    """For each device: the backend that runs there and why each other one does not.

    What ``python -m fastnorm info`` prints. Defaults to the CPU and, when present,
    the current CUDA device.
    """
    if devices is None:
        devices = [torch.device("cpu")]
        if torch.cuda.is_available():
            devices.append(torch.device("cuda", torch.cuda.current_device()))
    request = requested()
    rows = []
    for device in devices:
        try:
            selected = choose(device, request).backend.name
        except BackendUnavailableError as exc:
            selected = f"none ({exc})"
        rows.append(
            {
                "device": str(device),
                "requested": request,
                "selected": selected,
                "backends": {
                    name: backend.not_supported_reasons(device) for name, backend in backends().items()
                },
            }
        )
    return rows
