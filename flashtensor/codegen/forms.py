"""Local forms: cheaper Triton for one op where its operands allow it, as a list of rules.

Each rule takes the emitter, the node, its tile variables, the body being emitted and that body's lines,
and returns the right-hand side to assign, or None when it does not apply; `Emitter.compute` tries them
in `FORMS`' order before an op's own template (lower.py). They live here, not as loop-graph rewrites,
because each depends on how the kernel tiles the value (which operands are thinner than the tile, the
tile's size) or on the region a body runs in (a value the facts fix to 0 there). Adding one: write the
function, put it in FORMS, and test that it fires and matches eager (tests/test_forms.py).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from ..analysis.facts import nonnegative
from ..ir.loops import LNode, Var
from ..transform.exp2 import largest
from .body import Body
from .lower import BINARY, HALF
from .tiles import Tiles


def normalised_exp(em: Tiles, n: LNode, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> Optional[str]:
    """exp2(x - m) / d with thin m and d as exp2(x - (m + log2 d)) (see exp_over)."""
    if n.op != "div" or (folded := exp_over(em, n.args[0], n.args[1], tv, ctx, lines)) is None:
        return None
    return em.rounded(n, folded, ctx)


def thin_divisor(em: Tiles, n: LNode, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> Optional[str]:
    """x / d with d over fewer variables than the tile: divided on d's tile where x varies no more than d (see
    thin_quotient), else x times d's reciprocal (see reciprocal)."""
    if n.op != "div" or not isinstance(n.args[1], LNode) or len(em.tvars(n.args[1])) >= len(tv):
        return None
    if (q := thin_quotient(em, n.args[0], n.args[1], tv, ctx, lines)) is not None:
        return em.rounded(n, q, ctx)
    rcp = reciprocal(em, n.args[1], tv, ctx, lines)
    return em.rounded(n, em.times(n, em.arg(n.args[0], tv, ctx), rcp, ctx), ctx)


