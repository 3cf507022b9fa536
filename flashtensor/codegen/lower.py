"""How values print in Triton: type names, literals, elementwise templates, rounding to half types."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

from ..ir.ops import ELEMENTWISE, GROUP, Group, Op
from ..ir.sizes import source, symbolic

TL = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
      torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.bool: "tl.int1"}
HALF = (torch.float16, torch.bfloat16)
UNARY: dict[Op, str] = {op: e.triton for op, e in ELEMENTWISE.items() if GROUP[op] is Group.UNARY and e.triton}
BINARY: dict[Op, str] = {op: e.triton for op, e in ELEMENTWISE.items() if GROUP[op] is Group.BINARY and e.triton}
# where a result is rounded to a half type as eager rounds it, the function eager's CUDA kernel calls, so that the
# rounding lands where eager's does (bf16 soft caps rounded an ulp off with the kernels' own tanh)
AS_EAGER: dict[Op, str] = {Op.TANH: "_tanh_as_eager({})"}
# where only a value's absolute error reaches a result (analysis.precision.added_only): forms exact to an absolute
# error, cheaper than those exact relative to the value near 0
ABSOLUTE_FORMS: dict[Op, str] = {Op.TANH: "_tanh_fast({})"}
# tl.max/tl.min drop NaNs (maxnum); torch's amax/amin/maximum propagate them, so kernels reduce with these
NAN_REDUCE = {"max": "_max_over", "min": "_min_over"}


def quotient_as_eager(a: str, divisor: Any) -> Optional[str]:
    """a / divisor as eager computes it, for a quotient rounded to half precision as eager rounds it: a number
    divisor reaches eager's kernel as a CPU scalar, which CUDA's multiplies by (its float32 reciprocal, through
    the helper); None for a divisor that is a value or a size."""
    if isinstance(divisor, bool) or not isinstance(divisor, (int, float)) or symbolic(divisor):
        return None
    inverse = (torch.tensor(1.0) / float(divisor)).item()     # in float32, as eager's kernel takes it
    return f"_div_as_eager({a}, {lit(float(divisor))}, {lit(inverse)})"


def lit(v: Any) -> str:
    if symbolic(v):             # a size, or a number derived from sizes (2.0 / kv_len): computed from the arguments
        return source(v)
    if isinstance(v, bool):     # Triton's bool, so `x | False` stays int1 (with 0 it became int32)
        return "True" if v else "False"
    if isinstance(v, float):
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        if math.isnan(v):
            return 'float("nan")'
        return repr(v)
    return repr(v)


def pow2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << (max(n, 1) - 1).bit_length())


def round_to(dtype: torch.dtype, expr: str) -> str:
    """expr, a float32 value, rounded to the half type and kept in float32."""
    return f"_round_bf16({expr})" if dtype == torch.bfloat16 else f"({expr}).to({TL[dtype]}).to(tl.float32)"


def contig(shape: tuple[int, ...] | list[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(list(shape)):
        out.append(acc if symbolic(s) or s != 1 else 0)
        acc *= s
    return out[::-1]
