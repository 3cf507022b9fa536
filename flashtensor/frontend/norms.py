"""Capture rules' bodies for the normalisations that return several tensors: layer_norm's output, mean and rstd,
and the moments var_mean returns, built from primitives that fuse (QK-norm before attention). Half inputs are
computed in float32, as eager computes them."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch

from ..ir.graph import Builder, Node
from ..ir.ops import WIDE


def dims_of(dims: Any, rank: int) -> list[int]:
    """A reduction's `dim` argument as sorted non-negative dims: every one where it is None or empty."""
    if dims is None or dims == []:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(d % rank for d in dims)


def _to(b: Builder, x: Node, dtype: torch.dtype, src: str) -> Node:
    return x if x.dtype == dtype else b.add("cast", (x,), x.shape, dtype, src)


def moments(b: Builder, x: Node, dims: list[int], correction: float, src: str) -> tuple[Node, Node, Node]:
    """The mean over `dims` (kept), the deviations from it and their variance; two passes (the mean first), as
    accurate as eager's one-pass Welford, and NaN where an infinity makes Welford's NaN."""
    x = _to(b, x, WIDE.get(x.dtype, x.dtype), src)
    count = 1
    for d in dims:
        count *= x.shape[d]
    kept = tuple(1 if d in dims else n for d, n in enumerate(x.shape))
    mean = b.add("mean", (x,), kept, x.dtype, src, dims=dims, keepdim=True)
    if count > 1:   # eager's one-pass Welford makes an infinite mean NaN (inf - inf at the next element)
        mean = b.add("where", (b.infinite(mean, src), math.nan, mean), kept, x.dtype, src)
    dev = b.add("sub", (x, mean), x.shape, x.dtype, src)
    total = b.add("reduce", (b.add("mul", (dev, dev), x.shape, x.dtype, src),), kept, x.dtype, src, kind="sum",
                  dims=dims, keepdim=True)
    if count == 1:  # one element's deviation from itself is 0 (NaN if it is not finite), as eager's; a kernel that
        # computes x again for it may round it an ulp apart (an FMA contracted on the GPU in one pass, not the
        # other), and that ulp squared over a correction's 0 made inf where eager's 0 / 0 is NaN
        total = b.add("mul", (total, 0.0), kept, x.dtype, src)
    return mean, dev, b.add("div", (total, float(max(count - correction, 0))), kept, x.dtype, src)


def layer_norm(b: Builder, x: Node, rank: int, weight: Optional[Node], bias: Optional[Node], eps: float,
               dtypes: Sequence[torch.dtype], src: str) -> list[Node]:
    """native_layer_norm (F.layer_norm, nn.LayerNorm) over the last `rank` dimensions: (x - mean) * rsqrt(var +
    eps) * weight + bias, then the mean and rstd, in `dtypes`."""
    mean, dev, var = moments(b, x, list(range(len(x.shape) - rank, len(x.shape))), 0, src)
    rstd = b.add("rsqrt", (b.add("add", (var, eps), var.shape, var.dtype, src),), var.shape, var.dtype, src)
    y = b.add("mul", (dev, rstd), dev.shape, dev.dtype, src)
    for p, op in ((weight, "mul"), (bias, "add")):
        if p is not None:
            y = b.add(op, (y, _to(b, p, y.dtype, src)), y.shape, y.dtype, src)
    return [_to(b, n, d, src) for n, d in zip((y, mean, rstd), dtypes)]
