"""The finite check's code inside a kernel.

Skipping tiles by value facts and constant folding assume finite inputs. In a plan with a check each
kernel runs twice: with MODE=0 it assumes them, and each program, once its tile is stored, checks a
piece of the inputs (x * 0 summed: NaN where x is not finite or outside its op's domain) and sets a
zeroed flag to NaN when the sum is not 0; with MODE=1, after the whole plan, it returns at once when
the flag is 0 and otherwise recomputes every tile as eager does. Which kernel checks which input is
decided across the plan (checkplan.py).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..analysis.facts import MODERATE
from ..ir.loops import LNode, Var, exact_cast
from ..ir.sizes import Size, ceildiv, source
from .artifact import FINITE
from .body import Body
from .lower import TL, pow2, round_to
from .tiles import Tiles

CHECK_BLOCK = 8192      # most elements per step of the finite check
SIZED_CHECK_BLOCK = 4096    # the step where a piece's size is a run-time one (a whole step is live in registers)
CHECK_PIECE = 64        # a program's piece of a checked input starts at a multiple of this many elements: with
                        # run-time sizes Triton sees the start aligned only so, and loads 16 bytes at a time
CHECK_MARK = "     # check"   # ends the lines of the finite check inside a tile (the fixup pass drops them)


def check_add(em: Tiles, i: int, raw: str, tv: list[Var], mask: Optional[str]) -> list[str]:
    """The finite check of a tile of input i this program loaded: x * 0 (NaN where x is outside the
    input's domain; masked-off elements count as inside), summed over the loop's axis into a small
    accumulator (`check_acc`), or whole where the tile has no loop axis (it is loaded once). In the loop
    over skipped tiles it adds whole tiles into `chkt{i}`, keeps the domain's bound as a running
    minimum in `chkm{i}` (two instructions per element where the test and select took four) and leaves
    the sums to after the loop (see _check)."""
    x, dom = as_checked(em, i, raw), em.checks[i][1]
    if em.check_whole:
        lines = [f"chkt{i} += {x} * 0{CHECK_MARK}"]
        if dom:
            m = _measure(x, dom)
            m = f"tl.where({mask}, {m}, float(\"inf\"))" if mask else m
            lines.append(f"chkm{i} = _min_nan(chkm{i}, {m}){CHECK_MARK}")
        return lines
    if dom == "moderate":   # -|x| at least -MODERATE also rules out inf and NaN: one running minimum tests both
        m = _measure(x, dom)
        m = f"tl.where({mask}, {m}, 0.0)" if mask else m
        return [f"chkr{i} = _min_nan(chkr{i}, {_over_tile(em, '_min_over', m, tv)}){CHECK_MARK}"]
    return [check_sum(em, i, _check_term(x, dom, mask), tv)]


def check_sum(em: Tiles, i: int, term: str, tv: list[Var]) -> str:
    """Line adding a check term over a tile of input i to its accumulator."""
    return f"chk{i} += {_over_tile(em, 'tl.sum', term, tv)}.to(tl.float32){CHECK_MARK}"


def _over_tile(em: Tiles, reduce: str, x: str, tv: list[Var]) -> str:
    """x over tv reduced by `reduce` over the loop's axis, or whole where the tile has none; a scalar (one value
    per program) as it is."""
    if em.s.loop in tv:
        return f"{reduce}({x}, {tv.index(em.s.loop)})"
    return f"{reduce}(tl.ravel({x}), 0)" if tv else f"({x})"


def check_by_log(em: Tiles, log: LNode, out: str, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> None:
    """The flushing log `out` of a checked tile of an input, over the same tile, is finite exactly where
    the input is positive normal and finite, the domain its check tests: the check becomes out * 0, held
    in `ctx.witness` until a sum over the loop of the same tile takes it in (see _loop_body). KeyFormer's
    row kernel: 956 -> 773 sm_90 instructions per step of its loop."""
    x = log.args[0]
    while isinstance(x, LNode) and x.op == "cast" and exact_cast(x):
        x = x.args[0]
    if ctx is None or em.s.loop not in tv or id(x) not in ctx.checked or em.tvars(x) != tv:
        return
    i = x.attrs["input"]
    line, mask = ctx.checked.pop(id(x))
    if i in em.narrowed or em.checks[i][1] != "positive" or line not in lines:
        return
    lines.remove(line)
    ctx.witness[i] = (f"tl.where({mask}, {out} * 0, 0.0)" if mask else f"{out} * 0", tv)


def as_checked(em: Tiles, i: int, x: str) -> str:
    """Input i's value x as the check tests it: through the narrowest cast the program applies to it; a mask's
    -inf as 0 (CheckPlan.masks)."""
    x = round_to(em.narrowed[i], x) if i in em.narrowed else x
    return f"tl.where({x} == float(\"-inf\"), tl.zeros_like({x}), {x})" if i in em.spec.check.masks else x


def check_acc(em: Tiles, i: int) -> tuple[str, str]:
    """Input i's tile-check accumulator, its initialisation and its sum: x * 0 summed (`chk{i}`), or for a
    "moderate" domain the running minimum of -|x| (`chkr{i}`, see check_add), 0 or NaN once tested."""
    tv = em.tvars(em.checks[i][0])
    shape = [str(em.blk[v]) for v in tv if v is not em.s.loop] if em.s.loop in tv else []
    if em.checks[i][1] == "moderate":
        least = _in_domain(f"chkr{i}", "moderate")
        return (f"chkr{i} = tl.full([{', '.join(shape)}], float(\"inf\"), tl.float32){CHECK_MARK}",
                f"tl.sum(tl.ravel({least}), 0)" if shape else least)
    return (f"chk{i} = tl.zeros([{', '.join(shape)}], tl.float32){CHECK_MARK}",
            f"tl.sum(tl.ravel(chk{i}), 0)" if shape else f"chk{i}")


_DOMAIN_MIN = {"positive": ("{}", "1.1754943508222875e-38"), "nonneg": ("{}", "0.0"),
               "nonzero": ("tl.abs({})", "1.401298464324817e-45"), "moderate": ("-tl.abs({})", f"-{MODERATE}")}


def _measure(x: str, dom: str) -> str:
    """The value that a domain bounds from below; with "+moderate" (a skip by a huge mask constant relies on
    the input being at most analysis.facts.MODERATE in magnitude) -1 where |x| is larger. A domain with
    "moderate" measures in float32 (Triton's interpreter has no bf16 constants)."""
    base, _, moderate = dom.partition("+")
    if "moderate" in dom:
        x = f"({x}).to(tl.float32)"
    m = _DOMAIN_MIN[base][0].format(x)
    return f"tl.where(tl.abs({x}) <= {MODERATE}, {m}, -1.0)" if moderate else m


def _meets(m: str, dom: str) -> str:
    """Whether m, a value of the domain's measure, reaches its bound (False for NaN)."""
    return f"({m} >= {_DOMAIN_MIN[dom.partition('+')[0]][1]})"


def _check_term(x: str, dom: Optional[str], mask: Optional[str] = None) -> str:
    """x * 0: 0 where x is finite, NaN where it is not, or where it lies outside `dom` (elements `mask`
    leaves out count as inside)."""
    if not dom:
        return f"{x} * 0"
    cond = _meets(_measure(x, dom), dom) + (f" | ~({mask})" if mask else "")
    if "moderate" in dom:     # in float32, in x's type again after
        return f"tl.where({cond}, ({x}).to(tl.float32) * 0, float(\"nan\")).to(({x}).dtype)"
    return f"tl.where({cond}, {x} * 0, float(\"nan\"))"


def _in_domain(least: str, dom: str) -> str:
    """0 where `least`, a running minimum of the domain's measure, meets its bound, else NaN."""
    return f"tl.where({_meets(least, dom)}, 0.0, float(\"nan\"))"


def program_check(em: Tiles, shares: tuple[int, ...], check: dict, part: int, tiles: Size, stages: int) -> list[str]:
    """The finite check's lines at the end of a MODE=0 program (see emit_kernel): this program's piece of
    the kernel's part of each checked input (part `part` of parts proportional to `shares`), summed as x * 0
    in the input's own precision (two half values per instruction); inputs of one size share a loop, so their
    loads are in flight together.
    Inputs checked on the program's tiles (`em.checks`) add the loop tiles it skipped, then their sums,
    unless no value read there reaches a result (Schedule.read_when_skipped).
    That loop adds whole tiles and sums them once after it (a row sum per step costs shuffles). It has no
    dot, and Triton software-pipelines its loads only when told the stages: they then go through shared
    memory `stages` deep, as the main loop's operands do."""
    flag = em.buffer(FINITE, (1,), torch.float32, "intermediate", written=True)
    skipped = []
    live = em.s.read_when_skipped()
    looped = [n for n, _ in em.checks.values() if em.s.loop in n.vars and n.attrs["input"] in live]
    if looped:
        L = em.s.loop
        assert L is not None    # looped loads vary along the loop
        bl = em.blk[L]
        ctx = Body(0, frozenset(), True, {})
        em.check_whole = True
        for n in looped:
            em.compute(n, ctx, ctx.lines)
        em.check_whole = False
        for n in looped:
            i, tile = n.attrs["input"], ", ".join(str(em.blk[v]) for v in em.tvars(n))
            skipped.append(f"    chkt{i} = tl.zeros([{tile}], tl.float32)")
            if em.checks[i][1]:
                skipped.append(f"    chkm{i} = tl.full([{tile}], float(\"inf\"), tl.float32)")
        gap = [("ga", "gb")] if em.s.gap or em.s.runtime_gap else []
        first, last = ("slo", "shi") if em.split else ("0", source(L.extent))     # this program's piece of the loop
        for lo, hi in [(first, "lo")] + gap + [(f"(hi + {bl - 1}) // {bl} * {bl}", last)]:
            skipped += [f"    for l0 in tl.range({lo}, {hi}, {bl}, num_stages={stages}):     # loop tiles it skipped",
                        f"        o_{L} = l0 + tl.arange(0, {bl})"] + ["        " + ln for ln in ctx.lines]
        for n in looped:
            i, ax = n.attrs["input"], em.tvars(n).index(L)
            dom = em.checks[i][1]
            if dom == "moderate":     # into the running minimum the computed tiles kept (check_add)
                skipped.append(f"    chkr{i} = _min_nan(chkr{i}, _min_over(chkm{i}, {ax}) + tl.sum(chkt{i}, {ax}))")
                continue
            low = f" + tl.sum({_in_domain(f'chkm{i}', dom)}, {ax})" if dom else ""
            skipped.append(f"    chk{i} += tl.sum(chkt{i}, {ax}){low}")
    sizes: dict[str, tuple[Size, list[int]]] = {}
    for i in check:
        numel = math.prod(em.inputs[i][0])
        sizes.setdefault(str(numel), (numel, []))[1].append(i)
    inits, out = [], []
    before, whole = sum(shares[:part]), sum(shares)
    for size, group in sizes.values():
        start, stop = _cut(size, before, whole), _cut(size, before + shares[part], whole)
        per = ceildiv(ceildiv(stop - start, tiles), CHECK_PIECE) * CHECK_PIECE
        blk = SIZED_CHECK_BLOCK if isinstance(per, torch.SymInt) else min(CHECK_BLOCK, pow2(per))
        out += [f"    end = tl.minimum({source(start)} + (pid64 + 1) * {source(per)}, {source(stop)})",
                f"    for off in range({source(start)} + pid64 * {source(per)}, end, {blk}):",
                f"        o = off + tl.arange(0, {blk})"]
        for i in group:
            shape, dtype = em.inputs[i]
            inits.append(f"    chk{i} = tl.zeros([{blk}], {TL[dtype]})")
            out += [f"        v{i} = tl.load({em.buffer(('in', i), shape, dtype, 'input')} + o, mask=o < end, other=0)",
                    f"        chk{i} += {_check_term(as_checked(em, i, f'v{i}'), check[i], 'o < end')}"]
    total = " + ".join([f"tl.sum(chk{i}.to(tl.float32), 0)" for i in check] +
                       [check_acc(em, i)[1] for i in em.checks] +
                       [f"tl.sum(tl.ravel({acc} * 0), 0)" if tv else f"{acc} * 0" for acc, tv in em.carriers.items()])
    head = ["if MODE == 0:     # this program's piece of the finite check", "    pid64 = pid.to(tl.int64)"]
    return head + inits + out + skipped + [f"    if {total} != 0:     # NaN: some value here is NaN or inf",
                                           f"        tl.store({flag}, float(\"nan\"))"]


def _cut(size: Size, num: int, den: int) -> Size:
    """size * num // den without the product, which can pass int32 where size is a kernel's size argument,
    rounded down to a multiple of CHECK_PIECE where it is not an end."""
    if num in (0, den):
        return size if num else 0
    return (size // den * num + size % den * num // den) // CHECK_PIECE * CHECK_PIECE


def modes(em: Tiles, fixup: bool, tiles: Size, tile: list[str], checked: list[str]) -> list[str]:
    """The kernel body: one tile per program, then its piece of the check (MODE=0); in a plan with a check,
    also the fixup pass (MODE=1), whose fixup programs return at once when the flag is 0 and
    otherwise loop over the tiles (see emit_kernel). Few programs keep the usual, finite case cheap."""
    if not fixup:
        return ["fin = 1", "pid = tl.program_id(0)"] + tile
    flag = em.buffer(FINITE, (1,), torch.float32, "intermediate")
    return ["if MODE == 1:     # the fixup pass",
            f"    if tl.load({flag}) == 0:     # every input finite: the first pass was exact",
            "        return",
            "    fin = 0",
            # not pipelined: Triton pipelined this loop's loads around the inner loops' own buffers (327 KB of
            # shared memory where the first pass takes 32 KB), and the fixup pass runs for non-finite inputs only
            f"    for pid in tl.range(tl.program_id(0), {source(tiles)}, tl.num_programs(0), num_stages=1):"] + \
        ["        " + ln for ln in tile if not ln.endswith(CHECK_MARK)] + \
        ["else:", "    fin = 1", "    pid = tl.program_id(0)"] + ["    " + ln for ln in checked]
