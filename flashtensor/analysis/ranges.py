"""How large a value can get, for the question precision.py asks: can eager's fp16 value of it overflow?

A value's magnitude is one of four levels, in order:

- BOUNDED: a proven bound (constants and indices, tanh and sigmoid, exp of a value with a proven upper bound
  such as x - max x, a non-negative value over its own sum, a quotient by a value with a positive lower bound);
- INPUT: a program input as loaded: fp16 holds it, and real data sit far inside fp16's range;
- DATA: computed from the data by sums, contractions, products with inputs, multiplies by constants of at
  most 1: of the data's size, assumed inside fp16's range, the assumption every fused attention kernel makes
  of its scores (docs/design.md §3.5, the limit);
- WILD: may pass fp16's largest value: a product of two DATA values (s * s), an unbounded value times a
  constant past 1 (s * 1e3, s / 1e-3), exp of a value with no upper bound, a quotient by a value with no
  positive lower bound (1 / (x + eps)), a bound past 65504.

Lower and upper bounds of values (not magnitudes) go with it: x - max x <= 0 bounds an exponential, and
var + eps >= eps (var >= 0) bounds a reciprocal square root. Bounds of half values are rounded as eager
rounds them: fp16(1e-12) is 0, so clamp_min(x, 1e-12) gives a divisor no lower bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..ir.loops import Affine, LNode, LoopGraph
from ..ir.sizes import Size, symbolic
from .facts import nonnegative

FP16_MAX = torch.finfo(torch.float16).max
BOUNDED, INPUT, DATA, WILD = range(4)


@dataclass(frozen=True)
class Mag:
    level: int
    bound: float = math.inf      # |x| <= bound, where level is BOUNDED


def _bounded(b: float) -> Mag:
    return Mag(BOUNDED, b) if b <= FP16_MAX else Mag(WILD)


def _join(a: Mag, b: Mag) -> Mag:
    if a.level == b.level == BOUNDED:
        return Mag(BOUNDED, max(a.bound, b.bound))
    return a if a.level >= b.level else b


def _sum(a: Mag, b: Mag) -> Mag:
    """a + b. A constant near fp16's top plus data passes it (s + finfo(fp16).min is -inf in eager)."""
    if a.level == b.level == BOUNDED:
        return _bounded(a.bound + b.bound)
    if WILD in (a.level, b.level) or any(m.level == BOUNDED and m.bound > FP16_MAX / 2 for m in (a, b)):
        return Mag(WILD)
    return Mag(DATA)


def _product(a: Mag, b: Mag) -> Mag:
    """a * b: two data values or data times more than 1 may overflow; an input times data is data."""
    if a.level == b.level == BOUNDED:
        return _bounded(a.bound * b.bound)
    if a.level == BOUNDED or b.level == BOUNDED:
        c, x = (a, b) if a.level == BOUNDED else (b, a)
        return x if c.bound <= 1 or x.level == WILD else Mag(WILD)
    return Mag(DATA) if INPUT in (a.level, b.level) and WILD not in (a.level, b.level) else Mag(WILD)


def _affine_range(e: Affine) -> tuple[float, float]:
    """The range of e over its variables (unbounded where a size is symbolic: any length may come)."""
    if symbolic(e.const) or any(symbolic(v.extent) or symbolic(c) for v, c in e.terms):
        return -math.inf, math.inf
    lo = hi = float(e.const)
    for v, c in e.terms:
        lo, hi = lo + min(0, c * (v.extent - 1)), hi + max(0, c * (v.extent - 1))
    return lo, hi


def _upper(extent: Size) -> float:
    return math.inf if symbolic(extent) else float(extent)


