"""The part of a program that can become kernels: everything not downstream of an op that runs in eager."""
from __future__ import annotations

from ..ir.graph import Graph, Node, topo_order


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
