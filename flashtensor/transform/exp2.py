"""exp(x) -> exp2(x * log2 e), with the constant folded into x (docs/design.md §3.6).

The GPU evaluates exp as ex2(x * log2 e), so a softmax pays one multiply per score for
the conversion on top of the one that applies the softmax scale. Pushing log2 e down
through additions, subtractions, selects and multiplications by constants merges the two
into the scale: `exp(s * c - max(s * c))` becomes `exp2(s * (c log2 e) - max(s * (c log2 e)))`.
A max or min that the pushed factor meets is taken over the scaled values (log2 e > 0
keeps the order), and its other readers see it divided back, a per-row cost.

A float32 log the factor reaches becomes log2 (log x * log2 e = log2 x), computed on the GPU's
approximate unit like exp2 itself: under an exponential its absolute error of about 1e-7 is a
relative one in the result, far inside the float32 contract, and the accurate log costs some
twenty instructions per element (KeyFormer's Gumbel noise).

Half-precision values are only scaled through when the kernels compute them in float32
without rounding (`through_half`); where eager's fp16 rounding is reproduced, and at a cast of
an input that rounds (always reproduced), scaling before the rounding would change the rounded
value, so the factor stops there.

An exponent that may hold a huge value (a mask's finfo.min or -1e9, an fp16 input) is not folded: its product's
rounding would differ between the places that compute it, which a fully masked row shows (`COARSE`).
"""
from __future__ import annotations

import math

import torch

from ..analysis.precision import kept
from ..ir.loops import LNode, LoopGraph, NodeTable, node_vars, rebuilt, stamp

LOG2E = 1.0 / math.log(2.0)
# the smallest magnitude a scaled exponent may not reach: float32 rounds x * log2 e by up to |x log2 e| * 2^-24,
# and where one value is scaled in two places (two kernels of a plan, two loop segments, one of which fuses the
# product into the subtraction of the max while the other rounds it first) its exponents differ by that much.
# Past this a fully masked row's probabilities, all near the mask constant, move by 4e-5 or more (at fp16's
# finfo.min, 0.15%: each row sums to 1.0015), and float32's c + x rounds on a grid of |c| * 2^-23 that a fold
# would rescale (s - 1e9 rounds s to multiples of 64 in eager); finfo(float32).min * log2 e is past float32's range
COARSE = 2.0 ** 10
_HALF = (torch.float16, torch.bfloat16)


def _const(t):
    """The value of a constant operand (a Python number or a scalar node), else None."""
    if isinstance(t, LNode):
        return float(t.attrs["value"]) if t.op == "scalar" else None
    return float(t)