def _times(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b


def _exp(x: float, base: float) -> float:
    return math.inf if x > 1000 else base ** x


class Ranges:
    """Magnitudes and value bounds of a loop graph's nodes, computed once in topological order."""

    def __init__(self, g: LoopGraph) -> None:
        self.mag: dict[int, Mag] = {}
        self.lo: dict[int, float] = {}
        self.hi: dict[int, float] = {}
        for n in g.nodes:
            self.lo[id(n)], self.hi[id(n)] = self._bounds(n)
            self.mag[id(n)] = self._mag(n)

    def of(self, x: object) -> Mag:
        if isinstance(x, LNode):
            return self.mag[id(x)]
        v = float(x) if isinstance(x, (int, float)) else 1.0
        return _bounded(abs(v) if math.isfinite(v) else 0.0)   # an infinite constant is exact in any type

    def low(self, x: object) -> float:
        return self.lo[id(x)] if isinstance(x, LNode) else float(x) if isinstance(x, (int, float)) else 0.0

    def high(self, x: object) -> float:
        return self.hi[id(x)] if isinstance(x, LNode) else float(x) if isinstance(x, (int, float)) else 1.0

    def least(self, x: object) -> float:
        """A proven positive lower bound of |x|, else 0."""
        lo, hi = self.low(x), self.high(x)
        return lo if lo > 0 else -hi if hi < 0 else 0.0

    def _bounds(self, n: LNode) -> tuple[float, float]:
        lo, hi = self._bounds_of(n)
        if nonnegative(n):
            lo = max(lo, 0.0)
        if n.dtype in (torch.float16, torch.bfloat16):     # eager holds the value rounded (monotone)
            lo, hi = torch.tensor([lo, hi]).to(n.dtype).float().tolist()
        return lo, hi

    def _bounds_of(self, n: LNode) -> tuple[float, float]:
        op, a = n.op, n.args
        if n.dtype == torch.bool:
            return 0.0, 1.0
        if op == "iota":
            return _affine_range(n.attrs["expr"])
        if op == "scalar":
            return float(n.attrs["value"]), float(n.attrs["value"])
        if op in ("cast", "reduce") and n.attrs.get("kind") in (None, "max", "min"):
            return self.low(a[0]), self.high(a[0])
        if op == "reduce":      # a sum of k values in [lo, hi]; of exp(x - max x), one of them is 1
            k, x = _upper(n.attrs["var"].extent), a[0]
            one = isinstance(x, LNode) and x.op == "exp" and isinstance(x.args[0], LNode) and \
                x.args[0].op == "sub" and _max_of(x.args[0].args[1], x.args[0].args[0], n.attrs["var"])
            return max(_times(self.low(x), k), 1.0 if one else -math.inf), _times(self.high(x), k)
        if op == "neg":
            return -self.high(a[0]), -self.low(a[0])
        if op in ("exp", "exp2"):
            base = math.e if op == "exp" else 2.0
            return _exp(self.low(a[0]), base), _exp(self.high(a[0]), base)
        if op in ("tanh", "sigmoid"):
            return (-1.0 if op == "tanh" else 0.0), 1.0
        if op == "sqrt":
            return math.sqrt(max(self.low(a[0]), 0.0)), math.sqrt(max(self.high(a[0]), 0.0))
        if op == "where":
            return min(self.low(a[1]), self.low(a[2])), max(self.high(a[1]), self.high(a[2]))
        if op in ("maximum", "minimum"):
            f = max if op == "maximum" else min
            return f(self.low(a[0]), self.low(a[1])), f(self.high(a[0]), self.high(a[1]))
        if op == "add":
            return self.low(a[0]) + self.low(a[1]), self.high(a[0]) + self.high(a[1])
        if op == "sub":
            hi = 0.0 if _max_of(a[1], a[0]) else self.high(a[0]) - self.low(a[1])
            return self.low(a[0]) - self.high(a[1]), hi
        if op == "div" and _normalised(a[0], a[1]):
            return 0.0, 1.0
        if op == "div" and isinstance(a[1], (int, float)) and a[1] != 0:
            ends = [self.low(a[0]) / a[1], self.high(a[0]) / a[1]]
            return min(ends), max(ends)
        if op == "mul" and a[0] is a[1]:
            return 0.0, max(self.high(a[0]) ** 2, self.low(a[0]) ** 2)
        if op == "pow" and isinstance(a[1], (int, float)) and a[1] > 0 and float(a[1]).is_integer() and a[1] % 2 == 0:
            return 0.0, max(abs(self.low(a[0])), abs(self.high(a[0]))) ** a[1]
        if op == "mul":
            ends = [_times(x, y) for x in (self.low(a[0]), self.high(a[0])) for y in (self.low(a[1]), self.high(a[1]))]
            return min(ends), max(ends)
        return -math.inf, math.inf

    def _mag(self, n: LNode) -> Mag:
        lo, hi = self.lo[id(n)], self.hi[id(n)]
        if math.isfinite(lo) and math.isfinite(hi):
            return _bounded(max(abs(lo), abs(hi)))
        if n.op == "load":
            return Mag(INPUT)
        rule = _RULES.get(n.op)
        return rule(self, n) if rule else Mag(WILD)


def _max_of(m: object, x: object, var: object = None) -> bool:
    """m is a max reduction of x (over `var` where given), so x - m <= 0."""
    return isinstance(m, LNode) and m.op == "reduce" and m.attrs["kind"] == "max" and m.args[0] is x and \
        var in (None, m.attrs["var"])


def _normalised(num: object, den: object) -> bool:
    """num / den is a non-negative value over its own sum: in [0, 1]."""
    return isinstance(den, LNode) and den.op == "reduce" and den.attrs["kind"] == "sum" and den.args[0] is num and \
        nonnegative(num)


def _quotient(r: Ranges, num: object, den: object) -> Mag:
    """num / den, bounded through den's least |value|."""
    least = r.least(den)
    return _product(r.of(num), _bounded(1 / least)) if least > 0 else Mag(WILD)


def _pow(r: Ranges, n: LNode) -> Mag:
    x, k = n.args
    if isinstance(k, LNode):
        return Mag(WILD)
    if k < 0:
        least = r.least(x)
        return _bounded(least ** k) if least > 0 else Mag(WILD)
    m = r.of(x)
    return m if k <= 1 or m.level == WILD else _product(m, m) if k <= 2 else Mag(WILD)


def _reduce(r: Ranges, n: LNode) -> Mag:
    m = r.of(n.args[0])
    if n.attrs["kind"] != "sum":
        return m
    if m.level == BOUNDED:
        return _bounded(m.bound * _upper(n.attrs["var"].extent))
    return Mag(DATA if m.level < WILD else WILD)


def _same(r: Ranges, n: LNode) -> Mag:
    return r.of(n.args[0])


def _data(r: Ranges, n: LNode) -> Mag:
    return Mag(DATA) if r.of(n.args[0]).level < WILD else Mag(WILD)


_RULES: dict[str, Callable[[Ranges, LNode], Mag]] = {
    "scalar": lambda r, n: r.of(n.attrs["value"]), "cast": _same, "neg": _same, "abs": _same, "sqrt": _data,
    "where": lambda r, n: _join(r.of(n.args[1]), r.of(n.args[2])),
    "maximum": lambda r, n: _join(r.of(n.args[0]), r.of(n.args[1])),
    "minimum": lambda r, n: _join(r.of(n.args[0]), r.of(n.args[1])),
    "add": lambda r, n: _sum(r.of(n.args[0]), r.of(n.args[1])),
    "sub": lambda r, n: _sum(r.of(n.args[0]), r.of(n.args[1])),
    "mul": lambda r, n: _product(r.of(n.args[0]), r.of(n.args[1])),
    "div": lambda r, n: _quotient(r, n.args[0], n.args[1]),
    "reciprocal": lambda r, n: _quotient(r, 1.0, n.args[0]),
    "rsqrt": lambda r, n: _bounded(r.least(n.args[0]) ** -0.5) if r.least(n.args[0]) > 0 else Mag(WILD),
    "log": lambda r, n: Mag(BOUNDED, 104.0), "log2": lambda r, n: Mag(BOUNDED, 150.0),
    "log2_approx": lambda r, n: Mag(BOUNDED, 150.0),
    "pow": _pow, "reduce": _reduce,
}


def overflows(g: LoopGraph) -> list[LNode]:
    """The fp16 values eager may round to inf where float32 keeps them finite: WILD values made by an op that
    can grow a magnitude (a select, negation or maximum of rounded values is rounded already). Sums are not
    among them: eager accumulates in float32 as the kernels do, and the loop form cannot tell a mean's sum,
    which eager never rounds, from a sum the program rounds before dividing it."""
    r = Ranges(g)
    return [n for n in g.nodes if n.dtype == torch.float16 and r.mag[id(n)].level == WILD and
            n.op not in ("load", "where", "neg", "abs", "maximum", "minimum", "reduce")]
