"""Value facts: where a value is a known constant, as regions given by affine predicates (docs/design.md §3.5).

A region is a conjunction of half-planes `expr >= 0` over index variables. For each
loop node we find facts `(region, constant)`: a causal mask `where(j - i >= 1, -inf, 0)`
is -inf on {j - i - 1 >= 0} and 0 on {i - j >= 0}. Facts flow through arithmetic
(x + -inf = -inf, exp(-inf) = 0, 0 * x = 0, 0 / x = 0), assuming the unknown operand
is finite; that is the assumption every fused attention kernel makes. Where the facts
themselves say the other operand is not finite (the row max of a fully masked row is
-inf, so s - max is NaN there, not -inf) that region is cut out of the absorbed one.
Finite inputs can still give non-finite values: `input_domains` says what a runtime check
must also require of an input that a log, a square root or a division reads directly.
Huge finite mask constants (finfo.min, -1e9) are a value class of their own (`Magnitudes`): an exp
of one minus a row max that is not hugely negative is 0, which `Facts.neutral` and the zero facts
of such exps give the schedule as regions to skip.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Optional

import torch

from ..ir.loops import Affine, LNode, LoopGraph, read_input
from ..ir.ops import UNARY_OPS, Op
from ..ir.sizes import symbolic
from .atoms import HUGE, MODERATE, Atom, Cond, Exists, Scope, classes, masks

Region = tuple[Cond, ...]        # conjunction of half-planes e >= 0 and conditions on the data (analysis/atoms.py)
Plane = tuple[Affine, ...]       # a region of half-planes only
Fact = tuple[Region, float]      # the node equals the constant (a float, int or bool) on the region

IDENTITY = {"sum": 0.0, "max": -math.inf, "min": math.inf, "any": False}
_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}
_TESTS = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
          "ge": operator.ge}


def negate(h: Affine) -> Affine:
    """not (e >= 0)  <=>  -e - 1 >= 0 over the integers."""
    return h.scale(-1) + Affine((), -1)


def _negate(c: Cond) -> Optional[Cond]:
    """The complement of a condition, where it is one: a half-plane's, a bool atom's; None otherwise."""
    if isinstance(c, Affine):
        return negate(c)
    return c.negated() if isinstance(c, Atom) else None


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


def _sum(c: Any, extent: Any) -> Any:
    """The sum of `extent` copies of the constant c; None (no fact) for a float other than 0 over a symbolic
    extent: -inf summed over kv_len is sympy's -oo, which no size printer takes (and an empty axis sums to 0,
    not -inf), and each test of 0.5 * kv_len would be a guard. Integer counts stay expressions of the sizes."""
    if not symbolic(extent):
        return c * extent
    if c == 0:
        return c
    return None if isinstance(c, float) else c * extent


def _empty(region: Region) -> bool:
    """Whether some half-plane of the region, or the sum of two (i - j >= 0 and j - i - 1 >= 0 give -1 >= 0), holds
    nowhere in its variables' index box, or two of its atoms contradict each other (sufficient, not necessary)."""
    planes = [h for h in region if isinstance(h, Affine)]
    atoms = {(c.node, c.test) for c in region if isinstance(c, Atom)}
    return any(h.const + sum(c * (v.extent - 1) for v, c in h.terms if c > 0) < 0
               for h in planes + [a + b for k, a in enumerate(planes) for b in planes[k + 1:]]) or \
        any((n, "true") in atoms and (n, "false") in atoms or (n, "huge") in atoms and (n, "above") in atoms
            for n, _ in atoms)


def _minus(region: Region, cut: Region) -> list[Region]:
    """region without cut, as a union of conjunctions (one per negated condition of cut; a condition without a
    complement gives none, which leaves out a piece of the difference: fewer facts, never a wrong one)."""
    if _empty(cut) or _empty(region + cut):
        return [region]
    return [r for h in cut if (nh := _negate(h)) is not None and not _empty(r := _and(region, (nh,)))]


