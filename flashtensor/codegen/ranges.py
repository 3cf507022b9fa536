"""Run-time tile ranges for masks read from tensors (docs/design.md §3.5): the pre-pass kernels a kernel's launch
runs first (codegen/artifact.py `Prologue`), and the lines of the kernel that load their result.

A kernel whose skipped regions hold conditions on the data (Schedule.runtime, analysis/atoms.py) gets a range
pre-pass: one program per row tile (the kernel's own row block) and entry of the batch variables those conditions
read, so a mask broadcast over heads is read once per batch entry, not once per head. The program first finds,
for each row, whether each Exists over the loop holds (a row of the mask with an unmasked element; it stops once
every row has found one), then walks the loop's tiles and keeps the first and the last one that holds an element
outside every skipped region (the compile-time ones too). The kernel's loop runs over that range, intersected with
its compile-time bounds; the tiles inside it are computed as ever, the mask applied elementwise. A row tile with a
row that no region spares (a fully masked row) thus gets the full range. An Exists over the row variable (in a
kernel over keys looping over queries: whether each query row keeps a key) is a vector over the loop, which a
pre-pass of its own finds first. The fixup pass (MODE=1) runs every tile, as it always does.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

import torch

from ..analysis.atoms import TESTS, Atom, Exists
from ..analysis.facts import Region
from ..ir.loops import Affine, LNode, Var
from ..ir.sizes import Size, ceildiv, python, source
from ..options import TileConfig
from .artifact import Prologue
from .body import Body
from .emitter import Emitter
from .spec import CheckPlan, KernelSpec
from .tiles import Tiles

PROLOGUE_WARPS = 4


class _Prepass(Emitter):
    """Prints the masks' values inside a pre-pass loop: every value in the loop body (the pre-pass tiles the row
    and loop as the kernel does, but may loop over either), no finite check."""

    def home(self, n: LNode) -> str:
        return "body"


def _batch(s: Any, conds: list) -> list[Var]:
    """The kernel's batch variables that the conditions read, in the kernel's order."""
    seen = {v for c in conds for v in c.vars}
    return [v for v in s.batch if v in seen]


def _conditions(s: Any) -> list:
    """Every condition of the run-time regions, those inside an Exists too."""
    out: list = []
    for reg in s.runtime:
        for c in reg:
            out += [c] + (list(c.region) if isinstance(c, Exists) else [])
    return out


def _vectors(s: Any) -> list[Exists]:
    """The Exists conditions over the row variable: vectors over the loop, found by a pre-pass of their own."""
    return list(dict.fromkeys(c for reg in s.runtime for c in reg if isinstance(c, Exists) and c.var is s.row))


def _inline(s: Any) -> list[Exists]:
    """The Exists conditions over the loop variable: per row, found by the range pre-pass before its walk."""
    return list(dict.fromkeys(c for reg in s.runtime for c in reg if isinstance(c, Exists) and c.var is s.loop))


def _linear(vs: list[Var]) -> tuple[str, Size]:
    """The row-major index over batch variables (their `i_v`), and the number of entries."""
    expr, count = "0", 1
    for v in vs:
        expr = f"({expr}) * {source(v.extent)} + i_{v}"
        count = count * v.extent
    return expr, count


def _range_buffer(s: Any, blk: dict[Var, int], name: str) -> tuple[tuple, tuple[Any, ...]]:
    """Key and shape of the kernel's range buffer: (batch entries, row tiles, 2) int32, each [lo, hi)."""
    _, count = _linear(_batch(s, _conditions(s)))
    shape = (count, ceildiv(s.row.extent, blk[s.row]), 2)
    return ("ranges", name, *(str(python(d)) for d in shape)), shape


def load_range(em: Tiles) -> tuple[str, str]:
    """Lines (into the kernel's `pre`) loading this program's run-time range; the names of its bounds."""
    s = em.s
    key, shape = _range_buffer(s, em.blk, em.spec.name)
    buf = em.buffer(key, shape, torch.int32, "intermediate")
    lin, _ = _linear(_batch(s, _conditions(s)))
    assert s.row is not None    # run-time regions are over a kernel's row and loop
    em.pre += [f"rt = (({lin}) * {source(shape[1])} + r0 // {em.blk[s.row]}) * 2",
               f"rlo = tl.load({buf} + rt)", f"rhi = tl.load({buf} + rt + 1)"]
    return "rlo", "rhi"


