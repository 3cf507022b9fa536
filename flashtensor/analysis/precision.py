"""Precision policy: where the kernels round half-precision values as eager does.

A plan is "faithful" when eager's half-precision rounding of intermediates decides results the contract
holds tightly: float32 outputs computed from fp16 inputs (1e-4 against rounding eager applies on the
way), or an input the program casts to fp16 (its zeros and infs are eager's, a log of them). bf16's
coarser rounding at other points than eager's costs more than it buys, so only fp16 makes a plan
faithful. A cast of an input that rounds is rounded in every plan (ir.loops.rounds_input).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..ir.loops import LNode, LoopGraph, rounds_input
from .facts import narrowed_inputs

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Precision:
    faithful: bool                       # half-precision values are rounded as eager rounds them
    narrowed: dict[int, torch.dtype]     # inputs a cast narrows, with the narrowest type (the check tests them so)


def decide(loops: LoopGraph) -> Precision:
    """The precision policy of this program's kernels."""
    narrowed = narrowed_inputs(loops)
    faithful = (any(o.dtype == torch.float32 for o in loops.outputs) and
                any(dt == torch.float16 for _, dt in loops.inputs)) or torch.float16 in narrowed.values()
    return Precision(faithful, narrowed)


# a constant at least this large (an fp16 step of 2, a bf16 step of 2) decides a half sum's rounding
_COARSE = {torch.float16: 2.0 ** 11, torch.bfloat16: 2.0 ** 8}


def _mask_like(x: object, dtype: torch.dtype) -> bool:
    """x is a large finite constant, or a select or product that gives one (an additive mask: finfo.min on padded
    keys). An infinite one is exact in any sum (analysis.facts.exact_sum)."""
    if not isinstance(x, LNode):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and _COARSE[dtype] <= abs(x) < math.inf
    if x.op == "scalar":
        return _mask_like(x.attrs["value"], dtype)
    if x.op == "cast":
        return _mask_like(x.args[0], dtype)
    if x.op == "where":
        return _mask_like(x.args[1], dtype) or _mask_like(x.args[2], dtype)
    return x.op == "mul" and any(_mask_like(a, dtype) for a in x.args)


def rounds_sum(n: LNode) -> bool:
    """A half-precision sum with an additive mask of large constants: eager rounds s + finfo(fp16).min to -65504,
    which makes a fully masked row uniform, while float32 keeps s's differences. Rounded in every plan."""
    return n.dtype in _HALF and n.op in ("add", "sub") and any(_mask_like(a, n.dtype) for a in n.args)


def rounds(n: LNode, faithful: bool) -> bool:
    """Whether the kernels round n to its half type (else its float32 value stands for it, no instruction)."""
    return (faithful and n.dtype in _HALF) or rounds_input(n) or rounds_sum(n)
