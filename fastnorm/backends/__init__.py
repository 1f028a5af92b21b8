"""Backends compute the local partial of a norm and the conditional scale.

A backend sees the dense gradients of one device, already validated and
deduplicated by the front (``fastnorm/norm.py``), and implements three steps:

* ``prepare(tensors)``: what it needs to read them (a pointer table, a task
  split); the front caches it while the gradients' addresses do not change;
* ``reduce(prepared, mode, p, result_dtype, per_tensor)``: the partial, the
  local root and, on request, each tensor's partial from the same pass;
* ``scale_(prepared, norm, max_norm)``: ``x *= min(1, max_norm / (norm + 1e-6))``
  in place, decided on the device, touching no memory when it is 1.

Selection: ``FASTNORM_BACKEND=auto|triton|cpp|torch`` (read at every call)
forces one; ``auto`` takes triton on CUDA, cpp on the CPU, and torch where
those cannot run (never Triton's interpreter: it is for tests). A forced
backend that cannot run raises with every reason.
"""

from __future__ import annotations

import enum
import os
import warnings
from dataclasses import dataclass
from typing import Any, Protocol

import torch

ENV_VAR = "FASTNORM_BACKEND"
CHOICES = ("auto", "triton", "cpp", "torch")


class Mode(enum.IntEnum):
    """Which reduction a norm type needs.

    L2, L1, LINF and LP (any other p > 0) are fused: their values are shared
    with csrc/fastnorm.h and the Triton kernels. ZERO (p = 0), NEG (p < 0) and
    NINF (p = -inf) are served by the torch backend only: the front never hands
    them to a fused backend.
    """

    L2 = 0
    L1 = 1
    LINF = 2
    LP = 3
    ZERO = 4
    NEG = 5
    NINF = 6

    @staticmethod
    def of(p: float) -> Mode:
        if p == 2.0:
            return Mode.L2
        if p == 1.0:
            return Mode.L1
        if p == float("inf"):
            return Mode.LINF
        if p == 0.0:
            return Mode.ZERO
        if p == float("-inf"):
            return Mode.NINF
        if p < 0.0:
            return Mode.NEG
        return Mode.LP

    @property
    def fused(self) -> bool:
        """Whether the fused backends compute this reduction."""
        return self <= Mode.LP


class Backend(Protocol):
    """What every backend provides (see the module docstring)."""

    name: str

    def not_supported_reasons(self, device: torch.device) -> list[str]:
        """Why this backend cannot serve tensors on ``device``; empty when it can."""
        ...

    def prepare(self, tensors: list[torch.Tensor]) -> Any:
        """Tables for ``tensors`` (dense, one device, float16/bfloat16/float32/float64)."""
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

    def scale_(self, prepared: Any, norm: torch.Tensor, max_norm: float) -> None:
        """Scales the tensors by ``min(1, max_norm / (norm + 1e-6))`` (torch's formula)."""
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


def choose(device: torch.device, request: str) -> Choice:
    """The backend for tensors on ``device`` under ``request`` (a CHOICES value)."""
    table = backends()
    if request != "auto":
        backend = table[request]
        reasons = backend.not_supported_reasons(device)
        if reasons:
            raise BackendUnavailableError(
                f"{ENV_VAR}={request} cannot serve {device.type} tensors: " + "; ".join(reasons)
            )
        return Choice(backend, True, {})
    skipped: dict[str, list[str]] = {}
    for name in _auto_order(device):
        backend = table[name]
        reasons = backend.not_supported_reasons(device)
        if not reasons:
            return Choice(backend, False, skipped)
        skipped[name] = reasons
    raise AssertionError("the torch backend serves every device")  # pragma: no cover


_WARNED: set[tuple[str, str]] = set()


def warn_if_slow(device: torch.device, choice: Choice) -> None:
    """Warns once per device type when the expected fused backend is missing."""
    fast = expected_fast(device)
    if choice.forced or fast is None or choice.backend.name == fast:
        return
    key = (device.type, choice.backend.name)
    if key in _WARNED:
        return
    _WARNED.add(key)
    reasons = "; ".join(choice.skipped.get(fast, ["unavailable"]))
    warnings.warn(
        f"fastnorm: the {fast} backend cannot serve {device.type} tensors ({reasons}); "
        f"using the {choice.backend.name} backend, which is correct but slower. "
        f"`python -m fastnorm info` shows every backend and why.",
        RuntimeWarning,
        stacklevel=4,
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
