"""Picks block sizes, warps and pipeline stages per kernel by timing variants on the real device.

Kernels are tuned in plan order: each one runs on the intermediates the already-tuned
kernels before it produced. On the CPU (Triton's interpreter) the first config is used.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from ..codegen.emit import KernelSource
from .launch import Launch, allocate, load_kernel

# (row block, loop block, warps, stages): first is the default, the rest are tried on a GPU
CONFIGS = [(128, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 4, 3)]


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def tune(variants: Callable[[tuple], KernelSource], buffers: dict, device: torch.device) -> Launch:
    """Best Launch among CONFIGS for one kernel; `buffers` holds inputs and earlier kernels' results
    and receives this kernel's outputs."""
    configs = CONFIGS[:1] if device.type != "cuda" or interpreting() else CONFIGS
    best, best_ms = None, float("inf")
    seen = set()
    for cfg in configs:
        src = variants(cfg)
        if src.source in seen:
            continue
        seen.add(src.source)
        la = Launch(src, load_kernel(src))
        allocate(src, buffers, device)
        if len(configs) == 1:
            return la
        try:
            import triton.testing
            ms = triton.testing.do_bench(lambda: la(buffers), warmup=5, rep=20, return_mode="median")
        except Exception:  # a config the device cannot run (shared memory, registers): skip it
            continue
        if ms < best_ms:
            best, best_ms = la, ms
    if best is None:
        raise RuntimeError("no kernel configuration ran on this device")
    return best
