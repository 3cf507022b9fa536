"""Capture rules for constant padding and pooling: F.pad, avg_pool1d/2d, max_pool1d/2d.

SnapKV smooths its column scores with `avg_pool1d` and PyramidKV with `max_pool1d` before top-k. A pooled
value is a sum (or max) of the padded input read at kernel-size shifted offsets, so the rules build it from
ops the loop form already has: padding is a cat of constant blocks around the input, each kernel offset a
strided slice of it. The loop form re-derives a sliced value at each offset, which is free for elementwise
values but would compute a reduction once per offset: the input is marked `stored`, and where it reads a
reduction (column statistics) a kernel computes it once and the pooling reads it back at each offset.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable, Iterator, Optional

import torch

from ..ir.graph import Builder, Node
from ..ir.ops import WIDE, scalar

aten = torch.ops.aten


def _arg(a: list, kw: dict, i: int, key: str, default: Any) -> Any:
    return a[i] if len(a) > i else kw.get(key, default)


def _each(v: Any, n: int) -> list[int]:
    """An int or a one- or n-element list as n ints (pooling's kernel_size, stride, padding, dilation)."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def pad(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Optional[Node]:
    """constant_pad_nd (F.pad in "constant" mode): per padded dimension, a cat of a block of the value, the
    input and another block; a negative amount crops, as a slice."""
    x, amounts = a[0], list(a[1])
    value = _arg(a, kw, 2, "value", 0)
    if any(n == 0 for n in s):
        return None
    for k in range(len(amounts) // 2):
        dim, lo, hi = len(x.shape) - 1 - k, amounts[2 * k], amounts[2 * k + 1]
        if lo < 0 or hi < 0:
            kept = x.shape[dim] + min(lo, 0) + min(hi, 0)
            x = b.add("slice", (x,), _with(x.shape, dim, kept), d, src, dim=dim, start=-min(lo, 0))
        blocks = [b.add("full", (), _with(x.shape, dim, n), d, src, value=scalar(value, d), device=x.device)
                  for n in (max(lo, 0), max(hi, 0))]
        pieces = [p for p in (blocks[0], x, blocks[1]) if p.shape[dim] > 0]
        if len(pieces) > 1:
            x = b.add("cat", tuple(pieces), _with(x.shape, dim, sum(p.shape[dim] for p in pieces)), d, src,
                      dim=dim)
    return x


def _with(shape: tuple, dim: int, n: int) -> tuple:
    return tuple(n if i == dim else e for i, e in enumerate(shape))


def _windows(b: Builder, x: Node, kernel: list[int], stride: list[int], dilation: list[int], s: tuple,
             src: str) -> Iterator[Node]:
    """Per kernel offset, the padded input `x` read at `o * stride + t * dilation` along its last dimensions
    for every output index o (output shape `s`)."""
    dims = range(len(x.shape) - len(kernel), len(x.shape))
    for offsets in itertools.product(*(range(k) for k in kernel)):
        y = x
        for dim, t, st, dl in zip(dims, offsets, stride, dilation):
            if y.shape[dim] != s[dim] or t:
                every = {"step": st} if st != 1 and s[dim] > 1 else {}
                y = b.add("slice", (y,), _with(y.shape, dim, s[dim]), y.dtype, src, dim=dim, start=t * dl, **every)
        yield y


def shared(b: Builder, x: Node, src: str) -> Node:
    """x, marked `stored`: each window reads it at its own offset, and where it reads a reduction (the loop form
    decides: elsewhere the mark goes), a value stored once is cheaper to read k times than to compute k times."""
    return b.add("stored", (x,), x.shape, x.dtype, src)


def _padded(b: Builder, x: Node, padding: list[int], value: float, src: str) -> Optional[Node]:
    lead = len(x.shape) - len(padding)
    shape = tuple(e + 2 * padding[i - lead] if i >= lead else e for i, e in enumerate(x.shape))
    amounts = [p for n in reversed(padding) for p in (n, n)]
    return pad(b, [x, amounts, value], {}, shape, x.dtype, src) if any(padding) else x


def avg_pool(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Optional[Node]:
    """avg_pool2d (also F.avg_pool1d, which calls it on an unsqueezed input): the sum of the windows over the
    divisor, accumulated in float32 for half inputs and rounded once, as eager's kernels do. ceil_mode, whose
    last window runs past the input, stays an eager op."""
    x, kernel = a[0], _each(a[1], 2)
    stride = _each(_arg(a, kw, 2, "stride", []) or kernel, 2)
    padding = _each(_arg(a, kw, 3, "padding", 0), 2)
    if _arg(a, kw, 4, "ceil_mode", False) or not d.is_floating_point:
        return None
    x = shared(b, x, src)
    wide = WIDE.get(d, d)
    xw = x if x.dtype == wide else b.add("cast", (x,), x.shape, wide, src)
    xp = _padded(b, xw, padding, 0.0, src)
    if xp is None:
        return None
    total: Optional[Node] = None
    for y in _windows(b, xp, kernel, stride, [1, 1], s, src):
        total = y if total is None else b.add("add", (total, y), s, wide, src)
    assert total is not None
    override = _arg(a, kw, 6, "divisor_override", None)
    divisor: Any = override or math.prod(kernel)
    if not override and any(padding) and not _arg(a, kw, 5, "count_include_pad", True):
        divisor = _counts(b, x, kernel, stride, padding, s, wide)
    out = b.add("div", (total, divisor), s, wide, src)
    return out if wide == d else b.add("cast", (out,), s, d, src)


def _counts(b: Builder, x: Node, kernel: list[int], stride: list[int], padding: list[int], s: tuple,
            dtype: torch.dtype) -> Node:
    """How many of each window's elements lie inside the unpadded input (count_include_pad=False), a constant
    of the output's last two dimensions."""
    per_dim = []
    for dim, k, st, p in zip(range(len(s) - 2, len(s)), kernel, stride, padding):
        n = x.shape[dim]
        per_dim.append(torch.tensor([min(o * st - p + k, n) - max(o * st - p, 0) for o in range(s[dim])],
                                    dtype=dtype))
    value = (per_dim[0][:, None] * per_dim[1][None, :]).to(x.device)
    return b.add("const", (), tuple(value.shape), dtype, value=value)


def max_pool(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Optional[Node]:
    """The values of max_pool2d_with_indices (also F.max_pool1d): the maximum over the windows of the input
    padded with -inf (NaN propagates, as in eager). ceil_mode stays an eager op."""
    x, kernel = a[0], _each(a[1], 2)
    stride = _each(_arg(a, kw, 2, "stride", []) or kernel, 2)
    padding = _each(_arg(a, kw, 3, "padding", 0), 2)
    dilation = _each(_arg(a, kw, 4, "dilation", 1), 2)
    if _arg(a, kw, 5, "ceil_mode", False) or not d.is_floating_point:
        return None
    xp = _padded(b, shared(b, x, src), padding, -math.inf, src)
    if xp is None:
        return None
    best: Optional[Node] = None
    for y in _windows(b, xp, kernel, stride, dilation, s, src):
        best = y if best is None else b.add("maximum", (best, y), s, d, src)
    return best


RULES: dict[Any, Callable] = {aten.constant_pad_nd.default: pad, aten.avg_pool2d.default: avg_pool}
