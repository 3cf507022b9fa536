"""Precision policy: where the kernels round half-precision values as eager does.

Elsewhere a half value's float32 value stands for it: faster, and closer to the exact answer. Eager's rounding
decides a result, and the kernels reproduce it, in three places:

- a plan is "faithful", rounding every half intermediate, when float32 outputs come from half inputs (their 1e-4
  contract is tighter than the rounding eager applies on the way) or an input is cast to a half type (its zeros
  and infs are eager's, a log of them). In bf16 too: where a steep function (exp, mish's tail) amplifies a
  score's rounding, float32 scores are a draw of error as large as eager's bf16 ones, and at times farther
  from the exact answer than eager's;
- in every plan, a cast of an input that rounds (ir.loops.rounds_input) and a half sum with a huge finite mask
  constant or a half input (`rounds_sum`);
- in every plan, the values `decide` marks (`ROUNDS`): a half value whose zero decides a result (the operand
  cone of a log, a reciprocal or a square root: fp16(p + 1e-9) is 0 where p underflowed, and log gives -inf),
  an fp16 value that may overflow where float32 would not (analysis/ranges.py: s * s, s / 1e-3), and the
  values a mask is added to (`mask_deciding`: the step of s + finfo.min that eager rounds s into). Those are
  marked `UNDER_MASKS`: on tiles where the masks are 0 (a run of tiles a passed mask keeps whole) their rounding
  decides nothing, and a kernel that alone computes them leaves it out there (`deciding_masks`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ir.loops import ABSOLUTE, ROUNDS, UNDER_MASKS, LNode, LoopGraph, read_input, rounds_input
from .facts import narrowed_inputs
from .ranges import Ranges, overflows

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Precision:
    faithful: bool                       # half-precision values are rounded as eager rounds them
    narrowed: dict[int, torch.dtype]     # inputs a cast narrows, with the narrowest type (the check tests them so)


def decide(loops: LoopGraph) -> Precision:
    """The precision policy of this program's kernels; marks the nodes every plan rounds (`ROUNDS`)."""
    for n in mask_deciding(loops):
        n.attrs[ROUNDS] = UNDER_MASKS
    for n in zero_deciding(loops) + overflows(loops):
        n.attrs[ROUNDS] = True
    for n in added_only(loops):
        n.attrs[ABSOLUTE] = True
    narrowed = narrowed_inputs(loops)
    faithful = (any(o.dtype == torch.float32 for o in loops.outputs) and
                any(dt in _HALF for _, dt in loops.inputs)) or any(dt in _HALF for dt in narrowed.values())
    return Precision(faithful, narrowed)


# a constant at least this large (an fp16 step of 2, a bf16 step of 2) decides a half sum's rounding
_COARSE = {torch.float16: 2.0 ** 11, torch.bfloat16: 2.0 ** 8}


def _mask_like(x: object, dtype: torch.dtype) -> bool:
    """x is a large finite constant, or a select or product that gives one (an additive mask: finfo.min on padded
    keys). An infinite one is exact in any sum (analysis.facts.exact_sum)."""
    if not isinstance(x, LNode):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and _COARSE[dtype] <= abs(x) < math.inf
    if x.op == "scalar":
        return _mask_like(x.attrs["value"], dtype)
    if x.op == "cast":
        return _mask_like(x.args[0], dtype)
    if x.op == "where":
        return _mask_like(x.args[1], dtype) or _mask_like(x.args[2], dtype)
    return x.op == "mul" and any(_mask_like(a, dtype) for a in x.args)


def rounds_sum(n: LNode) -> bool:
    """A half-precision sum with an additive mask of large constants, or with a half input, whose values may be one
    (transformers passes its mask so): eager rounds s + finfo(fp16).min to -65504, which makes a fully masked row
    uniform, while float32 keeps s's differences. Rounded in every plan."""
    return n.dtype in _HALF and n.op in ("add", "sub") and \
        any(_mask_like(a, n.dtype) or (read_input(a) is not None and a.dtype in _HALF) for a in n.args)


