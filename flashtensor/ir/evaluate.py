"""Reference evaluator: runs any graph IR with plain torch ops (the oracle every stage is checked against)."""
from __future__ import annotations

from typing import Sequence

import torch

from .graph import Graph, Node, topo_order
from .ops import EVAL


def evaluate(g: Graph, args: Sequence[torch.Tensor], env: dict[Node, torch.Tensor] | None = None,
             order: Sequence[Node] | None = None) -> list[torch.Tensor]:
    """Values of `g.outputs` for the given program inputs; `env` may pre-set any node's value. `order`,
    when given, is `topo_order(g.outputs, stop=...)` for the same inputs and env keys, computed once by
    a caller that evaluates the same graph many times."""
    vals: dict[Node, torch.Tensor] = dict(env or {})
    for n, a in zip(g.inputs, args):
        vals.setdefault(n, a)
    for n in order if order is not None else topo_order(g.outputs, stop=set(vals)):
        if n in vals:
            continue
        ins = [vals[a] if isinstance(a, Node) else a for a in n.args]
        vals[n] = EVAL[n.op](n, *ins)
    return [vals[o] for o in g.outputs]
