"""Symbolic sizes for shape-generic plans: fake inputs whose chosen dimensions are torch SymInts.

The trace then computes every size the program derives (a causal mask's diagonal `kv_len - q_len + 1`, a
window's start) as an expression of those symbols, and the ShapeEnv records a guard for each decision taken on
their traced values; ir/sizes.py says how the later stages treat them. Sizes 0 and 1 are not specialised and
equal sizes get separate symbols, so one plan can serve q_len 1 and q_len != kv_len.
"""
from __future__ import annotations

from typing import Any, Sequence, cast

import sympy
import torch
import torch.fx.experimental._config
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
from torch.overrides import TorchFunctionMode

from ..ir.sizes import symbolic


def symbolic_inputs(args: Sequence[torch.Tensor], dynamic: frozenset[tuple[int, int]]
                    ) -> tuple[FakeTensorMode, list[torch.Tensor]]:
    """A fake mode with a fresh ShapeEnv, and fakes of `args` whose (input, dimension) pairs in `dynamic` are
    symbolic (non-tensor arguments pass through)."""
    env = ShapeEnv(duck_shape=False, specialize_zero_one=False)
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    fakes: list = []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            fakes.append(a)
            continue
        dims = [DimDynamic.DYNAMIC if (i, d) in dynamic else DimDynamic.STATIC for d in range(a.dim())]
        fakes.append(mode.from_tensor(a, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims),
                                      source=ConstantSource(f"input{i}")))
    return mode, fakes


def size_oblivious() -> Any:
    """Trace with sizes of 0 or 1 not special: torch's ops then take their general path for a symbolic size
    (a matmul with q_len 1 stays a batched matmul) instead of guarding on the traced value, so one plan serves
    decode's q_len 1 and batch 1 beside longer ones."""
    return torch.fx.experimental._config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]


def size_sources(fakes: Sequence) -> dict[str, tuple[int, int]]:
    """Each size symbol of the fake inputs, by name, as created (before the trace found two of them equal):
    the (input, dimension) that gives its value on a call."""
    return {str(cast(torch.SymInt, s).node._expr): (i, d) for i, t in enumerate(fakes)
            if isinstance(t, torch.Tensor) for d, s in enumerate(t.shape) if symbolic(s)}


_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__}


class Matmuls(TorchFunctionMode):
    """Matrix products of operands of two or more dimensions written out as expand, reshape and bmm. Under
    size-oblivious tracing, torch 2.11's own matmul reads its operands' sizes as plain ints, which specialises
    every symbol to the traced call's value (torch 2.13's does not); this keeps them symbolic on both."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func not in _MATMULS or kwargs or len(args) != 2 or min(a.dim() for a in args) < 2:
            return func(*args, **kwargs)
        a, b = args
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        out = torch.bmm(a.expand(*batch, m, k).reshape(-1, m, k), b.expand(*batch, k, n).reshape(-1, k, n))
        return out.view(*batch, m, n)


def fixed_sizes(fakes: Sequence, dynamic: frozenset[tuple[int, int]], env: ShapeEnv) -> frozenset[tuple[int, int]]:
    """The (input, dimension) pairs in `dynamic` whose size the trace fixed to a constant: replaced by one, or
    guarded equal to one (a kv_len of 1, which torch's matmul decided on). A plan is not generic there, and the
    graph's nodes would mix the symbol (those traced before the decision) with its value (those after)."""
    fixed = set()
    for g in env.guards:
        e = env.replace(g.expr)
        if isinstance(e, sympy.Equality):
            fixed |= {a for a, b in (e.args, e.args[::-1]) if a.is_Symbol and b.is_Integer}
    out = set()
    for i, d in dynamic:
        e = env.replace(cast(torch.SymInt, fakes[i].shape[d]).node._expr)
        if e.is_Integer or e in fixed:
            out.add((i, d))
    return frozenset(out)
