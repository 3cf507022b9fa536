"""The loop's structure in a kernel: its segments, one tile step of every accumulator, and the program's place.

The loop over the loop variable runs in segments (a predicated head, the unpredicated bulk, a predicated
tail, and tiles with a constant-folded body); skipped tiles are left out. One step updates the running
maxima first, then every accumulator of the pass, rescaled where a running max moved.
"""
from __future__ import annotations

import ast
import math
import operator
import re
from typing import TYPE_CHECKING, Optional

from ..analysis.facts import IDENTITY, negate
from ..ir.loops import Affine, LNode, Var
from ..ir.sizes import Size, ceildiv, hint, source, symbolic
from ..schedule.schedule import Accum, Schedule, ScheduleError
from . import check, forms, ranges
from .body import Body
from .lower import lit
from .tiles import Tiles

if TYPE_CHECKING:
    from .emitter import Emitter


def segments(em: Tiles) -> list[tuple[str, str, frozenset, bool]]:
    """Loop ranges in order, each with the half-planes that hold on all its tiles and whether it needs
    bounds tests. The loop runs over [lo, hi), less the gap [ga, gb) of a skipped region bounded on both sides
    (the keys between attention sinks and a window); each of the one or two pieces is a predicated head, a bulk
    (wholly outside every skipped region and special half-plane) and a predicated tail, and the tiles wholly
    inside the special half-plane come before the first head or after the last tail. Every range that is not
    empty starts at a multiple of the loop block (an empty one may start at hi)."""
    s, L = em.s, em.s.loop
    assert L is not None    # kernels without a loop have no segments
    if s.stepped:           # one value per step, every value: one segment without bounds tests
        em.pre += ["lo = 0", f"hi = {source(L.extent)}"]
        return [("lo", "hi", frozenset(), False)]
    bl = em.blk[L]
    lo, hi = ["0"], [source(L.extent)]
    full = source((L.extent // bl) * bl)      # the end of the last whole tile
    ulo, uhi = ["0"], [full]
    live: set[Affine] = set()
    gap = None
    for reg in s.skip:
        up = [h for h in reg if h.coeff(L) > 0]       # holds from some position of the loop on
        down = [h for h in reg if h.coeff(L) < 0]     # holds up to some position
        rows = " & ".join(f"({_span(em, h)[1]} >= 0)" for h in reg if not h.coeff(L))   # on every row of the tile
        if reg == s.gap:
            gap = (up, down, rows)
            continue
        inside = _fold("tl.maximum" if up else "tl.minimum", [_inside(em, h) for h in up or down])
        if rows:
            inside = f"tl.where({rows}, {inside}, {hi[0] if up else lo[0]})"
        (hi if up else lo).append(inside)
        for h in up or down:      # the bulk is wholly outside each of them
            _outside(em, h, ulo, uhi)
            live.add(negate(h))
    for h in s.special:
        _outside(em, h, ulo, uhi)
        live.add(negate(h))
    bounds: tuple[str, ...] = ()
    if s.runtime:       # the range a pre-pass found outside the regions over masks read from tensors
        bounds = ranges.load_range(em)
        lo.append(bounds[0])
        hi.append(bounds[1])
        for h in _planes(s):      # the bulk also stays outside their one-sided half-planes: they fold there too
            _outside(em, h, ulo, uhi)
            live.add(negate(h))
    if s.skip or s.special or s.runtime:
        # skipping and constant folding rely on finite inputs (x + -inf = -inf): `fin` is 0 in the fixup
        # pass, where every tile is computed, predicated, as eager computes it (see emit_kernel)
        em.pre.append(f"lo = {_fold('tl.maximum', lo)} * fin")
        em.pre.append(f"hi = {source(L.extent)} - ({source(L.extent)} - {_fold('tl.minimum', hi)}) * fin")
    else:
        em.pre.append("lo = 0")
        em.pre.append(f"hi = {source(L.extent)}")
    if em.split:
        # this program's piece [slo, shi) of the loop, whole tiles; an empty one past the last tile. Its bounds are
        # multiples of the block, so an empty piece is an empty range of tiles too (loop_header counts tiles)
        nt = source(ceildiv(L.extent, bl))
        piece = [f"slo = tl.minimum(sid * (({nt} + ns - 1) // ns), {nt}) * {bl}",
                 f"shi = tl.minimum(slo + (({nt} + ns - 1) // ns) * {bl}, {nt} * {bl})",
                 "lo = tl.minimum(tl.maximum(lo, slo), shi)", "hi = tl.maximum(lo, tl.minimum(hi, shi))"]
        # a count of 1 at these sizes (SPLIT 0): the whole loop, its bounds as the unsplit kernel's, so that the
        # compiler sees what it can fold (a causal kernel's empty first segment)
        em.pre += ["if SPLIT:"] + ["    " + ln for ln in piece] + ["else:", "    slo = 0", f"    shi = {nt} * {bl}"] \
            if em.runtime_split else piece
    pieces = [("lo", "hi", ulo, uhi, live)]
    if s.runtime_gap:   # the largest gap the pre-pass found: every loop steps over it (loop_header)
        em.pre.append(f"ga = tl.minimum(tl.maximum({bounds[2]}, lo), hi)")
        em.pre.append(f"gb = ga + (tl.maximum(ga, tl.minimum({bounds[3]}, hi)) - ga) * fin")
    if gap is not None:
        ups, downs, rows = gap
        start = f"({_fold('tl.maximum', [_inside(em, h) for h in ups])} + {bl - 1}) // {bl} * {bl}"
        stop = _fold("tl.minimum", [_inside(em, h) for h in downs])
        em.pre.append(f"ga = tl.minimum(tl.maximum({start}, lo), hi)")
        em.pre.append(f"gb = ga + (tl.maximum(ga, tl.minimum({f'tl.where({rows}, {stop}, 0)' if rows else stop}, hi))"
                      " - ga) * fin")
        pieces = [("lo", "ga", ulo, list(uhi), live | {negate(h) for h in ups}),
                  ("gb", "hi", list(ulo), uhi, live | {negate(h) for h in downs})]
        for h in ups:
            _outside(em, h, [], pieces[0][3])
        for h in downs:
            _outside(em, h, pieces[1][2], [])
    segs: list[tuple[str, str, frozenset, bool]] = []
    none: frozenset[Affine] = frozenset()
    for k, (a, b, los, his, bulk) in enumerate(pieces):
        ua, ub = ("ua", "ub") if k == 0 else ("ua2", "ub2")
        em.pre.append(f"{ua} = tl.minimum(tl.maximum({_fold('tl.maximum', los)}, {a}), {b})")
        # the bulk ends by `hi` where a run-time range may end before the compile-time bulk does
        em.pre.append(f"{ub} = tl.maximum({ua}, "
                      f"{_fold('tl.minimum', his + ([b] if b != 'hi' or s.runtime or em.split else []))})")
        head, tail, tested = _head_and_tail(em, k, a, ua, ub, full)
        segs += [(a, head, none, tested)] + _bulk(em, k, ua, ub, frozenset(bulk), bounds[4:]) + [(tail, b, none, True)]
    for h in s.special:
        cl, kmin, _ = _span(em, h)
        if cl > 0:      # from the first tile wholly inside h to the end
            tail = segs[-1][0]
            first = f"(((tl.maximum(-{kmin}, 0) + {cl - 1}) // {cl}) + {bl - 1}) // {bl} * {bl}"
            em.pre.append(f"sp = hi - (hi - tl.minimum(tl.maximum({first}, {tail}), hi)) * fin")
            segs = segs[:-1] + [(tail, "sp", none, True), ("sp", "hi", frozenset([h]), True)]
        else:           # from the start to the last tile wholly inside h
            _, head, _, tested = segs[0]
            end = f"(tl.maximum({kmin} + {-cl}, 0) // {-cl}) // {bl} * {bl}"
            em.pre.append(f"sp = lo + (tl.minimum(tl.maximum({end}, lo), {head}) - lo) * fin")
            segs = [("lo", "sp", frozenset([h]), tested), ("sp", head, none, tested)] + segs[1:]
    return segs


def empty_in(em: Tiles, lo: str, hi: str) -> set[int]:
    """The passes (`fin`: 1 the first, 0 the fixup) in which segment [lo, hi) is empty at compile time, its bounds
    folding to constants there. An early-exit loop (a `while`) over a range Triton folds to empty fails in its
    sm_90 pipeline (TritonGPUCoalesce, Triton 3.6), so emit_kernel leaves such segments out."""
    empty = set()
    for fin in (0, 1):
        env: dict[str, int] = {"fin": fin}
        for line in em.pre:
            name, eq, expr = line.partition(" = ")
            if eq and name.isidentifier():
                value = _static(ast.parse(expr, mode="eval").body, env)
                if value is None:
                    env.pop(name, None)
                else:
                    env[name] = value
        a, b = (_static(ast.parse(x, mode="eval").body, env) for x in (lo, hi))
        if a is not None and b is not None and a >= b:
            empty.add(fin)
    return empty


_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_CALLS = {"tl.minimum": min, "tl.maximum": max}


def _static(x: ast.expr, env: dict[str, int]) -> Optional[int]:
    """The value of an integer bound expression whose names all have values in `env`; None otherwise (a size
    argument, a pre-pass's range, a row index) and where Triton's integer division might round otherwise."""
    if isinstance(x, ast.Constant):
        return x.value if type(x.value) is int else None
    if isinstance(x, ast.Name):
        return env.get(x.id)
    if isinstance(x, ast.UnaryOp) and isinstance(x.op, ast.USub):
        v = _static(x.operand, env)
        return None if v is None else -v
    if isinstance(x, ast.BinOp):
        a, b = _static(x.left, env), _static(x.right, env)
        if a is None or b is None:
            return None
        if type(x.op) in _ARITH:
            return _ARITH[type(x.op)](a, b)
        return a // b if isinstance(x.op, ast.FloorDiv) and a >= 0 and b > 0 else None
    if isinstance(x, ast.Call) and ast.unparse(x.func) in _CALLS and x.args and not x.keywords:
        known = [v for a in x.args if (v := _static(a, env)) is not None]
        return _CALLS[ast.unparse(x.func)](known) if len(known) == len(x.args) else None
    return None


def _head_and_tail(em: Tiles, k: int, a: str, ua: str, ub: str, full: str) -> tuple[str, str, bool]:
    """The head segment's end, the tail's start, and whether the head tests the loop's bounds. Where the last tile
    can be partial, the head [a, ua) ends by the last whole tile (`full`), so it needs no bounds test (only its
    masks), and the tail, which keeps the tests, starts at the head's end where the head reached past that tile
    (the bulk [ua, ub) is then empty: it ends by that tile too); a generic causal kernel's head otherwise holds a
    second copy of the tail's bounds tests. Elsewhere the head [a, ua) and the tail [ub, ...) as they are."""
    L = em.s.loop
    assert L is not None
    if not em.partial(L):
        return ua, ub, True
    ha, ta = ("ha", "ta") if k == 0 else ("ha2", "ta2")
    em.pre.append(f"{ha} = tl.minimum({ua}, tl.maximum({a}, {full}))")
    em.pre.append(f"{ta} = {ub} - ({ua} - {ha})")
    return ha, ta, False


def _bulk(em: Tiles, k: int, ua: str, ub: str, region: frozenset, kept: tuple[str, ...]) -> list:
    """The bulk segment [ua, ub); where a pre-pass found a run [rfa, rfb) of tiles whose masks keep every element
    (`kept`), the part of it inside the bulk runs with their constants in place (ranges.kept_atoms)."""
    if not kept:
        return [(ua, ub, region, False)]
    fa, fb = f"fa{k}", f"fb{k}"
    em.pre.append(f"{fa} = tl.minimum(tl.maximum({kept[0]}, {ua}), {ub})")
    em.pre.append(f"{fb} = {fa} + (tl.maximum({fa}, tl.minimum({kept[1]}, {ub})) - {fa}) * fin")
    return [(ua, fa, region, False), (fa, fb, region | frozenset(ranges.kept_atoms(em.s)), False),
            (fb, ub, region, False)]


# shared memory a loop's pipelined tile loads may take: past it, with the dot operands' staging, a kernel cannot
# launch (sm_90 allows 227 KB a block); below it the tuner skips a configuration that does not fit, as before
PIPELINED_BYTES = 200 * 1024


def within_shared(em: Tiles, loads: list[tuple[list[Var], int]], stages: int) -> int:
    """`stages`, or fewer (never below two) where the loop's tile loads (`loads`, those of its body), buffered
    stages - 1 deep, would take more than PIPELINED_BYTES: a 128 x 128 tile of float32 noise beside rotated K
    and its cos and sin tables, three stages, asked for 311 KB and could not launch, where two take 164 KB."""
    L = em.s.loop
    per_stage = sum(math.prod(em.blk[v] for v in tv) * size for tv, size in loads if L in tv)
    while stages > 2 and (stages - 1) * per_stage > PIPELINED_BYTES:
        stages -= 1
    return stages


def stages_of(em: Tiles, region: frozenset, stages: int) -> int:
    """A segment's pipeline stages. Where a pre-pass found a run of tiles the masks keep whole, the segments outside
    it load a mask tile beside each K and V tile: one stage fewer there keeps the kernel's shared memory at the
    kept run's (causal under a passed fp16 mask, 64 x 64 tiles, 3 stages: 128 KB, one program per SM of an H100,
    against 112 KB and two), for the few partial tiles those segments cover. Never down to one: ptxas (Triton 3.6,
    sm_90) crashes on a left-padding kernel's fixup pass whose partial loops are not pipelined."""
    kept = ranges.kept_atoms(em.s)
    return stages - 1 if kept and stages > 2 and not set(kept) <= region else stages


def loop_header(em: Tiles, k: int, lo: str, hi: str, stages: int) -> list[str]:
    """The header of segment k's loop over [lo, hi), tiles of the loop variable at `l0`. With a gap found at run
    time, the loop counts the segment's tiles outside it and steps over it (one loop, not one per side, so the body
    is not printed twice; Triton still pipelines its loads)."""
    bl = em.blk[em.s.loop] if em.s.loop is not None else 1
    if not em.s.runtime_gap:
        # tl.range with explicit stages: Triton then also pipelines the loop's loads that feed no dot. A loop that
        # runs starts at a multiple of the block (see segments); said so, Triton loads a tile contiguous along the
        # loop variable (KeyFormer's noise) in 16-byte pieces, not 4
        return [f"for l0 in tl.range(tl.multiple_of({lo}, {bl}), {hi}, {bl}, num_stages={stages}):"]
    # counted in tiles, so that l0 is a multiple of the block by its arithmetic: a tl.multiple_of hint on it made
    # Triton 3.6's sm_90 pipeline fail on a bool mask's loads (cp.async of 1 byte). The count is of [lo, hi)'s
    # length: an empty segment may start off the tiles (at an extent not a multiple of the block), and flooring
    # its start would run the tile before it again
    return [f"g0_{k} = tl.maximum({lo}, ga)", f"gn_{k} = tl.maximum(tl.minimum({hi}, gb) - g0_{k}, 0)",
            f"for n0 in tl.range({lo} // {bl}, {lo} // {bl} + ({hi} - {lo} - gn_{k} + {bl - 1}) // {bl}, "
            f"num_stages={stages}):",
            f"    l0 = (n0 + tl.where(n0 >= g0_{k} // {bl}, gn_{k} // {bl}, 0)) * {bl}"]


def _planes(s: Schedule) -> list[Affine]:
    """The half-planes along the loop of run-time regions bounded on one side (a causal part beside a padding
    mask): the bulk, wholly outside them, runs their conditions' constants in place."""
    L = s.loop
    assert L is not None    # run-time regions are over a kernel's row and loop
    out = []
    for reg in s.runtime:
        planes = [h for h in reg if isinstance(h, Affine) and h.coeff(L)]
        up, down = [h for h in planes if h.coeff(L) > 0], [h for h in planes if h.coeff(L) < 0]
        out += [] if up and down else up or down
    return list(dict.fromkeys(out))


def _inside(em: Tiles, h: Affine) -> str:
    """Where h holds on every row of the tile: from this position on (a positive loop coefficient), or up to
    before it (a negative one)."""
    cl, kmin, _ = _span(em, h)
    if cl > 0:
        return f"(tl.maximum(-{kmin}, 0) + {cl - 1}) // {cl}"
    assert em.s.loop is not None    # only kernels with a loop have segments
    bl = em.blk[em.s.loop]
    return f"(tl.maximum({kmin} + {-cl}, 0) // {-cl}) // {bl} * {bl}"


def _outside(em: Tiles, h: Affine, ulo: list[str], uhi: list[str]) -> None:
    """Bounds of the tiles wholly outside h, on every row of the tile: before (uhi) or from (ulo) a tile."""
    cl, _, kmax = _span(em, h)
    assert em.s.loop is not None    # only kernels with a loop have segments
    bl = em.blk[em.s.loop]
    if cl > 0:
        uhi.append(f"((tl.maximum(-{kmax}, 0) + {cl - 1}) // {cl}) // {bl} * {bl}")
    else:
        ulo.append(f"((tl.maximum({kmax} + {-cl}, 0) // {-cl}) + {bl - 1}) // {bl} * {bl}")


def _span(em: Tiles, h: Affine) -> tuple[int, str, str]:
    """h's loop coefficient and the least and greatest of its other terms over this program's row tile."""
    row, loop = em.s.row, em.s.loop
    assert loop is not None
    if row is None or not (cr := h.coeff(row)):
        return h.coeff(loop), source(h.const), source(h.const)
    a, b = f"{cr} * r0", f"{cr} * (r0 + {em.blk[row] - 1})"
    c = source(h.const)
    return h.coeff(loop), f"(tl.minimum({a}, {b}) + {c})", f"(tl.maximum({a}, {b}) + {c})"


def _fold(fn: str, xs: list[str]) -> str:
    return xs[0] if len(xs) == 1 else f"{fn}({xs[0]}, {_fold(fn, xs[1:])})"


def loop_body(em: Emitter, ctx: Body, accs: list[Accum], running: dict) -> None:
    """One tile step: running maxima first, then every accumulator of the pass."""
    s = em.s
    L = s.loop
    assert L is not None    # called for kernels with a loop only
    pred = ctx.bounds and em.partial(L)    # bounds tests on the loop variable
    news = {}
    for a in accs:
        if a.kind in ("max", "min"):
            x = a.node.args[0]
            xt = em.tvars(x)
            base, scale = forms.scaled(em, x, ctx)
            e = em.full(em.arg(base, xt, ctx), [base], xt, ctx)
            if pred:
                e = f"tl.where({em.idx(L, xt)} < {source(L.extent)}, {e}, {lit(IDENTITY[a.kind])})"
            fn = "max" if a.kind == "max" else "min"
            new = f"new_{a.node.name}"
            red = e if s.stepped else em.extreme(a.node, a.kind, e, xt.index(L))
            if scale != 1.0:
                red = f"{red} * {lit(scale)}"
            if a.node in em.nan_free:
                ctx.lines.append(f"{new} = tl.{fn}imum({running[a.node]}, {red})")
            else:
                ctx.lines.append(f"{new} = tl.{fn}imum({running[a.node]}, {red}, propagate_nan=tl.PropagateNan.ALL)")
            safe = f"safe_{a.node.name}"
            ctx.lines.append(f"{safe} = tl.where({new} == {lit(IDENTITY[a.kind])}, 0.0, {new})")
            ctx.running[a.node] = safe
            news[a.node] = new
            for base, k in sorted({(b, k) for acc in accs for d, b, k in acc.rescale if d is a.node}):
                moved = f"{running[a.node]} - {safe}" if k == 1.0 else f"({running[a.node]} - {safe}) * {lit(k)}"
                ctx.lines.append(f"{_alpha(base, a.node, k)} = tl.{base}({moved})")
    for a in accs:
        acc = running[a.node]
        tv = em.tvars(a.node)
        alpha = "".join(f" * {em.bcast(_alpha(b, d, k), em.tvars(d), tv)}" for d, b, k in a.rescale)
        if a.kind in ("max", "min"):
            continue
        if a.kind == "any":
            x = a.node.args[0]
            xt = em.tvars(x)
            e = f"({em.full(em.arg(x, xt, ctx), [x], xt, ctx)} != 0)"
            if pred:
                e = f"({e} & ({em.idx(L, xt)} < {source(L.extent)}))"
            e = f"{e}.to(tl.int32)" if s.stepped else f"tl.max({e}.to(tl.int32), axis={xt.index(L)})"
            ctx.lines.append(f"{acc} = tl.maximum({acc}, {e})")
            continue
        if a.node in s.dots:
            fa, fb, k = s.dots[a.node]
            # past the loop's extent both operands are zeroed: a padded lane of either may be inf (the log of
            # a noise load's padding 0), and inf times the other's 0 is NaN
            opa = em.operand(fa, a.node, True, ctx, ctx.lines, mask_loop=pred)
            opb = em.operand(fb, a.node, False, ctx, ctx.lines, mask_loop=pred)
            ctx.lines.append(f"{acc} = tl.dot({opa}, {opb}, {acc}{alpha}{em.dot_prec(fa + fb)})")
            continue
        xt = [v for v in s.order if any(isinstance(f, LNode) and v in f.vars for f, _ in a.kept)]
        if s.stepped:       # the summand is one step's value, over the accumulator's own tile
            e = em.full(em.product(a.kept, tv, ctx, ctx.lines), [f for f, _ in a.kept], tv, ctx)
            ctx.lines.append(f"{acc} = {acc}{alpha} + {e}")
            continue
        if L not in xt:
            raise ScheduleError(f"{a.node.name}: summand does not vary along the loop",
                                "a sum whose summand does not vary along the loop", a.node.origin)
        e = em.full(em.product(a.kept, xt, ctx, ctx.lines), [f for f, _ in a.kept], xt, ctx)
        for i in [i for i, (_, wt) in ctx.witness.items() if wt == xt]:   # one sum carries both
            e = f"_with_check({e}, {ctx.witness.pop(i)[0]}, MODE == 0)"
            em.carriers[acc] = tv
        if pred:
            e = f"tl.where({em.idx(L, xt)} < {source(L.extent)}, {e}, 0.0)"
        ctx.lines.append(f"{acc} = {acc}{alpha} + tl.sum({e}, axis={xt.index(L)})")
    for d, new in news.items():
        ctx.lines.append(f"{running[d]} = {new}")
    for i, (term, wt) in ctx.witness.items():     # no sum of that tile took it in
        ctx.lines.append(check.check_sum(em, i, term, wt))
    ctx.witness.clear()


def finals(em: Emitter, accs: list[Accum], pass_: int, cache: dict) -> Body:
    """The block after a pass: each accumulator's result (`red_*`), its loop-invariant factors applied."""
    post = Body(pass_ + 1, frozenset(), False, cache)
    for a in accs:
        e = f"acc_{a.node.name}"
        if a.kind == "any":
            e = f"({e} != 0)"
        tv = em.tvars(a.node)
        for f, pw in a.pulled:
            fe = em.arg(f, tv, post)
            e = f"{e} * {fe}" if pw > 0 else f"{e} / {fe}"
        em.finals[a.node] = f"red_{a.node.name}"
        post.lines.append(f"red_{a.node.name} = {e}")
    return post


def unsettled(em: Tiles, accs: list[Accum]) -> str:
    """Scalar that is true while some `any` accumulator of the tile is still false (Schedule.stops_early)."""
    terms = []
    for a in accs:
        acc = f"acc_{a.node.name}"
        terms.append(f"(tl.min(tl.ravel({acc}), 0) == 0)" if em.tvars(a.node) else f"({acc} == 0)")
    return " | ".join(terms)


def placement(em: Tiles, ntiles: Size, grid1: Size) -> list[str]:
    """Row tile and batch index of this program. Tiles whose loop covers the most are launched first
    (the direction follows the skipped and constant-folded half-planes; with run-time ranges, the order a pre-pass
    sorted them in), across the batch in groups of
    about `group_programs` programs: the longest tiles of a group start together and its shortest end it,
    so the last wave is short, while a group's batch entries are few enough to share the cache."""
    s = em.s
    out = []
    group = max(1, min(hint(grid1), em.spec.group_programs // hint(ntiles)))   # correct at any size: a group
    n, span = source(grid1), source(group * ntiles)
    pid = "pid"
    if em.split:        # the pieces of one row tile's loop are neighbours in the grid
        count = f"ns = {source(em.splits)}"
        out += ["if SPLIT:", "    " + count, "else:", "    ns = 1"] if em.runtime_split else [count]
        out += ["sid = pid % ns", "tp = pid // ns"]
        pid = "tp"
    if not symbolic(grid1) and not symbolic(ntiles) and group >= grid1:      # past the grid is the whole grid
        out += [f"t = {pid} // {n}", f"b = {pid} % {n}"]
    else:
        out += [f"g = {pid} // {span}", f"gn = tl.minimum({group}, {n} - g * {group})",
                f"t = ({pid} - g * {span}) // gn", f"b = g * {group} + ({pid} - g * {span}) % gn"]
    index, rest = [], "b"
    for v in reversed(s.batch):
        index.append(f"i_{v} = {rest} % {source(v.extent)}")
        rest = f"({rest} // {source(v.extent)})"
    if s.row is not None and s.runtime:     # in the order a pre-pass found: the longest ranges first
        return out + index + ranges.load_order(em) + [f"r0 = t * {em.blk[s.row]}",
                                                      f"o_{s.row} = r0 + tl.arange(0, {em.blk[s.row]})"]
    if s.row is not None:
        # loop work grows with the row index (a gap's rows bound it on both sides, so it does not count)
        ends = [h for reg in s.skip if reg != s.gap for h in reg if s.loop is not None and h.coeff(s.loop)]
        grows = sum(h.coeff(s.row) for h in ends + s.special) < 0
        out.append(f"r0 = ({source(ntiles - 1)} - t) * {em.blk[s.row]}" if grows else f"r0 = t * {em.blk[s.row]}")
        out.append(f"o_{s.row} = r0 + tl.arange(0, {em.blk[s.row]})")
    return out + index


def _alpha(base: str, d: LNode, k: float) -> str:
    """Name of the factor exp((d_old - d_new) * k) that rescales accumulators when the running max d moves."""
    return f"alpha_{base}_{d.name}" if k == 1.0 else f"alpha_{base}_{d.name}_" + re.sub(r"\W", "_", repr(k))