class _Folder:
    def __init__(self, through_half: bool) -> None:
        self.through_half = through_half
        self.new: dict[int, LNode] = {}          # old node -> rewritten node
        self.scaled: dict[int, LNode] = {}       # rewritten node -> the same value times LOG2E
        self.unscalable: set[int] = set()        # exps (old nodes) whose argument is scaled after it is computed
        self.table = NodeTable()

    def node(self, op: str, args: tuple, dtype: torch.dtype, **attrs) -> LNode:
        return self.table.get(op, args, dtype, node_vars(op, args, attrs), attrs)

    def opaque_to_scaling(self, n: LNode) -> bool:
        return _opaque(n, self.through_half)

    def scale(self, x, c: float = LOG2E):
        """x * c, pushed as far down as the rules allow."""
        if not isinstance(x, LNode):
            return x * c if isinstance(x, float) else float(x) * c
        if c == 1.0:
            return x
        if c != LOG2E:
            return self._scale(x, c)
        if id(x) not in self.scaled:
            self.scaled[id(x)] = self._scale(x, c)
        return self.scaled[id(x)]

    def _scale(self, x: LNode, c: float) -> LNode:
        op, a = x.op, x.args
        dt = _wide(x.dtype)
        if self.opaque_to_scaling(x) or not x.dtype.is_floating_point:
            return self.node("mul", (x, c), torch.float32)
        if op in ("mul", "div") and _const(a[1]) is not None or op == "mul" and _const(a[0]) is not None:
            other, k = (a[0], _const(a[1])) if _const(a[1]) is not None else (a[1], _const(a[0]))
            k = k if op == "mul" else (1.0 / k if k else math.inf)
            if isinstance(other, LNode) and other.dtype == x.dtype and k != 0 and math.isfinite(k):
                return self.scale(other, k * c)
        if op in ("add", "sub"):
            return self.factored(op, self.scale(a[0], c), self.scale(a[1], c), dt)
        if op == "neg":
            return self.node("neg", (self.scale(a[0], c),), dt)
        if op == "where":
            return self.node("where", (a[0], self.scale(a[1], c), self.scale(a[2], c)), dt)
        if op == "scalar":
            return self.node("scalar", (), dt, value=float(x.attrs["value"]) * c)
        if op == "log" and x.dtype == torch.float32:     # log x * c = log2 x * (c ln 2), under an exp
            lg = self.node("log2_approx", (a[0],), x.dtype)
            k = c * math.log(2.0)
            return lg if abs(k - 1.0) < 1e-15 else self.node("mul", (lg, k), x.dtype)
        if op == "cast" and a[0].dtype.is_floating_point and not self.opaque_to_scaling(a[0]):
            return self.node("cast", (self.scale(a[0], c),), dt)
        return self.node("mul", (x, c), dt)

    def factored(self, op: str, left, right, dtype: torch.dtype) -> LNode:
        """left op right, where both still carry a multiply by a constant (k1 > 0 on the left), as
        (lhs op rhs * (k2 / k1)) * k1: one multiply is left, which a running max takes outside (the emitter's
        `scaled`) and the exponent's subtraction fuses, in place of one on each side and an add. KeyFormer's
        (s + g) / tau with g = -log(noise): s * c + lg2(noise) * (-c ln 2) becomes
        (s + lg2(noise) * -ln 2) * c."""
        (lhs, k1), (rhs, k2) = _residual(left), _residual(right)
        if k1 is None or k2 is None or not 0 < k1 < math.inf:
            return self.node(op, (left, right), dtype)
        inner = self.node(op, (lhs, self.scale(rhs, k2 / k1)), dtype)
        return self.node("mul", (inner, k1), dtype)

    def rewrite(self, n: LNode, feeds_exp: set[int]) -> LNode:
        args = tuple(self.new[id(a)] if isinstance(a, LNode) else a for a in n.args)
        if n.op == "exp" and id(n) in self.unscalable:
            return self.node("exp2", (self.node("mul", (args[0], LOG2E), _wide(args[0].dtype)),), n.dtype, **n.attrs)
        if n.op == "exp":
            return self.node("exp2", (self.scale(args[0]),), n.dtype, **n.attrs)
        if id(n) in feeds_exp:
            # a max or min under an exp: kept over the scaled values; its other readers divide back
            red = self.node("reduce", (self.scale(args[0]),), _wide(n.dtype), **n.attrs)
            out = self.node("mul", (red, 1.0 / LOG2E), n.dtype)
            self.scaled[id(out)] = red
            return out
        if all(x is y for x, y in zip(args, n.args)):
            return n
        return self.node(n.op, args, n.dtype, **n.attrs)


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The type of a value times log2 e: float32 for a half one, which the kernels compute unrounded. The facts
    round a constant to its node's type, and would otherwise hold values the kernels never compute (fp16's finfo.min
    times log2 e rounded to -inf folded tiles to 0; `_unscalable` now keeps such values unscaled besides)."""
    return torch.float32 if dtype in _HALF else dtype


def _opaque(x: LNode, through_half: bool) -> bool:
    """A half value the factor stops at: the kernels round it (in this plan, or in every plan)."""
    return x.dtype in _HALF and (not through_half or kept(x))


def _residual(x) -> tuple:
    """(y, k) with x = y * k for a constant k that scaling left as a multiply (through negations), else
    (x, None)."""
    if isinstance(x, LNode) and x.op == "neg":
        y, k = _residual(x.args[0])
        return (y, -k) if k is not None else (x, None)
    if isinstance(x, LNode) and x.op == "mul" and _const(x.args[1]) is not None and isinstance(x.args[0], LNode):
        return x.args[0], _const(x.args[1])
    return x, None


def _finite(v: float, c: float) -> float:
    """|v * c| for a finite constant v (an infinite one stays infinite, as in eager), else 0."""
    return abs(v * c) if math.isfinite(v) else 0.0


def largest(x, c: float = 1.0) -> float:
    """The largest finite magnitude that scaling x by c could create, from its constants and inputs (the
    pushes of `_Folder._scale`; a value the factor stops at is multiplied whole, with the same magnitudes). An
    input may hold any finite value of its type: Hugging Face passes its finfo(float32).min mask in. Computed
    values (sums, transcendentals) count as 0. codegen.forms also asks it how large a row max may be."""
    if not isinstance(x, LNode):
        return _finite(float(x), c) if not isinstance(x, bool) else 0.0
    op, a = x.op, x.args
    if not x.dtype.is_floating_point:
        return 0.0
    if op == "load":
        return _finite(torch.finfo(x.dtype).max, c)
    if op == "scalar":
        return _finite(float(x.attrs["value"]), c)
    if op in ("mul", "div") and _const(a[1]) is not None or op == "mul" and _const(a[0]) is not None:
        other, k = (a[0], _const(a[1])) if _const(a[1]) is not None else (a[1], _const(a[0]))
        k = k if op == "mul" else (1.0 / k if k else math.inf)
        if not math.isfinite(k) or k == 0:
            return 0.0
        return _finite(k, c) if not isinstance(other, LNode) else largest(other, k * c)
    if op in ("add", "sub"):
        return max(largest(a[0], c), largest(a[1], c))
    if op in ("neg", "cast") or (op == "reduce" and x.attrs["kind"] in ("max", "min")):
        return largest(a[0], c)
    if op == "where":
        return max(largest(a[1], c), largest(a[2], c))
    if op in ("maximum", "minimum"):      # torch.max(s, finfo.min), H2O's clamp: either operand's value
        return max(largest(a[0], c), largest(a[1], c))
    if op == "mul":                       # of two values: a huge one times an input, or a moderate value
        big, other = largest(a[0], c), largest(a[1])
        return big * other if big and other else max(big, other * c)
    if op == "div":                       # a huge value over another may be larger still
        return math.inf if largest(a[0], c) else 0.0
    return 0.0


def _passed(x: LNode) -> list[LNode]:
    """The operands of x that a factor pushed into x reaches: a sum's, a negation's, a cast's, those of a multiply
    or divide by a constant, a select's two values."""
    if x.op in ("add", "sub", "neg", "cast") or (x.op in ("mul", "div") and len(x.inputs) == 1):
        return list(x.inputs)
    return list(x.inputs[1:]) if x.op == "where" else []