# a zero argument makes these infinite, or infinitely steep: log(0) = -inf, 1 / 0 = inf, sqrt(1e-9) = 3e-5
_POLES = ("log", "log2", "log2_approx", "rsqrt", "reciprocal", "sqrt")


def _poles(n: LNode, r: Ranges) -> list[LNode]:
    """The computed arguments of n that may be zero where that is a pole of n (a divisor, a negative power)."""
    if n.op in _POLES or (n.op == "pow" and not isinstance(n.args[1], LNode) and n.args[1] < 1):
        args = [n.args[0]]
    elif n.op == "div":
        args = [n.args[1]]
    else:
        return []
    return [a for a in args if isinstance(a, LNode) and a.op not in ("load", "scalar") and r.least(a) == 0]


def _pole_of(x: object, r: Ranges, half: set[int]) -> bool:
    """x is a pole's result (through negations and casts) whose argument a half value's rounding may make zero."""
    while isinstance(x, LNode) and x.op in ("neg", "cast"):
        x = x.args[0]
    return isinstance(x, LNode) and any(id(a) in half for a in _poles(x, r))


def zero_deciding(g: LoopGraph) -> list[LNode]:
    """Half values whose exact zero decides a result: the values computed from an argument of a pole that may
    be zero (one with no positive lower bound: fp16(var + 1e-12) may be 0, a softmax's sum is at least 1), the
    numerator over such a divisor (0 / 0 is NaN, x / 0 inf), a factor of a pole's result (0 * -inf is NaN: the
    entropy -p log(p + eps) with p underflowed; a pole of float32 data alone is infinite in eager and kernels
    alike, and its factors are left as they are). A float32 sum of half values is zero only where eager's is
    (`_cone` rounds its terms)."""
    r = Ranges(g)
    half: set[int] = set()      # values computed from half values
    roots: list[object] = []
    for n in g.nodes:
        if (n.dtype in _HALF and n.op not in ("load", "scalar", "iota")) or any(id(a) in half for a in n.inputs):
            half.add(id(n))
        ps = _poles(n, r)
        roots += ps + ([n.args[0]] if ps and n.op == "div" else [])
        if n.op == "mul":
            roots += [n.args[i] for i in (0, 1) if _pole_of(n.args[1 - i], r, half)]
    return _cone(roots)


# uses through which a value's absolute error stays an absolute error of the result, scaled at most: sums, the
# exponentials of a softmax (exp(x + e) = exp(x)(1 + e)) and its running maxima; its relative error near 0 reaches
# none of them. A comparison (its sign), a product with a value or a log (its relative error) are not among them
_ADDITIVE = ("add", "sub", "exp", "exp2", "maximum", "minimum")


def added_only(g: LoopGraph) -> list[LNode]:
    """The tanh values every use of which is additive (`_ADDITIVE`, or a sum or max reduction), looking through
    negations, casts, products and quotients by numbers and the branches of a select: a soft cap's
    cap * tanh(s / cap) + mask. Elsewhere the kernels' tanh is exact relative to its value near 0 too (mish's
    x tanh(softplus(x)) at x = -16 is a tiny negative weight whose log decides an entropy)."""
    uses: dict[int, list[LNode]] = {}
    for n in g.nodes:
        for a in n.inputs:
            uses.setdefault(id(a), []).append(n)
    outputs = {id(o.node) for o in g.outputs}

    def additive(x: LNode) -> bool:
        if id(x) in outputs:
            return False
        for u in uses.get(id(x), []):
            if u.op in ("neg", "cast") or (u.op in ("mul", "div") and not isinstance(u.args[1], LNode)) or \
                    (u.op == "mul" and not isinstance(u.args[0], LNode)) or (u.op == "where" and u.args[0] is not x):
                if not additive(u):
                    return False
            elif not (u.op in _ADDITIVE or (u.op == "reduce" and u.attrs["kind"] in ("sum", "max", "min"))):
                return False
        return True
    return [n for n in g.nodes if n.op == "tanh" and additive(n)]


