"""fastnorm: the total gradient norm in one fused multi-tensor pass.

``total_norm`` and ``clip_`` replace ``torch.nn.utils.get_total_norm`` and
``clip_grad_norm_``; both return a device scalar and never synchronize.
"""

from fastnorm.backends import report as backend_report
from fastnorm.norm import clear_cache, clip_, tensor_norms, total_norm

__version__ = "0.1.0"

__all__ = ["total_norm", "clip_", "tensor_norms", "backend_report", "clear_cache", "__version__"]
