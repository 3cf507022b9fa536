"""Decomposition: composite ops -> primitives (reductions, elementwise math, index predicates).

softmax -> max, sub, exp, sum, div; log_softmax -> max, sub, exp, sum, log, sub;
mean -> sum, div; logsumexp -> max, sub, exp, sum, log, add; norm(p=1) -> abs, sum; norm(p=2) -> mul, sum, sqrt;
masked_fill -> where; triu/tril, and constants that are index masks, -> where over index tensors;
clamp -> maximum/minimum;
addmm/linear -> matmul, add; elu -> where, expm1; log_sigmoid -> minimum, exp, log1p; nan_to_num -> where.
The result is evaluated by the same reference evaluator.
"""
from __future__ import annotations

import math

import torch

from ..ir.graph import Builder, Graph, Node
from ..ir.ops import WIDE, Op, scalar
from .constants import as_index_predicate


def decompose(g: Graph) -> Graph:
    b = Builder()
    env: dict[Node, Node] = {}
    for n in g.nodes:
        args = tuple(env[a] if isinstance(a, Node) else a for a in n.args)
        rule = _RULES.get(n.op)
        env[n] = rule(b, n, *args) if rule else b.add(n.op, args, n.shape, n.dtype, n.source, **n.attrs)
    return Graph([env[i] for i in g.inputs], [env[o] for o in g.outputs], b.nodes, g.returns)


def _keep_shape(shape, dims):
    return tuple(1 if d in dims else s for d, s in enumerate(shape))


def _red(b: Builder, kind: str, x: Node, dims, keep: bool, src: str, dtype=None) -> Node:
    shape = _keep_shape(x.shape, dims) if keep else tuple(s for d, s in enumerate(x.shape) if d not in dims)
    return b.add("reduce", (x,), shape, dtype or x.dtype, src, kind=kind, dims=list(dims), keepdim=keep)


def _cast(b: Builder, x: Node, dtype, src: str) -> Node:
    return x if x.dtype == dtype else b.add("cast", (x,), x.shape, dtype, src)


def _softmax(b: Builder, n: Node, x: Node) -> Node:
    """Computed in float32 for half types, as eager's kernels do internally."""
    x = _cast(b, x, WIDE.get(n.dtype, n.dtype), n.source)
    d, s = n.attrs["dim"], n.source
    m = _red(b, "max", x, [d], True, s)
    z = b.add("sub", (x, m), x.shape, x.dtype, s)
    e = b.add("exp", (z,), x.shape, x.dtype, s)
    total = _red(b, "sum", e, [d], True, s)
    if n.op == "softmax":
        out = b.add("div", (e, total), x.shape, x.dtype, s)
    else:
        out = b.add("sub", (z, b.add("log", (total,), total.shape, total.dtype, s)), x.shape, x.dtype, s)
    return _cast(b, out, n.dtype, s)


def _mean(b: Builder, n: Node, x: Node) -> Node:
    count = 1
    for d in n.attrs["dims"]:
        count *= x.shape[d]
    t = _red(b, "sum", x, n.attrs["dims"], n.attrs["keepdim"], n.source)
    return b.add("div", (t, float(count)), n.shape, n.dtype, n.source)


def _logsumexp(b: Builder, n: Node, x: Node) -> Node:
    """max + log(sum(exp(x - max))), the max as a softmax's (so a kernel keeps it running); a row whose max is
    infinite gives that max, as eager's does (its shift by 0 there). In float32 for half x."""
    s, dims, keep = n.source, n.attrs["dims"], n.attrs["keepdim"]
    x = _cast(b, x, WIDE.get(n.dtype, n.dtype), s)
    m = _red(b, "max", x, dims, True, s)
    e = b.add("exp", (b.add("sub", (x, m), x.shape, x.dtype, s),), x.shape, x.dtype, s)
    total = _red(b, "sum", e, dims, keep, s)
    m = m if keep else b.add("reshape", (m,), total.shape, m.dtype, s)
    lse = b.add("add", (m, b.add("log", (total,), total.shape, x.dtype, s)), total.shape, x.dtype, s)
    return _cast(b, b.add("where", (b.infinite(m, s), m, lse), total.shape, x.dtype, s), n.dtype, s)


def _norm(b: Builder, n: Node, x: Node) -> Node:
    p, s = n.attrs["ord"], n.source
    if p == 1.0:
        return _red(b, "sum", b.add("abs", (x,), x.shape, x.dtype, s), n.attrs["dims"], n.attrs["keepdim"], s)
    if p == 2.0:
        sq = b.add("mul", (x, x), x.shape, x.dtype, s)
        t = _red(b, "sum", sq, n.attrs["dims"], n.attrs["keepdim"], s)
        return b.add("sqrt", (t,), n.shape, n.dtype, s)
    if p == float("inf"):
        return _red(b, "max", b.add("abs", (x,), x.shape, x.dtype, s), n.attrs["dims"], n.attrs["keepdim"], s)
    return b.add("norm", (x,), n.shape, n.dtype, s, **n.attrs)  # other orders stay composite (evaluated as is)


def _clamp(b: Builder, n: Node, x: Node) -> Node:
    if n.attrs["min"] is not None:
        x = b.add("maximum", (x, n.attrs["min"]), n.shape, n.dtype, n.source)
    if n.attrs["max"] is not None:
        x = b.add("minimum", (x, n.attrs["max"]), n.shape, n.dtype, n.source)
    return x