def _covering(region: Region, v) -> Optional[Region]:
    """The region of the other variables on which `region` holds for every value of v: each half-plane at its
    worst v (a reduction over v of a value constant on `region` is that constant there); None where a condition
    on the data varies along v (no region says it holds for every v)."""
    out: list[Cond] = []
    for h in region:
        if not isinstance(h, Affine):
            if v in h.vars:
                return None
            out.append(h)
            continue
        c = h.coeff(v)
        rest = Affine(tuple((w, k) for w, k in h.terms if w is not v), h.const)
        out.append(rest if c >= 0 else rest + Affine((), c * (v.extent - 1)))
    return tuple(out)


def _always(h: Affine) -> bool:
    """Whether h >= 0 holds everywhere in its variables' index box."""
    return h.const + sum(c * (v.extent - 1) for v, c in h.terms if c < 0) >= 0


def _exists(region: Region, v) -> Optional[Region]:
    """The region of the other variables on which `region` holds for some value of v in its range (a max over v
    of a value that is not hugely negative there is not either), half-planes that always hold left out. Exact
    where v's coefficients are +-1, as in index comparisons, or where conditions on the data vary along v (an
    `Exists` of the conditions that do); None otherwise, or where it is empty."""
    dep = tuple(h for h in region if v in h.vars)
    if not all(isinstance(h, Affine) for h in dep):
        inner = tuple(h for h in dep if not isinstance(h, Exists))
        return None if len(inner) < len(dep) else tuple(h for h in region if v not in h.vars) + (Exists(v, inner),)
    lows, ups = [Affine((), 0)], [Affine((), v.extent - 1)]     # v >= -low, v <= up
    keep: list[Cond] = []
    for h in region:
        if not isinstance(h, Affine):
            keep.append(h)
            continue
        c = h.coeff(v)
        rest = Affine(tuple((w, k) for w, k in h.terms if w is not v), h.const)
        if c not in (-1, 0, 1):
            return None
        (keep if c == 0 else lows if c == 1 else ups).append(h if c == 0 else rest)
    out = tuple(dict.fromkeys(h for h in keep + [lo + up for lo in lows for up in ups]
                              if not isinstance(h, Affine) or not _always(h)))
    return None if _empty(out) else out


