"""What the fused backends (cpp, triton) share: the calls they pass on, and why.

Both read every tensor as one flat run of memory and compute the p-norms with
p > 0 and inf; ``auto`` hands everything else to the torch backend, and a
forced fused backend refuses it with these reasons (``fastnorm.backends.choose``).
"""

from __future__ import annotations

from fastnorm._partial import Mode

NOT_FUSED = (
    "it computes norm types 2, 1, inf and p > 0 (norm_type={p}: the number of non-zero tensors, a "
    "negative p or -inf, runs on torch's ops)"
)
NOT_DENSE = (
    "it reads tensors whose elements lie consecutively in memory, in any order; a view with gaps "
    "or an expanded tensor runs on torch's ops"
)


def fused_reasons(mode: Mode | None, dense: bool) -> list[str]:
    """What a fused backend (one pass over consecutive memory) cannot serve of a call."""
    reasons = []
    if mode is not None and not mode.fused:
        reasons.append(NOT_FUSED.format(p={Mode.ZERO: "0", Mode.NINF: "-inf"}.get(mode, "p < 0")))
    if not dense:
        reasons.append(NOT_DENSE)
    return reasons
