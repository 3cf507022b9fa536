"""Capture rules' bodies for activations and pointwise composites applied to scores (SiLU, GELU and ReLU-family
attention, softplus gates, lerp and addcmul mixes) and the variance of a statistic: each built from primitives
that fuse, with eager's own formula. A half input is computed in float32 and rounded once, as eager's kernels
compute in float32 internally."""
from __future__ import annotations

import math
from typing import Any, Callable, Union

import torch

from ..ir.graph import Builder, Node
from ..ir.ops import WIDE
from .norms import dims_of, moments

aten = torch.ops.aten
Operand = Union[Node, float]


class _Math:
    """Elementwise arithmetic on nodes of one shape and dtype, for writing eager's formulas as they read."""

    def __init__(self, b: Builder, like: Node, src: str) -> None:
        self.b, self.shape, self.dtype, self.src = b, like.shape, like.dtype, src

    def __call__(self, op: str, *args: Operand) -> Node:
        return self.b.add(op, args, self.shape, self.dtype, self.src)

    def test(self, op: str, x: Operand, y: Operand) -> Node:
        return self.b.add(op, (x, y), self.shape, torch.bool, self.src)


def _wide(b: Builder, x: Any, dtype: torch.dtype, src: str) -> Any:
    """x in the dtype eager computes an op of `dtype` in (float32 for half types); numbers as they are."""
    w = WIDE.get(dtype, dtype)
    if not isinstance(x, Node) or x.dtype == w:
        return x
    return b.add("cast", (x,), x.shape, w, src)