class Facts:
    """Per-node affine values (for integer index arithmetic) and constant facts. With a `Scope`, masks read from
    tensors are conditions of their own (analysis/atoms.py): `bools` are true or false by their atoms, `addends`
    have their atoms for magnitude classes, and `data` holds what depends on either."""

    def __init__(self, scope: Optional[Scope] = None) -> None:
        self.scope = scope
        self.bools: set[LNode] = set()
        self.addends: set[LNode] = set()
        self.data: dict[int, bool] = {}
        self.affine: dict[LNode, Affine] = {}
        self.facts: dict[LNode, list[Fact]] = {}
        self.magnitudes = Magnitudes()
        self.huge: dict[LNode, list[Fact]] = {}        # (region, b): n <= b <= -HUGE there (or -inf)
        self.above: dict[LNode, list[Region]] = {}     # n >= -MODERATE there
        self.below: dict[LNode, list[Region]] = {}     # n <= MODERATE there
        self.vanishing: list[LNode] = []               # exps that are 0 where their argument is hugely negative

    def of(self, n: LNode) -> list[Fact]:
        return self.facts.get(n, [])

    def run(self, nodes: list[LNode]) -> "Facts":
        if self.scope is not None:
            self.bools, self.addends = masks(nodes, self.scope)
        for n in nodes:
            self.facts[n] = [(r, _rounded(v, n.dtype)) for r, v in self._node(n)]
            if not self.facts[n] and n in self.bools:
                self.facts[n] = [((Atom(n, "true"),), True), ((Atom(n, "false"),), False)]
            if n in self.addends:       # tiles where the mask keeps every element run without it (codegen/ranges.py)
                self.facts[n] = self.facts[n] + [((Atom(n, "zero"),), 0.0)]
            self._classes(n)
        return self

    @property
    def atoms(self) -> set[LNode]:
        """The masks read from tensors: what the kernel's run-time skips rely on instead of facts of their values."""
        return self.bools | self.addends

    def depends(self, x: object) -> bool:
        """Whether x depends on a mask read from a tensor (then a row of it may be wholly masked by the data)."""
        if not isinstance(x, LNode) or not (self.bools or self.addends):
            return False
        if id(x) not in self.data:
            self.data[id(x)] = x in self.bools or x in self.addends or any(self.depends(a) for a in x.inputs)
        return self.data[id(x)]

    def _classes(self, n: LNode) -> None:
        """Where n is hugely negative (`huge`) and where it is not (`above`, `below`; see Magnitudes); an exp of a
        hugely negative value is 0, a constant fact like any other (its node is kept in `vanishing`)."""
        self.above[n], self.below[n], self.huge[n] = self.magnitudes.run(n, self)
        if n.op in ("exp", "exp2") and (huge := self.huge.get(n.args[0])):
            self.facts[n] = self.facts[n] + [(r, 0.0) for r, _ in huge]
            self.vanishing.append(n)

    def neutral(self, r: LNode) -> list[Region]:
        """Regions where the argument of reduction r cannot change r's result: where it is r's identity, and for a
        max, where it is hugely negative on rows that have an element that is not (which then beats it)."""
        kind, x = r.attrs["kind"], r.args[0]
        out = [reg for reg, v in self.of(x) if v == IDENTITY[kind]]
        if kind == "max":
            out += [_and(reg, rows) for reg, _ in self.huge.get(x, []) for rows in self.above.get(r, [])]
        return out

    def _aff(self, a) -> Optional[Affine]:
        if isinstance(a, LNode):
            return self.affine.get(a)
        if isinstance(a, (int, torch.SymInt)) and not isinstance(a, bool):    # a symbolic size too (a diagonal)
            return Affine((), a)
        return None

    def _affs(self, args: tuple) -> Optional[tuple[Affine, Affine]]:
        """Both operands of a binary op as affine values, when both are."""
        x, y = self._aff(args[0]), self._aff(args[1])
        return None if x is None or y is None else (x, y)

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
        if op in ("add", "sub") and (xy := self._affs(args)) is not None:
            x, y = xy
            self.affine[n] = x + (y.scale(-1) if op == "sub" else y)
            return []
        if op in ("ge", "gt", "le", "lt") and (xy := self._affs(args)) is not None:
            d = xy[0] + xy[1].scale(-1)        # x - y
            h = {"ge": d, "gt": d + Affine((), -1), "le": d.scale(-1), "lt": d.scale(-1) + Affine((), -1)}[op]
            return [((h,), True), ((negate(h),), False)]
        fs = [self._const_facts(a) for a in args]
        if op in _TESTS:        # a comparison of known constants: eager's special cases (x == 0) on masked keys
            return _both(fs[0], fs[1], lambda a, b: _TESTS[op](a, b) if _number(a) and _number(b) else None)
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
        if op == "reduce":
            return self._reduce(n, fs[0])
        if op in UNARY_OPS:     # the op's own meaning in float64 (run rounds it to the node's dtype): log 0 is -inf
            f = UNARY_OPS[Op(op)].torch
            return [(r, f(torch.tensor(float(v), dtype=torch.float64)).item()) for r, v in fs[0] if _number(v)]
        if op in ("add", "sub", "mul", "div"):
            return self._arith(op, args, fs)
        return []

    def _reduce(self, n: LNode, fs: list[Fact]) -> list[Fact]:
        """A value constant on a region that spans the whole reduced range reduces to a known constant."""
        v, kind = n.attrs["var"], n.attrs["kind"]
        out = []
        for r, c in fs:
            cover = _covering(r, v)
            if cover is None or _empty(cover) or isinstance(c, Affine):
                continue
            if kind == "sum":
                c = _sum(c, v.extent)
                if c is None:
                    continue
            out.append((cover, c))
        return out

    def _arith(self, op: str, args, fs) -> list[Fact]:
        """Absorbing constants: unknown (finite) operands do not matter; known non-finite ones are cut out. An
        operand that depends on a mask read from a tensor (a row max that a wholly masked row makes -inf) must be
        known finite instead: the constant holds where its magnitude classes say so."""
        out: list[Fact] = []
        for side in (0, 1):
            for r, v in fs[side]:
                if op in ("add", "sub") and isinstance(v, float) and math.isinf(v):
                    value = v if (op == "add" or side == 0) else -v
                elif (op == "mul" or (op == "div" and side == 0)) and _eq(v, 0):
                    value = 0.0
                else:
                    continue
                other = args[1 - side]
                if op != "div" and self.depends(other):
                    out += [(_and(r, q), value) for q in self._finite(op, v, other)]
                else:
                    infinite = [(q, b) for q, b in self.huge.get(other, []) if b == -math.inf] \
                        if isinstance(other, LNode) else []
                    out += [(reg, value) for reg in _defined(op, side, v, r, fs[1 - side] + infinite)]
        out += _both(fs[0], fs[1], lambda a, b: _fold(op, a, b))
        return out

    def _finite(self, op: str, v: float, y: LNode) -> list[Region]:
        """Where y cannot cancel the absorbing constant v: not -inf (moderate from below) where -inf would give NaN,
        not +inf where +inf would, neither under a multiply by 0."""
        if op == "mul":
            return _pairs(self.above.get(y, []), self.below.get(y, []))
        cancel = -v if op == "add" else v      # x + y is NaN at y = -x; x - y and y - x at y = x
        return self.above.get(y, []) if cancel < 0 else self.below.get(y, [])


