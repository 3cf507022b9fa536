"""The part of a program that can become kernels: everything not downstream of an op that runs in eager after
them, with the values of the ops that can run in eager before them as inputs, and whether running it as kernels
beats running the whole program as written."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..ir.graph import Graph, Node, topo_order
from ..ir.ops import GROUP, Group, Op
from ..ir.reasons import place
from ..ir.sizes import hint

# ops a value may pass through on its way from the inputs to an op that runs before the kernels: none of the
# reductions and contractions the kernels are for
_BEFORE = (Group.SOURCE, Group.LAYOUT, Group.UNARY, Group.BINARY, Group.SELECT)


def prologue(g: Graph) -> list[Node]:
    """The ops without a lowering that run in eager PyTorch before the kernels: those whose arguments come from the
    inputs through elementwise and layout ops and other such ops only (`cos[position_ids]`, an embedding of T5's
    bucketed positions, a gather of selected keys), and whose values a reduction or contraction reads (directly
    or not; where only elementwise ops follow, kernels would save eager little). The kernels read their values as
    inputs, so what depends on them still fuses."""
    early: set[Node] = set()
    for n in g.nodes:
        if (n.op == Op.OPAQUE or GROUP[n.op] in _BEFORE) and all(a in early for a in n.inputs):
            early.add(n)
    heavy: set[Node] = set()       # nodes a reduction or contraction depends on
    for n in reversed(g.nodes):
        if n in heavy or GROUP[n.op] in (Group.REDUCE, Group.CONTRACT):
            heavy.update(n.inputs)
    return [n for n in g.nodes if n.op == Op.OPAQUE and n in early and n in heavy]


def fusable_part(g: Graph) -> Graph:
    """The subgraph that does not depend on an op without a loop-form lowering, other than those of `prologue`,
    whose values it takes as inputs after the program's (input nodes naming the op in their `prologue` attribute;
    the nodes that read them are copies under the same names). Its outputs are the program outputs inside it and
    the values the eager remainder reads."""
    before = set(prologue(g))
    tainted: set[Node] = set()
    for n in g.nodes:
        if n not in before and (n.op == "opaque" or any(a in tainted for a in n.inputs)):
            tainted.add(n)
    outs: list[Node] = []
    for n in g.nodes:
        if n in tainted:
            outs += [a for a in n.inputs if a not in tainted]
    outs += [o for o in g.outputs if o not in tainted]
    outs = [o for o in dict.fromkeys(outs) if o.op not in ("input", "full", "iota", "const") and o not in before]
    keep = set(topo_order(outs, stop=before))
    read = [n for n in g.nodes if n in before and n in keep]
    new: dict[Node, Node] = {
        n: Node(Op.INPUT, (), n.shape, n.dtype, {"index": len(g.inputs) + k, "device": n.device, "prologue": n.name},
                f"in_{n.name}", n.source) for k, n in enumerate(read)}
    for n in g.nodes:      # producers first
        if n in keep and n not in before and any(a in new for a in n.inputs):
            new[n] = dataclasses.replace(n, args=tuple(new.get(a, a) if isinstance(a, Node) else a for a in n.args))
    nodes = [new[n] for n in read] + [new.get(n, n) for n in g.nodes if n in keep and n not in before]
    return Graph(g.inputs + [new[n] for n in read], [new.get(o, o) for o in outs], nodes)


def prologue_names(fused: Graph) -> list[str]:
    """The names of the ops whose values the fused part reads after the program's inputs, in that order."""
    return [n.attrs["prologue"] for n in fused.inputs if "prologue" in n.attrs]


def eager_handoff(g: Graph, fused: Graph) -> Optional[str]:
    """Why the whole program should run as written instead of partly in kernels, or None. A value the kernels
    would hand to the eager remainder that is larger than every input and output of the program (an Sq x Sk
    score matrix feeding an op without a lowering) is written to memory as eager writes it, the rule
    check_boundaries applies between kernels (docs/design.md §3.4): the kernels then save nothing, and the
    remainder, evaluated from the decomposed graph, costs more than the user's own ops (0.36x eager on an
    H200). In a shape-generic program each comparison is a guard: an Sq x Sk matrix is smaller than the (Sq, D)
    queries at Sk < D and larger beyond, so a plan that hands it over at the traced lengths must not serve
    longer ones (the traced sizes alone once decided it for every length)."""
    ends = [math.prod(n.shape) for n in g.inputs + g.outputs]
    returned = {o.name for o in g.outputs}
    handed = [n for n in fused.outputs if n.name not in returned and all(math.prod(n.shape) > e for e in ends)]
    if not handed:
        return None
    n = max(handed, key=lambda n: hint(math.prod(n.shape)))
    return (f"no fused plan: the kernels would hand eager PyTorch a {list(n.shape)} intermediate ({place(n)}), "
            "larger than every input and output; the whole program runs in eager PyTorch")
