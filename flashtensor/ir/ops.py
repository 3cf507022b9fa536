"""The op vocabulary, one enum for every stage, and the table that says what each op means.

`Op` names every op of the graph IR and of the loop form; `GROUP` puts each in one group, and
the stages dispatch on the group (capture lowers ATen calls to ops, decompose removes the
composites, loop form removes layout ops and contractions, codegen prints the elementwise and
reduction ops). An elementwise op is one row of `ELEMENTWISE`: its torch meaning (the reference
evaluators and the eager fallback), its Triton template (codegen) and the ATen overloads that
capture lowers to it. `tests/test_ops.py` checks that every op is covered by each stage or is
declared eager-only.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F


class Op(enum.StrEnum):
    # sources
    INPUT = "input"
    CONST = "const"
    FULL = "full"
    IOTA = "iota"
    # layout (gone in the loop form)
    PERMUTE = "permute"
    RESHAPE = "reshape"
    EXPAND = "expand"
    SELECT = "select"
    SLICE = "slice"
    CAT = "cat"
    # a value read at several index maps (pooled column statistics, running totals read at query and key):
    # computed once by a kernel and stored, each read loads it (the loop form's `at`) instead of computing it again
    STORED = "stored"
    # elementwise
    NEG = "neg"
    EXP = "exp"
    LOG = "log"
    TANH = "tanh"
    ABS = "abs"
    SIGMOID = "sigmoid"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    EXP2 = "exp2"
    LOG2 = "log2"
    RECIPROCAL = "reciprocal"
    LOGICAL_NOT = "logical_not"
    LOG2_APPROX = "log2_approx"
    EXPM1 = "expm1"
    LOG1P = "log1p"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    CEIL = "ceil"
    ADD = "add"
    SUB = "sub"
    TRUNC_DIV = "trunc_div"
    FMOD = "fmod"
    MUL = "mul"
    DIV = "div"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    POW = "pow"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    CAST = "cast"
    WHERE = "where"
    # reductions and contractions
    REDUCE = "reduce"
    CUMSUM = "cumsum"      # a running total along one axis
    MATMUL = "matmul"
    # composites (rewritten into the ops above by transform.decompose)
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    MEAN = "mean"
    LOGSUMEXP = "logsumexp"
    NORM = "norm"
    CLAMP = "clamp"
    MASKED_FILL = "masked_fill"
    TRIU = "triu"
    TRIL = "tril"
    ADDMM = "addmm"
    LINEAR = "linear"
    ELU = "elu"
    LOG_SIGMOID = "log_sigmoid"
    NAN_TO_NUM = "nan_to_num"
    # loop form only
    LOAD = "load"
    SCALAR = "scalar"
    REDUCE_AXES = "reduce_axes"
    AT = "at"            # a stored value read at an affine index (zero outside its range)
    # an ATen call the IR does not model: runs in eager PyTorch
    OPAQUE = "opaque"


class Group(enum.Enum):
    SOURCE = "source"
    LAYOUT = "layout"
    UNARY = "unary"
    BINARY = "binary"
    SELECT = "select"          # cast, where: elementwise with their own rules
    REDUCE = "reduce"
    CONTRACT = "contract"
    COMPOSITE = "composite"
    LOOP = "loop"              # produced and consumed inside the loop form
    EAGER = "eager"


@dataclass(frozen=True)
class Elementwise:
    """One elementwise op: torch's meaning, Triton's (a template over the operands' expressions; None
    where only a codegen form lowers it, see codegen/forms.py), and the ATen overloads lowered to it."""
    torch: Callable
    triton: Optional[str]
    aten: tuple[str, ...] = ()


_LOG2E = 1.0 / math.log(2.0)


def _extreme(pick: Callable, clamp: Callable) -> Callable:
    """maximum/minimum that also take a Python scalar on either side."""
    def f(a: Any, b: Any) -> Any:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return pick(a, b)
        return clamp(a, b) if isinstance(a, torch.Tensor) else clamp(b, a)
    return f


def _cmp(name: str) -> tuple[str, ...]:
    return (f"{name}.Tensor", f"{name}.Scalar")


# elementwise ops, one row each: adding one is its enum member and its row
UNARY_OPS: dict[Op, Elementwise] = {
    Op.NEG: Elementwise(torch.neg, "(-{})", ("neg.default",)),
    Op.EXP: Elementwise(torch.exp, "tl.exp({})", ("exp.default",)),
    Op.LOG: Elementwise(torch.log, "tl.log({})", ("log.default",)),
    Op.TANH: Elementwise(torch.tanh, "_tanh({})", ("tanh.default",)),
    Op.ABS: Elementwise(torch.abs, "tl.abs({})", ("abs.default",)),
    Op.SIGMOID: Elementwise(torch.sigmoid, f"(1.0 / (1.0 + tl.exp2({-_LOG2E!r} * {{}})))", ("sigmoid.default",)),
    Op.SQRT: Elementwise(torch.sqrt, "tl.sqrt({})", ("sqrt.default",)),
    Op.RSQRT: Elementwise(torch.rsqrt, "tl.rsqrt({})", ("rsqrt.default",)),
    Op.EXP2: Elementwise(torch.exp2, "tl.exp2({})", ("exp2.default",)),
    Op.LOG2: Elementwise(torch.log2, "tl.log2({})", ("log2.default",)),
    Op.RECIPROCAL: Elementwise(torch.reciprocal, "(1.0 / {})", ("reciprocal.default",)),
    Op.LOGICAL_NOT: Elementwise(torch.logical_not, "({} == 0)", ("logical_not.default", "bitwise_not.default")),
    # log2 that kernels may compute as coarsely as exp2 (the GPU's approximate unit); only ever inside an
    # exponential's argument, where an absolute error of ~1e-7 is a relative one in the result
    Op.LOG2_APPROX: Elementwise(torch.log2, "_log2_approx({}, False)"),
    # without exp(x) - 1's and log(1 + x)'s cancellation near 0 (the helpers say how)
    Op.EXPM1: Elementwise(torch.expm1, "_expm1({})", ("expm1.default",)),
    Op.LOG1P: Elementwise(torch.log1p, "_log1p({})", ("log1p.default",)),
    Op.ERF: Elementwise(torch.erf, "tl.erf({})", ("erf.default",)),
    Op.SIN: Elementwise(torch.sin, "tl.sin({})", ("sin.default",)),
    Op.COS: Elementwise(torch.cos, "tl.cos({})", ("cos.default",)),
    Op.FLOOR: Elementwise(torch.floor, "tl.floor({})", ("floor.default",)),
    Op.CEIL: Elementwise(torch.ceil, "tl.ceil({})", ("ceil.default",)),
}
BINARY_OPS: dict[Op, Elementwise] = {
    Op.ADD: Elementwise(torch.add, "({} + {})", _cmp("add")),
    Op.SUB: Elementwise(torch.sub, "({} - {})", _cmp("sub")),
    Op.MUL: Elementwise(torch.mul, "({} * {})", _cmp("mul")),
    Op.DIV: Elementwise(torch.div, "({} / {})", _cmp("div")),
    Op.MAXIMUM: Elementwise(_extreme(torch.maximum, torch.clamp_min),
                            "tl.maximum({}, {}, propagate_nan=tl.PropagateNan.ALL)", ("maximum.default",)),
    Op.MINIMUM: Elementwise(_extreme(torch.minimum, torch.clamp_max),
                            "tl.minimum({}, {}, propagate_nan=tl.PropagateNan.ALL)", ("minimum.default",)),
    # a float power (a tensor base and exponent: RetNet's decay gamma ** (i - j)) with torch's signs and special
    # cases; x ** 2 is codegen/forms.py's x * x, as eager computes it
    Op.POW: Elementwise(torch.pow, "_pow({}, {})", ("pow.Tensor_Scalar", "pow.Tensor_Tensor")),
    Op.EQ: Elementwise(torch.eq, "({} == {})", _cmp("eq")),
    Op.NE: Elementwise(torch.ne, "({} != {})", _cmp("ne")),
    Op.LT: Elementwise(torch.lt, "({} < {})", _cmp("lt")),
    Op.LE: Elementwise(torch.le, "({} <= {})", _cmp("le")),
    Op.GT: Elementwise(torch.gt, "({} > {})", _cmp("gt")),
    Op.GE: Elementwise(torch.ge, "({} >= {})", _cmp("ge")),
    # integer index arithmetic (chunked and strided masks: i // chunk, (i - j) % stride) as C and Triton's // and
    # % compute it on integers: the quotient rounded toward 0, the remainder with the dividend's sign; capture
    # builds floor division and Python's remainder from them (frontend/indices.py)
    Op.TRUNC_DIV: Elementwise(lambda a, b: torch.div(a, b, rounding_mode="trunc"), "({} // {})"),
    Op.FMOD: Elementwise(torch.fmod, "({} % {})"),
    Op.LOGICAL_AND: Elementwise(torch.logical_and, "({} & {})", ("logical_and.default", "bitwise_and.Tensor")),
    Op.LOGICAL_OR: Elementwise(torch.logical_or, "({} | {})", ("logical_or.default", "bitwise_or.Tensor")),
}

ELEMENTWISE: dict[Op, Elementwise] = {**UNARY_OPS, **BINARY_OPS}

GROUP: dict[Op, Group] = {
    **{op: Group.SOURCE for op in (Op.INPUT, Op.CONST, Op.FULL, Op.IOTA)},
    **{op: Group.LAYOUT for op in (Op.PERMUTE, Op.RESHAPE, Op.EXPAND, Op.SELECT, Op.SLICE, Op.CAT,
                                       Op.STORED)},
    **{op: Group.UNARY for op in UNARY_OPS},
    **{op: Group.BINARY for op in BINARY_OPS},
    Op.CAST: Group.SELECT, Op.WHERE: Group.SELECT,
    Op.REDUCE: Group.REDUCE, Op.CUMSUM: Group.REDUCE, Op.MATMUL: Group.CONTRACT,
    **{op: Group.COMPOSITE for op in (Op.SOFTMAX, Op.LOG_SOFTMAX, Op.MEAN, Op.LOGSUMEXP, Op.NORM, Op.CLAMP,
                                      Op.MASKED_FILL, Op.TRIU, Op.TRIL, Op.ADDMM, Op.LINEAR, Op.ELU,
                                      Op.LOG_SIGMOID, Op.NAN_TO_NUM)},
    **{op: Group.LOOP for op in (Op.LOAD, Op.SCALAR, Op.REDUCE_AXES, Op.AT)},
    Op.OPAQUE: Group.EAGER,
}
UNARY: dict[Op, Callable] = {op: e.torch for op, e in ELEMENTWISE.items() if GROUP[op] is Group.UNARY}
BINARY: dict[Op, Callable] = {op: e.torch for op, e in ELEMENTWISE.items() if GROUP[op] is Group.BINARY}
COMPOSITE = frozenset(op for op, g in GROUP.items() if g is Group.COMPOSITE)


WIDE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
"""The dtype eager computes a half-precision op's insides in (normalisations, pooling, elu): float32."""