# ---- magnitudes: where a value is hugely negative, and where it is not --------------------------------------

_SCALE = 2.0 ** 8      # a multiply by a constant at most this large keeps a moderate value moderate
_CAP = 16              # regions kept per class and node


def _number(v: object) -> bool:
    return isinstance(v, (int, float))


def _pairs(xs: list[Region], ys: list[Region]) -> list[Region]:
    return [_and(a, b) for a in xs for b in ys]


class Magnitudes:
    """Where a value is hugely negative (at most a bound b <= -HUGE, or -inf) and where it is moderate from below
    (>= -MODERATE, `above`) or from above (<= MODERATE, `below`).

    Hugging Face masks with torch.finfo(dtype).min, others with -1e9: finite, so s + c is not a constant, but
    exp(s + c - m) is exactly 0 wherever the row max m is not hugely negative, that is on rows with an element
    that is moderate. A fully masked row is another matter (finfo.min absorbs s, a uniform row; -1e9 does not,
    a softmax of the scores), so nothing is claimed there. Program inputs (float, checked at run time to be at
    most MODERATE where a skip relies on them, analysis.facts `vanishing`) and indices are moderate; values
    computed from moderate ones by the program's arithmetic are taken to stay small beside a huge constant,
    as the kernels take them to stay finite (docs/design.md §3.5)."""

    def run(self, n: LNode, f: "Facts") -> tuple[list[Region], list[Region], list[Fact]]:
        if n in f.addends:      # a mask added to the scores: its own atoms say everything
            return classes(n)
        consts = [(r, v) for r, v in f.facts[n] if _number(v)]
        above = [r for r, v in consts if v >= -MODERATE]
        below = [r for r, v in consts if v <= MODERATE]
        huge = [(r, float(v)) for r, v in consts if -math.inf < v <= -HUGE]
        a, b, h = self._rules(n, f)
        return (list(dict.fromkeys(above + a))[:_CAP], list(dict.fromkeys(below + b))[:_CAP],
                list(dict.fromkeys(huge + h))[:_CAP])

    @staticmethod
    def _cls(f: "Facts", x: object) -> tuple[list[Region], list[Region], list[Fact]]:
        if isinstance(x, LNode):
            return f.above.get(x, []), f.below.get(x, []), f.huge.get(x, [])
        v = float(x) if isinstance(x, (int, float)) else math.nan
        return ([()] if v >= -MODERATE else []), ([()] if v <= MODERATE else []), \
            ([((), v)] if -math.inf < v <= -HUGE else [])

    def _rules(self, n: LNode, f: "Facts") -> tuple[list[Region], list[Region], list[Fact]]:
        op, args = n.op, n.args
        everywhere: list[Region] = [()]
        if n.dtype == torch.bool or n in f.affine or op == "iota" or (op == "load" and n.dtype.is_floating_point):
            return everywhere, everywhere, []
        cls = [self._cls(f, a) for a in args]
        mod = [[r for r in a if r in b] for a, b, _ in cls]
        if op == "cast":
            return cls[0]
        if op == "where":
            above, below, huge = _pairs(cls[1][0], cls[2][0]), _pairs(cls[1][1], cls[2][1]), \
                [(_and(r1, r2), max(b1, b2)) for r1, b1 in cls[1][2] for r2, b2 in cls[2][2]]
            for rc, vc in f._const_facts(args[0]):       # the branch the condition selects, where it is known
                a, b, h = cls[1 if vc else 2]
                above += [_and(rc, r) for r in a]
                below += [_and(rc, r) for r in b]
                huge += [(_and(rc, r), x) for r, x in h]
            return above, below, huge
        if op in ("add", "sub"):
            (a0, b0, h0), (a1, b1, h1) = cls
            if op == "sub":
                a1, b1, h1 = b1, a1, []       # x - y: y's bound from below bounds the difference from above
            huge = [(_and(r, q), b) for r, b in h0 for q in b1] + [(_and(r, q), b) for r, b in h1 for q in b0] + \
                [(_and(r, q), max(b, c)) for r, b in h0 for q, c in h1]
            return _pairs(a0, a1), _pairs(b0, b1), _overflowing(huge, n.dtype)
        if op == "neg":
            return cls[0][1], cls[0][0], []
        if op in ("mul", "div"):
            above, below, huge = self._product(op, args, cls, mod)
            return above, below, _overflowing(huge, n.dtype)
        if op in ("exp", "exp2"):
            return everywhere, cls[0][1], []
        if op in ("tanh", "sigmoid"):
            return everywhere, everywhere, []
        if op == "reduce":
            return self._reduce(n, cls[0], mod[0])
        if op in ("load", "scalar"):
            return [], [], []
        both = mod[0] if len(mod) == 1 else _pairs(mod[0], mod[1]) if len(mod) == 2 else []
        return both, both, []

    @staticmethod
    def _product(op: str, args: tuple, cls: list, mod: list) -> tuple[list[Region], list[Region], list[Fact]]:
        """A multiply or divide by a constant scales a huge bound and keeps (or, negative, swaps) the moderate
        sides; a product of moderate values is moderate."""
        ks = [_const_value(a) for a in args]
        side = 0 if ks[1] is not None else 1 if op == "mul" and ks[0] is not None else None
        if side is None:
            both = _pairs(mod[0], mod[1])
            return both, both, []
        k = ks[1 - side]
        assert k is not None
        k = k if op == "mul" else (1.0 / k if k else math.inf)
        a, b, h = cls[side]
        if not math.isfinite(k) or k == 0 or abs(k) > _SCALE or abs(k) < 1 / _SCALE:
            return [], [], []
        huge = [(r, v * k) for r, v in h if k > 0 and v * k <= -HUGE]
        return (a, b, huge) if k > 0 else (b, a, [])

    @staticmethod
    def _reduce(n: LNode, cls: tuple, mod: list[Region]) -> tuple[list[Region], list[Region], list[Fact]]:
        """A max is moderate from below where some element is (`_exists`), from above where every one is; a sum
        where every element is moderate."""
        v, kind = n.attrs["var"], n.attrs["kind"]
        a, b, h = cls

        def every(rs: list[Region]) -> list[Region]:
            return [c for r in rs if (c := _covering(r, v)) is not None and not _empty(c)]

        def some(rs: list[Region]) -> list[Region]:
            return [e for r in rs if (e := _exists(r, v)) is not None]
        if kind == "max":
            return some(a), every(b), [(c, x) for r, x in h if (c := _covering(r, v)) is not None and not _empty(c)]
        if kind == "min":
            return every(a), some(b), [(e, x) for r, x in h if (e := _exists(r, v)) is not None]
        if kind == "sum":
            return every(mod), every(mod), []
        return [], [], []


