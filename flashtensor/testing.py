"""The correctness contract of docs/design.md §6 as code: the demo, the benchmarks and the tests all use it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


def tolerance(dtype: torch.dtype) -> float:
    """Allowed relative error: 2e-3 for half types, 1e-4 for other floats, 0 (exact) otherwise."""
    if dtype in (torch.float16, torch.bfloat16):
        return 2e-3
    return 1e-4 if dtype.is_floating_point else 0.0


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """norm(out - ref) / norm(ref) over the positions where `ref` is finite (inf or NaN if `out` is not finite
    there)."""
    o, r = out.detach().cpu().double(), ref.detach().cpu().double()
    finite = torch.isfinite(r)
    diff = torch.linalg.vector_norm(o[finite] - r[finite]).item()
    norm = torch.linalg.vector_norm(r[finite]).item()
    return diff / norm if norm > 0 else diff


@dataclass
class Match:
    """How one output compares with eager: `error` against `tol`, and what is wrong ('' when nothing)."""
    error: float
    tol: float
    problem: str

    @property
    def ok(self) -> bool:
        return not self.problem


def compare(out: Any, ref: torch.Tensor) -> Match:
    """Check `out` against the eager value `ref`: same shape and dtype, same NaN/inf positions, error within
    tolerance."""
    tol = tolerance(ref.dtype)
    if not isinstance(out, torch.Tensor):
        return Match(math.nan, tol, f"expected a tensor, got {type(out).__name__}")
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return Match(math.nan, tol, f"got {out.dtype}{list(out.shape)}, eager gives {ref.dtype}{list(ref.shape)}")
    o, r = out.detach().cpu(), ref.detach().cpu()
    if tol == 0.0:
        wrong = int((o != r).sum())
        return Match(wrong / max(r.numel(), 1), tol, f"{wrong} of {r.numel()} elements differ" if wrong else "")
    if not torch.equal(o.isnan(), r.isnan()):
        return Match(math.nan, tol, "NaN positions differ from eager")
    inf = o.isinf() | r.isinf()
    if not torch.equal(o[inf], r[inf]):
        return Match(math.nan, tol, "inf positions differ from eager")
    err = rel_err(o, r)
    return Match(err, tol, "" if err <= tol else f"relative error {err:.3e} exceeds {tol:g}")


def as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)
