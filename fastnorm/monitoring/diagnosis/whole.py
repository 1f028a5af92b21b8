"""``diagnose``: a whole series judged at once, each signal given as ``(steps, values)`` or by step."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastnorm.monitoring.diagnosis.diagnoser import Diagnoser
from fastnorm.monitoring.diagnosis.events import Diagnosis
from fastnorm.monitoring.diagnosis.robust import ByStep, by_step


def diagnose(
    steps: Iterable[int],
    values: Iterable[Any],
    *,
    loss: ByStep | None = None,
    lr: ByStep | None = None,
    scale: ByStep | None = None,
    reward: ByStep | None = None,
    layers: Mapping[int, Mapping[str, Any]] | None = None,
    skipped: ByStep | None = None,
    optimizer: Mapping[str, ByStep] | None = None,
    precision: str | None = None,
    max_norm: float | None = None,
    objective: str | None = None,
    keys: Iterable[str] = (),
    located: Mapping[int, Mapping[str, Any]] | None = None,
    **thresholds: Any,
) -> Diagnosis:
    r"""Diagnoses a gradient-norm series: stable, or nonfinite, diverged, exploding, vanishing, stalled.

    Reads the series against a robust running baseline (see the module's
    description, and :class:`Diagnoser` for the thresholds and their defaults),
    with the loss, the learning rate, a loss scaler's scale, per-layer norms
    and the optimizer's skip flags when given, and reports every event with its kind, step range and actions,
    and the verdict (the most severe kind present).

    Args:
        steps (iterable of int): the step of each value, in order.
        values (iterable): the gradient norms (>= 0; NaN and inf allowed;
            anything else is reported as invalid).
        loss, lr, scale (optional): the training loss, the learning rate and a
            loss scaler's scale, each a ``(steps, values)`` pair or a mapping
            step -> value.
        reward (optional): a reward-driven run's mean reward, the same way: judged where the run is
            reward-driven (a reward that never rose is a stall).
        layers (mapping, optional): step -> {layer name: norm}, the per-layer
            norms at the steps they were logged.
        skipped (optional): whether the optimizer skipped each step (1 or
            True: skipped, 0 or False: applied), a ``(steps, values)`` pair or a
            mapping step -> value, as ``GradNormMonitor`` logs it under
            ``gradient_norm_skipped``.
        optimizer (mapping, optional): the optimizer's settings by name
            (``weight_decay``, ``eps``, ``beta1``, ``beta2``, ``momentum``),
            each a ``(steps, values)`` pair or a mapping step -> value, as
            ``GradNormMonitor(optimizer=)`` logs them.
        precision (str, optional): the run's precision (``"fp32"``,
            ``"bf16-mixed"``, ``"16-mixed"``, ...; see :class:`~fastnorm.GradNormMonitor`).
        max_norm (float, optional): the run's clipping threshold, for the advice.
        objective (str, optional): what the loss is (see :class:`Diagnoser`); default: read from ``keys``
            and the loss.
        keys (iterable of str): the names of the metrics the log holds, for the objective.
        located (mapping, optional): step -> {key: value} of a
            :class:`~fastnorm.Locator`'s logged findings (``locate_nonfinite/...``),
            reported as where the run first went non-finite or overflowed.
        **thresholds: the other keyword arguments of :class:`Diagnoser`.

    Returns:
        Diagnosis: the verdict, the events and the actions.

    Example::

        >>> import math
        >>> steps = range(200)
        >>> values = [1.0 + 0.1 * math.sin(i) for i in steps[:150]] + [1e4] * 50
        >>> fastnorm.diagnose(steps, values).verdict
        'exploding'
    """
    d = Diagnoser(max_norm=max_norm, precision=precision, objective=objective, **thresholds)
    d.update_keys(keys)
    flags = by_step(skipped, "skipped")
    if flags:
        d.update_skipped([s for s, _ in flags], [v for _, v in flags])
    # Before the norms: a reward-driven loss, or a reward, says the norm's exact zeros are tied batches.
    for given, what, method in ((loss, "loss", d.update_loss), (reward, "reward", d.update_reward)):
        pairs = by_step(given, what)
        if pairs:
            method([s for s, _ in pairs], [v for _, v in pairs])
    d.update(steps, values)
    for given, what, method in (
        (lr, "lr", d.update_lr),
        (scale, "scale", d.update_scale),
    ):
        pairs = by_step(given, what)
        if pairs:
            method([s for s, _ in pairs], [v for _, v in pairs])
    for name, given in (optimizer or {}).items():
        for step, value in by_step(given, name):
            d.update_settings(step, {name: value})
    for step in sorted(layers or {}):
        d.update_layers(step, layers[step])
    for step in sorted(located or {}):
        d.update_settings(step, located[step])
    return d.result()
