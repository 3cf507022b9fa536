"""A kernel's loop split across programs (flash-decoding), and the combine kernel that merges the pieces.

Short queries against long keys (decode, chunked prefill) give a row kernel a few programs, each looping over
every key: most of the GPU idles. Where the loop feeds only reductions that merge exactly (running maxima and
minima, `any`, and sums, rescaled by a running max or not: one pass, schedule/online.py), `count` gives each row
tile several programs, each over a contiguous piece of the loop (codegen/loop.py `segments` intersects its
range with the piece). Each stores its accumulators as they stand after the loop (`partials`: per piece, the
running max m_s and the unnormalised sums, relative to max(m_s, 0 where m_s is -inf) as the loop keeps them), and
a second kernel of the module (`combine`) merges them, m = max_s m_s, l = sum_s l_s * exp(m_s - m), then runs
the kernel's epilogue (loop-invariant factors, the roots, their stores) as the unsplit kernel would. A piece with
no live element (fully masked, or past the loop's end) holds m_s = -inf and sums of 0, which add nothing, so the
result equals the unsplit kernel's, a fully masked row's NaN or uniform row included. Column statistics (a kernel
over keys looping over queries) have programs enough for long keys: the count is 1 there, and a static count of
1 emits the kernel unchanged. A shape-generic kernel computes its count from its size arguments at launch; where
it comes to 1 (prefill), the kernel runs its epilogue itself and the launch skips the combine (`epilogue`), and
the launch passes SPLIT 0, a constexpr that leaves the pieces' code out of what Triton compiles: compiled in, its
bounds and store cost registers that the key loop's tensor core pipeline needs (ptxas then waits on each wgmma).
A bucket's lengths that cross from one piece to several compile the other variant on that first call.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from ..analysis.facts import IDENTITY
from ..ir.sizes import Size, ceildiv, python, source, symbolic
from ..options import TileConfig
from ..schedule.schedule import Accum, Schedule
from . import loop
from .artifact import FINITE, Prologue, header, plain_shape
from .emitter import Emitter
from .lower import contig, lit
from .spec import CheckPlan, KernelSpec
from .tiles import Tiles

MERGED = ("sum", "max", "min", "any")     # reductions whose pieces merge exactly
MIN_TILES = 4           # loop tiles a piece takes at least, where the count follows from the sizes
FILL = 4                # a kernel splits where its programs are at most 1/FILL of Options.split_programs (few SMs busy)
COMBINE_WARPS = 4
UNROLL = 4              # pieces a combine loads at once


def splittable(s: Schedule) -> bool:
    """Whether the kernel's loop can be split: one pass of reductions that merge (a second pass needs the first's
    results over the whole loop), a tiled loop."""
    return s.loop is not None and not s.stepped and s.passes == 1 and bool(s.accums) and \
        all(a.kind in MERGED for a in s.accums.values())


def count(em: Tiles, tiles: Size) -> Size:
    """Programs per row tile: Options.splits where forced; else, where the kernel's `tiles` programs would leave
    most SMs idle (at most 1/FILL of Options.split_programs), enough to reach Options.split_programs, each piece at
    least MIN_TILES loop tiles; 1 where the kernel cannot split. Symbolic where the sizes are (no guard: the
    kernel and the launch evaluate it per call)."""
    s, spec = em.s, em.spec
    if not splittable(s):
        return 1
    if spec.splits is not None:
        return spec.splits
    assert s.loop is not None       # splittable
    pieces = ceildiv(s.loop.extent, em.blk[s.loop]) // MIN_TILES
    want = ceildiv(spec.split_programs, tiles)
    if (not symbolic(pieces) and pieces <= 1) or (not symbolic(want) and want < FILL):
        return 1
    # times 0 (then 1 piece) where the kernel has programs enough without (want < FILL), without a guard
    return torch.sym_max(1, torch.sym_min(pieces, want * torch.sym_min(1, want // FILL)))


def _partial(em: Tiles, a: Accum, piece: str, written: bool) -> tuple[str, Optional[str]]:
    """The scratch buffer of accumulator a's pieces, (pieces, a's variables) contiguous: its name and offset of
    this tile's piece `piece`, and the tile's bounds mask (None where the tile is inside them)."""
    n = a.node
    shape = [v.extent for v in n.vars]
    dtype = torch.int32 if a.kind == "any" else torch.float32
    # keyed by the count too: the tuner's configurations share one buffer per key and may split differently
    buf = em.buffer(("split", em.spec.name, n.name, str(python(em.splits))), [em.splits, *shape], dtype,
                    "intermediate", written)
    tv = em.tvars(n)
    numel = 1
    for d in shape:
        numel = numel * d
    off = " + ".join([f"{piece} * {source(numel)}"] +
                     [f"{em.idx(v, tv)} * {source(st)}" for v, st in zip(n.vars, contig(shape))])
    return f"{buf} + {off}", em.range_mask(tv)


def partials(em: Tiles, accs: list[Accum]) -> list[str]:
    """Lines storing this program's piece of each accumulator (after its loop)."""
    out = []
    for a in accs:
        at, mask = _partial(em, a, "sid", True)
        acc = f"acc_{a.node.name}"
        if not em.tvars(a.node):     # a scalar that a loop with no tile in this piece leaves a literal
            acc = f"({acc} + tl.zeros([], {'tl.int32' if a.kind == 'any' else 'tl.float32'}))"
        out.append(f"tl.store({at}, {acc}{f', mask={mask}' if mask else ''})")
    return out