def _masked_fill(b: Builder, n: Node, x: Node, mask: Node, v) -> Node:
    v = _cast(b, v, n.dtype, n.source) if isinstance(v, Node) else scalar(v, n.dtype)
    return b.add("where", (mask, v, x), n.shape, n.dtype, n.source)


def _tri(lower: bool):
    def rule(b: Builder, n: Node, x: Node) -> Node:
        s = n.source
        dev = x.device
        rows = b.add("iota", (), n.shape[-2:], torch.int64, s, dim=0, device=dev)
        cols = b.add("iota", (), n.shape[-2:], torch.int64, s, dim=1, device=dev)
        diff = b.add("sub", (cols, rows), n.shape[-2:], torch.int64, s)
        keep = b.add("le" if lower else "ge", (diff, n.attrs["diagonal"]), n.shape[-2:], torch.bool, s)
        zero = 0.0 if x.dtype.is_floating_point else scalar(0, x.dtype)     # False for a bool mask
        return b.add("where", (keep, x, zero), n.shape, n.dtype, s)
    return rule


def _const(b: Builder, n: Node) -> Node:
    """A captured mask whose values follow its positions becomes those index comparisons (transform/constants.py),
    so value facts skip its tiles at compile time; any other constant stays."""
    form = as_index_predicate(b, n)
    return form if form is not None else b.add(n.op, (), n.shape, n.dtype, n.source, **n.attrs)


def _addmm(b: Builder, n: Node, bias: Node, x: Node, w: Node) -> Node:
    mm = b.add("matmul", (x, w), n.shape, n.dtype, n.source)
    return b.add("add", (mm, bias), n.shape, n.dtype, n.source)


def _linear(b: Builder, n: Node, x: Node, w: Node, bias: Node | None = None) -> Node:
    wt = b.add("permute", (w,), (w.shape[1], w.shape[0]), w.dtype, n.source, dims=[1, 0])
    mm = b.add("matmul", (x, wt), n.shape, n.dtype, n.source)
    return mm if bias is None else b.add("add", (mm, bias), n.shape, n.dtype, n.source)


def _elu(b: Builder, n: Node, x: Node) -> Node:
    """elu(x) = x * scale where x > 0, else expm1(x * input_scale) * alpha * scale; in float32 for half x."""
    s, a = n.source, n.attrs
    x = _cast(b, x, WIDE.get(n.dtype, n.dtype), s)
    neg = b.add("expm1", (_times(b, x, a["input_scale"], s),), x.shape, x.dtype, s)
    keep = b.add("gt", (x, 0.0), x.shape, torch.bool, s)
    out = b.add("where", (keep, _times(b, x, a["scale"], s), _times(b, neg, a["alpha"] * a["scale"], s)),
                x.shape, x.dtype, s)
    return _cast(b, out, n.dtype, s)


def _times(b: Builder, x: Node, c: float, src: str) -> Node:
    return x if c == 1 else b.add("mul", (x, float(c)), x.shape, x.dtype, src)


def _log_sigmoid(b: Builder, n: Node, x: Node) -> Node:
    """log sigmoid(x) = min(x, 0) - log1p(exp(-|x|)), eager's formula, finite for every finite x; in float32
    for half x."""
    s = n.source
    x = _cast(b, x, WIDE.get(n.dtype, n.dtype), s)
    e = b.add("exp", (b.add("neg", (b.add("abs", (x,), x.shape, x.dtype, s),), x.shape, x.dtype, s),),
              x.shape, x.dtype, s)
    out = b.add("sub", (b.add("minimum", (x, 0.0), x.shape, x.dtype, s),
                        b.add("log1p", (e,), x.shape, x.dtype, s)), x.shape, x.dtype, s)
    return _cast(b, out, n.dtype, s)


def _nan_to_num(b: Builder, n: Node, x: Node) -> Node:
    """NaN, +inf and -inf replaced by the given values, by default 0 and the dtype's largest and smallest."""
    s, a, f = n.source, n.attrs, torch.finfo(n.dtype)
    for test, value in ((("eq", -math.inf), f.min if a["neginf"] is None else a["neginf"]),
                        (("eq", math.inf), f.max if a["posinf"] is None else a["posinf"]),
                        (("ne", None), 0.0 if a["nan"] is None else a["nan"])):
        op, c = test
        cond = b.add(op, (x, x if c is None else c), x.shape, torch.bool, s)
        x = b.add("where", (cond, float(value), x), x.shape, n.dtype, s)
    return x


# one rule per composite op (ir.ops.COMPOSITE), and one for constants
_RULES = {
    Op.SOFTMAX: _softmax, Op.LOG_SOFTMAX: _softmax, Op.MEAN: _mean, Op.LOGSUMEXP: _logsumexp, Op.NORM: _norm,
    Op.CLAMP: _clamp, Op.MASKED_FILL: _masked_fill, Op.TRIU: _tri(False), Op.TRIL: _tri(True), Op.ADDMM: _addmm,
    Op.LINEAR: _linear, Op.ELU: _elu, Op.LOG_SIGMOID: _log_sigmoid, Op.NAN_TO_NUM: _nan_to_num, Op.CONST: _const,
}
