"""Picks block sizes, warps and pipeline stages per kernel by timing variants on the real device.

Kernels are tuned in plan order: each one runs on the intermediates the already-tuned
kernels before it produced. On the CPU (Triton's interpreter) the first config is used.
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

import torch

from .. import knobs
from ..codegen.kernel import emit_kernel
from ..codegen.spec import KernelSpec
from ..options import TileConfig
from .launch import Launch, load_kernel

log = logging.getLogger(__name__)


class TuneError(RuntimeError):
    """No tile configuration of a kernel ran on the device."""


def timed(device: torch.device) -> bool:
    """Whether candidates are timed (on a GPU) or the first is taken (on the CPU, where the interpreter's
    times say nothing)."""
    return device.type == "cuda" and not knobs.interpret()


def tune(spec: KernelSpec, configs: Sequence[TileConfig], buffers: dict, device: torch.device) -> Launch:
    """Best Launch among `configs` for one kernel; `buffers` holds inputs and earlier kernels' results
    and receives this kernel's outputs."""
    configs = list(configs) if timed(device) else list(configs[:1])
    best, best_ms = None, float("inf")
    seen = set()
    for cfg in configs:
        src = emit_kernel(spec, cfg)
        key = (src.source, src.num_warps, src.num_stages)    # warps and stages are not in the source
        if key in seen:
            log.debug("autotune %s: config %s gives the same kernel as an earlier one, skipped", src.name, cfg)
            continue
        seen.add(key)
        la = Launch(src, load_kernel(src))
        la.allocate(buffers, device)
        if len(configs) == 1:
            log.debug("autotune %s: one candidate on %s, config %s", src.name, device, cfg)
            return la
        try:
            import triton.testing
            ms = triton.testing.do_bench(lambda: la(buffers), warmup=5, rep=20, return_mode="median")
        except Exception as e:  # a config the device cannot run (shared memory, registers): skip it
            log.debug("autotune %s: config %s failed: %s: %s", src.name, cfg, type(e).__name__, e)
            continue
        log.debug("autotune %s: config %s (blocks %s) %.4f ms", src.name, cfg, src.blocks, ms)
        if ms < best_ms:
            best, best_ms = la, ms
    if best is None:
        raise TuneError("no kernel configuration ran on this device")
    log.debug("autotune %s: chose blocks %s, %d warps, %d stages (%.4f ms)", best.source.name, best.source.blocks,
              best.source.num_warps, best.source.num_stages, best_ms)
    best.ms = best_ms
    return best


def median_ms(f: Callable[[], object]) -> float:
    """f's median time on the device in ms (a first call inside, so a compile on it is not timed)."""
    import triton.testing
    return float(triton.testing.do_bench(f, warmup=10, rep=50, return_mode="median"))
