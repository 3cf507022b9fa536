"""FlashTensor: compiles plain-PyTorch attention variants into a few fused Triton kernels."""
import logging

from . import knobs
from .api import backend  # noqa: F401  (importing registers torch.compile(..., backend="flashtensor"))
from .api.compiled import compile
from .api.report import explain
from .driver import FallbackWarning
from .options import Options, TileConfig
from .version import __version__

__all__ = ["compile", "explain", "FallbackWarning", "Options", "TileConfig", "__version__"]


def _logging() -> None:
    """knobs.debug (FLASHTENSOR_DEBUG=1) sends every stage's IR and the search's decisions (logger "flashtensor")
    to stderr; off, the log calls cost a level check each. knobs.progress prints one line per tuned kernel
    (logger "flashtensor.progress"): planning on a GPU times every candidate kernel and can take minutes."""
    if knobs.debug():
        _to_stderr("flashtensor", "[%(name)s] %(message)s", logging.DEBUG)
    if knobs.progress():
        _to_stderr("flashtensor.progress", "flashtensor: %(message)s", logging.INFO).propagate = False  # once


def _to_stderr(name: str, fmt: str, level: int) -> logging.Logger:
    logger = logging.getLogger(name)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter(fmt))
    logger.addHandler(handler)
    logger.setLevel(level)
    return logger


_logging()
