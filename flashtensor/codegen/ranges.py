"""Run-time tile ranges for masks read from tensors (docs/design.md §3.5): the pre-pass kernels a kernel's launch
runs first (codegen/artifact.py `Prologue`), and the lines of the kernel that load their result.

A kernel whose skipped regions hold conditions on the data (Schedule.runtime, analysis/atoms.py) gets a range
pre-pass, one program per block of rows (a part of the kernel's row tile, so that every multiprocessor reads) and
entry of the batch variables those conditions read: a mask broadcast over heads is read once per batch entry, not
once per head. It reads the mask once, in pipelined steps of several loop tiles, and keeps the first and the last
loop tile that holds an element outside every skipped region (the compile-time ones too). An Exists over the loop
(a row of the mask that keeps an element) is a condition on each row, known at the end: a block with a row that has
none (a fully masked row) takes the range outside the regions without such a condition, the full one where every
region has it. The kernel's loop runs over the union of its row blocks' ranges, intersected with its compile-time
bounds; the tiles inside it are computed as ever, the mask applied elementwise. An Exists over the row variable (in
a kernel over keys looping over queries: whether each query keeps a key) is a vector over the loop, found by a
pre-pass of its own before. The fixup pass (MODE=1) runs every tile, as it always does.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Union

import torch

from ..analysis.atoms import TESTS, Atom, Exists, kept
from ..analysis.facts import Region
from ..ir.loops import Affine, LNode, Var
from ..ir.sizes import Size, ceildiv, python, source
from ..options import TileConfig
from .artifact import Prologue, header
from .body import Body
from .emitter import Emitter
from .lower import pow2
from .spec import CheckPlan, KernelSpec
from .tiles import Tiles

WARPS = 8        # of a pre-pass program
ROWS = 32        # rows per program of the range pre-pass
STEP = 8192      # elements per step of its loop (several loop tiles)
STAGES = 3       # its loads in flight
UNION = ("min", "max", "max", "min", "max", "min")     # a row tile's bounds from its row blocks'


class _Prepass(Emitter):
    """Prints the masks' values inside a pre-pass loop: every value in the loop body (a pre-pass may loop over the
    row or the loop variable), no finite check."""

    def home(self, n: LNode) -> str:
        return "body"


def prologues(spec: KernelSpec, cfg: TileConfig) -> tuple[str, list[Prologue]]:
    """The pre-pass kernels of a kernel with run-time regions, as source (appended to the kernel's module) and
    what the launch needs of each; none for a kernel without."""
    s = spec.schedule
    if not s.runtime:
        return "", []
    plain = dataclasses.replace(spec, check=CheckPlan())
    made = []
    for k, ex in enumerate(_vectors(s)):
        em = _Prepass(plain, cfg)
        made.append((em, f"{spec.name}_witness{k}", *_witness(em, ex, k)))
    em = _Prepass(plain, cfg)
    made.append((em, f"{spec.name}_ranges", *_ranges(em)))
    em = _Prepass(plain, cfg)
    made.append((em, f"{spec.name}_order", *_order(em)))
    sizes = sorted(spec.sizes)
    src, out = "", []
    for em, name, body, grid in made:
        bufs = [dataclasses.replace(b, shape=tuple(python(d) for d in b.shape)) for b in em.bufs.values()]
        src += "\n\n" + "\n".join(header(name, bufs, sizes, spec.aligned, mode=False) +
                                   ["    " + ln for ln in body]) + "\n"
        out.append(Prologue(name, bufs, (python(grid),), WARPS, sizes, em.limits))
    return src, out


def load_range(em: Tiles) -> tuple[str, ...]:
    """Lines (into the kernel's `pre`) loading this program's run-time bounds: the union of its row blocks' ranges,
    the part of their gaps and of their runs of kept tiles they all share; the names of the bounds (rlo, rhi, rga,
    rgb, and rfa, rfb where the masks keep elements)."""
    s = em.s
    assert s.row is not None    # run-time regions are over a kernel's row and loop
    br = em.blk[s.row]
    _, split = _split(br)
    key, shape = _range_buffer(em, split)
    buf = em.buffer(key, shape, torch.int32, "intermediate")
    n = shape[2]
    at = f"(({_linear(_batch(s))[0]}) * {source(shape[1])} + r0 // {br} * {split}) * {n}"
    names = ("rlo", "rhi", "rga", "rgb", "rfa", "rfb")[:n]
    if split == 1:
        em.pre += [f"rt = {at}"] + [f"{x} = tl.load({buf} + rt + {k})" for k, x in enumerate(names)]
    else:
        em.pre += [f"rt = {at} + tl.arange(0, {split}) * {n}"]
        em.pre += [f"{x} = tl.{fn}(tl.load({buf} + rt + {k}), 0)" for k, (x, fn) in enumerate(zip(names, UNION))]
    return names


def load_order(em: Tiles) -> list[str]:
    """The line mapping this program's row tile `t` (in launch order) to the row tile it computes, by the order the
    pre-pass sorted them in (after the batch indices i_v)."""
    buf, base = _order_buffer(em, False)
    return [f"t = tl.load({buf} + {base} + t)"]


# ---- what the pre-passes read and write -----------------------------------------------------------------------

def _batch(s: Any) -> list[Var]:
    """The kernel's batch variables that the run-time regions' conditions read, in the kernel's order."""
    seen = {v for reg in s.runtime for c in reg for v in c.vars} | \
        {v for reg in s.runtime for c in reg if isinstance(c, Exists) for x in c.region for v in x.vars}
    return [v for v in s.batch if v in seen]


def _vectors(s: Any) -> list[Exists]:
    """The Exists conditions over the row variable: vectors over the loop, found by a pre-pass of their own."""
    return list(dict.fromkeys(c for reg in s.runtime for c in reg if isinstance(c, Exists) and c.var is s.row))


def _inline(s: Any) -> list[Exists]:
    """The Exists conditions over the loop variable: per row, found by the range pre-pass as it reads."""
    return list(dict.fromkeys(c for reg in s.runtime for c in reg if isinstance(c, Exists) and c.var is s.loop))


def _linear(vs: list[Var]) -> tuple[str, Size]:
    """The row-major index over batch variables (their `i_v`), and the number of entries."""
    expr, count = "0", 1
    for v in vs:
        expr = f"({expr}) * {source(v.extent)} + i_{v}"
        count = count * v.extent
    return expr, count


def _decompose(vs: list[Var], rest: str) -> list[str]:
    """The batch indices i_v of a linear index (row-major over vs)."""
    out = []
    for v in reversed(vs):
        out.append(f"i_{v} = {rest} % {source(v.extent)}")
        rest = f"({rest} // {source(v.extent)})"
    return out


def _split(br: int) -> tuple[int, int]:
    """Rows per range pre-pass program, and its programs per row tile of the kernel: blocks of ROWS rows keep the
    multiprocessors reading (32 row tiles of 128 at S=4096 would leave most of an H200's 132 idle)."""
    rows = min(br, ROWS)
    return rows, br // rows


def _range_buffer(em: Tiles, split: int) -> tuple[tuple, tuple[Any, ...]]:
    """Key and shape of the kernel's range buffer: (batch entries, row tiles times `split`, 4 or 6) int32, each a
    row block's range [lo, hi), the largest gap [ga, gb) inside it and, where the masks keep elements, the longest
    run [fa, fb) of tiles whose every element they keep."""
    s = em.s
    assert s.row is not None
    shape = (_linear(_batch(s))[1], ceildiv(s.row.extent, em.blk[s.row]) * split, 6 if kept_atoms(s) else 4)
    return ("ranges", em.spec.name, *(str(python(d)) for d in shape)), shape


def _order_buffer(em: Tiles, written: bool) -> tuple[str, str]:
    """The buffer of the row tiles' launch order, (batch entries, row tiles) int32, and the offset of this program's
    entry."""
    s = em.s
    assert s.row is not None
    lin, count = _linear(_batch(s))
    nt = ceildiv(s.row.extent, em.blk[s.row])
    shape: tuple[Any, ...] = (count, nt)
    key = ("order", em.spec.name, *(str(python(d)) for d in shape))
    return em.buffer(key, shape, torch.int32, "intermediate", written), f"({lin}) * {source(nt)}"


def _witness_buffer(em: Tiles, ex: Exists, k: int, written: bool) -> tuple[str, str]:
    """The buffer of an Exists over the row, (its batch entries, the loop's extent) int32, and the offset of this
    program's entry."""
    L = em.s.loop
    assert L is not None
    lin, count = _linear([v for v in em.s.batch if v in ex.vars])
    shape: tuple[Any, ...] = (count, L.extent)
    key = ("witness", em.spec.name, k, *(str(python(d)) for d in shape))
    return em.buffer(key, shape, torch.int32, "intermediate", written), f"({lin}) * {source(L.extent)}"


# ---- the pre-passes -------------------------------------------------------------------------------------------

def _witness(em: Tiles, ex: Exists, k: int) -> tuple[list[str], Size]:
    """The pre-pass of an Exists over the row: per batch entry and tile of the loop, whether some row satisfies its
    region, walking the row tiles until every position has found one (at the first, mostly)."""
    s = em.s
    R, L = s.row, s.loop
    assert R is not None and L is not None
    br, bl = em.blk[R], em.blk[L]
    ext_r, ext_l = source(R.extent), source(L.extent)
    buf, base = _witness_buffer(em, ex, k, True)
    vs = [v for v in s.batch if v in ex.vars]
    nt = ceildiv(L.extent, bl)
    ctx = Body(0, frozenset(), True, {})
    cond = _conjunction(em, ex.region, ctx, {})
    lines = ["pid = tl.program_id(0)", f"t = pid % {source(nt)}", f"b = pid // {source(nt)}"] + _decompose(vs, "b")
    lines += [f"o_{L} = t * {bl} + tl.arange(0, {bl})", f"found = tl.zeros([{bl}], tl.int32)",
              "more = tl.min(found, 0) == 0", "r0 = tl.zeros([], tl.int32)", f"while (r0 < {ext_r}) & more:",
              f"    o_{R} = r0 + tl.arange(0, {br})"] + ["    " + ln for ln in ctx.lines]
    lines += [f"    ok = (o_{R}[:, None] < {ext_r}) & (o_{L}[None, :] < {ext_l})",
              f"    found = tl.maximum(found, tl.max(({cond} & ok).to(tl.int32), axis=0))",
              f"    more = tl.min(tl.where(o_{L} < {ext_l}, found, 1), 0) == 0", f"    r0 += {br}",
              f"tl.store({buf} + {base} + o_{L}, found, mask=o_{L} < {ext_l})"]
    return lines, nt * math.prod(v.extent for v in vs)


def _ranges(em: Tiles) -> tuple[list[str], Size]:
    """The range pre-pass: per batch entry and block of rows, the first and last loop tile with an element outside
    every skipped region, as [lo, hi) in loop positions, or (past the last tile, 0) where there is none."""
    s = em.s
    R, L = s.row, s.loop
    assert R is not None and L is not None
    rows, split = _split(em.blk[R])
    key, shape = _range_buffer(em, split)
    buf = em.buffer(key, shape, torch.int32, "intermediate", written=True)
    bl = em.blk[L]
    em.blk[R] = rows            # the pre-pass's own tile: a block of rows, several loop tiles wide
    k = max(1, min(STEP // (rows * bl), pow2(em.bucket(L.extent)) // bl))
    em.blk[L] = width = k * bl
    ext_r, ext_l = source(R.extent), source(L.extent)
    inline, ctx = _inline(s), Body(0, frozenset(), True, {})
    names = {ex: f"e{n}" for n, ex in enumerate(inline)}
    loads = []
    for n, ex in enumerate(_vectors(s)):
        wbuf, base = _witness_buffer(em, ex, n, False)
        names[ex] = f"w{n}"
        loads.append(f"    w{n} = tl.load({wbuf} + {base} + o_{L}, mask=o_{L} < {ext_l}, other=0)")
    found = [f"    e{n} = tl.maximum(e{n}, tl.max(({_conjunction(em, ex.region, ctx, {})} & ok).to(tl.int32), axis=1))"
             for n, ex in enumerate(inline)]
    regions = list(s.skip) + list(s.runtime)
    # "a": every region, its Exists over the loop taken to hold; "b": the regions without one
    kinds = {"a": [tuple(c for c in reg if c not in inline) for reg in regions]}
    if inline:
        kinds["b"] = [reg for reg in regions if not any(c in inline for c in reg)]
    past = f"{source(ceildiv(L.extent, bl))} * {bl}"
    lines = ["pid = tl.program_id(0)", f"t = pid % {source(shape[1])}", f"b = pid // {source(shape[1])}"]
    lines += _decompose(_batch(s), "b") + [f"o_{R} = t * {rows} + tl.arange(0, {rows})", f"rows = o_{R} < {ext_r}"]
    lines += [f"e{n} = tl.zeros([{rows}], tl.int32)" for n in range(len(inline))]
    lines += [f"sub = tl.arange(0, {k})"] if k > 1 else []
    for x in kinds:     # the range so far, the end of its last live tile, the largest gap so far
        lines += [f"lo_{x} = tl.zeros([], tl.int32) + {past}", f"hi_{x} = tl.zeros([], tl.int32)",
                  f"end_{x} = tl.zeros([], tl.int32) - 1", f"ga_{x} = tl.zeros([], tl.int32)",
                  f"gb_{x} = tl.zeros([], tl.int32)"]
    step = []
    for x, regs in kinds.items():
        live = f"((({' | '.join(f'({_conjunction(em, r, ctx, names)})' for r in regs) or 'False'}) == 0) & ok)"
        if k > 1:       # each loop tile's flag, from the step's
            tiles = f"tl.reshape({live}.to(tl.int32), ({rows}, {k}, {bl}))"
            step += [f"    live_{x} = tl.max(tl.max({tiles}, axis=2), axis=0)"]
            flags = [f"tl.sum(tl.where(sub == {j}, live_{x}, 0), 0)" for j in range(k)]
        else:
            step += [f"    live_{x} = tl.max(tl.ravel({live}.to(tl.int32)), 0)"]
            flags = [f"live_{x}"]
        for j, flag in enumerate(flags):
            at = f"l0 + {j * bl}"
            step += [f"    f_{x} = {flag} != 0",
                     f"    wider = f_{x} & (end_{x} >= 0) & ({at} - end_{x} > gb_{x} - ga_{x})",
                     f"    ga_{x} = tl.where(wider, end_{x}, ga_{x})", f"    gb_{x} = tl.where(wider, {at}, gb_{x})",
                     f"    end_{x} = tl.where(f_{x}, {at} + {bl}, end_{x})",
                     f"    lo_{x} = tl.where(f_{x}, tl.minimum(lo_{x}, {at}), lo_{x})",
                     f"    hi_{x} = tl.where(f_{x}, {at} + {bl}, hi_{x})"]
    full = kept_atoms(s)
    if full:    # the longest run of tiles whose every element the masks keep: run with their constants in place
        whole = f"(({_conjunction(em, tuple(full), ctx, names)}) | (ok == 0)).to(tl.int32)"
        lines += ["run = tl.zeros([], tl.int32) - 1", "fa = tl.zeros([], tl.int32)", "fb = tl.zeros([], tl.int32)"]
        if k > 1:
            step += [f"    kept = tl.min(tl.min(tl.reshape({whole}, ({rows}, {k}, {bl})), axis=2), axis=0)"]
            flags = [f"tl.sum(tl.where(sub == {j}, kept, 0), 0)" for j in range(k)]
        else:
            step += [f"    kept = tl.min(tl.ravel({whole}), 0)"]
            flags = ["kept"]
        for j, flag in enumerate(flags):
            at = f"l0 + {j * bl}"
            step += [f"    ff = ({flag} != 0) & ({at} < {ext_l})",      # a tile past the extent is none
                     f"    run = tl.where(ff, tl.where(run < 0, {at}, run), -1)",
                     f"    longer = ff & ({at} + {bl} - run > fb - fa)",
                     "    fa = tl.where(longer, run, fa)", f"    fb = tl.where(longer, {at} + {bl}, fb)"]
    lines += [f"for l0 in tl.range(0, {ext_l}, {width}, num_stages={STAGES}):",
              f"    o_{L} = l0 + tl.arange(0, {width})", f"    ok = rows[:, None] & (o_{L}[None, :] < {ext_l})"]
    lines += loads + ["    " + ln for ln in ctx.lines]
    lines += found + step
    bounds = ("lo", "hi", "ga", "gb")
    if inline:
        every = " & ".join(f"(e{n} != 0)" for n in range(len(inline)))
        lines += [f"every = tl.min(tl.where(rows, ({every}).to(tl.int32), 1), 0) != 0"]
        lines += [f"{x} = tl.where(every, {x}_a, {x}_b)" for x in bounds]
    else:
        lines += [f"{x} = {x}_a" for x in bounds]
    # a block without a live tile is all gap (its rows share any gap of the others)
    lines += [f"gb = tl.where(lo < hi, gb, {past})"]
    stored = bounds + (("fa", "fb") if full else ())
    return lines + [f"tl.store({buf} + pid * {len(stored)} + {n}, {x})" for n, x in enumerate(stored)], \
        shape[0] * shape[1]


def _order(em: Tiles) -> tuple[list[str], Size]:
    """The launch order of each batch entry's row tiles: the most loop tiles first (ties in row order), so that the
    last wave of programs is short, sorted by key. One program per batch entry."""
    s = em.s
    R, L = s.row, s.loop
    assert R is not None and L is not None
    br = em.blk[R]
    _, split = _split(br)
    key, shape = _range_buffer(em, split)
    rng = em.buffer(key, shape, torch.int32, "intermediate")
    buf, _ = _order_buffer(em, True)
    nt, n = ceildiv(R.extent, br), shape[2]
    span = pow2(-(-em.bucket(R.extent) // br), 1)      # the row tiles at the extent the kernel is emitted for
    lines = ["b = tl.program_id(0)", f"t = tl.arange(0, {span})", f"ok = t < {source(nt)}"]
    # a shape-generic plan's longer calls keep the rows' order (the sort holds `span` row tiles)
    lines += [f"for c in range(0, {source(nt)} * ({source(nt)} > {span}), {span}):",
              f"    tl.store({buf} + b * {source(nt)} + c + t, c + t, mask=c + t < {source(nt)})"]
    for k, (x, fn) in enumerate(zip(("lo", "hi", "ga", "gb"), UNION)):
        parts = [f"tl.load({rng} + ((b * {source(nt)} + t) * {split} + {j}) * {n} + {k}, mask=ok, other=0)"
                 for j in range(split)]
        expr = parts[0]
        for p in parts[1:]:
            expr = f"tl.{'minimum' if fn == 'min' else 'maximum'}({expr}, {p})"
        lines.append(f"{x} = {expr}")
    lines += [f"hi = tl.minimum(hi, {source(L.extent)})", "ga = tl.minimum(tl.maximum(ga, lo), hi)",
              "gb = tl.maximum(ga, tl.minimum(gb, hi))",
              "work = tl.maximum(hi - lo, 0) - (gb - ga)",
              f"order = tl.sort(tl.where(ok, work.to(tl.int64) * {span} + ({span} - 1 - t), -1), descending=True)",
              f"tl.store({buf} + b * {source(nt)} + t, ({span} - 1 - order % {span}).to(tl.int32), "
              f"mask=ok & ({source(nt)} <= {span}))"]
    return lines, shape[0]


def kept_atoms(s: Any) -> list[Atom]:
    """What holds where the run-time regions' masks keep every element (atoms.kept): a run of such tiles, which the
    pre-pass finds, runs with the masks' constants in place (a bool mask's true, an additive mask's 0), as
    FlexAttention's full blocks do."""
    return list(dict.fromkeys(a for reg in s.runtime for a in kept(reg)))


def _conjunction(em: Tiles, region: Union[Region, tuple], ctx: Body, names: dict[Exists, str]) -> str:
    """A region as a Triton condition over the (row, loop) tile; an Exists by the name it is held under (a row
    vector for one over the loop, a loop vector for one over the row)."""
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
            parts.append(f"({names[c]} != 0)" + ("[:, None]" if c.var is s.loop else "[None, :]"))
    return " & ".join(parts) or "True"
