"""Captured masks as index predicates: a constant tensor whose values follow its positions becomes that predicate.

Most code builds its causal, sliding-window or sink mask once, outside the attention function (a module's
`tril` buffer, a bool matrix from the enclosing scope), so the plan sees a constant tensor, not the comparisons of
`arange`s that value facts turn into skipped tiles. A constant of two values over its last two dimensions (leading
ones of size 1) whose pattern is a form below, with d = j - i (key minus query position), is rewritten as that
form of `iota` comparisons, checked against every element first:

- a band: d <= a and d >= b (causal: a = 0; a window of w: also b = 1 - w; triu(k): b = k alone);
- sinks beside a band: d <= a and (j < p or d >= b) (StreamingLLM's first p keys, then a window);
- a prefix: d <= a or j < p (prefix-LM: the first p keys seen by every query).

The guards key a plan by the constant's identity and version (api/guards.py), so the form holds for every call
the plan serves. A constant of another pattern stays a constant (a run-time mask, analysis/atoms.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..ir.graph import Builder, Node
from ..ir.ops import scalar


@dataclass(frozen=True)
class Atom:
    """d <= c ("d<="), d >= c ("d>="), or j < c ("j<")."""
    test: str
    c: int


@dataclass(frozen=True)
class Join:
    """Every part holds, or (`disjunction`) some part does."""
    parts: tuple[Union[Atom, "Join"], ...]
    disjunction: bool


Form = Union[Atom, Join]


def index_form(m: torch.Tensor) -> Optional[Form]:
    """A form of d and j that gives `m` (a bool matrix) exactly, or None. The matrix may be large (a model's whole
    context): the work is a few passes over bytes, no int64 matrix."""
    rows, cols = m.shape
    kept = m.any(1)
    if not kept.any():
        return Join((), True)               # nothing kept: a full False
    x = torch.nn.functional.pad(m.to(torch.int8), (1, 1))
    step = x[:, 1:] - x[:, :-1]             # +1 where a run starts, -1 one past where it ends (columns 0..cols)
    starts, ends = (step == 1).to(torch.uint8), (step == -1).to(torch.uint8)
    i = torch.arange(rows, device=m.device)
    last = cols - 1 - ends.flip(1).argmax(1)            # each kept row's last kept key
    first_end = ends.argmax(1)                          # one past the end of its first run
    last_start = cols - starts.flip(1).argmax(1)        # the start of its last run
    two = starts.sum(1, dtype=torch.int32) == 2
    a = _least((last - i)[kept & (last < cols - 1)])
    b = _most((last_start - i)[kept & (last_start > 0)])
    candidates = [_band(a, b),
                  _sinks(a, b, _most(first_end[two])),
                  _prefix(a, _least(last[kept] + 1))]
    return next((f for f in candidates if f is not None and torch.equal(evaluate(f, rows, cols, m.device), m)), None)


def _least(v: torch.Tensor) -> Optional[int]:
    return int(v.min()) if v.numel() else None


def _most(v: torch.Tensor) -> Optional[int]:
    return int(v.max()) if v.numel() else None


def _band(a: Optional[int], b: Optional[int]) -> Form:
    parts = tuple(Atom(t, c) for t, c in (("d<=", a), ("d>=", b)) if c is not None)
    return Join(parts, False)


def _sinks(a: Optional[int], b: Optional[int], p: Optional[int]) -> Optional[Form]:
    if b is None or p is None:
        return None
    inner = Join((Atom("j<", p), Atom("d>=", b)), True)
    return Join(((Atom("d<=", a),) if a is not None else ()) + (inner,), False)


def _prefix(a: Optional[int], p: Optional[int]) -> Optional[Form]:
    if a is None or p is None:
        return None
    return Join((Atom("d<=", a), Atom("j<", p)), True)


def evaluate(f: Form, rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """The form over a rows x cols grid, as a bool matrix."""
    i = torch.arange(rows, device=device)[:, None]
    j = torch.arange(cols, device=device)[None, :]
    if isinstance(f, Atom):     # j - i <= c as j <= i + c: no int64 matrix
        return {"d<=": j <= i + f.c, "d>=": j >= i + f.c, "j<": (j < f.c).expand(rows, cols)}[f.test]
    out = torch.full((rows, cols), not f.disjunction, device=device)
    for part in f.parts:
        v = evaluate(part, rows, cols, device)
        out = out | v if f.disjunction else out & v
    return out


def as_index_predicate(b: Builder, n: Node) -> Optional[Node]:
    """The constant n as a form of iota comparisons (where(form, hi, lo) for a constant of two values), or None
    where its values follow none."""
    value: torch.Tensor = n.attrs["value"]
    if isinstance(value, FakeTensor) or value.device.type == "meta" or value.dim() < 2 \
            or any(s != 1 for s in value.shape[:-2]) or min(value.shape[-2:]) < 2:
        return None     # a value the trace made (on fake tensors) has no values to read
    flat = value.reshape(value.shape[-2:])
    levels = [False, True] if value.dtype == torch.bool else _two_levels(flat)
    if levels is None:
        return None
    m = flat if value.dtype == torch.bool else flat == levels[1]
    f = index_form(m)
    if f is None:
        return None
    rows, cols = flat.shape
    keep = _emit(b, f, (rows, cols), value.device, n.source)
    out = keep if value.dtype == torch.bool else \
        b.add("where", (keep, scalar(levels[1], value.dtype), scalar(levels[0], value.dtype)), keep.shape,
              value.dtype, n.source)
    return out if out.shape == n.shape else b.add("reshape", (out,), n.shape, value.dtype, n.source)


def _two_levels(flat: torch.Tensor) -> Optional[list]:
    """The two values of a numeric matrix, the lower first, or None where it holds one, more, a NaN or complex
    numbers (two passes, no sort: a captured bias table may be large)."""
    if flat.is_complex() or (flat.is_floating_point() and bool(flat.isnan().any())):
        return None
    first = flat[0, 0]
    other = flat[flat != first]
    if other.numel() == 0 or not bool(((flat == first) | (flat == other[0])).all()):
        return None
    return sorted([first.item(), other[0].item()])


def _emit(b: Builder, f: Form, shape: tuple[int, int], device: torch.device, src: str) -> Node:
    if isinstance(f, Atom):
        cols = b.add("iota", (), shape, torch.int64, src, dim=1, device=device)
        if f.test == "j<":
            return b.add("lt", (cols, f.c), shape, torch.bool, src)
        rows = b.add("iota", (), shape, torch.int64, src, dim=0, device=device)
        bound = rows if f.c == 0 else b.add("add", (rows, f.c), shape, torch.int64, src)     # j - i <= c: j <= i + c
        return b.add("le" if f.test == "d<=" else "ge", (cols, bound), shape, torch.bool, src)
    if not f.parts:
        return b.add("full", (), shape, torch.bool, src, value=not f.disjunction, device=device)
    out = _emit(b, f.parts[0], shape, device, src)
    for part in f.parts[1:]:
        out = b.add("logical_or" if f.disjunction else "logical_and", (out, _emit(b, part, shape, device, src)), shape,
                    torch.bool, src)
    return out
