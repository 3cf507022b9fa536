"""Capture rules for slice and select assignment (`s[..., :5, :] = -inf`), which functionalisation turns into
slice_scatter and select_scatter: a where over the written index range of the base, or, where the written value
is a tensor in the window's own coordinates, a cat of the base around it."""
from __future__ import annotations

import torch

from ..ir.graph import Node


def scatter(select: bool):
    """slice_scatter / select_scatter, what a slice assignment becomes once functionalized: a select
    over the written index range, when the written value is known in the base's coordinates (a value
    broadcast, or such a write along another dimension into the same slice of the base)."""
    def rule(b, a, kw, s, d, src):
        base, val, dim = a[0], a[1], (a[2] if len(a) > 2 else 0) % len(s)
        if select:
            lo = a[3] % s[dim]
            hi = lo + 1
        else:
            if (a[5] if len(a) > 5 else 1) != 1:
                return None
            lo, hi = (a[3] if len(a) > 3 else None), (a[4] if len(a) > 4 else None)
            lo, hi = (0 if lo is None else lo), (s[dim] if hi is None else hi)
            lo, hi = (min(max(x + s[dim] if x < 0 else x, 0), s[dim]) for x in (lo, hi))
        value = _lifted(b, val, base, dim, lo, select, s, d, src)
        if value is None:
            return _joined(b, base, val, dim, lo, hi, select, s, d, src)
        return b.add("where", (_window(b, s, dim, lo, hi, base.device, src), value, base), s, d, src,
                     window=(dim, lo, hi))
    return rule


def _joined(b, base, val, dim, lo, hi, select, s, d, src):
    """A written tensor in the window's own coordinates (SnapKV's `w[..., -8:, -8:] += mask`): the base before the
    window, the value, and the base after it, joined by a cat along `dim`, whose pieces the loop form reads
    shifted."""
    if not isinstance(val, Node):
        return None
    if select:
        val = b.add("reshape", (val,), (*s[:dim], 1, *s[dim + 1:]), val.dtype, src)
    if tuple(val.shape) != (*s[:dim], hi - lo, *s[dim + 1:]):
        return None
    val = val if val.dtype == d else b.add("cast", (val,), val.shape, d, src)
    pieces = [b.add("slice", (base,), (*s[:dim], n, *s[dim + 1:]), d, src, dim=dim, start=at) if x is None else x
              for x, at, n in ((None, 0, lo), (val, lo, hi - lo), (None, hi, s[dim] - hi)) if n > 0]
    return pieces[0] if len(pieces) == 1 else b.add("cat", tuple(pieces), s, d, src, dim=dim)


def _window(b, s, dim, lo, hi, device, src):
    idx = b.add("iota", (), s, torch.int64, src, dim=dim, device=device)
    ge = b.add("ge", (idx, lo), s, torch.bool, src)
    return b.add("logical_and", (ge, b.add("lt", (idx, hi), s, torch.bool, src)), s, torch.bool, src)


def _lifted(b, v, base, dim, lo, select, s, d, src):
    """The value written by a scatter into `base` along `dim` at `lo`, in base's coordinates; None when
    that would need shifting it."""
    if not isinstance(v, Node):
        return v
    if v is base:                        # a window that is all of the base (slicing it gave it back)
        return base if not select and tuple(v.shape) == tuple(s) else None
    if v.op == "full" and not isinstance(v.attrs["value"], Node):
        return v.attrs["value"]
    if v.op == "expand" and not v.args[0].shape:
        return b.add("expand", (v.args[0],), s, d, src)
    if v.args and v.args[0] is base and v.attrs.get("dim") == dim and \
            v.attrs.get("index" if select else "start") == lo and v.op == ("select" if select else "slice") and \
            "step" not in v.attrs:
        return base                      # the same window of the base
    if v.op == "where" and "window" in v.attrs:
        d2, lo2, hi2 = v.attrs["window"]
        d2 += 1 if select and d2 >= dim else 0
        if d2 == dim:
            return None
        x, y = (_lifted(b, w, base, dim, lo, select, s, d, src) for w in v.args[1:])
        if x is None or y is None:
            return None
        return b.add("where", (_window(b, s, d2, lo2, hi2, base.device, src), x, y), s, d, src, window=(d2, lo2, hi2))
    return None


def copied(b, a, kw, s, d, src):
    """aten.copy (what functionalisation makes of a slice written back into itself, `w[..., -8:] += m`): the
    source broadcast to the destination's shape in its dtype."""
    val = a[1]
    if not isinstance(val, Node):
        return None
    if tuple(val.shape) != tuple(s):
        val = b.add("expand", (val,), s, val.dtype, src)
    return val if val.dtype == d else b.add("cast", (val,), s, d, src)
