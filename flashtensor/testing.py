"""The correctness contract of docs/design.md §6 as code: the demo, the benchmarks and the tests all use it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

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
    """How one output compares with eager: `error` against `tol`, and what is wrong ('' when nothing).
    `against` is "float64" where compare_with_exact held the output to the float64 answer instead."""
    error: float
    tol: float
    problem: str
    against: str = "eager"

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


# how much farther from the float64 answer than eager's own result an output may be (compare_with_exact)
EXACT_SLACK = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-4}


def _slack(precision: torch.dtype, n: int) -> float:
    """EXACT_SLACK, plus one rounding step of `precision` over the square root of the n elements compared: two
    results rounded from values a fraction of a step apart land a step apart on some elements, and on a tiny output
    (a few queries of a few keys) one such element moves the norm-wise error by up to about a step / sqrt(n)."""
    return EXACT_SLACK[precision] + torch.finfo(precision).eps / math.sqrt(max(n, 1))


def narrowest(args: Any) -> Optional[torch.dtype]:
    """The narrowest floating dtype among the tensors in `args` (compare_with_exact's `computed_in`)."""
    found = [a.dtype for a in as_tuple(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    return min(found, key=lambda d: torch.finfo(d).bits, default=None)


def compare_with_exact(out: Any, ref: torch.Tensor, exact: torch.Tensor,
                       computed_in: Optional[torch.dtype] = None, sources: Optional[int] = None) -> Match:
    """§6 with its float64 rule: `out` against eager's `ref`, and where a half-precision output misses eager by more
    than 2e-3 (bf16 eager is itself 3-5e-3 from the exact answer), against `exact`, the same program's output on
    float64 copies of the inputs: it passes if it is no farther from that than eager is, plus `_slack`. A float32
    output gets the same treatment only where eager itself is more than 1e-4 from float64 (an ill-conditioned
    output, where any other order of the same float32 operations misses eager too); elsewhere it passes if it is no
    farther from float64 than eager (a sum that cancels to 0 exactly, which eager's order leaves at 1e-7). A float32
    output of a program that computes in half precision (`computed_in`: the narrowest floating dtype its values pass
    through, `narrowest` of its inputs where nothing narrower is cast inside) carries that precision's rounding and
    gets its slack: the same statistic summed in float32 from scores rounded to bf16 is as far from float64 as that
    rounding takes it, one step either way of eager's, whichever dtype it is returned in. NaN and inf must sit where
    eager has them, unless eager's result places them otherwise than float64 does (rounded to a float32 output's
    type): then where float64 has them, and near its values where eager's are not finite. Where the float64
    answer is not finite but eager's is (a finfo(float64).min mask that a float32 softmax turns into -inf), float64
    says nothing: there the output is held to eager, within the tolerance or the
    distance between two results as close to a float64 answer there as eager and the output are to float64
    elsewhere. `sources`, where fewer than the output's elements, counts the rounded values it is made from, each
    of which moves a part of it as one (the nonzero probabilities of p @ v: a row of one key scales by a step of p
    where p rounds the other way): the slack is a step over the square root of that count. Callers pass `exact`
    only where compare(out, ref) fails: float64 runs are dear."""
    m = compare(out, ref)
    if m.ok or ref.dtype not in EXACT_SLACK or not isinstance(out, torch.Tensor) or out.shape != ref.shape \
            or out.dtype != ref.dtype:
        return m
    o, r, x = out.detach().cpu(), ref.detach().cpu(), exact.detach().cpu().double()
    if not m.problem.startswith("relative error"):   # NaN or inf positions differ from eager's
        # a float32 output is held to the float64 answer as float32 holds it: eager's own overflow of an
        # intermediate (the CPU's vectorised sinh(89) is exp(89) / 2, inf) is no place an output must be inf
        held_to = x.to(r.dtype) if r.dtype == torch.float32 else x
        if torch.equal(_nonfinite(r), _nonfinite(held_to)):
            return m
        if not torch.equal(_nonfinite(o), _nonfinite(held_to)):
            return Match(m.error, m.tol, f"{m.problem}, and from float64's")
        beside = torch.isfinite(held_to) & ~torch.isfinite(r)    # finite where eager is not: near float64 there
        if beside.any() and rel_err(o[beside], x[beside]) > m.tol:
            return Match(m.error, m.tol, f"{m.problem}, and far from float64 where eager is not finite")
        keep = torch.isfinite(x) & torch.isfinite(r)
        o, r, x = o[keep], r[keep], x[keep]
        m = compare(o, r)
        if m.ok:
            return m
    undefined = ~torch.isfinite(x)
    floor = rel_err(r[~undefined], x[~undefined])
    precision = computed_in if computed_in in EXACT_SLACK and r.dtype == torch.float32 else r.dtype
    if precision == torch.float32 and floor <= m.tol:
        err = rel_err(o[~undefined], x[~undefined])
        if err <= floor:      # no farther from float64 than eager (an output that cancels to 0 exactly, say)
            return Match(err, floor, "", "float64")
        return Match(m.error, m.tol, f"{m.problem} (eager is {floor:.1e} from float64)")
    count = int((~undefined).sum())
    bound = floor + _slack(precision, count if sources is None else min(count, sources))
    if undefined.any():
        # held to eager there: were float64 defined, an output within `bound` of it would be within floor + bound
        # of an eager result as far from it as eager is elsewhere. Where it is defined nowhere, eager's distance
        # is unknown: two results each within half a step of the answer are a step apart at most, on every element
        near = max(m.tol, (2 * floor + _slack(precision, int(undefined.sum()))) if (~undefined).any()
                   else torch.finfo(precision).eps)
        held = rel_err(o[undefined], r[undefined])
        if held > near:
            return Match(held, near, f"relative error {held:.3e} from eager where the float64 answer is not "
                                     f"finite, beyond {near:.3e}")
    err = rel_err(o[~undefined], x[~undefined])
    problem = "" if err <= bound else f"{m.problem}, and {err:.3e} from float64 where eager is {floor:.3e}"
    return Match(err, bound, problem, "float64")


def _nonfinite(t: torch.Tensor) -> torch.Tensor:
    """Where t is NaN, +inf and -inf."""
    return torch.stack([t.isnan(), t == math.inf, t == -math.inf])


def as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)