def prologues(spec: KernelSpec, cfg: TileConfig) -> tuple[str, list[Prologue]]:
    """The pre-pass kernels of a kernel with run-time regions, as source (appended to the kernel's module) and
    what the launch needs of each; none for a kernel without."""
    s = spec.schedule
    if not s.runtime:
        return "", []
    plain = dataclasses.replace(spec, check=CheckPlan())
    sources, out = [], []
    for k, ex in enumerate(_vectors(s)):
        em = _Prepass(plain, cfg)
        text, grid = _witness(em, ex, k)
        sources.append(text)
        out.append(_prologue(em, f"{spec.name}_witness{k}", grid))
    em = _Prepass(plain, cfg)
    text, grid = _ranges(em)
    sources.append(text)
    out.append(_prologue(em, f"{spec.name}_ranges", grid))
    sizes = sorted(spec.sizes)
    src = ""
    for p, body in zip(out, sources):
        head = f"def {p.name}({', '.join([b.name for b in p.buffers] + sizes)}, PDL: tl.constexpr):"
        src += "\n\n@triton.jit\n" + "\n".join([head, "    if PDL:", "        _after_prior()"] +
                                                ["    " + ln for ln in body]) + "\n"
    return src, [dataclasses.replace(p, sizes=sizes) for p in out]


def _prologue(em: Tiles, name: str, grid: Size) -> Prologue:
    bufs = [dataclasses.replace(b, shape=tuple(python(d) for d in b.shape)) for b in em.bufs.values()]
    return Prologue(name, bufs, (python(grid),), PROLOGUE_WARPS)


def _witness_buffer(em: Tiles, ex: Exists, k: int, written: bool) -> tuple[str, str]:
    """The buffer of an Exists over the row: (its batch entries, the loop's extent) int32; and this program's
    offset of its row of entries."""
    L = em.s.loop
    assert L is not None
    vs = [v for v in em.s.batch if v in ex.vars]
    lin, count = _linear(vs)
    shape: tuple[Any, ...] = (count, L.extent)
    key = ("witness", em.spec.name, k, *(str(python(d)) for d in shape))
    return em.buffer(key, shape, torch.int32, "intermediate", written), f"({lin}) * {source(L.extent)}"


def _decompose(vs: list[Var], rest: str) -> list[str]:
    """The batch indices i_v of a linear index (row-major over vs)."""
    out = []
    for v in reversed(vs):
        out.append(f"i_{v} = {rest} % {source(v.extent)}")
        rest = f"({rest} // {source(v.extent)})"
    return out


def _witness(em: Tiles, ex: Exists, k: int) -> tuple[list[str], Size]:
    """The pre-pass of an Exists over the row: per batch entry and tile of the loop, whether some row satisfies
    its region, walking the rows until every position has found one."""
    s = em.s
    R, L = s.row, s.loop
    assert R is not None and L is not None
    br, bl = em.blk[R], em.blk[L]
    buf, base = _witness_buffer(em, ex, k, True)
    vs = [v for v in s.batch if v in ex.vars]
    nt = ceildiv(L.extent, bl)
    ctx = Body(0, frozenset(), True, {})
    cond = _conjunction(em, ex.region, ctx)
    lines = ["pid = tl.program_id(0)", f"t = pid % {source(nt)}", f"b = pid // {source(nt)}"] + _decompose(vs, "b") + [
        f"o_{L} = t * {bl} + tl.arange(0, {bl})",
        f"found = tl.zeros([{bl}], tl.int32)",
        "more = tl.min(found, 0) == 0",
        "r0 = tl.zeros([], tl.int32)",
        f"while (r0 < {source(R.extent)}) & more:",
        f"    o_{R} = r0 + tl.arange(0, {br})"] + ["    " + ln for ln in ctx.lines] + [
        f"    ok = (o_{R}[:, None] < {source(R.extent)}) & (o_{L}[None, :] < {source(L.extent)})",
        f"    found = tl.maximum(found, tl.max(({cond} & ok).to(tl.int32), axis=0))",
        f"    more = tl.min(tl.where(o_{L} < {source(L.extent)}, found, 1), 0) == 0",
        f"    r0 += {br}",
        f"tl.store({buf} + {base} + o_{L}, found, mask=o_{L} < {source(L.extent)})"]
    return lines, nt * math.prod(v.extent for v in vs)