def _overflowing(huge: list[Fact], dtype: torch.dtype) -> list[Fact]:
    """A huge bound reached by arithmetic on a moderate value, as -inf where that value can take it past the type's
    range: eager's fp16 s + finfo.min is -inf for s <= -16, and mish or silu of -inf is NaN (x times a 0 that the
    facts would otherwise take for 0)."""
    if not dtype.is_floating_point:
        return huge
    return [(r, -math.inf if torch.tensor(b - MODERATE, dtype=torch.float64).to(dtype).isinf() else b)
            for r, b in huge]


def _const_value(x: object) -> Optional[float]:
    """The value of a constant operand (a Python number or a scalar node), else None."""
    if isinstance(x, LNode):
        return float(x.attrs["value"]) if x.op == "scalar" else None
    return float(x) if isinstance(x, (int, float)) else None


def _defined(op: str, side: int, v, region: Region, other: list[Fact]) -> list[Region]:
    """`region` minus where the other operand's facts make the result NaN (inf - inf, 0 * inf, 0 / 0)."""
    regions = [region]
    for r2, w in other:
        a, b = (v, w) if side == 0 else (w, v)
        if _nan(op, a, b):
            regions = [x for reg in regions for x in _minus(reg, r2)]
    return regions


def _nan(op: str, a, b) -> bool:
    try:
        v = _OPS[op](a, b)
    except ZeroDivisionError:
        return a == 0
    except TypeError:
        return False
    return isinstance(v, float) and math.isnan(v)


