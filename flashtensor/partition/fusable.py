"""The part of a program that can become kernels: everything not downstream of an op that runs in eager, and
whether running it as kernels beats running the whole program as written."""
from __future__ import annotations

import math
from typing import Optional

from ..ir.graph import Graph, Node, topo_order
from ..ir.reasons import place
from ..ir.sizes import hint


def fusable_part(g: Graph) -> Graph:
    """The subgraph that does not depend on an op without a loop-form lowering. Its outputs are the
    program outputs inside it and the values the eager remainder reads."""
    tainted: set[Node] = set()
    for n in g.nodes:
        if n.op == "opaque" or any(a in tainted for a in n.inputs):
            tainted.add(n)
    outs: list[Node] = []
    for n in g.nodes:
        if n in tainted:
            outs += [a for a in n.inputs if a not in tainted and a.op != "input"]
    outs += [o for o in g.outputs if o not in tainted]
    outs = [o for o in dict.fromkeys(outs) if o.op not in ("input", "full", "iota", "const")]
    keep = set(topo_order(outs))
    return Graph(g.inputs, outs, [n for n in g.nodes if n in keep])


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
    handed = [n for n in fused.outputs if n not in g.outputs and all(math.prod(n.shape) > e for e in ends)]
    if not handed:
        return None
    n = max(handed, key=lambda n: hint(math.prod(n.shape)))
    return (f"no fused plan: the kernels would hand eager PyTorch a {list(n.shape)} intermediate ({place(n)}), "
            "larger than every input and output; the whole program runs in eager PyTorch")
