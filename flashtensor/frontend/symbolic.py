"""Symbolic sizes for shape-generic plans: fake inputs whose chosen dimensions are torch SymInts.

The trace then computes every size the program derives (a causal mask's diagonal `kv_len - q_len + 1`, a
window's start) as an expression of those symbols, and the ShapeEnv records a guard for each decision taken on
their traced values; ir/sizes.py says how the later stages treat them. Sizes 0 and 1 are not specialised and
equal sizes get separate symbols, so one plan can serve q_len 1 and q_len != kv_len.
"""
from __future__ import annotations

from typing import Any, Sequence, cast

import torch
import torch.fx.experimental._config
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

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
