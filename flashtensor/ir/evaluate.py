"""Reference evaluator: runs any graph IR with plain torch ops (the oracle every stage is checked against)."""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

import torch

from .graph import Graph, Node, topo_order
from .ops import EVAL
from .sizes import at, has_symbolic


def evaluate(g: Graph, args: Sequence[torch.Tensor], env: dict[Node, torch.Tensor] | None = None,
             order: Sequence[Node] | None = None, sizes: Optional[Mapping[str, int]] = None) -> list[torch.Tensor]:
    """Values of `g.outputs` for the given program inputs; `env` may pre-set any node's value. `order`,
    when given, is `topo_order(g.outputs, stop=...)` for the same inputs and env keys, computed once by
    a caller that evaluates the same graph many times. A shape-generic graph's nodes run at `sizes`, the
    values of its size symbols in this call (a reshape to (B, H * kv_len) gets the call's kv_len)."""
    vals: dict[Node, torch.Tensor] = dict(env or {})
    for n, a in zip(g.inputs, args):
        vals.setdefault(n, a)
    for n in order if order is not None else topo_order(g.outputs, stop=set(vals)):
        if n in vals:
            continue
        ins = [vals[a] if isinstance(a, Node) else a for a in n.args]
        step = n
        if sizes is not None and symbolic_node(n):
            step = dataclasses.replace(n, shape=at(n.shape, sizes), attrs=at(n.attrs, sizes))
            ins = at(ins, sizes)
        vals[n] = EVAL[n.op](step, *ins)
    return [vals[o] for o in g.outputs]


def symbolic_node(n: Node) -> bool:
    """Whether n's meaning reads a symbolic size: in its shape, attributes or non-tensor arguments."""
    return has_symbolic((n.shape, n.attrs, [a for a in n.args if not isinstance(a, Node)]))
