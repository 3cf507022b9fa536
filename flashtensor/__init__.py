"""FlashTensor: compiles plain-PyTorch attention variants into a few fused Triton kernels."""
import logging
import os
import sys

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


def _progress_logging() -> None:
    """Planning on a GPU times every candidate kernel and can take minutes: one line per tuned kernel
    (logger "flashtensor.progress") goes to stderr when it is a terminal, or always with
    FLASHTENSOR_PROGRESS=1; FLASHTENSOR_PROGRESS=0 silences it."""
    setting = os.environ.get("FLASHTENSOR_PROGRESS", "")
    if setting == "1" or (setting == "" and sys.stderr.isatty()):
        logger = logging.getLogger("flashtensor.progress")
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("flashtensor: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False     # printed once, also under FLASHTENSOR_DEBUG


_debug_logging()
_progress_logging()
