"""Value facts: where a value is a known constant, as regions given by affine predicates (DESIGN 3.5).

A region is a conjunction of half-planes `expr >= 0` over index variables. For each
loop node we find facts `(region, constant)`: a causal mask `where(j - i >= 1, -inf, 0)`
is -inf on {j - i - 1 >= 0} and 0 on {i - j >= 0}. Facts flow through arithmetic
(x + -inf = -inf, exp(-inf) = 0, 0 * x = 0, 0 / x = 0), assuming the unknown operand
is finite; that is the assumption every fused attention kernel makes.
"""
from __future__ import annotations

import math
from typing import Optional

from ..ir.loops import Affine, LNode

Region = tuple[Affine, ...]      # conjunction of half-planes e >= 0
Fact = tuple[Region, object]     # the node equals the constant on the region

IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf, "any": False}


def negate(h: Affine) -> Affine:
    """not (e >= 0)  <=>  -e - 1 >= 0 over the integers."""
    return h.scale(-1) + Affine((), -1)


def _both(fa: list[Fact], fb: list[Fact], f) -> list[Fact]:
    out = []
    for ra, va in fa:
        for rb, vb in fb:
            v = f(va, vb)
            if v is not None:
                out.append((_and(ra, rb), v))
    return out


def _and(a: Region, b: Region) -> Region:
    return tuple(dict.fromkeys(a + b))


def _eq(v, c) -> bool:
    return not isinstance(v, Affine) and v == c


class Facts:
    """Per-node affine values (for integer index arithmetic) and constant facts."""

    def __init__(self) -> None:
        self.affine: dict[LNode, Affine] = {}
        self.facts: dict[LNode, list[Fact]] = {}

    def of(self, n: LNode) -> list[Fact]:
        return self.facts.get(n, [])

    def run(self, nodes: list[LNode]) -> "Facts":
        for n in nodes:
            self.facts[n] = self._node(n)
        return self

    def _aff(self, a) -> Optional[Affine]:
        if isinstance(a, LNode):
            return self.affine.get(a)
        if isinstance(a, int) and not isinstance(a, bool):
            return Affine((), a)
        return None

    def _const_facts(self, a) -> list[Fact]:
        if isinstance(a, LNode):
            if a.op == "scalar":
                return [((), a.attrs["value"])]
            return self.of(a)
        return [((), a)]

    def _node(self, n: LNode) -> list[Fact]:
        op, args = n.op, n.args
        if op == "iota":
            self.affine[n] = n.attrs["expr"]
            return []
        if op == "scalar":
            return [((), n.attrs["value"])]
        if op in ("add", "sub") and all(self._aff(a) is not None for a in args):
            x, y = self._aff(args[0]), self._aff(args[1])
            self.affine[n] = x + (y.scale(-1) if op == "sub" else y)
            return []
        if op in ("ge", "gt", "le", "lt") and all(self._aff(a) is not None for a in args):
            d = self._aff(args[0]) + self._aff(args[1]).scale(-1)        # x - y
            h = {"ge": d, "gt": d + Affine((), -1), "le": d.scale(-1), "lt": d.scale(-1) + Affine((), -1)}[op]
            return [((h,), True), ((negate(h),), False)]
        fs = [self._const_facts(a) for a in args]
        if op == "where":
            out = []
            for rc, vc in fs[0]:
                for rx, vx in fs[1 if vc else 2]:
                    out.append((_and(rc, rx), vx))
            return out
        if op == "logical_or":
            out = [(r, True) for f in fs for r, v in f if v is True]
            return out + _both(fs[0], fs[1], lambda a, b: False if a is False and b is False else None)
        if op == "logical_and":
            out = [(r, False) for f in fs for r, v in f if v is False]
            return out + _both(fs[0], fs[1], lambda a, b: True if a is True and b is True else None)
        if op == "logical_not":
            return [(r, not v) for r, v in fs[0]]
        if op == "cast":
            return fs[0]
        if op in ("exp", "exp2"):
            return [(r, 0.0 if v == -math.inf else (math.exp(v) if op == "exp" else 2.0 ** v)) for r, v in fs[0]]
        if op == "neg":
            return [(r, -v) for r, v in fs[0]]
        if op in ("tanh", "sigmoid"):
            f = math.tanh if op == "tanh" else (lambda v: 0.0 if v == -math.inf else 1 / (1 + math.exp(-v)))
            return [(r, f(v)) for r, v in fs[0]]
        if op in ("add", "sub", "mul", "div"):
            return self._arith(op, args, fs)
        return []

    def _arith(self, op: str, args, fs) -> list[Fact]:
        """Absorbing constants: unknown (finite) operands do not matter."""
        out: list[Fact] = []
        for side in (0, 1):
            for r, v in fs[side]:
                if op in ("add", "sub") and isinstance(v, float) and math.isinf(v):
                    out.append((r, v if (op == "add" or side == 0) else -v))
                elif op == "mul" and _eq(v, 0):
                    out.append((r, 0.0))
                elif op == "div" and side == 0 and _eq(v, 0):
                    out.append((r, 0.0))
        out += _both(fs[0], fs[1], lambda a, b: _fold(op, a, b))
        return out


def _fold(op: str, a, b):
    """Both operands known (e.g. -inf on a region divided by a positive constant): the exact result."""
    try:
        v = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a / b}[op]()
    except (ZeroDivisionError, TypeError):
        return None
    return None if isinstance(v, float) and math.isnan(v) else v
