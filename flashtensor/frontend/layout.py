"""Capture rules for the layout ops that join, repeat or cut tensors: cat, stack, repeat, slice.

cat is a graph op of its own (the loop form selects among its pieces by the joined axis' index, see
transform/loopform.py); stack is a cat of pieces with the new axis inserted, and repeat an expand of a new
axis before each repeated one, merged into it, so neither needs a lowering of its own.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..ir.graph import Builder, Node

aten = torch.ops.aten


def _cat(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Optional[Node]:
    """torch.cat: the pieces in eager's promoted dtype; empty pieces (also the legacy 1-D empty tensor eager
    lets through at any rank) contribute nothing, and an empty result stays an eager op."""
    dim = (a[1] if len(a) > 1 else kw.get("dim", 0)) % len(s)
    pieces = [x if x.dtype == d else b.add("cast", (x,), x.shape, d, src) for x in a[0] if 0 not in x.shape]
    if len(pieces) <= 1 or 0 in s:
        return pieces[0] if pieces and 0 not in s else None
    return b.add("cat", tuple(pieces), s, d, src, dim=dim)


def _stack(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Optional[Node]:
    """torch.stack: a cat of the pieces, each with a size-1 axis at the new dimension."""
    dim = (a[1] if len(a) > 1 else kw.get("dim", 0)) % len(s)
    pieces = [b.add("reshape", (x,), (*x.shape[:dim], 1, *x.shape[dim:]), x.dtype, src) for x in a[0]]
    return _cat(b, [pieces, dim], {}, s, d, src)


def _repeat(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Node:
    """Tensor.repeat: out[.., r * n + y, ..] = x[.., y, ..], an axis of extent r expanded in front of each
    repeated one and merged into it (row-major, as reshape merges)."""
    x, sizes = a[0], list(a[1])
    shape = [1] * (len(sizes) - len(x.shape)) + list(x.shape)
    split = [e for n in shape for e in (1, n)]
    grown = [e for r, n in zip(sizes, shape) for e in (r, n)]
    y = b.add("reshape", (x,), tuple(split), d, src)
    y = b.add("expand", (y,), tuple(grown), d, src)
    return b.add("reshape", (y,), s, d, src)


def _slice(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Node:
    """x[..., start:stop:step] along one dimension; a negative start counts from the end."""
    x = a[0]
    dim = (a[1] if len(a) > 1 else 0) % len(x.shape)
    start = a[2] if len(a) > 2 and a[2] is not None else 0
    step = a[4] if len(a) > 4 else 1
    start = max(0, start + x.shape[dim] if start < 0 else start)
    if tuple(x.shape) == s:
        return x
    every = {"step": step} if step != 1 and s[dim] > 1 else {}    # x[..., ::2] (GPT-J's interleaved halves)
    return b.add("slice", (x,), s, d, src, dim=dim, start=min(start, x.shape[dim]), **every)


RULES: dict[Any, Callable] = {aten.cat.default: _cat, aten.stack.default: _stack, aten.repeat.default: _repeat,
                              aten.slice.Tensor: _slice}
