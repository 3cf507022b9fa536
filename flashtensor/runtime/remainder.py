"""What a partly fused program runs in eager PyTorch: the decomposed graph's nodes that no kernel computes.

The remainder is an opaque op and what depends on it. On CUDA devices it runs as one `torch.compile`d
function: an FX graph with one call per decomposed node, built per plan (so no two plans share Dynamo's
per-code cache and its recompile limit), compiled on the plan's first call and reused by every later one.
Inductor fuses the decomposed primitives back (a softmax is five of them), which the op-by-op evaluator
cannot; it emulates eager's rounding of half-precision intermediates. It is compiled whole (fullgraph): the
pieces around a graph break cost more host time on every call than the evaluator (kvpress's SnapKV window
scores on the H200, their pooling run between two compiled pieces: 0.52 ms a call, of which the kernels took
0.03), so where Dynamo would break the graph the evaluator runs it instead. A remainder with one computing node
(SnapKV's pooling of the column sums: one opaque call between views) has nothing to fuse, and Dynamo and
Inductor would add seconds to the first call for it: the reference evaluator (ir/evaluate.py) runs it, as
eager would. The evaluator also runs every remainder off CUDA: on the CPU the kernels only run in Triton's
interpreter, where times mean nothing, and Inductor's C++ build would add 10 to 20 s to every plan's first
call (`Options(compile_remainder=True)` asks for it anyway). Inductor may order a reduction differently from
eager, within the correctness contract (docs/design.md §6); should torch.compile fail, the evaluator takes
over for good (the reason goes to the debug log).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ..ir.evaluate import evaluate, symbolic_node
from ..ir.graph import Graph, Node, topo_order
from ..ir.ops import EVAL, GROUP, Group

log = logging.getLogger(__name__)


def compiles_remainder(device: torch.device, asked: Optional[bool]) -> bool:
    """Whether the remainder runs through torch.compile: where asked, else on CUDA devices."""
    return device.type == "cuda" if asked is None else asked


class Remainder:
    """Evaluates `g.outputs` given the program's inputs and the values the kernels computed (`ready`)."""

    def __init__(self, g: Graph, ready: Sequence[Node], compiled: bool) -> None:
        self.graph = g
        self.ready = list(ready)
        self.order = topo_order(g.outputs, stop=set(g.inputs) | set(self.ready))
        self.compiled: Optional[Callable] = None
        # a shape-generic plan's remainder reads the call's sizes, which the evaluator takes and an FX graph of
        # steps with their nodes bound would not
        self.generic = any(symbolic_node(n) for n in self.order if n not in g.inputs and n not in self.ready)
        computing = [n for n in self.order if n not in g.inputs and n not in self.ready
                     and GROUP[n.op] not in (Group.SOURCE, Group.LAYOUT)]
        if compiled and not self.generic and len(computing) > 1:
            self.compiled = torch.compile(_graph_module(g, self.ready, self.order), fullgraph=True,
                                          options={"emulate_precision_casts": True})

    def __call__(self, inputs: Sequence[torch.Tensor], env: dict[Node, torch.Tensor],
                 sizes: Optional[Mapping[str, int]] = None) -> list[torch.Tensor]:
        """`sizes`: the values of a shape-generic plan's size symbols in this call."""
        if self.compiled is not None:
            try:
                return list(self.compiled(*inputs, *[env[n] for n in self.ready]))
            except Exception:  # noqa: BLE001 - whatever torch.compile cannot take, the evaluator can
                log.debug("torch.compile of the eager remainder failed; the evaluator runs it", exc_info=True)
                self.compiled = None
        return evaluate(self.graph, inputs, env, self.order, sizes if self.generic else None)


def _graph_module(g: Graph, ready: list[Node], order: list[Node]) -> torch.fx.GraphModule:
    """The remainder as an FX graph: the program's inputs and the kernels' values in, `g.outputs` out."""
    fx = torch.fx.Graph()
    vals: dict[Node, Any] = {n: fx.placeholder(f"in_{n.name}") for n in list(g.inputs) + ready}
    for n in order:
        if n not in vals:
            vals[n] = fx.call_function(_step(n), tuple(vals[a] if isinstance(a, Node) else a for a in n.args))
    fx.output(tuple(vals[o] for o in g.outputs))
    return torch.fx.GraphModule(torch.nn.Module(), fx)


def _step(n: Node) -> Callable:
    """One node's meaning (ir/ops.py EVAL) with its attributes bound."""
    f = EVAL[n.op]

    def step(*args: Any) -> Any:
        return f(n, *args)
    step.__name__ = f"eval_{n.name}"
    return step
