"""The op vocabulary of the graph IR and the meaning of each op as plain torch.

`EVAL[op](node, *args)` computes one node from its evaluated arguments; the
reference evaluator and the eager fallback both use it, so there is one
definition of what every op means.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

def _extreme(pick, clamp):
    """maximum/minimum that also take a Python scalar on either side."""
    def f(a, b):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return pick(a, b)
        return clamp(a, b) if isinstance(a, torch.Tensor) else clamp(b, a)
    return f


UNARY: dict[str, Callable] = {
    "neg": torch.neg, "exp": torch.exp, "log": torch.log, "tanh": torch.tanh, "abs": torch.abs,
    "sigmoid": torch.sigmoid, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "exp2": torch.exp2,
    "log2": torch.log2, "reciprocal": torch.reciprocal, "logical_not": torch.logical_not,
    # log2 that kernels may compute as coarsely as exp2 (the GPU's approximate unit); only ever inside an
    # exponential's argument, where an absolute error of ~1e-7 is a relative one in the result
    "log2_approx": torch.log2,
}
BINARY: dict[str, Callable] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "maximum": _extreme(torch.maximum, torch.clamp_min), "minimum": _extreme(torch.minimum, torch.clamp_max),
    "pow": torch.pow,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
}
# Composite ops that `transform.decompose` rewrites into the primitives above.
COMPOSITE = ("softmax", "log_softmax", "mean", "norm", "clamp", "masked_fill", "triu", "tril",
             "addmm", "linear")


def _reduce(n, x):
    kind, dims, keep = n.attrs["kind"], n.attrs["dims"], n.attrs["keepdim"]
    if not dims:
        return x
    if kind == "sum":
        return torch.sum(x, dim=dims, keepdim=keep, dtype=n.dtype)
    if kind == "any":
        return torch.any(x, dim=dims, keepdim=keep) if len(dims) == 1 else torch.amax(x.to(torch.uint8), dims, keep).bool()
    if any(x.shape[d] == 0 for d in dims):   # decomposed softmax over no elements: eager's softmax gives empty, amax raises
        return torch.full(n.shape, -math.inf if kind == "max" else math.inf, dtype=x.dtype, device=x.device)
    f = torch.amax if kind == "max" else torch.amin
    return f(x, dims, keep)


def _iota(n):
    shape, dim = n.shape, n.attrs["dim"]
    r = torch.arange(shape[dim], dtype=n.dtype, device=n.attrs["device"])
    view = [1] * len(shape)
    view[dim] = shape[dim]
    return r.view(view).expand(shape)


def _norm(n, x):
    return torch.linalg.vector_norm(x, n.attrs["ord"], n.attrs["dims"], n.attrs["keepdim"])


def _tri(lower: bool):
    def f(n, x):
        return (torch.tril if lower else torch.triu)(x, n.attrs["diagonal"])
    return f


def _slice(n, x):
    return x.narrow(n.attrs["dim"], n.attrs["start"], n.shape[n.attrs["dim"]])


EVAL: dict[str, Callable] = {
    **{k: (lambda f: lambda n, x: f(x))(f) for k, f in UNARY.items()},
    **{k: (lambda f: lambda n, a, b: f(a, b))(f) for k, f in BINARY.items()},
    "cast": lambda n, x: x.to(n.dtype),
    "where": lambda n, c, a, b: torch.where(c, a, b),
    "reduce": _reduce,
    "matmul": lambda n, a, b: torch.matmul(a, b),
    "permute": lambda n, x: x.permute(n.attrs["dims"]),
    "reshape": lambda n, x: x.reshape(n.shape),
    "expand": lambda n, x: x.expand(n.shape),
    "select": lambda n, x: x.select(n.attrs["dim"], n.attrs["index"]),
    "slice": _slice,
    "const": lambda n: n.attrs["value"],
    "full": lambda n: torch.full(n.shape, n.attrs["value"], dtype=n.dtype, device=n.attrs["device"]),
    "iota": _iota,
    "softmax": lambda n, x: torch.softmax(x, n.attrs["dim"], dtype=n.dtype),
    "log_softmax": lambda n, x: torch.log_softmax(x, n.attrs["dim"], dtype=n.dtype),
    "mean": lambda n, x: torch.mean(x, n.attrs["dims"], n.attrs["keepdim"]),
    "norm": _norm,
    "clamp": lambda n, x: torch.clamp(x, n.attrs["min"], n.attrs["max"]),
    "masked_fill": lambda n, x, m, v: x.masked_fill(m, v),
    "triu": _tri(False),
    "tril": _tri(True),
    "addmm": lambda n, b, x, w: torch.addmm(b, x, w),
    "linear": lambda n, x, w, b=None: F.linear(x, w, b),
    "opaque": lambda n, *a: _opaque(n, *a),
}


def _opaque(n, *args):
    """An op the IR does not model: run the captured ATen callable itself."""
    it = iter(args)
    real = [next(it) if isinstance(a, str) and a == "<tensor>" else a for a in n.attrs["arg_spec"]]
    out = n.attrs["fn"](*real, **n.attrs["kwargs"])
    return out[n.attrs["index"]] if n.attrs["index"] is not None else out
