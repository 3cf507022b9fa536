"""Capture rule for prefix sums: torch.cumsum.

A running total is a sum over a window that ends at each position: `c[i] = sum over t <= i of x[t]`. The graph
keeps it as one `cumsum` op (eager's own call where it runs unfused), and the loop form lowers it to that masked
sum over a fresh variable, whose tiles past the diagonal the value facts skip. Its result is marked `stored`:
attention with a forget gate reads the gates' running log-sum at both the query and the key
(`c[..., :, None] - c[..., None, :]`), and a kernel that computes it once and stores it serves both reads, where
each would otherwise sum again inside the attention's loop. Its input is stored too where it reads a reduction.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..ir.graph import Builder, Node
from .pooling import shared

aten = torch.ops.aten


def cumsum(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Optional[Node]:
    """torch.cumsum in eager's result dtype (int64 for bools and integers); half inputs sum in float32 and round
    each total once, as eager's kernels accumulate them."""
    x = a[0]
    if not s or 0 in s:
        return None
    if x.dtype != d and not (x.dtype.is_floating_point and d.is_floating_point):
        x = b.add("cast", (x,), x.shape, d, src)
    total = b.add("cumsum", (shared(b, x, src),), s, d, src, dim=a[1] % len(s))
    return b.add("stored", (total,), s, d, src)


RULES: dict[Any, Callable] = {aten.cumsum.default: cumsum}
