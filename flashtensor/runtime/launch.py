"""Loads generated Triton source as a module and launches its kernels in plan order."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from .. import knobs
from ..codegen.artifact import FINITE, Buffer, KernelSource
from ..ir.sizes import evaluator

SIZES = ("sizes",)     # buffer key of the size symbols' values


def load_kernel(k: KernelSource, name: Optional[str] = None) -> Any:
    """Import the kernel (or another function of its module, a prologue's) from a file named by its source hash
    (Triton's jit reads source from files)."""
    digest = hashlib.sha256(k.source.encode()).hexdigest()[:20]
    mod_name = f"ft_{k.name}_{digest}"
    if mod_name in sys.modules:
        return getattr(sys.modules[mod_name], name or k.name)
    path = knobs.cache_dir() / "kernels" / f"{mod_name}.py"
    if not path.exists() or path.read_text() != k.source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(k.source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, name or k.name)


@dataclass
class Launch:
    source: KernelSource
    fn: Any
    ms: float = 0.0          # the tuner's median time on the device (0 where nothing was timed)

    def __call__(self, buffers: dict, fixup: bool = False, after_prior: bool = False) -> None:
        """MODE=0: the kernel, each program also checking its piece of the inputs; MODE=1: the fixup pass
        (codegen/check.py says what both do). `after_prior`: a programmatic dependent launch where
        the device has them, which may start while the plan's kernel before it on the stream finishes (its
        programs first wait for that kernel's writes): the launch gap between a plan's kernels goes. Only
        the plan's own kernels after its first are launched so; any kernel's wait is a no-op otherwise."""
        for fn, grid, args, options in self.steps(buffers, fixup, after_prior):
            fn[grid](*args, **options)

    def compile(self, buffers: dict, fixup: bool = False, after_prior: bool = False) -> None:
        """Compile what the same call would launch, launching nothing (Triton's warmup): the tuner compiles its
        candidates side by side before it times them one by one."""
        for fn, grid, args, options in self.steps(buffers, fixup, after_prior):
            fn.warmup(*args, grid=grid, **options)

    def steps(self, buffers: dict, fixup: bool, after_prior: bool) -> list[tuple[Any, tuple[int], list, dict]]:
        """The launches of one call, in order, as (function, grid, arguments, options): the pre-passes (not in the
        fixup pass, which computes every tile and reads no run-time range), the kernel, and the combine of a split
        loop (in the fixup pass too, after it recomputed the pieces; none where the count comes to 1)."""
        src = self.source
        sizes = buffers.get(SIZES, {})
        tiles, splits, merged, *before = self._grids(sizes)
        args = [buffers[b.source] for b in src.buffers] + [sizes[n] for n in src.sizes]
        pdl = _dependent_launch(args[0].device)     # the code waits, and lets the next kernel launch early
        out = []
        for p, fn, n in zip(src.prologues if not fixup else [], self.prologues, before):
            out.append((fn, (n,), [buffers[b.source] for b in p.buffers] + [sizes[x] for x in p.sizes],
                        {"PDL": pdl, "launch_pdl": pdl and after_prior, "num_warps": p.num_warps}))
            after_prior = True
        out.append((self.fn, (min(tiles, src.fixup_programs),) if fixup else (tiles,), args,
                    {"MODE": int(fixup), "PDL": pdl, "launch_pdl": pdl and after_prior, "num_warps": src.num_warps,
                     "num_stages": src.num_stages}))
        c = src.combine
        if c is not None and splits != 1:
            out.append((self.combine, (merged,), [buffers[b.source] for b in c.buffers] + [sizes[x] for x in c.sizes],
                        {"MODE": int(fixup), "PDL": pdl, "launch_pdl": pdl, "num_warps": c.num_warps}))
        return out

    def allocate(self, buffers: dict, device: torch.device) -> None:
        """Create the outputs, intermediates and the (zeroed) finite-check flag this kernel and its companions
        use that `buffers` does not hold yet."""
        shapes = self._shapes(buffers.get(SIZES, {}))
        for b, shape in zip(self._buffers, shapes):
            if b.source == FINITE and FINITE not in buffers:
                buffers[FINITE] = torch.zeros(shape, dtype=b.dtype, device=device)
            elif b.source not in buffers:
                buffers[b.source] = torch.empty(shape, dtype=b.dtype, device=device)

    @functools.cached_property
    def _buffers(self) -> list[Buffer]:
        companions = self.source.prologues + ([self.source.combine] if self.source.combine else [])
        return self.source.buffers + [b for p in companions for b in p.buffers]

    @functools.cached_property
    def _shapes(self) -> Callable[[Mapping[str, int]], tuple]:
        """Every buffer's shape at a call's sizes, in one evaluation."""
        return evaluator([f"({''.join(f'{d}, ' for d in b.shape)})" for b in self._buffers])

    @functools.cached_property
    def _grids(self) -> Callable[[Mapping[str, int]], tuple]:
        """The kernel's programs, its split count, the combine's programs and each prologue's, in one evaluation."""
        src = self.source
        return evaluator([src.grid[0], src.splits, src.combine.grid[0] if src.combine else 1] +
                         [p.grid[0] for p in src.prologues])

    @functools.cached_property
    def prologues(self) -> list[Any]:
        return [load_kernel(self.source, p.name) for p in self.source.prologues]

    @functools.cached_property
    def combine(self) -> Any:
        assert self.source.combine is not None     # launched only for a kernel with a split loop
        return load_kernel(self.source, self.source.combine.name)


@functools.cache
def _dependent_launch(device: torch.device) -> bool:
    """Programmatic dependent launch needs sm_90 or later (and a real device)."""
    return device.type == "cuda" and not knobs.interpret() and torch.cuda.get_device_capability(device)[0] >= 9


def input_buffers(inputs: Sequence[torch.Tensor], sizes: Optional[dict[str, int]] = None) -> dict:
    """Program inputs keyed as kernels name them (generated code assumes contiguous layouts), and the values of
    the size symbols a shape-generic plan's kernels take (under SIZES)."""
    bufs: dict[Any, Any] = {("in", i): t.contiguous() for i, t in enumerate(inputs)}
    bufs[SIZES] = sizes or {}
    return bufs


def run_kernels(launches: Sequence[Launch], inputs: Sequence[torch.Tensor], device: torch.device,
                sizes: Optional[dict[str, int]] = None) -> dict:
    """Allocate intermediates and outputs, launch every kernel, then the fixup pass where the plan has one
    (it returns at once unless an input was not finite); returns all buffers by key."""
    buffers = input_buffers(inputs, sizes)
    for la in launches:
        la.allocate(buffers, device)
    for k, la in enumerate(launches):
        la(buffers, after_prior=k > 0)
    for la in launches:
        if la.source.fixup:
            la(buffers, fixup=True, after_prior=True)
    return buffers
