"""Capture rules for reductions: sum, max, min and any as the IR's one reduce op, and the ones built from it with
eager's meaning (all as not any of not, count_nonzero as the sum of x != 0, nansum with NaN taken as 0)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from .norms import dims_of

aten = torch.ops.aten


def _reduce(kind: str) -> Callable:
    def rule(b, args, kw, shape, dtype, src):
        x = args[0]
        dims = dims_of(args[1] if len(args) > 1 else kw.get("dim"), len(x.shape))
        keep = bool(args[2] if len(args) > 2 else kw.get("keepdim", False))
        if kind == "sum" and x.dtype != dtype and x.dtype != torch.bool:
            x = b.add("cast", (x,), x.shape, dtype, src)
        return b.add("reduce", (x,), shape, dtype, src, kind=kind, dims=dims, keepdim=keep)
    return rule


def _all(b, a, kw, s, d, src):
    """all(x) as not any(not x): the IR has one boolean reduction (bool results only; uint8 stays eager)."""
    if d != torch.bool:
        return None
    nx = b.add("logical_not", (a[0],), a[0].shape, torch.bool, src)
    return b.add("logical_not", (_reduce("any")(b, [nx, *a[1:]], kw, s, d, src),), s, d, src)


def _count_nonzero(b, a, kw, s, d, src):
    """count_nonzero(x, dim): NaN counts; no keepdim."""
    nonzero = b.add("ne", (a[0], 0), a[0].shape, torch.bool, src)
    return _reduce("sum")(b, [nonzero, a[1] if len(a) > 1 else kw.get("dim"), False], {}, s, d, src)


def _nansum(b, a, kw, s, d, src):
    x = a[0]
    if not x.dtype.is_floating_point:
        return _reduce("sum")(b, a, kw, s, d, src)
    nan = b.add("ne", (x, x), x.shape, torch.bool, src)
    return _reduce("sum")(b, [b.add("where", (nan, 0.0, x), x.shape, x.dtype, src), *a[1:]], kw, s, d, src)


RULES: dict[Any, Callable] = {
    aten.sum.dim_IntList: _reduce("sum"), aten.sum.default: _reduce("sum"),
    aten.amax.default: _reduce("max"), aten.amin.default: _reduce("min"),
    aten.max.default: _reduce("max"), aten.min.default: _reduce("min"),
    aten.any.dim: _reduce("any"), aten.any.default: _reduce("any"), aten.any.dims: _reduce("any"),
    aten.all.dim: _all, aten.all.default: _all, aten.all.dims: _all,
    aten.count_nonzero.default: _count_nonzero, aten.count_nonzero.dim_IntList: _count_nonzero,
    aten.nansum.default: _nansum,
}
