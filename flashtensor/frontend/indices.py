"""Capture rules for the integer index arithmetic masks are built from: Llama 4's chunked attention compares
i // chunk with j // chunk, strided sparse attention tests (i - j) % stride == 0. Floor division and Python's
remainder are built from the truncating division and remainder (ir/ops.py); the divisor must be a nonzero number,
since eager raises on an integer division by 0 and a kernel would not. Float operands stay eager ops: eager's
float floor division and remainder round in their own way."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..ir.graph import Builder, Node

aten = torch.ops.aten


def _by_number(a: list) -> bool:
    """An integer tensor over a nonzero integer."""
    x, y = a[0], a[1]
    return isinstance(x, Node) and x.dtype != torch.bool and not x.dtype.is_floating_point and \
        isinstance(y, int) and not isinstance(y, bool) and y != 0


def _rounded(b: Builder, x: Node, y: int, s: tuple, d: torch.dtype, src: str, mode: str) -> Node:
    """x // y (mode "floor"), x / y rounded toward 0 ("trunc") or Python's x % y ("remainder")."""
    if mode == "trunc":
        return b.add("trunc_div", (x, y), s, d, src)
    r = b.add("fmod", (x, y), s, d, src)
    # the truncated quotient is one too high, and the remainder one divisor short, where the remainder is nonzero
    # and its sign is not the divisor's
    off = b.add("lt" if y > 0 else "gt", (r, 0), s, torch.bool, src)
    if mode == "remainder":
        return b.add("where", (off, b.add("add", (r, y), s, d, src), r), s, d, src)
    q = b.add("trunc_div", (x, y), s, d, src)
    return b.add("where", (off, b.add("sub", (q, 1), s, d, src), q), s, d, src)


def _rule(rounding: Optional[str]) -> Callable:
    """A rule for one rounding (None: the call's rounding_mode, where it has one)."""
    def rule(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Any:
        mode = rounding or kw.get("rounding_mode", a[2] if len(a) > 2 else None)
        if mode not in ("floor", "trunc", "remainder") or not _by_number(a) or d.is_floating_point:
            return None
        return _rounded(b, a[0], a[1], s, d, src, mode)
    return rule


def _fmod(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Any:
    return b.add("fmod", (a[0], a[1]), s, d, src) if _by_number(a) and not d.is_floating_point else None


def _xor(b: Builder, a: list, kw: dict, s: tuple, d: torch.dtype, src: str) -> Any:
    """Exclusive or of two bool tensors: where they differ."""
    x, y = a[0], a[1]
    if not all(isinstance(t, Node) and t.dtype == torch.bool for t in (x, y)) or d != torch.bool:
        return None
    return b.add("ne", (x, y), s, d, src)


RULES: dict[Any, Callable] = {
    aten.floor_divide.default: _rule("floor"), aten.floor_divide.Scalar: _rule("floor"),
    aten.div.Tensor_mode: _rule(None), aten.div.Scalar_mode: _rule(None),
    aten.remainder.Scalar: _rule("remainder"), aten.remainder.Tensor: _rule("remainder"),
    aten.fmod.Scalar: _fmod, aten.fmod.Tensor: _fmod,
    aten.bitwise_xor.Tensor: _xor, aten.logical_xor.default: _xor,
}
