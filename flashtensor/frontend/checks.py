"""Eager's checks on values that fake tensors skip: a trace of a program eager rejects must fail too.

`capture` lowers an op only after these pass; an exception raised here makes capture run the function in eager
PyTorch once (frontend/eager.py), which raises eager's own error for the user.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..ir.graph import Node

aten = torch.ops.aten

# where each op that converts a Python number to its output's dtype takes it (positions, then keywords)
_FILLS = {aten.masked_fill.Scalar: (2,), aten.masked_fill.Tensor: (2,), aten.full.default: (1,),
          aten.full_like.default: (1,), aten.fill.Scalar: (1,), aten.fill.Tensor: (1,),
          aten.index_fill.int_Scalar: (3,), aten.clamp.default: (1, 2, "min", "max"),
          aten.clamp_min.default: (1,), aten.clamp_max.default: (1,)}
_C10 = {torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16", torch.float32: "float", torch.int8: "int8_t",
        torch.uint8: "uint8_t", torch.int16: "int16_t", torch.int32: "int", torch.int64: "int64_t"}


def check_fill(t: Any, args: list, kw: dict, dtype: torch.dtype) -> None:
    """Raise eager's error where the number op `t` converts to `dtype` overflows it (`masked_fill(m, -1e9)` on
    fp16)."""
    if dtype not in _C10:
        return
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    for at in _FILLS.get(t, ()):
        v = kw.get(at) if isinstance(at, str) else args[at] if at < len(args) else None
        if isinstance(v, Node) and v.op == "const" and v.attrs["value"].numel() == 1:
            v = v.attrs["value"].item()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
                not info.min <= v <= info.max:
            raise RuntimeError(f"value cannot be converted to type {_C10[dtype]} without overflow")