def _fold(op: str, a, b):
    """Both operands known (e.g. -inf on a region divided by a positive constant): the exact result."""
    try:
        v = _OPS[op](a, b)
    except (ZeroDivisionError, TypeError):
        return None
    return None if isinstance(v, float) and math.isnan(v) else v


def nan_absorbing_maxima(g: LoopGraph) -> set[LNode]:
    """Max/min reductions that may skip NaN operands (the GPU's fast max does) without changing any result.

    A softmax stabiliser d = max_v y is read only as exp(y - d), and that only by sums over v of it or
    by its division by such a sum. A NaN anywhere in y then reaches every one of those results through
    the exp term itself, whatever d is, so propagating it through d as well adds nothing."""
    users: dict[int, list[LNode]] = {}
    for n in g.nodes:
        for a in n.inputs:
            users.setdefault(id(a), []).append(n)
    outs = {id(o.node) for o in g.outputs}

    def normalised(w: LNode, e: LNode, v) -> bool:
        def total(x) -> bool:
            return isinstance(x, LNode) and x.op == "reduce" and x.attrs["kind"] == "sum" \
                and x.attrs["var"] is v and x.args[0] is e
        return total(w) or (w.op == "div" and w.args[0] is e and total(w.args[1]))

    found = set()
    for d in g.nodes:
        if d.op != "reduce" or d.attrs["kind"] not in ("max", "min") or id(d) in outs or not users.get(id(d)):
            continue
        y, v = d.args[0], d.attrs["var"]
        subs = users[id(d)]
        exps = [e for u in subs for e in users.get(id(u), [])]
        if all(u.op == "sub" and u.args[0] is y and u.args[1] is d and id(u) not in outs for u in subs) and \
                exps and all(e.op in ("exp", "exp2") and id(e) not in outs and users.get(id(e)) and
                             all(normalised(w, e, v) for w in users[id(e)]) for e in exps):
            found.add(d)
    return found