def _unscalable(g: LoopGraph) -> set[int]:
    """Exps whose argument may hold a constant or an input of magnitude COARSE or more (an fp16 input, a mask's
    finfo.min or -1e9, through selects and roundings alike): they stay exp2((x - m) * log2 e), with the multiply
    after the subtraction of the max, where x - m is exact near the max and rounded as eager rounds it, whichever
    kernel computes it."""
    return {id(n) for n in g.nodes if n.op == "exp" and largest(n.args[0], LOG2E) >= COARSE}


def _reductions_under_exp(g: LoopGraph, through_half: bool, exps: set[int]) -> set[int]:
    """Max/min reductions reached from the argument of an exp in `exps` through the ops the factor passes."""
    out: set[int] = set()
    stack = [n.args[0] for n in g.nodes if n.op == "exp" and id(n) in exps and isinstance(n.args[0], LNode)]
    seen: set[int] = set()
    while stack:
        x = stack.pop()
        if not isinstance(x, LNode) or id(x) in seen or _opaque(x, through_half):
            continue
        seen.add(id(x))
        if x.op == "reduce" and x.attrs["kind"] in ("max", "min"):
            out.add(id(x))
        else:
            stack += _passed(x)
    return out


def fold_exp2(g: LoopGraph, through_half: bool) -> LoopGraph:
    """The same program with every exp computed as exp2 of a scaled argument."""
    if not any(n.op == "exp" for n in g.nodes):
        return g
    f = _Folder(through_half)
    exps = {id(n) for n in g.nodes if n.op == "exp"}
    f.unscalable = _unscalable(g)
    feeds = _reductions_under_exp(g, through_half, exps - f.unscalable) - \
        _reductions_under_exp(g, through_half, f.unscalable)
    for n in g.nodes:
        f.new[id(n)] = f.rewrite(n, feeds)
        stamp(f.new[id(n)], n.origin)
    return rebuilt(g, f.new, "t")
