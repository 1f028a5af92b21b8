"""What the printed advice says: every action the diagnosis can give, and the ones built from evidence.

The texts follow the model-instability guide fastnorm serves. An action that depends on
the run (its clipping threshold, the steps of earlier spikes) is built here from the
evidence the signal modules hand over, never from a guess.
"""

from __future__ import annotations

LOWER_LR = "Lower the learning rate (by 3-10x), or lengthen its warmup."
PRECISION = "Use a more stable precision: bf16-mixed instead of fp16 (16-mixed), or full fp32 (32-true)."
RAISE_LR = "Raise the learning rate, especially for small models (about 10M parameters or fewer)."
NORMALISATION = (
    "Check the input normalisation (inputs scaled to about zero mean and unit variance), the "
    "normalisation layers (LayerNorm/BatchNorm between deep layers) and the initialisation "
    "(Kaiming or Xavier, matched to the activation)."
)
CHECKPOINT = (
    "Re-run from the latest checkpoint; if it reproduces, switch to fp32 (32-true) to isolate "
    "reduced-precision arithmetic."
)
SKIP_NONFINITE = (
    "Skip the steps whose norm is not finite instead of applying them: fastnorm.StepClipper(optimizer, "
    "max_norm) does it inside torch's fused optimizer step, without a host sync."
)
CHECK_DATA_NAN = (
    "Check the data for NaN/inf (inputs and labels) and the loss scaler (with fp16, use a dynamic "
    "one such as torch.amp.GradScaler)."
)
INVALID_ACTION = "Check what is logged as the gradient norm: a norm is a number >= 0."
LOG_LOSS = (
    "Log the loss beside the norm (GradNormMonitor.update(norm, loss=loss)): a norm that rises by orders "
    "of magnitude while the loss falls steadily is a model leaving a small initialisation, not an explosion."
)


def clipping(max_norm: float | None, peak: str, base: str) -> str:
    if max_norm is None:
        return (
            "Enable gradient clipping: no max_norm was set for this run "
            "(e.g. fastnorm.clip_(model.parameters(), max_norm=1.0))."
        )
    return (
        f"Tighten the gradient clipping: max_norm={max_norm:g} is set while the norm went from {base} "
        f"to {peak}; a max_norm near its healthy level ({base}) bounds every update."
    )


def explode_actions(max_norm: float | None, peak: str, base: str, isolated: list[int]) -> tuple[str, ...]:
    """What to do about a norm that exploded from ``base`` to ``peak``, after spikes at ``isolated``."""
    actions = [LOWER_LR, clipping(max_norm, peak, base), PRECISION]
    if isolated:
        actions.append(
            "Check the data for outliers: isolated spikes came first (step "
            + ", ".join(map(str, isolated[:5]))
            + ("..." if len(isolated) > 5 else "")
            + ")."
        )
    return tuple(actions)


def stall_actions(never: bool, layer_snapshots: int, layers_vanished: bool) -> tuple[str, ...]:
    """What to do about a stalled loss: one that ``never`` improved, or that went back up."""
    if layer_snapshots == 0:
        vanishing = (
            "Check for vanishing gradients: log per-layer norms (fastnorm.LayerGradNorms) and look for "
            "layers orders of magnitude below the others."
        )
    elif layers_vanished:
        vanishing = (
            "The per-layer norms show vanishing gradients (see the vanishing event): "
            + NORMALISATION[0].lower()
            + NORMALISATION[1:]
        )
    else:
        vanishing = (
            "The per-layer norms show no vanishing layer: look at the learning rate and the data first."
        )
    if never:
        lr = (
            "Raise the learning rate (it may be far too low), and check that the optimizer steps the "
            "parameters at all (a schedule at 0, frozen parameters, zero_grad between backward and step)."
        )
    else:
        lr = (
            "Check the learning rate and the weight decay: a loss that climbs back to where it "
            "started follows a rate too high for this stage, or a decay that shrinks the weights "
            "to nothing; a change in the data pipeline does the same."
        )
    data = "Check the data: labels that match their inputs, shuffling, a loss function that fits the task."
    return (lr, data, vanishing)


def spike_action(side: int, where: str) -> str:
    """What to do about a short excursion above (``side`` > 0) or below the band, at ``where``."""
    if side > 0:
        return f"Isolated spike: check that batch ({where}) for outliers or mislabelled samples."
    return f"A short drop: check that batch ({where}): empty, padded or repeated samples?"
