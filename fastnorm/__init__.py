"""fastnorm: the total gradient norm in one fused multi-tensor pass.

``total_norm`` and ``clip_`` replace ``torch.nn.utils.get_total_norm`` and
``clip_grad_norm_``; both return a device scalar and never synchronize.
``GradNormMonitor`` keeps that scalar for every step on the device, logs it at
a cadence and diagnoses the trend (``diagnose``, also ``fastnorm diagnose PATH``).
``StepClipper`` folds the clip into torch's fused optimizer step, and skips a
non-finite step (and, with ``SpikeGuard``, a spiking one) on the device.
``patch`` makes torch's clip functions, and the trainers that call them, run fastnorm.

Names are imported on first use: ``fastnorm.diagnose`` runs without torch, and
``import fastnorm`` costs nothing until a name is used.
"""

from fastnorm import _lazy

__version__ = "0.1.0"

_NAMES = {
    "total_norm": "fastnorm.norm",
    "clip_": "fastnorm.norm",
    "tensor_norms": "fastnorm.norm",
    "tensor_stats": "fastnorm.norm",
    "clear_cache": "fastnorm.norm",
    "NoGradientWarning": "fastnorm.norm",
    "StepClipper": "fastnorm.optim",
    "SpikeGuard": "fastnorm.guard",
    "patch": "fastnorm.integrations.patch",
    "backend_report": "fastnorm.backends:report",
    "GradNormMonitor": "fastnorm.monitoring",
    "LayerGradNorms": "fastnorm.layers",
    "UnstableGradientWarning": "fastnorm.monitoring",
    "RecoveredWarning": "fastnorm.monitoring",
    "MonitorWarning": "fastnorm.monitoring",
    "Logger": "fastnorm.monitoring",
    "Window": "fastnorm.monitoring",
    "JsonlLogger": "fastnorm.monitoring",
    "TensorBoardLogger": "fastnorm.monitoring",
    "MLflowLogger": "fastnorm.monitoring",
    "WandbLogger": "fastnorm.monitoring",
    "ConsoleLogger": "fastnorm.monitoring",
    "diagnose": "fastnorm.monitoring",
    "Diagnoser": "fastnorm.monitoring",
    "Diagnosis": "fastnorm.monitoring",
    "Event": "fastnorm.monitoring",
    "read_series": "fastnorm.monitoring",
    "Series": "fastnorm.monitoring",
    "Locator": "fastnorm.locate",
}

__all__ = [*_NAMES, "__version__"]

__getattr__, __dir__ = _lazy.attach(__name__, _NAMES)
