"""Precision policy: where the kernels round half-precision values as eager does.

A plan is "faithful" when eager's half-precision rounding of intermediates decides results the contract
holds tightly: float32 outputs computed from fp16 inputs (1e-4 against rounding eager applies on the
way), or an input the program casts to fp16 (its zeros and infs are eager's, a log of them). bf16's
coarser rounding at other points than eager's costs more than it buys, so only fp16 makes a plan
faithful. A cast of an input that rounds is rounded in every plan (ir.loops.rounds_input).
"""
from __future__ import annotations

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


def rounds(n: LNode, faithful: bool) -> bool:
    """Whether the kernels round n to its half type (else its float32 value stands for it, no instruction)."""
    return (faithful and n.dtype in _HALF) or rounds_input(n)
