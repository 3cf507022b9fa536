"""FlashTensor: compiles plain-PyTorch attention variants into a few fused Triton kernels."""
import logging
import os

from . import backend  # noqa: F401  (importing registers torch.compile(..., backend="flashtensor"))
from .runtime.compiled import compile
from .runtime.report import explain

__version__ = "0.1.0"
__all__ = ["compile", "explain", "__version__"]


def _debug_logging() -> None:
    """FLASHTENSOR_DEBUG=1 sends every stage's IR and the search's decisions (logger "flashtensor") to stderr.
    Off, the pipeline's log calls cost a level check each."""
    if os.environ.get("FLASHTENSOR_DEBUG", "0") not in ("", "0"):
        logger = logging.getLogger("flashtensor")
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)


_debug_logging()
