"""The monitoring half of fastnorm: record, log and diagnose the gradient norm.

The modules depend one way, each only on those before it:

* ``series``: the metric names and reading them back from the files trainers write;
* ``diagnosis``: what a series means and what to do about it (pure Python; a subpackage,
  one module per signal, its own order stated there);
* ``plot`` and ``loggers``: drawing a diagnosis; sending windows to their destinations;
* ``optimizer``: what the monitor reads of an optimizer (its settings, the precision), on the host;
* ``monitor``: the device-side recorder that feeds the loggers and the diagnosis;
* ``command``: ``fastnorm diagnose PATH``.

Every public name is also importable from ``fastnorm``. Names are imported on
first use, so that the diagnosis and the readers run without torch. Nothing here
imports the compute core: the per-layer norms the monitor logs are computed by
:class:`fastnorm.LayerGradNorms` (``fastnorm.layers``) and handed over.
"""

from fastnorm import _lazy

_NAMES = {
    "GradNormMonitor": "fastnorm.monitoring.monitor",
    "UnstableGradientWarning": "fastnorm.monitoring.monitor",
    "RecoveredWarning": "fastnorm.monitoring.monitor",
    "MonitorWarning": "fastnorm.monitoring.monitor",
    "Logger": "fastnorm.monitoring.loggers",
    "Window": "fastnorm.monitoring.loggers",
    "JsonlLogger": "fastnorm.monitoring.loggers",
    "TensorBoardLogger": "fastnorm.monitoring.loggers",
    "MLflowLogger": "fastnorm.monitoring.loggers",
    "WandbLogger": "fastnorm.monitoring.loggers",
    "ConsoleLogger": "fastnorm.monitoring.loggers",
    "diagnose": "fastnorm.monitoring.diagnosis",
    "Diagnoser": "fastnorm.monitoring.diagnosis",
    "Diagnosis": "fastnorm.monitoring.diagnosis",
    "Event": "fastnorm.monitoring.diagnosis",
    "read_series": "fastnorm.monitoring.series",
    "Series": "fastnorm.monitoring.series",
}

__all__ = list(_NAMES)

__getattr__, __dir__ = _lazy.attach(__name__, _NAMES)