def scalar(v: Any, dtype: torch.dtype) -> Any:
    """A Python number as a value of `dtype`, as eager stores it in a tensor of that dtype (a fill, a select's
    constant): rounded to a floating dtype (-1e9 is -998244352 in bf16, and a row masked by it in some tiles and by
    -1e9 in others is not uniform); a bool's 1 is True, since where(keep, x, 0) of a bool x is int64 in torch and
    int32 in Triton, where a condition must be a bool."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point:
        r = torch.tensor(v, dtype=dtype).item()
        return v if r == v else r
    return v


def _reduce(n: Any, x: torch.Tensor) -> torch.Tensor:
    kind, dims, keep = n.attrs["kind"], n.attrs["dims"], n.attrs["keepdim"]
    if not dims:
        return x
    if kind == "sum":
        return torch.sum(x, dim=dims, keepdim=keep, dtype=n.dtype)
    if kind == "any":
        if len(dims) == 1:
            return torch.any(x, dim=dims, keepdim=keep)
        return torch.amax(x.to(torch.uint8), dims, keep).bool()
    # decomposed softmax over no elements: eager's softmax gives empty, amax raises
    if any(x.shape[d] == 0 for d in dims):
        return torch.full(n.shape, -math.inf if kind == "max" else math.inf, dtype=x.dtype, device=x.device)
    f = torch.amax if kind == "max" else torch.amin
    return f(x, dims, keep)


def _iota(n: Any) -> torch.Tensor:
    shape, dim = n.shape, n.attrs["dim"]
    r = torch.arange(shape[dim], dtype=n.dtype, device=n.attrs["device"])
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return r.view(view).expand(shape)


def _norm(n: Any, x: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(x, n.attrs["ord"], n.attrs["dims"], n.attrs["keepdim"])


def _tri(lower: bool) -> Callable:
    def f(n: Any, x: torch.Tensor) -> torch.Tensor:
        return (torch.tril if lower else torch.triu)(x, n.attrs["diagonal"])
    return f


def _slice(n: Any, x: torch.Tensor) -> torch.Tensor:
    d, start, step = n.attrs["dim"], n.attrs["start"], n.attrs.get("step", 1)
    return x[(slice(None),) * d + (slice(start, start + (n.shape[d] - 1) * step + 1, step),)]


TENSOR = "<tensor>"     # an opaque call's tensor argument, in its `arg_spec` and `kwargs`


def _opaque(n: Any, *args: Any) -> Any:
    """An op the IR does not model: run the captured ATen callable itself on the node's inputs, put back in
    the places TENSOR marks (lists of tensors included). No iterator or generator: Dynamo, which compiles a
    partial plan's remainder, cannot rebuild one at a graph break."""
    real, k = _filled(n.attrs["arg_spec"], args, 0)
    kwargs = {}
    for name, v in n.attrs["kwargs"].items():
        kwargs[name], k = _filled(v, args, k)
    out = n.attrs["fn"](*real, **kwargs)
    return out[n.attrs["index"]] if n.attrs["index"] is not None else out


