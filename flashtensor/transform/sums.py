"""Nested sums in the order that partitions well: over the long variable inside, the short one outside.

sum_i (sum_g p) / G, the mean of attention probabilities over a GQA head group before the column sums,
becomes (sum_g (sum_i p)) / G. The inner sum is then the column sums of each head, the kernel every
attention statistic already has; the outer sum over the few heads of a group reads only that thin result
(partition/plan.py cuts a sum that another sum reads). Sums commute, so the value is the same up to the
order of float additions. A sum of a product (a contraction) is left as it is, unless every factor carries
the outer variable too: a contraction over two variables at once (an output projection over heads and head
dimension, sum_h sum_e y[n, h, e] w[o, h, e]) then sums the longer one inside, which is the dot's K.

A contraction over three or more variables (GQA's output projection, its heads split into kv head and group)
is more than a kernel can sum; where its factors read those variables as one row-major axis, they become one
variable (`merge_contractions`).
"""
from __future__ import annotations

import math
from typing import Any

from ..ir.loops import Affine, LNode, LoopGraph, NodeTable, Var, loop_topo, node_vars, rebuilt, substituted, var_union
from ..ir.sizes import hint


def _scaled_sum(x: object) -> tuple[LNode, list[tuple[str, float]]] | None:
    """(s, ops) where x is the sum s followed by multiplies or divides by constants `ops` (a mean), else None."""
    ops: list[tuple[str, float]] = []
    while isinstance(x, LNode) and x.op in ("mul", "div") and isinstance(x.args[1], float):
        ops.append((x.op, x.args[1]))
        x = x.args[0]
    if isinstance(x, LNode) and x.op == "reduce" and x.attrs["kind"] == "sum":
        return x, ops[::-1]
    return None


def _factors(x: object) -> list[object]:
    """The factors of a product of muls."""
    return _factors(x.args[0]) + _factors(x.args[1]) if isinstance(x, LNode) and x.op == "mul" else [x]


def _joint(product: LNode, outer: Var) -> bool:
    """Whether every factor of `product` (a mul) varies along `outer`, so both sums contract it."""
    return all(isinstance(f, LNode) and outer in f.vars for f in _factors(product))


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


def _summed(n: LNode) -> tuple[list[Var], object]:
    """The variables of the directly nested sums that n is, outermost first, and the value the innermost sums."""
    vs: list[Var] = []
    x: object = n
    while isinstance(x, LNode) and x.op == "reduce" and x.attrs["kind"] == "sum" and x.dtype == n.dtype:
        vs.append(x.attrs["var"])
        x = x.args[0]
    return vs, x


def _row_major(group: list[Var], scale: Any) -> Affine:
    """The flat index of `group` read as one row-major axis (the last variable innermost), times `scale`."""
    terms, stride = [], scale
    for v in reversed(group):
        terms.append((v, stride))
        stride = stride * v.extent
    return Affine(tuple(reversed(terms)))


def _order(group: list[Var], factors: list[object]) -> list[Var]:
    """The group in the row-major order a load of the product reads it in (the largest stride first; by traced
    sizes, since a wrong guess only fails the check in `_merged_factor`), else by variable."""
    for f in factors:
        if isinstance(f, LNode) and f.op == "load":
            for e in f.attrs["index"]:
                if set(group) <= set(e.vars):
                    return sorted(group, key=lambda v: -hint(e.coeff(v)))
    return sorted(group, key=lambda v: v.id)


def _merged_factor(f: object, group: list[Var], k: Var, table: NodeTable) -> object:
    """Factor f of a product summed over `group`, read with the group as the one variable k: a load whose index
    holds the group's row-major combination reads k there; a computed value is stored and read back with the group
    merged (an `at` read), its variables renamed to new ones, the last in its layout, where the group is not
    already adjacent there in order. Only a value that reads a reduction is stored: one computed per element would
    cost a round trip through memory. None where f reads the group otherwise."""
    if not isinstance(f, LNode) or not set(group) & set(f.vars):
        return f
    if f.op == "load":
        index = list(f.attrs["index"])
        holding = [i for i, e in enumerate(index) if set(group) & set(e.vars)]
        if len(holding) != 1:
            return None
        e = index[holding[0]]
        step = e.coeff(group[-1])
        if Affine(tuple((v, e.coeff(v)) for v in group)) != _row_major(group, step):
            return None
        index[holding[0]] = Affine(tuple(t for t in e.terms if t[0] not in group), e.const) + Affine.of(k).scale(step)
        return table.get("load", (), f.dtype, var_union(*(e.vars for e in index)), {**f.attrs, "index": tuple(index)})
    if f.op == "at" or not set(group) <= set(f.vars) or not any(m.op == "reduce" for m in loop_topo([f])):
        return None
    at = f.vars.index(group[0])
    if list(f.vars[at:at + len(group)]) != group:
        fresh = [Var(v.extent) for v in group]
        f = substituted(f, {v: Affine.of(u) for v, u in zip(group, fresh)}, table, {})
        group = fresh
    attrs = {"map": (), "merged": (tuple(group), k)}
    return table.get("at", (f,), f.dtype, node_vars("at", (f,), attrs), attrs)


def merge_contractions(g: LoopGraph, through_half: bool) -> LoopGraph:
    """The same program with a contraction over three or more variables summed over one merged variable instead.

    A kernel contracts over two variables at most (a dot's K and a stepped loop). The output projection of GQA
    attention sums over the kv head, the head in its group and the head dimension, the heads split in two by
    repeat_kv. Where every load of the product reads those variables only as one row-major axis (one index
    combination), they are one variable k: a computed factor (the attention output) is stored with them adjacent
    and read back over k (an `at` read with `merged`, so the partition cuts it, docs/design.md §3.4), and the
    sums are one, whose dot's K is k.
    """
    table = NodeTable()
    new: dict[int, LNode] = {}

    def merged(n: LNode) -> LNode | None:
        """n as one sum over a merged variable, where n sums a product over three or more variables that merge."""
        vs, x = _summed(n)
        if len(vs) < 3 or not isinstance(x, LNode) or x.op != "mul" or \
                sum(1 for f in _factors(x) if isinstance(f, LNode) and set(vs) & set(f.vars)) < 2:
            return None
        group = _order(vs, _factors(x))
        k = Var(math.prod(v.extent for v in group))

        def product(y: object) -> object:
            if not (isinstance(y, LNode) and y.op == "mul"):
                return _merged_factor(y, group, k, table)
            a, b = product(y.args[0]), product(y.args[1])
            if a is None or b is None:
                return None
            return table.get("mul", (a, b), y.dtype, node_vars("mul", (a, b), y.attrs), dict(y.attrs))

        body = product(x)
        if not isinstance(body, LNode):
            return None
        attrs = {**n.attrs, "var": k}
        return table.get("reduce", (body,), n.dtype, node_vars("reduce", (body,), attrs), attrs)

    for n in g.nodes:
        args = tuple(new[id(a)] if isinstance(a, LNode) else a for a in n.args)
        out = n if all(x is y for x, y in zip(args, n.args)) else \
            table.get(n.op, args, n.dtype, node_vars(n.op, args, n.attrs), dict(n.attrs))
        new[id(n)] = (merged(out) if out.op == "reduce" else None) or out
    if all(new[id(n)] is n for n in g.nodes):
        return g
    return rebuilt(g, new, "m")
