"""Picks block sizes, warps and pipeline stages per kernel by timing variants on the real device.

Kernels are tuned in plan order: each one runs on the intermediates the already-tuned
kernels before it produced. On the CPU (Triton's interpreter) the first config is used.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Sequence

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


def candidates(spec: KernelSpec, configs: Sequence[TileConfig], device: torch.device) -> list[Launch]:
    """`spec`'s kernel at each configuration where the device times them (the first elsewhere), one Launch per
    distinct kernel."""
    out: dict[tuple, Launch] = {}
    for cfg in list(configs) if timed(device) else list(configs[:1]):
        src = emit_kernel(spec, cfg)
        key = (src.source, src.num_warps, src.num_stages)    # warps and stages are not in the source
        if key in out:
            log.debug("autotune %s: config %s gives the same kernel as an earlier one, skipped", src.name, cfg)
            continue
        out[key] = Launch(src, load_kernel(src))
    return list(out.values())


def tune(launches: list[Launch], buffers: dict, device: torch.device, after_prior: bool = False) -> Launch:
    """The fastest of one kernel's candidates (`candidates`, compiled by compile_all), each timed as the plan
    launches it (`after_prior`: after another of the plan's kernels, Launch.__call__) so that the plan's run
    compiles no variant of its own; `buffers` holds the inputs and earlier kernels' results and receives this
    kernel's outputs."""
    for la in launches:
        la.allocate(buffers, device)
    if len(launches) == 1:
        log.debug("autotune %s: one candidate on %s", launches[0].source.name, device)
        return launches[0]
    best, best_ms = None, float("inf")
    for la in launches:
        try:
            import triton.testing
            ms = triton.testing.do_bench(lambda: la(buffers, after_prior=after_prior), warmup=5, rep=20,
                                         return_mode="median")
        except Exception as e:  # a config the device cannot run (shared memory, registers): skip it
            log.debug("autotune %s: config %s failed: %s: %s", la.source.name, la.source.config, type(e).__name__, e)
            continue
        log.debug("autotune %s: config %s %.4f ms", la.source.name, la.source.config, ms)
        if ms < best_ms:
            best, best_ms = la, ms
    if best is None:
        raise TuneError("no kernel configuration ran on this device")
    log.debug("autotune %s: chose blocks %s, %d warps, %d stages (%.4f ms)", best.source.name, best.source.blocks,
              best.source.num_warps, best.source.num_stages, best_ms)
    best.ms = best_ms
    return best


def compile_all(jobs: Sequence[tuple[Launch, dict, bool, bool]]) -> None:
    """Compile each (launch, buffers, fixup, after_prior) as that call would, side by side in threads (Triton's
    compiler spends its time in native passes and in ptxas, a subprocess). A failure is left to the launch that
    follows, which raises it where the caller handles it (the tuner skips that configuration). Under Triton's
    interpreter a warmup compiles nothing."""
    if not jobs:
        return
    with ThreadPoolExecutor(max(1, min(len(jobs), knobs.compile_threads()))) as pool:
        for job, done in zip(jobs, pool.map(lambda j: _compiled(*j), jobs)):
            if done is not None:
                log.debug("autotune %s: compiling failed: %s", job[0].source.name, done)


def _compiled(la: Launch, buffers: dict, fixup: bool, after_prior: bool) -> Optional[str]:
    try:
        la.compile(buffers, fixup, after_prior)
    except Exception as e:  # noqa: BLE001 - reported where the launch raises it again
        return f"{type(e).__name__}: {e}"
    return None


def median_ms(f: Callable[[], object]) -> float:
    """f's median time on the device in ms (a first call inside, so a compile on it is not timed)."""
    import triton.testing
    return float(triton.testing.do_bench(f, warmup=10, rep=50, return_mode="median"))


def call_ms(f: Callable[[], object], device_ms: Callable[[Callable[[], object]], float] = median_ms,
            sync: Callable[[], object] = torch.cuda.synchronize, calls: int = 20) -> float:
    """f's time per call as its caller sees it, in ms: the device's median (`device_ms`, the L2 cache flushed
    before each call), or where the host cannot issue calls that fast (the launches, guards and allocations of
    a small call), the wall time per call of up to `calls` back-to-back calls (fewer for a long call: about
    10 ms of them), whichever is longer. Pricing by the device's time alone kept plans whose host time made
    them slower than eager."""
    device = device_ms(f)
    n = max(1, min(calls, int(10 / max(device, 1e-3))))
    sync()
    start = time.perf_counter()
    for _ in range(n):
        f()
    sync()
    return max(device, (time.perf_counter() - start) * 1e3 / n)