def _filled(a: Any, args: tuple, k: int) -> tuple[Any, int]:
    """`a` with its TENSOR marks replaced by args[k], args[k + 1], ...; and the index after the last one used."""
    if isinstance(a, str) and a == TENSOR:
        return args[k], k + 1
    if isinstance(a, (list, tuple)):
        out = []
        for x in a:
            v, k = _filled(x, args, k)
            out.append(v)
        return type(a)(out), k
    return a, k


def _unary_eval(f: Callable) -> Callable:
    return lambda n, x: f(x)


def _binary_eval(f: Callable) -> Callable:
    return lambda n, a, b: f(a, b)


# `EVAL[op](node, *args)` computes one graph-IR node from its evaluated arguments; the reference
# evaluator and the eager fallback both use it, so there is one definition of what every op means.
EVAL: dict[Op, Callable] = {
    **{k: _unary_eval(f) for k, f in UNARY.items()},
    **{k: _binary_eval(f) for k, f in BINARY.items()},
    Op.CAST: lambda n, x: x.to(n.dtype),
    Op.WHERE: lambda n, c, a, b: torch.where(c, a, b),
    Op.REDUCE: _reduce,
    Op.CUMSUM: lambda n, x: torch.cumsum(x, n.attrs["dim"], dtype=n.dtype),
    Op.MATMUL: lambda n, a, b: torch.matmul(a, b),
    Op.PERMUTE: lambda n, x: x.permute(n.attrs["dims"]),
    Op.RESHAPE: lambda n, x: x.reshape(n.shape),
    Op.EXPAND: lambda n, x: x.expand(n.shape),
    Op.SELECT: lambda n, x: x.select(n.attrs["dim"], n.attrs["index"]),
    Op.SLICE: _slice,
    Op.CAT: lambda n, *xs: torch.cat(xs, n.attrs["dim"]),
    Op.STORED: lambda n, x: x,
    Op.CONST: lambda n: n.attrs["value"],
    Op.FULL: lambda n: torch.full(n.shape, n.attrs["value"], dtype=n.dtype, device=n.attrs["device"]),
    Op.IOTA: _iota,
    Op.SOFTMAX: lambda n, x: torch.softmax(x, n.attrs["dim"], dtype=n.dtype),
    Op.LOG_SOFTMAX: lambda n, x: torch.log_softmax(x, n.attrs["dim"], dtype=n.dtype),
    Op.MEAN: lambda n, x: torch.mean(x, n.attrs["dims"], n.attrs["keepdim"]),
    Op.LOGSUMEXP: lambda n, x: torch.logsumexp(x, n.attrs["dims"], n.attrs["keepdim"]),
    Op.NORM: _norm,
    Op.CLAMP: lambda n, x: torch.clamp(x, n.attrs["min"], n.attrs["max"]),
    Op.MASKED_FILL: lambda n, x, m, v: x.masked_fill(m, v),
    Op.TRIU: _tri(False),
    Op.TRIL: _tri(True),
    Op.ADDMM: lambda n, b, x, w: torch.addmm(b, x, w),
    Op.LINEAR: lambda n, x, w, b=None: F.linear(x, w, b),
    Op.ELU: lambda n, x: torch.ops.aten.elu(x, n.attrs["alpha"], n.attrs["scale"], n.attrs["input_scale"]),
    Op.LOG_SIGMOID: lambda n, x: F.logsigmoid(x),
    Op.NAN_TO_NUM: lambda n, x: torch.nan_to_num(x, n.attrs["nan"], n.attrs["posinf"], n.attrs["neginf"]),
    Op.OPAQUE: _opaque,
}