def mask_deciding(g: LoopGraph) -> list[LNode]:
    """The half values a sum with a mask (`rounds_sum`) adds the mask to, back to the loads: eager's s + finfo.min
    rounds s into steps of the constant's ulp (fp16: 32, and -inf from s <= -16), and a fully masked row spreads
    its probability over the keys in the top step, so s must be eager's own half value to land in eager's step
    (float32 scores an ulp from eager's counted one key more, in a row where eager counts none). fp16 only: its
    steps are as fine as scores (8 at -1e4), bf16's are not (64 at -1e4, 2**120 at its finfo.min)."""
    return _cone([a for _, masks, others in _mask_sums(g.nodes) for a in others])


def deciding_masks(nodes: list[LNode]) -> dict[int, list[object]]:
    """For each value rounded for the masks alone (`UNDER_MASKS`, no cast of an input that rounds, no sum with a
    mask), the masks of the sums it decides: where they are all 0, s + 0 is s and the rounding decides nothing."""
    out: dict[int, list[object]] = {}
    for _, masks, others in _mask_sums(nodes):
        for x in _cone(others):
            if x.attrs.get(ROUNDS) == UNDER_MASKS and not rounds_input(x) and not rounds_sum(x):
                out.setdefault(id(x), []).extend(masks)
    return out


def _mask_sums(nodes: list[LNode]) -> list[tuple[LNode, list[object], list[object]]]:
    """The fp16 sums with a mask (`rounds_sum`), each with its mask operands and its others."""
    out = []
    for n in nodes:
        if n.dtype == torch.float16 and rounds_sum(n):
            masks = [a for a in n.args if _mask_like(a, n.dtype) or read_input(a) is not None]
            out.append((n, masks, [a for a in n.args if not any(a is m for m in masks)]))
    return out


def _cone(roots: list[object]) -> list[LNode]:
    """The half values the roots are computed from, roots included, back to the loads: every float value is
    walked through, since float32 arithmetic carries a half value's rounding on (a product, a cast); sums are
    walked through but not rounded: their terms are."""
    out: dict[int, LNode] = {}
    stack = [x for x in roots if isinstance(x, LNode)]
    while stack:
        x = stack.pop()
        if id(x) not in out and x.op not in ("load", "scalar", "iota") and x.dtype.is_floating_point:
            out[id(x)] = x
            stack += x.inputs
    return [x for x in out.values() if x.dtype in _HALF and x.op != "reduce"]


def saturates(n: LNode, faithful: bool) -> float:
    """Where n is rounded only as a sum with a mask (`rounds_sum`): the magnitude from which its rounding is kept;
    0 where it is rounded everywhere or nowhere. Eager's s + finfo.min rounds to finfo.min, which makes a fully
    masked row uniform; below that magnitude eager's sum is s + 0, exact, and the float32 sum is as close to the
    exact answer (rounding it there would round the float32 scores once where eager rounded each step before:
    another draw of error, at times farther from the exact answer than eager's)."""
    if (faithful and n.dtype in _HALF) or _marked(n) or not rounds_sum(n):
        return 0.0
    return _COARSE[n.dtype]


def _marked(n: LNode) -> bool:
    return bool(n.attrs.get(ROUNDS)) or rounds_input(n)


def kept(n: LNode) -> bool:
    """Whether every plan rounds n, faithful or not (the rewrites and the factorisation of sums leave it whole)."""
    return _marked(n) or rounds_sum(n)


def rounds(n: LNode, faithful: bool) -> bool:
    """Whether the kernels round n to its half type (else its float32 value stands for it, no instruction)."""
    return (faithful and n.dtype in _HALF) or kept(n)