def _ranges(em: Tiles) -> tuple[list[str], Size]:
    """The range pre-pass: per batch entry and row tile, the first and last loop tile with an element outside
    every skipped region (compile-time and run-time), as [lo, hi) in loop positions (lo = hi past the last tile
    when there is none)."""
    s = em.s
    R, L = s.row, s.loop
    assert R is not None and L is not None
    br, bl = em.blk[R], em.blk[L]
    key, shape = _range_buffer(s, em.blk, em.spec.name)
    buf = em.buffer(key, shape, torch.int32, "intermediate", written=True)
    vs = _batch(s, _conditions(s))
    nt = shape[1]
    ext_r, ext_l = source(R.extent), source(L.extent)
    lines = ["pid = tl.program_id(0)", f"t = pid % {source(nt)}", f"b = pid // {source(nt)}"] + _decompose(vs, "b") + [
        f"o_{R} = t * {br} + tl.arange(0, {br})", f"rows = o_{R} < {ext_r}"]
    inline = _inline(s)
    names: dict[Exists, str] = {}
    if inline:      # per row, whether each Exists over the loop holds; the walk stops once all of them do
        ctx = Body(0, frozenset(), True, {})
        found = []
        for k, ex in enumerate(inline):
            names[ex] = f"e{k}"
            found.append(f"    e{k} = tl.maximum(e{k}, tl.max(({_conjunction(em, ex.region, ctx)} & ok).to(tl.int32), "
                         "axis=1))")
        every = " & ".join(f"(e{k} != 0)" for k in range(len(inline)))
        lines += [f"e{k} = tl.zeros([{br}], tl.int32)" for k in range(len(inline))] + [
            f"more = tl.min(tl.where(rows, ({every}).to(tl.int32), 1), 0) == 0",
            "l0 = tl.zeros([], tl.int32)",
            f"while (l0 < {ext_l}) & more:",
            f"    o_{L} = l0 + tl.arange(0, {bl})",
            f"    ok = rows[:, None] & (o_{L}[None, :] < {ext_l})"] + ["    " + ln for ln in ctx.lines] + found + [
            f"    more = tl.min(tl.where(rows, ({every}).to(tl.int32), 1), 0) == 0",
            f"    l0 += {bl}"]
    # the walk: from the first tile on until one holds an element outside every skipped region, then from the
    # last one back; the tiles between are not read
    span = f"{source(ceildiv(L.extent, bl))} * {bl}"
    lines += ["lo = tl.zeros([], tl.int32)", "more = lo == 0", f"while (lo < {ext_l}) & more:"]
    lines += _live(em, "lo", names) + [f"    lo += tl.where(more, {bl}, 0)"]
    lines += [f"hi = tl.zeros([], tl.int32) + {span}", "more = hi > lo", "while (hi > lo) & more:"]
    lines += _live(em, f"hi - {bl}", names) + [f"    hi -= tl.where(more, {bl}, 0)"]
    lines += [f"tl.store({buf} + pid * 2, lo)", f"tl.store({buf} + pid * 2 + 1, hi)"]
    return lines, shape[0] * nt


def _live(em: Tiles, start: str, names: dict[Exists, str]) -> list[str]:
    """The loop body of the walk over the tile at `start`: `more` stays true while every element of the tile lies
    in some skipped region (or past the extents)."""
    s = em.s
    R, L = s.row, s.loop
    assert R is not None and L is not None
    ext_l = source(L.extent)
    ctx = Body(0, frozenset(), True, {})
    loads = []
    for k, ex in enumerate(_vectors(s)):
        wbuf, base = _witness_buffer(em, ex, k, False)
        names[ex] = f"w{k}"
        loads.append(f"    w{k} = tl.load({wbuf} + {base} + o_{L}, mask=o_{L} < {ext_l}, other=0)")
    skipped = " | ".join(f"({_conjunction(em, reg, ctx, names)})" for reg in list(s.skip) + list(s.runtime))
    head = [f"    o_{L} = {start} + tl.arange(0, {em.blk[L]})", f"    ok = rows[:, None] & (o_{L}[None, :] < {ext_l})"]
    return head + loads + ["    " + ln for ln in ctx.lines] + \
        [f"    more = tl.max(tl.ravel((({skipped}) == 0) & ok).to(tl.int32), 0) == 0"]


def _conjunction(em: Tiles, region: Union[Region, tuple], ctx: Body, names: dict | None = None) -> str:
    """A region as a Triton condition over the (row, loop) tile; Exists conditions by the names they were found
    under (`names`: a row vector for one over the loop, a loop vector for one over the row)."""
    s = em.s
    assert s.row is not None and s.loop is not None     # run-time regions are over a kernel's row and loop
    tv = [s.row, s.loop]
    parts = []
    for c in region:
        if isinstance(c, Affine):
            parts.append(f"({em.affine(c, tv)} >= 0)")
        elif isinstance(c, Atom):
            parts.append(f"({em.arg(c.node, tv, ctx)} {TESTS[c.test]})")
        else:
            assert names is not None and c in names     # an Exists found before the walk
            parts.append(f"({names[c]} != 0)" + ("[:, None]" if c.var is s.loop else "[None, :]"))
    return " & ".join(parts) or "True"
