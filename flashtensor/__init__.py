"""FlashTensor: compiles plain-PyTorch attention variants into a few fused Triton kernels."""
from .runtime.compiled import compile
from .runtime.report import explain

__version__ = "0.1.0"
__all__ = ["compile", "explain", "__version__"]