def thin_quotient(em: Tiles, x: Any, d: LNode, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> Optional[str]:
    """x / d computed on d's own tile and broadcast to tv, where x varies over none of tv's other variables: as
    many divisions as the reciprocal would take, and eager's correctly rounded quotient (x / |x| is exactly 1,
    which x * (1 / |x|) may miss by an ulp: SimA's L1 normalisation over one token gives signs that cancel)."""
    have = em.tvars(d)
    if not isinstance(x, LNode) or not set(em.tvars(x)) <= set(have):
        return None
    q = em.fresh("quot")
    lines.append(f"{q} = {em.arg(x, have, ctx)} / {em.arg(d, have, ctx)}")
    return em.bcast(q, have, tv)


def identity_operand(em: Tiles, n: LNode, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> Optional[str]:
    """x + 0, x - 0, x * 1, x / 1 (operands as printed, so also a value the region's facts fix): x, exact."""
    if n.op not in BINARY:
        return None
    a, b = em.arg(n.args[0], tv, ctx), em.arg(n.args[1], tv, ctx)
    kept = _identity(n.op, a, b)
    if kept is None:
        return None
    src = n.args[kept]
    exact = isinstance(src, LNode) and src.dtype == n.dtype
    return (a, b)[kept] if exact else em.rounded(n, (a, b)[kept], ctx)


def square(em: Tiles, n: LNode, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> Optional[str]:
    """x ** 2 as x * x (the only power the kernels lower)."""
    if n.op != "pow" or isinstance(n.args[1], LNode) or float(n.args[1]) != 2.0:
        return None
    x = em.arg(n.args[0], tv, ctx)
    return f"{x} * {x}"


def fp16_scale(em: Tiles, n: LNode, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> Optional[str]:
    """A faithful fp16 product of fp16 values and a constant (the scores' scale) on the packed fp16 unit:
    per element half an fma, half a multiply and one conversion instead of two conversions and a
    multiply. The result is within one fp16 step of eager's float32 multiply and rounding, and equal to
    it for at least 96% of fp16 values (tests/test_kernels.py checks every one)."""
    if n.op != "mul" or not (em.faithful and n.dtype == torch.float16) or math.prod(em.blk[v] for v in tv) < 512:
        return None      # the asm takes elements in pairs: at 8 warps a tile of 512 gives each thread two
    for i in (0, 1):
        c, x = em.constant(n.args[i], ctx.region if ctx else frozenset()), n.args[1 - i]
        if isinstance(c, float) and isinstance(x, LNode) and x.dtype == torch.float16 and \
                (split := split_f16(c)) is not None:
            if x.op == "cast" and isinstance(x.args[0], LNode) and x.args[0].dtype == torch.float32:
                x = x.args[0]      # _scale_f16 rounds to fp16 first: one conversion, not three
            return f"_scale_f16({em.arg(x, tv, ctx)}, {split[0]!r}, {_pair(split[1])}, {_pair(split[2])})"
    return None


Form = Callable[["Tiles", LNode, list[Var], Optional[Body], list[str]], Optional[str]]
FORMS: list[Form] = [normalised_exp, thin_divisor, fp16_scale, identity_operand, square]


def scaled(em: Tiles, x: Any, ctx: Body) -> tuple:
    """(y, c) with x equal to y * c on this body's tiles for a positive constant c, else (x, 1.0).
    A running max of x is then c times the max of y (exact: rounding is monotone), and x's multiply
    is left with one use, the exponent's subtraction, which the compiler fuses with it."""
    y = x
    while isinstance(y, LNode):
        if y.op == "cast" and y.dtype.is_floating_point and y.args[0].dtype.is_floating_point \
                and not em.rounds(y, ctx):
            y = y.args[0]          # emitted as no instruction
            continue
        zero = [i for i, a in enumerate(y.args) if y.op in ("add", "sub")
                and (i == 1 or y.op == "add") and em.constant(a, ctx.region) == 0]
        other = y.args[1 - zero[0]] if zero else None
        if not (isinstance(other, LNode) and other.dtype == y.dtype):
            break
        y = other                  # x + 0 on these tiles: a copy
    if not isinstance(y, LNode) or y.op != "mul" or em.rounds(y, ctx):
        return x, 1.0
    for i in (0, 1):
        c, other = em.constant(y.args[i], ctx.region), y.args[1 - i]
        if isinstance(c, float) and 0 < c < math.inf and isinstance(other, LNode):
            return other, c
    return x, 1.0


def exp_over(em: Tiles, e: Any, d: Any, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> Optional[str]:
    """exp2(x - m) / d, with m and d over fewer variables than the tile and d >= 0, as
    exp2(x - (m + log2 d)): per element one subtraction the compiler fuses with x's scaling, in
    place of a multiply after the exponential. d = 0 or +inf give what the division gives.
    log2 d is lg2.approx: its absolute error (2^-22 near 1, relative 2^-22 elsewhere) is a relative
    one of the same size in the quotient, as ex2.approx's own, and libdevice's log2 costs some twenty
    instructions for each of the thread's d values, in every step of a loop over the tile's other axis."""
    if (parts := exp_over_parts(e, d)) is None or ctx is None:
        return None
    if em.faithful and (e.dtype in HALF or e.args[0].dtype in HALF):
        return None
    if ctx.region and em.s.constant_on(e, ctx.region) is not None:
        return None
    x, m = parts
    mv, dv = (em.tvars(m) if isinstance(m, LNode) else []), em.tvars(d)
    if len(dv) >= len(tv) or len(mv) >= len(tv) or (mv and dv != mv) or em.deps_acc(d) or \
            (isinstance(m, LNode) and em.deps_acc(m)):
        return None
    key = (id(e), id(d), tuple(tv))
    if key in ctx.quotients:     # a second use in this body (p and p * p): no second load and exponential
        return ctx.quotients[key]
    lse, p = em.fresh("lse"), em.fresh("p")
    if (m, d) in em.folded:       # stored by the kernel that reduced m and d: one load, no log per step
        em.load_intermediate(em.folded[m, d], lse, lines, ctx)
    else:
        lines.append(f"{lse} = {em.arg(m, dv, ctx)} + _log2_approx({em.arg(d, dv, ctx)}, False)")
    lines.append(f"{p} = tl.exp2({em.arg(x, tv, ctx)} - {em.bcast(lse, dv, tv)})")
    ctx.quotients[key] = p
    return p


def reciprocal(em: Tiles, d: Any, tv: list[Var], ctx: Optional[Body], lines: list[str]) -> str:
    """1 / d for a divisor over fewer variables than the tile: one division per element of d's own
    tile, broadcast to tv and multiplied in (a division per tile element costs far more)."""
    have = em.tvars(d) if isinstance(d, LNode) else []
    rcp = em.fresh("rcp")
    lines.append(f"{rcp} = 1.0 / {em.arg(d, have, ctx)}")
    return em.bcast(rcp, have, tv)


# the largest |m| that exp_over folds into m + log2 d: float32 rounds the sum by up to |m| * 2^-24, a relative
# error of ln 2 times that in the quotient (1.1e-5 here); a fully masked row's m is the mask's fill (-1e9 * log2 e,
# whose rounding step of 128 swallowed log2 d: every probability 1 instead of 1 / Skv)
FOLD_LIMIT = 2.0 ** 8


def exp_over_parts(e: Any, d: Any) -> Optional[tuple]:
    """(x, m) where e / d is exp2(x - m) / d with d >= 0 and m no larger than FOLD_LIMIT wherever it is a
    constant or an input of the program (transform.exp2.largest): the form `exp_over` folds."""
    if isinstance(e, LNode) and e.op == "exp2" and isinstance(e.args[0], LNode) and e.args[0].op == "sub" \
            and isinstance(d, LNode) and nonnegative(d) and largest(e.args[0].args[1]) <= FOLD_LIMIT:
        return e.args[0].args[0], e.args[0].args[1]
    return None


def _identity(op: str, a: str, b: str) -> Optional[int]:
    """Which operand is the result when the other is the operation's identity literal."""
    if op in ("add", "sub", "mul", "div") and b == ("0.0" if op in ("add", "sub") else "1.0"):
        return 0
    if op in ("add", "mul") and a == ("0.0" if op == "add" else "1.0"):
        return 1
    return None


def split_f16(c: float) -> Optional[tuple[float, float, float]]:
    """c as eager's float32 opmath holds it, and that value as fp16 hi + lo (lo the rounded remainder);
    None where hi leaves fp16's normal range or hi + lo misses c32 by more than 2^-21 of it (a remainder
    deep in fp16's subnormals)."""
    c32 = float(torch.tensor(c, dtype=torch.float32))
    hi = float(torch.tensor(c32, dtype=torch.float16))
    lo = float(torch.tensor(c32 - hi, dtype=torch.float16))
    if not 2.0 ** -14 <= abs(hi) <= 65504.0 or abs(c32 - hi - lo) > 2.0 ** -21 * abs(c32):
        return None
    return c32, hi, lo


def _pair(v: float) -> int:
    """An fp16 value's bits in both halves of an int32 (an f16x2 operand)."""
    b = int(torch.tensor(v, dtype=torch.float16).view(torch.int16)) & 0xFFFF
    return (b << 16 | b) - (1 << 32 if b & 0x8000 else 0)