# what an op needs of its argument for a finite result: log(0) = -inf, sqrt(-1) = NaN, 1 / 0 = inf
_DOMAIN = {"log": "positive", "log2": "positive", "log2_approx": "positive", "rsqrt": "positive",
           "sqrt": "nonneg", "reciprocal": "nonzero", "log1p": "nonneg", "pow": "positive"}


def input_domains(g: LoopGraph) -> dict[int, str]:
    """Program inputs that a log, log2 or rsqrt ("positive"), a sqrt ("nonneg"), or a division or
    reciprocal as the divisor ("nonzero") reads directly or through casts, with what their values must
    satisfy; log1p's operand ("nonneg") and pow's base ("positive") are held to a part of their domain that
    keeps the check one of these (other values take the fixup pass, which is exact). A finite noise entry of
    0 under KeyFormer's -log is +inf there, and -inf + inf is NaN in a masked tile the kernels skip;
    checking finiteness alone would miss it. Values computed from the
    inputs (a log of a product that underflows) are not covered."""
    need: dict[int, set[str]] = {}
    for n in g.nodes:
        if n.op in _DOMAIN:
            arg, what = n.args[0], _DOMAIN[n.op]
        elif n.op == "div":
            arg, what = n.args[1], "nonzero"
        else:
            continue
        if (i := read_input(arg)) is not None:
            need.setdefault(i, set()).add(what)
    return {i: next(iter(w)) if len(w) == 1 else "positive" for i, w in need.items()}


def narrowed_inputs(g: LoopGraph) -> dict[int, torch.dtype]:
    """Program inputs that a cast narrows (to a float type with a smaller range: float32 to fp16), each with
    the narrowest such type. Eager's cast turns 1e-9 into 0 and 1e6 into inf there, so a check of the input
    must look at the narrowed value (a log of it is -inf, not -20.7)."""
    out: dict[int, torch.dtype] = {}
    for n in g.nodes:
        i = read_input(n) if n.op == "cast" and n.dtype.is_floating_point else None
        if i is not None and g.inputs[i][1].is_floating_point and \
                torch.finfo(n.dtype).max < torch.finfo(out.get(i, g.inputs[i][1])).max:
            out[i] = n.dtype
    return out


# ---- sign facts: what holds of a value everywhere it is defined (no regions) ----------------------------

def nonnegative(x: object) -> bool:
    """x >= 0 (or NaN) wherever it is defined: exponentials, and sums, products, casts and selects of such."""
    if not isinstance(x, LNode):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0
    if x.op in ("exp", "exp2"):
        return True
    if x.op == "scalar":
        return nonnegative(x.attrs["value"])
    if x.op == "reduce":
        return x.attrs["kind"] in ("sum", "max", "min") and nonnegative(x.args[0])
    if x.op in ("mul", "add", "cast", "div"):
        return all(nonnegative(a) for a in x.args)
    return x.op == "where" and all(nonnegative(a) for a in x.args[1:])


def zero_or_inf(x: object) -> bool:
    """x is 0 or +-inf wherever it is defined (a literal, or a select between such literals)."""
    if isinstance(x, LNode):
        if x.op == "scalar":
            return zero_or_inf(x.attrs["value"])
        return x.op == "where" and all(zero_or_inf(y) for y in x.args[1:])
    return isinstance(x, (int, float)) and (x == 0 or math.isinf(x))


def exact_sum(n: LNode) -> bool:
    """A half-precision add/sub of a half value and 0 or +-inf (an additive mask) is exact: no rounding."""
    if n.op not in ("add", "sub"):
        return False
    a, b = n.args
    return any(zero_or_inf(m) and isinstance(x, LNode) and x.dtype == n.dtype for x, m in ((a, b), (b, a)))


def _rounded(v: Any, dtype: torch.dtype) -> Any:
    """A constant as a node of `dtype` holds it, since eager rounds each result: fp16's p + 1e-9 is 0 where p is."""
    ok = isinstance(v, float) and math.isfinite(v) and dtype.is_floating_point
    return torch.tensor(v, dtype=dtype).item() if ok else v