def epilogue(em: Emitter, parts: list[str]) -> list[str]:
    """What follows a split kernel's loop: its partials (`parts`). Where the count is symbolic, a call whose sizes
    give one piece (a long query: programs enough) runs the kernel's own epilogue instead, and the launch skips
    the combine, so a shape-generic plan costs prefill nothing."""
    if not symbolic(em.splits):
        return parts
    post = loop.finals(em, list(em.s.accums.values()), 0, dict(em.cache_pre))
    whole = post.lines + em.store_roots({**em.cache_pre, **post.cache})
    return ["if ns == 1:     # one piece"] + ["    " + ln for ln in whole] + ["else:"] + ["    " + ln for ln in parts]


def _merge(em: Emitter, accs: list[Accum]) -> list[str]:
    """Lines merging every accumulator's pieces into `acc_*`, as the loop leaves them: extremes and `any` first,
    then the sums, each piece rescaled from its own running max to the merged one. Each loop over the pieces
    takes UNROLL at a time, unrolled, so that their loads are in flight together (one after another, a combine
    of 16 pieces waited out 32 memory latencies)."""
    out = []
    ext = [a for a in accs if a.kind != "sum"]
    sums = [a for a in accs if a.kind == "sum"]

    def init(a: Accum) -> str:
        shape = ", ".join(str(em.blk[v]) for v in em.tvars(a.node))
        value, dt = ("0", "tl.int32") if a.kind == "any" else (lit(IDENTITY[a.kind]), "tl.float32")
        return f"acc_{a.node.name} = tl.full([{shape}], {value}, {dt})"

    def load(a: Accum, other: str) -> str:
        """Piece sp of a, `other` where sp is past the count or the element outside the tile's bounds."""
        at, mask = _partial(em, a, "sp", False)
        return f"tl.load({at}, mask=(sp < ns){f' & ({mask})' if mask else ''}, other={other})"

    pieces = [f"for sp0 in range(0, ns, {UNROLL}):", f"    for u in tl.static_range({UNROLL}):", "        sp = sp0 + u"]
    out += [init(a) for a in ext]
    if ext:
        out += pieces
        for a in ext:
            acc, fn = f"acc_{a.node.name}", "max" if a.kind != "min" else "min"
            nan = "" if a.node in em.nan_free or a.kind == "any" else ", propagate_nan=tl.PropagateNan.ALL"
            other = "0" if a.kind == "any" else lit(IDENTITY[a.kind])
            out.append(f"        {acc} = tl.{fn}imum({acc}, {load(a, other)}{nan})")
    maxima = sorted({d for a in sums for d, _, _ in a.rescale}, key=lambda d: d.name)
    out += [f"safe_{d.name} = tl.where(acc_{d.name} == float(\"-inf\"), 0.0, acc_{d.name})" for d in maxima]
    out += [init(a) for a in sums]
    if sums:
        out += pieces
        for d in maxima:
            out += [f"        m_{d.name} = {load(em.s.accums[d], lit(IDENTITY['max']))}",
                    f"        m_{d.name} = tl.where(m_{d.name} == float(\"-inf\"), 0.0, m_{d.name})"]
        for a in sums:
            tv = em.tvars(a.node)
            alpha = "".join(
                f" * {em.bcast(f'tl.{base}(' + _moved(d, k) + ')', em.tvars(d), tv)}" for d, base, k in a.rescale)
            x = f"x_{a.node.name}"
            out.append(f"        {x} = {load(a, '0')}")
            # a piece that added nothing adds nothing, whatever its rescale (0 * inf is NaN)
            out.append(f"        acc_{a.node.name} += tl.where({x} == 0, 0.0, {x}{alpha})" if alpha else
                       f"        acc_{a.node.name} += {x}")
    return out


def _moved(d: Any, k: float) -> str:
    """The exponent that takes a piece's sums from its running max to the merged one."""
    return f"m_{d.name} - safe_{d.name}" if k == 1.0 else f"(m_{d.name} - safe_{d.name}) * {lit(k)}"


def combine(spec: KernelSpec, cfg: TileConfig, ntiles: Size, grid1: Size, splits: Size) -> tuple[str, Prologue]:
    """The combine kernel of a split kernel, as source (appended to its module) and what the launch needs: one
    program per row tile merges the pieces, then runs the kernel's epilogue and stores its roots. Its finite check
    is the split kernel's; in the fixup pass it merges again what that pass recomputed."""
    em = Emitter(dataclasses.replace(spec, check=CheckPlan()), cfg)
    em.splits = splits
    s = spec.schedule
    accs = list(s.accums.values())
    merge = _merge(em, accs)
    post = loop.finals(em, accs, 0, dict(em.cache_pre))
    stores = em.store_roots({**em.cache_pre, **post.cache})
    head = []
    if spec.check.shares:
        flag = em.buffer(FINITE, (1,), torch.float32, "intermediate")
        head = ["if MODE == 1:     # the fixup pass", f"    if tl.load({flag}) == 0:", "        return"]
    em.splits = 1                   # one program per row tile
    place = loop.placement(em, ntiles, grid1)
    body = head + ["pid = tl.program_id(0)"] + place + [f"ns = {source(splits)}"] + \
        [f"o_{v} = tl.arange(0, {em.blk[v]})" for v in s.whole] + em.pre + merge + post.lines + stores
    name = f"{spec.name}_combine"
    bufs = [plain_shape(b) for b in em.bufs.values()]
    sizes = sorted(spec.sizes)
    src = "\n\n" + "\n".join(header(name, bufs, sizes, spec.aligned, mode=True) + ["    " + ln for ln in body]) + "\n"
    return src, Prologue(name, bufs, (python(ntiles * grid1),), COMBINE_WARPS, sizes, em.limits)
