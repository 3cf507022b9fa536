"""On-disk plan cache: a new process launches the kernels an earlier one planned and tuned, without planning.

An entry is keyed by the decomposed graph (its text plus the bytes of every constant), the argument
signature, the device, whether Triton interprets, and the torch, triton and flashtensor versions
(flashtensor's includes a hash of its own source files, so an edited compiler never reuses old plans).
Its value is plain data, loadable with `torch.load(weights_only=True)`: the chosen kernels as dicts
(Triton source, grid, buffers keyed by ("in", i) / ("out", k) / ("tmp", j), warps, stages, blocks),
the constants, which buffer holds each fused-graph output (by node name), and the planner's notes.

Files live in FLASHTENSOR_CACHE_DIR/plans (default ~/.cache/flashtensor/plans). Each is written to a
temporary file in the same folder and renamed into place, so concurrent writers never expose a partial
entry; a header with the payload's length and SHA-256 catches corrupt or truncated files, which are
discarded with a CacheWarning and rebuilt. FLASHTENSOR_CACHE=0 (knobs.cache) turns the cache off.
"""
from __future__ import annotations

import functools
import hashlib
import io
import logging
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from .. import knobs
from ..caller import user_stacklevel
from ..ir.graph import Graph
from ..version import __version__

log = logging.getLogger(__name__)

_MAGIC = b"FTPLAN1\n"
_HEADER = len(_MAGIC) + 8 + 32      # magic, payload length (8 bytes), payload SHA-256


class CacheWarning(UserWarning):
    """A plan cache entry could not be used (corrupt, truncated, unreadable) and is rebuilt."""


def signature(args: Sequence[Any], value: Callable[[Any], Any] = repr, shapes: bool = True) -> tuple:
    """What a plan is specialised to: every tensor's shape, dtype, device and strides; every other value, as `value`
    gives it (repr here, stable across processes; ft.compile's in-memory key passes api.guards.fingerprint).
    Without `shapes`, a tensor's rank and whether it is contiguous stand for its shape and strides: the key of a
    shape-generic plan, whose guards say which sizes it serves."""
    if not shapes:
        return tuple([("T", a.dim(), a.dtype, a.device, a.is_contiguous()) if isinstance(a, torch.Tensor)
                      else ("V", value(a)) for a in args])
    return tuple([("T", a.shape, a.dtype, a.device, a.stride()) if isinstance(a, torch.Tensor) else ("V", value(a))
                  for a in args])     # runs on every call: no string conversions


@functools.cache
def versions() -> str:
    """torch, triton and flashtensor versions; flashtensor's includes its source files' hash."""
    import triton

    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return f"torch {torch.__version__}, triton {triton.__version__}, flashtensor {__version__}+{h.hexdigest()[:16]}"


def _tensor_digest(t: torch.Tensor) -> str:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return f"{t.dtype}{list(t.shape)}:" + hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def key(graph: Graph, args: Sequence[Any], options: str, bucket: tuple = ()) -> str:
    """Hex key of a plan for `graph` (decomposed) called with `args` under `options` (Options.key()); a
    shape-generic graph's plan is keyed by the arguments' ranks and the length bucket of its sizes instead of
    their shapes (the entry's guards are checked on load)."""
    consts = [f"{n.name}.{k}={_tensor_digest(v)}" for n in graph.nodes for k, v in n.attrs.items()
              if isinstance(v, torch.Tensor)]
    devices = sorted({str(a.device) for a in args if isinstance(a, torch.Tensor)})
    names = [torch.cuda.get_device_name(d) for d in devices if d.startswith("cuda")]
    generic = bool(bucket)      # a shape-generic plan has sizes to bucket
    text = "\n".join([str(graph), *consts, repr(signature(args, shapes=not generic)), repr(bucket), repr(names),
                      f"interpret={knobs.interpret()}", options, versions()])
    return hashlib.sha256(text.encode()).hexdigest()


def _path(k: str) -> Path:
    d = knobs.cache_dir() / "plans"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{k}.plan"


def store(k: str, entry: dict) -> None:
    """Write `entry` (plain data) atomically; a failure to write only costs the next process a re-plan."""
    buf = io.BytesIO()
    torch.save(entry, buf)
    payload = buf.getvalue()
    data = _MAGIC + len(payload).to_bytes(8, "little") + hashlib.sha256(payload).digest() + payload
    path = _path(k)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"FlashTensor: could not write plan cache entry {path}: {e}", CacheWarning,
                      stacklevel=user_stacklevel())
        return
    log.debug("plan cache: stored %s", path)


def load(k: str) -> Optional[dict]:
    """The entry stored under `k`, or None on a miss; a damaged entry is deleted with a CacheWarning."""
    path = _path(k)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        log.debug("plan cache miss: %s", path)
        return None
    payload = data[_HEADER:]
    length = int.from_bytes(data[len(_MAGIC):len(_MAGIC) + 8], "little")
    problem = ""
    if not data.startswith(_MAGIC) or len(data) < _HEADER:
        problem = "bad header"
    elif len(payload) != length:
        problem = f"{len(payload)} payload bytes, header says {length}"
    elif hashlib.sha256(payload).digest() != data[len(_MAGIC) + 8:_HEADER]:
        problem = "checksum mismatch"
    else:
        try:
            entry = torch.load(io.BytesIO(payload), weights_only=True)
            log.debug("plan cache hit: %s", path)
            return entry
        except Exception as e:  # noqa: BLE001 - any unreadable entry is rebuilt, whatever the reason
            problem = f"unreadable ({type(e).__name__}: {e})"
    warnings.warn(f"FlashTensor: discarding corrupt plan cache entry {path}: {problem}; rebuilding it",
                  CacheWarning, stacklevel=user_stacklevel())
    path.unlink(missing_ok=True)
    return None
