"""Every environment variable and global knob FlashTensor reads, in one place.

Values are read from the environment when asked for, so a test's `monkeypatch.setenv` or a
user's `os.environ[...] = ...` before the first compile takes effect; `override` sets them for a
`with` block without touching the environment (tests, benchmarks).

| variable | knob | meaning |
|---|---|---|
| TRITON_INTERPRET=1 | interpret | kernels run in Triton's CPU interpreter |
| FLASHTENSOR_CACHE_DIR | cache_dir | plans/ and kernels/ live here (default ~/.cache/flashtensor) |
| FLASHTENSOR_CACHE=0 | cache | neither read nor write the on-disk plan cache |
| FLASHTENSOR_DEBUG=1 | debug | log every stage and decision to stderr (read at import) |
| FLASHTENSOR_PROGRESS=1/0 | progress | one line per tuned kernel; default: when stderr is a terminal |
| FLASHTENSOR_COMPILE_THREADS | compile_threads | kernels the tuner compiles at once (default: the cores, 16 at most) |
| FLASHTENSOR_POISON=1 | poison | buffers a plan allocates start as NaN (integers: -2**31), not as memory was |
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, Iterator

_overrides: list[dict[str, Any]] = []


def _get(name: str, from_env: Any) -> Any:
    for scope in reversed(_overrides):
        if name in scope:
            return scope[name]
    return from_env


def interpret() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (triton binds this when a kernel is defined)."""
    return bool(_get("interpret", os.environ.get("TRITON_INTERPRET", "0") == "1"))


def cache_dir() -> Path:
    """Where plans and generated kernel sources live; created on first use."""
    d = Path(_get("cache_dir", os.environ.get("FLASHTENSOR_CACHE_DIR", Path.home() / ".cache" / "flashtensor")))
    (d / "kernels").mkdir(parents=True, exist_ok=True)
    return d


def cache() -> bool:
    """Whether the on-disk plan cache is read and written."""
    return bool(_get("cache", os.environ.get("FLASHTENSOR_CACHE", "1") != "0"))


def debug() -> bool:
    return bool(_get("debug", os.environ.get("FLASHTENSOR_DEBUG", "0") not in ("", "0")))


def progress() -> bool:
    setting = os.environ.get("FLASHTENSOR_PROGRESS", "")
    return bool(_get("progress", setting == "1" or (setting == "" and sys.stderr.isatty())))


def compile_threads() -> int:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return int(_get("compile_threads", os.environ.get("FLASHTENSOR_COMPILE_THREADS", min(16, usable))))


def poison() -> bool:
    """Whether a plan's outputs and intermediates are filled with NaN when allocated: a GPU's caching allocator
    hands out memory that held other tensors, where a CPU's fresh pages are zeros, so a kernel that reads a
    value no kernel wrote shows on the CPU too (the tests set it)."""
    return bool(_get("poison", os.environ.get("FLASHTENSOR_POISON", "0") == "1"))


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Set knobs (interpret, cache_dir, cache, debug, progress, compile_threads, poison) for the block; nests."""
    unknown = set(values) - {"interpret", "cache_dir", "cache", "debug", "progress", "compile_threads", "poison"}
    if unknown:
        raise TypeError(f"unknown knob(s): {', '.join(sorted(unknown))}")
    _overrides.append(values)
    try:
        yield
    finally:
        _overrides.remove(values)
