"""What a gradient-norm series means, and what to do about it.

Pure Python over plain numbers (no torch, no numpy, nothing of fastnorm but
:mod:`fastnorm.checks`), so it runs anywhere a metrics file can be read and is
testable without a device. The modules depend one way, each only on those
before it:

* ``events``: the kinds of event, :class:`Event`, :class:`Diagnosis` and its report;
* ``robust``: the streaming statistics (running medians, the noise band, a thinned series);
* ``advice``: the actions the diagnosis can print;
* one module per signal: ``schedule`` (the learning rate), ``skips`` (non-finite
  norms, the optimizer's skip flags, the loss scale), ``layers`` (per-layer
  norms), ``norm`` (the norm's departures and drift), ``loss`` (the loss's shape
  and the norm's rise that goes with it), ``zeros`` (a norm of exactly 0: nothing trains);
* ``diagnoser``: :class:`Diagnoser`, which feeds each signal and joins their events
  into a verdict, and :func:`diagnose`.
"""

from fastnorm.monitoring.diagnosis.advice import (
    CHECK_DATA_NAN,
    CHECKPOINT,
    INVALID_ACTION,
    LOG_LOSS,
    LOWER_LR,
    NORMALISATION,
    PRECISION,
    RAISE_LR,
    SKIP_NONFINITE,
)
from fastnorm.monitoring.diagnosis.diagnoser import Diagnoser
from fastnorm.monitoring.diagnosis.events import (
    DECAY,
    DIVERGED,
    EXPLODING,
    GROWTH,
    HEADLINES,
    INVALID,
    KINDS,
    NONFINITE,
    SKIPPED,
    SPIKE,
    STABLE,
    STALLED,
    UNSTABLE,
    VANISHING,
    Diagnosis,
    Event,
)
from fastnorm.monitoring.diagnosis.robust import ByStep
from fastnorm.monitoring.diagnosis.whole import diagnose

__all__ = [
    "CHECK_DATA_NAN",
    "CHECKPOINT",
    "INVALID_ACTION",
    "LOG_LOSS",
    "LOWER_LR",
    "NORMALISATION",
    "PRECISION",
    "RAISE_LR",
    "SKIP_NONFINITE",
    "ByStep",
    "Diagnoser",
    "diagnose",
    "DECAY",
    "DIVERGED",
    "EXPLODING",
    "GROWTH",
    "HEADLINES",
    "INVALID",
    "KINDS",
    "NONFINITE",
    "SKIPPED",
    "SPIKE",
    "STABLE",
    "STALLED",
    "UNSTABLE",
    "VANISHING",
    "Diagnosis",
    "Event",
]
