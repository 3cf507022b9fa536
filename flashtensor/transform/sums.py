"""Nested sums in the order that partitions well: over the long variable inside, the short one outside.

sum_i (sum_g p) / G, the mean of attention probabilities over a GQA head group before the column sums,
becomes (sum_g (sum_i p)) / G. The inner sum is then the column sums of each head, the kernel every
attention statistic already has; the outer sum over the few heads of a group reads only that thin result
(partition/plan.py cuts a sum that another sum reads). Sums commute, so the value is the same up to the
order of float additions. A sum of a product (a contraction) is left as it is, unless every factor carries
the outer variable too: a contraction over two variables at once (an output projection over heads and head
dimension, sum_h sum_e y[n, h, e] w[o, h, e]) then sums the longer one inside, which is the dot's K.
"""
from __future__ import annotations

from ..ir.loops import LNode, LoopGraph, NodeTable, Var, node_vars, rebuilt


def _scaled_sum(x: object) -> tuple[LNode, list[tuple[str, float]]] | None:
    """(s, ops) where x is the sum s followed by multiplies or divides by constants `ops` (a mean), else None."""
    ops: list[tuple[str, float]] = []
    while isinstance(x, LNode) and x.op in ("mul", "div") and isinstance(x.args[1], float):
        ops.append((x.op, x.args[1]))
        x = x.args[0]
    if isinstance(x, LNode) and x.op == "reduce" and x.attrs["kind"] == "sum":
        return x, ops[::-1]
    return None


def _joint(product: LNode, outer: Var) -> bool:
    """Whether every factor of `product` (a mul) varies along `outer`, so both sums contract it."""
    def factors(x: object) -> list[object]:
        return factors(x.args[0]) + factors(x.args[1]) if isinstance(x, LNode) and x.op == "mul" else [x]
    return all(isinstance(f, LNode) and outer in f.vars for f in factors(product))


def commute_sums(g: LoopGraph, through_half: bool) -> LoopGraph:
    """The same program with every sum over a long variable of a (scaled) sum over a shorter one swapped."""
    table = NodeTable()
    new: dict[int, LNode] = {}

    def node(op: str, args: tuple, dtype, **attrs) -> LNode:
        return table.get(op, args, dtype, node_vars(op, args, attrs), attrs)

    def swapped(var, x: LNode, dtype) -> LNode | None:
        """sum over var of x moved inside every (scaled) sum over a shorter variable that x is; None if x is none."""
        inner = _scaled_sum(x)
        if inner is None or inner[0].attrs["var"].extent >= var.extent or not inner[0].dtype == dtype == \
                inner[0].args[0].dtype or (inner[0].args[0].op == "mul" and not _joint(inner[0].args[0], var)):
            return None     # a contraction (q k^T over d) stays whole: its dot is the kernel's inner loop
        s, ops = inner
        below = swapped(var, s.args[0], dtype) or node("reduce", (s.args[0],), dtype, kind="sum", var=var)
        out = node("reduce", (below,), dtype, kind="sum", var=s.attrs["var"])
        for op, c in ops:
            out = node(op, (out, c), dtype)
        return out

    for n in g.nodes:
        args = tuple(new[id(a)] if isinstance(a, LNode) else a for a in n.args)
        if n.op == "reduce" and n.attrs["kind"] == "sum" and isinstance(args[0], LNode) and \
                (out := swapped(n.attrs["var"], args[0], n.dtype)) is not None:
            new[id(n)] = out
        elif all(x is y for x, y in zip(args, n.args)):
            new[id(n)] = n
        else:
            new[id(n)] = node(n.op, args, n.dtype, **n.attrs)
    changed = any(new[id(n)] is not n for n in g.nodes)
    if not changed:
        return g
    return rebuilt(g, new, "s")