def _pointwise(formula: Callable[..., Node], tensors: int = 1, **defaults: Any) -> Callable:
    """A capture rule: the call's first `tensors` arguments widened, the rest bound to `defaults` by position or
    name, `formula(m, *tensors, **params)` built, and the result rounded to the call's dtype."""
    def rule(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Any:
        if not d.is_floating_point:
            return None
        xs = [_wide(b, x, d, src) for x in a[:tensors]]
        xs = [b.add("expand", (x,), s, x.dtype, src) if isinstance(x, Node) and x.shape != s else x for x in xs]
        given = {**dict(zip(defaults, a[tensors:])), **{k: v for k, v in kw.items() if k in defaults}}
        like = next(x for x in xs if isinstance(x, Node))
        out = formula(_Math(b, like, src), *xs, **{k: given.get(k, v) for k, v in defaults.items()})
        return out if out.dtype == d else b.add("cast", (out,), s, d, src)
    return rule


def _silu(m: _Math, x: Node) -> Node:
    return m("div", x, m("add", m("exp", m("neg", x)), 1.0))


def _softplus(m: _Math, x: Node, beta: float, threshold: float) -> Node:
    bx = m("mul", x, float(beta))
    smooth = m("div", m("log1p", m("exp", bx)), float(beta))
    return m("where", m.test("gt", bx, float(threshold)), x, smooth)


def _gelu(m: _Math, x: Node, approximate: str) -> Node:
    """Eager's formulas; the tanh form's 0.5 x (1 + tanh(y)) as x sigmoid(2 y), equal, without the cancellation
    of 1 + tanh(y) where tanh(y) nears -1 (its kernels' tanh is 1 - 2 / (e^2y + 1), whose rounding there left the
    negative tail 8.5e-3 from float64 in fp16 where eager's libm tanh is 6.5e-3)."""
    if approximate == "tanh":
        inner = m("mul", m("add", x, m("mul", m("mul", m("mul", x, x), x), 0.044715)), math.sqrt(2 / math.pi))
        return m("mul", x, m("sigmoid", m("mul", inner, 2.0)))
    return m("mul", m("mul", x, 0.5), m("add", m("erf", m("mul", x, math.sqrt(0.5))), 1.0))


def _hardtanh(m: _Math, x: Node, min_val: float, max_val: float) -> Node:
    return m("minimum", m("maximum", x, float(min_val)), float(max_val))


def _leaky_relu(m: _Math, x: Node, negative_slope: float) -> Node:
    return m("where", m.test("gt", x, 0.0), x, m("mul", x, float(negative_slope)))


def _lerp(m: _Math, start: Node, end: Node, weight: Operand) -> Node:
    """eager's two-sided form: from start where |weight| < 1/2, from end otherwise."""
    diff = m("sub", end, start)
    if not isinstance(weight, Node):
        w = float(weight)
        return m("add", start, m("mul", diff, w)) if abs(w) < 0.5 else m("sub", end, m("mul", diff, 1.0 - w))
    near_start = m("add", start, m("mul", diff, weight))
    near_end = m("sub", end, m("mul", diff, m("sub", 1.0, weight)))
    return m("where", m.test("lt", m("abs", weight), 0.5), near_start, near_end)


def _addcmul(m: _Math, x: Node, t1: Node, t2: Node, value: float) -> Node:
    return m("add", x, m("mul", m("mul", t1, t2), float(value)))


def _sign(m: _Math, x: Node) -> Node:
    """eager's (x > 0) - (x < 0): 0 at NaN."""
    return m("where", m.test("gt", x, 0.0), 1.0, m("where", m.test("lt", x, 0.0), -1.0, 0.0))


def _hardsigmoid(m: _Math, x: Node) -> Node:
    return m("div", _hardtanh(m, m("add", x, 3.0), 0.0, 6.0), 6.0)


def _mish(m: _Math, x: Node) -> Node:
    return m("mul", x, m("tanh", m("log1p", m("exp", x))))


def _logaddexp(m: _Math, a: Node, b: Operand) -> Node:
    """max + log1p(exp(-|a - b|)), and a itself where a and b are the same infinity (their difference is NaN)."""
    top = m("maximum", a, b)
    out = m("add", top, m("log1p", m("exp", m("neg", m("abs", m("sub", a, b))))))
    return m("where", m.test("logical_and", m.test("eq", a, b), m.test("eq", m("abs", a), math.inf)), a, out)


def _round(m: _Math, x: Node) -> Node:
    """To the nearest integer, halves to the even one; from 2^23 on (and infinities, NaN) x is its own."""
    low = m("floor", x)
    frac = m("sub", x, low)
    odd = m("sub", low, m("mul", m("floor", m("mul", low, 0.5)), 2.0))
    up = m("where", m.test("gt", frac, 0.5), 1.0, m("where", m.test("lt", frac, 0.5), 0.0, odd))
    return m("where", m.test("lt", m("abs", x), 2.0 ** 23), m("add", low, up), x)


def _log10(m: _Math, x: Node) -> Node:
    return m("mul", m("log", x), 1 / math.log(10))


def _trunc(m: _Math, x: Node) -> Node:
    return m("where", m.test("ge", x, 0.0), m("floor", x), m("ceil", x))


def _frac(m: _Math, x: Node) -> Node:
    return m("sub", x, _trunc(m, x))


def _half_exps(m: _Math, x: Node, join: str) -> Node:
    """e^x / 2 joined to e^-x / 2, each as exp(+-x - ln 2): finite wherever sinh and cosh are (e^x alone is not
    from x = 88.7 on)."""
    return m(join, m("exp", m("sub", x, math.log(2))), m("exp", m("sub", m("neg", x), math.log(2))))


def _sinh(m: _Math, x: Node) -> Node:
    """Near 0, from expm1 (e^x - e^-x cancels there)."""
    small = m("mul", m("sub", m("expm1", x), m("expm1", m("neg", x))), 0.5)
    return m("where", m.test("lt", m("abs", x), 1.0), small, _half_exps(m, x, "sub"))


def _cosh(m: _Math, x: Node) -> Node:
    return _half_exps(m, x, "add")


def _hardswish(m: _Math, x: Node) -> Node:
    return m("mul", x, _hardsigmoid(m, x))


def _celu(m: _Math, x: Node, alpha: float) -> Node:
    negative = m("mul", m("expm1", m("div", x, float(alpha))), float(alpha))
    return m("add", m("maximum", x, 0.0), m("minimum", negative, 0.0))


def _heaviside(m: _Math, x: Node, values: Operand) -> Node:
    """eager's: `values` at 0, else x > 0 (0 at NaN)."""
    return m("where", m.test("eq", x, 0.0), values, m("where", m.test("gt", x, 0.0), 1.0, 0.0))


def _entr(m: _Math, x: Node) -> Node:
    """eager's special.entr: -x log x where x > 0, 0 at 0, -inf below 0, NaN at NaN."""
    edge = m("where", m.test("eq", x, 0.0), 0.0, m("where", m.test("lt", x, 0.0), -math.inf, x))
    return m("where", m.test("gt", x, 0.0), m("neg", m("mul", x, m("log", x))), edge)


def _xlogy(m: _Math, x: Operand, y: Operand) -> Node:
    """eager's xlogy: x log y, and 0 where x is 0 and y is not NaN."""
    if not isinstance(y, Node):         # a number: its log as torch gives it (-inf at 0, NaN below)
        return m("where", m.test("eq", x, 0.0), 0.0, m("mul", x, torch.log(torch.tensor(float(y))).item()))
    zero = m.test("logical_and", m.test("eq", x, 0.0), m.test("eq", y, y))
    return m("where", zero, 0.0, m("mul", x, m("log", y)))


def _clamp_tensors(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Any:
    """clamp with tensor bounds: the maximum with the lower, then the minimum with the upper (both keep x's NaN, as
    clamp does); bounds of another dtype stay eager."""
    x, lo, hi = a[0], a[1] if len(a) > 1 else kw.get("min"), a[2] if len(a) > 2 else kw.get("max")
    if x.dtype != d or any(isinstance(t, Node) and t.dtype != d for t in (lo, hi)):
        return None
    for op, bound in (("maximum", lo), ("minimum", hi)):
        if bound is not None:
            x = b.add(op, (x, bound), s, d, src)
    return x


def _variance(root: bool) -> Callable:
    """var / std (`correction`, 1 unless given) over dims (all where None), in float32 for half inputs."""
    def rule(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Any:
        x = a[0]
        if not d.is_floating_point:
            return None
        dims = dims_of(a[1] if len(a) > 1 else kw.get("dim"), len(x.shape))
        correction = kw.get("correction")
        _, _, var = moments(b, x, dims, 1 if correction is None else correction, src)
        if root:
            var = b.add("sqrt", (var,), var.shape, var.dtype, src)
        var = b.add("reshape", (var,), s, var.dtype, src) if var.shape != s else var
        return var if var.dtype == d else b.add("cast", (var,), s, d, src)
    return rule


def _logit(m: _Math, x: Node, eps: Any) -> Node:
    """eager's log(z / (1 - z)), z clamped to [eps, 1 - eps] where eps is given (in float32 only: for half inputs
    the CPU's eager rounds 1 - eps to the half type, CUDA's does not)."""
    if eps is not None:
        x = m("minimum", m("maximum", x, float(eps)), 1.0 - float(eps))
    return m("log", m("div", x, m("sub", 1.0, x)))


def _logit_rule(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Any:
    """logit's capture rule; with eps, half inputs stay eager (see _logit)."""
    if d in WIDE and kw.get("eps", a[1] if len(a) > 1 else None) is not None:
        return None
    return _pointwise(_logit, eps=None)(b, a, kw, s, d, src)


def _atanh(m: _Math, x: Node) -> Node:
    """log((1 + x) / (1 - x)) / 2 as log1p(2 x / (1 - x)) / 2: no cancellation near 0; +-inf at +-1, NaN past."""
    return m("mul", m("log1p", m("div", m("mul", x, 2.0), m("sub", 1.0, x))), 0.5)


def _asinh(m: _Math, x: Node) -> Node:
    """sign(x) log(|x| + sqrt(x^2 + 1)) as log1p(|x| + x^2 / (1 + sqrt(1 + x^2))), no cancellation near 0; from
    2^28 on, where x^2 may overflow, log |x| + ln 2."""
    a = m("abs", x)
    sq = m("mul", a, a)
    near = m("log1p", m("add", a, m("div", sq, m("add", m("sqrt", m("add", sq, 1.0)), 1.0))))
    size = m("where", m.test("gt", a, 2.0 ** 28), m("add", m("log", a), math.log(2)), near)
    return m("where", m.test("lt", x, 0.0), m("neg", size), m("where", m.test("gt", x, 0.0), size, x))


def _ignoring_nan(pick: str) -> Callable[[_Math, Node, Operand], Node]:
    """fmax and fmin: the other operand where one is NaN (NaN only where both are)."""
    def formula(m: _Math, a: Node, b: Operand) -> Node:
        both = m("where", m.test("ne", b, b), a, m(pick, a, b)) if isinstance(b, Node) else m(pick, a, b)
        return m("where", m.test("ne", a, a), b, both)
    return formula


def _hypot(m: _Math, a: Node, b: Operand) -> Node:
    """sqrt(a^2 + b^2) without its overflow: the larger magnitude times sqrt(1 + r^2), r the ratio (at most 1); 0
    where both are 0, inf where either is infinite (NaN beside it too), else NaN where either is."""
    x, y = m("abs", a), m("abs", b) if isinstance(b, Node) else abs(float(b))
    big, small = m("maximum", x, y), m("minimum", x, y)
    r = m("div", small, big)
    scaled = m("where", m.test("eq", big, 0.0), 0.0, m("mul", big, m("sqrt", m("add", m("mul", r, r), 1.0))))
    return m("where", m("logical_or", m.test("eq", x, math.inf), m.test("eq", y, math.inf)), math.inf, scaled)


def _tested(kind: str) -> Callable:
    """A capture rule for a float test: isnan as x != x, the infinities by comparison with them."""
    def rule(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Any:
        x = a[0]
        if not isinstance(x, Node) or not x.dtype.is_floating_point:
            return None
        if kind == "nan":
            return b.add("ne", (x, x), s, torch.bool, src)
        if kind in ("posinf", "neginf"):
            return b.add("eq", (x, math.inf if kind == "posinf" else -math.inf), s, torch.bool, src)
        if kind == "inf":
            return b.infinite(x, src)
        return b.add("lt", (b.add("abs", (x,), x.shape, x.dtype, src), math.inf), s, torch.bool, src)
    return rule


RULES: dict[Any, Callable] = {
    aten.silu.default: _pointwise(_silu),
    aten.softplus.default: _pointwise(_softplus, beta=1.0, threshold=20.0),
    aten.gelu.default: _pointwise(_gelu, approximate="none"),
    aten.hardtanh.default: _pointwise(_hardtanh, min_val=-1.0, max_val=1.0),
    aten.leaky_relu.default: _pointwise(_leaky_relu, negative_slope=0.01),
    aten.lerp.Scalar: _pointwise(_lerp, 2, weight=0.5),
    aten.lerp.Tensor: _pointwise(_lerp, 3),
    aten.addcmul.default: _pointwise(_addcmul, 3, value=1.0),
    aten.special_entr.default: _pointwise(_entr),
    aten.sign.default: _pointwise(_sign),
    aten.hardsigmoid.default: _pointwise(_hardsigmoid),
    aten.mish.default: _pointwise(_mish),
    aten.logaddexp.default: _pointwise(_logaddexp, 2),
    aten.round.default: _pointwise(_round),
    aten.trunc.default: _pointwise(_trunc), aten.fix.default: _pointwise(_trunc),
    aten.frac.default: _pointwise(_frac),
    aten.sinh.default: _pointwise(_sinh), aten.cosh.default: _pointwise(_cosh),
    aten.hardswish.default: _pointwise(_hardswish),
    aten.celu.default: _pointwise(_celu, alpha=1.0),
    aten.heaviside.default: _pointwise(_heaviside, 2),
    aten.logit.default: _logit_rule,
    aten.atanh.default: _pointwise(_atanh), aten.asinh.default: _pointwise(_asinh),
    aten.hypot.default: _pointwise(_hypot, 2),
    aten.fmax.default: _pointwise(_ignoring_nan("maximum"), 2),
    aten.fmin.default: _pointwise(_ignoring_nan("minimum"), 2),
    **{getattr(aten, f"is{kind}").default: _tested(kind) for kind in ("nan", "inf", "posinf", "neginf", "finite")},
    aten.log10.default: _pointwise(_log10),
    aten.xlogy.Tensor: _pointwise(_xlogy, 2),
    aten.xlogy.Scalar_Other: _pointwise(_xlogy, 2),
    aten.clamp.Tensor: _clamp_tensors,
    aten.var.correction: _variance(False),
    aten.std.correction: _variance(True),
}
