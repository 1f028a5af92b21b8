"""fastnorm: the total gradient norm in one fused multi-tensor pass.

``total_norm`` and ``clip_`` replace ``torch.nn.utils.get_total_norm`` and
``clip_grad_norm_``; both return a device scalar and never synchronize.
``GradNormMonitor`` keeps that scalar for every step on the device, logs it at
a cadence and diagnoses the trend (``diagnose``, also ``fastnorm diagnose PATH``).
``StepClipper`` folds the clip into torch's fused optimizer step.
"""

from fastnorm.backends import report as backend_report
from fastnorm.monitoring import (
    ConsoleLogger,
    Diagnoser,
    Diagnosis,
    Event,
    GradNormMonitor,
    JsonlLogger,
    LayerNorms,
    Logger,
    MLflowLogger,
    MonitorWarning,
    Series,
    TensorBoardLogger,
    UnstableGradientWarning,
    WandbLogger,
    Window,
    diagnose,
    read_series,
)
from fastnorm.norm import clear_cache, clip_, tensor_norms, total_norm
from fastnorm.optim import StepClipper

__version__ = "0.1.0"

__all__ = [
    "total_norm",
    "clip_",
    "StepClipper",
    "tensor_norms",
    "backend_report",
    "clear_cache",
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
    "__version__",
]
