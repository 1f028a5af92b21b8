"""The monitoring half of fastnorm: record, log and diagnose the gradient norm.

The modules depend one way, each only on those before it:

* ``series``: the metric names and reading them back from the files trainers write;
* ``diagnosis``: what a series means and what to do about it (pure Python);
* ``plot`` and ``loggers``: drawing a diagnosis; sending windows to their destinations;
* ``monitor``: the device-side recorder that feeds the loggers and the diagnosis;
* ``command``: ``fastnorm diagnose PATH``.

Every public name is also importable from ``fastnorm``.
"""

from fastnorm.monitoring.diagnosis import Diagnoser, Diagnosis, Event, diagnose
from fastnorm.monitoring.loggers import (
    ConsoleLogger,
    JsonlLogger,
    Logger,
    MLflowLogger,
    TensorBoardLogger,
    WandbLogger,
    Window,
)
from fastnorm.monitoring.monitor import GradNormMonitor, LayerNorms, MonitorWarning, UnstableGradientWarning
from fastnorm.monitoring.series import Series, read_series

__all__ = [
    "GradNormMonitor",
    "LayerNorms",
    "UnstableGradientWarning",
    "MonitorWarning",
    "Logger",
    "Window",
    "JsonlLogger",
    "TensorBoardLogger",
    "MLflowLogger",
    "WandbLogger",
    "ConsoleLogger",
    "diagnose",
    "Diagnoser",
    "Diagnosis",
    "Event",
    "read_series",
    "Series",
]
