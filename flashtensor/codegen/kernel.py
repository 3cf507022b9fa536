"""Triton source for one scheduled kernel: the passes of its loop, the stores, and the program's modes."""
from __future__ import annotations

import math

from ..analysis.facts import IDENTITY
from ..ir.loops import Var
from ..ir.sizes import ceildiv, python
from ..options import TileConfig
from ..schedule.schedule import ScheduleError
from . import check, loop, ranges, split
from .artifact import HELPERS_MODULE, KernelSource, header, plain_shape
from .body import Body
from .emitter import Emitter
from .lower import lit
from .spec import KernelSpec

# what generated kernels call from codegen/triton_helpers.py
HELPERS = ("_after_prior", "_aligned", "_div_as_eager", "_expm1", "_log1p", "_log2_approx", "_max_over", "_min_nan",
           "_min_over", "_mul_rn", "_pow", "_round_bf16", "_scale_f16", "_tanh", "_tanh_as_eager", "_tanh_fast",
           "_with_check")


def emit_kernel(spec: KernelSpec, cfg: TileConfig) -> KernelSource:
    """Triton source for `spec` at tile configuration `cfg`. With a finite check (spec.check, see check.py)
    the kernel takes MODE=0 for the plan's first pass and MODE=1 for the fixup pass."""
    em = Emitter(spec, cfg)
    s = spec.schedule
    c = spec.check
    grid1 = math.prod(v.extent for v in s.batch)
    ntiles = ceildiv(s.row.extent, em.blk[s.row]) if s.row is not None else 1
    tiles = ntiles * grid1
    em.splits = split.count(em, tiles)
    body: list[str] = []
    final_cache: dict[int, tuple[str, list[Var]]] = {}
    parts: list[str] = []
    segments = loop.segments(em) if s.loop is not None else []
    # ptxas (Triton 3.6's, sm_90) crashes (error -11) on some two-stage pipelined loops with a dot 16 wide (a head
    # dim of 16); three stages build, and a tile that narrow needs little shared memory for the third
    narrow = any(em.blk[v] <= 16 for v in s.whole)
    stages = 3 if cfg.num_stages == 2 and narrow and s.dots else cfg.num_stages
    for p in range(s.passes if s.loop is not None else 0):
        assert s.loop is not None     # no passes without a loop
        accs = [a for a in s.accums.values() if a.pass_ == p]
        running = {a.node: f"acc_{a.node.name}" for a in accs}
        for a in accs:
            shape = ", ".join(str(em.blk[v]) for v in em.tvars(a.node))
            init = lit(IDENTITY[a.kind]) if a.kind != "any" else "0"
            dt = "tl.int32" if a.kind == "any" else "tl.float32"
            body.append(f"acc_{a.node.name} = " + (f"tl.full([{shape}], {init}, {dt})" if shape else init))
        early = s.stops_early(p)
        if early:   # tiles that can set an `any` first, the constant-folded ones (mostly false) last
            segments = sorted(segments, key=lambda seg: bool(seg[2] & set(s.special)))
            body.append(f"more = {loop.unsettled(em, accs)}")
        for k, (lo, hi, region, bounds) in enumerate(segments):
            ctx = Body(p, region, bounds, {**em.cache_pre, **final_cache}, at_l0=True)
            first = len(em.loaded)
            loop.loop_body(em, ctx, accs, running)
            for n, _ in em.checks.values():     # a checked load these tiles do not otherwise need
                if s.loop in n.vars and ctx.lookup(n) is None:
                    ctx.cache[id(n)] = em.compute(n, ctx, ctx.lines)
            step = f"i_{s.loop} = l0" if s.stepped else f"o_{s.loop} = l0 + tl.arange(0, {em.blk[s.loop]})"
            if not early:
                # narrow: never two stages
                depth = stages if narrow else loop.within_shared(em, em.loaded[first:],
                                                                 loop.stages_of(em, region, stages))
                body += loop.loop_header(em, k, lo, hi, depth) + ["    " + ln for ln in [step] + ctx.lines]
                continue
            empty = loop.empty_in(em, lo, hi)
            if len(empty) == 2:
                continue
            jump = ["l0 = tl.where((l0 >= ga) & (l0 < gb), gb, l0)"] if s.runtime_gap else []
            ctx.lines += [f"more = {loop.unsettled(em, accs)}", f"l0 += {em.blk[s.loop]}"] + jump
            seg = [f"l0 = {lo} + tl.zeros([], tl.int32)"] + jump + [f"while (l0 < {hi}) & more:"] + \
                ["    " + ln for ln in [step] + ctx.lines]
            # `fin` is a constant in each pass, so Triton compiles only the pass that runs this segment
            body += [f"if fin == {1 - min(empty)}:"] + ["    " + ln for ln in seg] if empty else seg
        if em.split:    # this program's piece of the pass: its partials, merged by the combine kernel
            parts = split.partials(em, accs)
            break
        post = loop.finals(em, accs, p, {**em.cache_pre, **final_cache})
        body += post.lines
        final_cache.update(post.cache)
    if s.loop is None and s.accums:
        raise ScheduleError("reductions without a loop variable")
    body += split.epilogue(em, parts) if em.split else em.store_roots({**em.cache_pre, **final_cache})
    for n, _ in em.checks.values():
        if s.loop not in n.vars and id(n) not in em.cache_pre:
            em.value(n, None)
    tile = loop.placement(em, ntiles, grid1) + [f"o_{v} = tl.arange(0, {em.blk[v]})" for v in s.whole] + \
        [check.check_acc(em, i)[0] for i in em.checks] + em.pre + body
    programs = tiles * em.splits
    checked = tile + (check.program_check(em, c.shares, dict(c.flat), c.part, programs, cfg.num_stages)
                      if c.shares and (c.flat or em.checks) else [])
    prog = check.modes(em, bool(c.shares), programs, tile, checked)
    buffers = list(em.bufs.values())
    size_args = sorted(spec.sizes)
    lines = header(spec.name, buffers, size_args, spec.aligned, mode=True, split=em.runtime_split) + \
        ["    " + ln for ln in prog]
    pre_src, pre = ranges.prologues(spec, cfg)
    comb_src, comb = split.combine(spec, cfg, ntiles, grid1, em.splits) if em.split else ("", None)
    src = "import triton\nimport triton.language as tl\n\n" + \
        f"from {HELPERS_MODULE} import {', '.join(HELPERS)}\n\n\n" + "\n".join(lines) + "\n" + pre_src + comb_src
    blocks = {str(v): em.blk[v] for v in em.blk}
    return KernelSource(spec.name, src, [plain_shape(b) for b in buffers], (python(programs),), cfg.num_warps,
                        cfg.num_stages, blocks, bool(s.skip or s.special or s.runtime), bool(c.shares),
                        spec.fixup_programs, size_args, pre, python(em.splits), comb, sorted(set(em.limits)),
                        spec.aligned)
