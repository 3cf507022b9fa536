"""A reduction over a copy of a variable, renamed onto the variable itself where that shares work.

Where one tensor reaches an op in two roles, the lowering gives one of them fresh copies of its variables
(docs/design.md §3.1). F.normalize(k, p=1, dim=-2) divides k[n] by sum_m |k[m]|: the sum reads k over a copy m
of the token variable n, so a projection k = x w is computed twice, once over n and once over m. The variable a
reduction removes is bound: renamed to any variable its argument does not otherwise use, the value is the same.
Renamed onto n, the argument reads the values the program already computes (the projection once), and the
sum is over the program's own token variable, which partition and schedule treat like any reduction over
it: a statistic that the kernel looping over the tokens carries beside the others. A rename is kept only
where the renamed argument is a value, or reads a value, that the program computes anyway (not only a load).

A copy may also be a few positions shorter than the variable a reduction binds (a softmax over the keys and a
sink's column joined by cat, its probabilities then summed over the keys alone): the reduction is peeled, over
the copy, combined with its argument at the remaining positions (`peel_reductions`).
"""
from __future__ import annotations

from typing import Callable, Optional

from ..ir.loops import Affine, LNode, LoopGraph, NodeTable, Var, loop_topo, node_vars, rebuilt, substituted
from ..ir.sizes import hint, symbolic

# a reduction peeled (`peel_reductions`): how its prefix and each peeled position combine, and how many positions
COMBINE = {"sum": "add", "max": "maximum", "min": "minimum", "any": "logical_or"}
PEEL = 4


def share_reductions(g: LoopGraph, through_half: bool) -> LoopGraph:
    """The same program with each reduction over a copy of a variable renamed where that shares nodes."""
    users: dict[Var, set[int]] = {}
    for n in g.nodes:
        for v in n.vars + ((n.attrs["var"],) if n.op == "reduce" else ()):
            users.setdefault(v, set()).add(id(n))
    loads = [n for n in g.nodes if n.op == "load"]

    def rename(n: LNode, m: LNode, table: NodeTable) -> Optional[LNode]:
        own = {id(x) for x in loop_topo([n])}
        if not users[n.attrs["var"]] <= own:     # its variable is no copy: other values use it
            return None
        outside = {id(x) for x in g.nodes if x.op != "load" and id(x) not in own}
        return _renamed(m, table, outside, loads)
    return _each_reduction(g, "b", rename)


def peel_reductions(g: LoopGraph, through_half: bool) -> LoopGraph:
    """The same program with each reduction over a variable a few positions longer than a copy of it split: the
    reduction over the copy, combined with its argument at each further position. GPT-OSS's softmax runs over the
    keys and one more column, a sink's logit joined by cat, and its probabilities then meet the values over the
    keys alone: two key variables, 4097 and 4096 long, neither of which a tile holds whole. Peeled, every
    reduction runs over the keys, and the sink's logit is one value per row."""
    loads = [n for n in g.nodes if n.op == "load"]
    return _each_reduction(g, "p", lambda n, m, table: _peeled(m, table, loads) if m.attrs["kind"] in COMBINE
                           else None)


def _each_reduction(g: LoopGraph, tag: str, redo: Callable[[LNode, LNode, NodeTable], Optional[LNode]]) -> LoopGraph:
    """g with each reduction, its operands rebuilt first, replaced by what `redo(original, rebuilt, table)` gives
    where it gives a node (the table makes equal structures the program's own nodes); g itself where none is."""
    table = NodeTable()
    for n in g.nodes:
        table.add(n)
    new: dict[int, LNode] = {}
    for n in g.nodes:
        args = tuple(new[id(a)] if isinstance(a, LNode) else a for a in n.args)
        m = n if all(x is y for x, y in zip(args, n.args)) else _node(table, n.op, args, n.dtype, n.attrs)
        if m.op == "reduce":
            m = redo(n, m, table) or m
        new[id(n)] = m
    if all(new[id(n)] is n for n in g.nodes):
        return g
    return rebuilt(g, new, tag)


def _peeled(r: LNode, table: NodeTable, loads: list[LNode]) -> Optional[LNode]:
    """r as a reduction over a shorter copy u of its variable v, combined with its argument at v = u's extent and
    on; None where v has no such copy."""
    v, arg, kind = r.attrs["var"], r.args[0], r.attrs["kind"]
    for u in _copies(v, loop_topo([arg]), loads):
        gap = v.extent - u.extent       # a number also where both are symbolic (S + 1 and S)
        if u in arg.vars or symbolic(gap) or not 0 < hint(gap) <= PEEL:
            continue
        body = substituted(arg, {v: Affine.of(u)}, table, {})
        tails = [substituted(arg, {v: Affine((), u.extent + i)}, table, {}) for i in range(int(hint(gap)))]
        if kind != "sum":       # idempotent: the peeled values go inside, max_u max(x_u, c), a plain running max
            for at in tails:
                body = _node(table, COMBINE[kind], (body, at), body.dtype, {})
            return _node(table, "reduce", (body,), r.dtype, {**r.attrs, "var": u})
        out = _node(table, "reduce", (body,), r.dtype, {**r.attrs, "var": u})
        for at in tails:
            at = at if at.dtype == r.dtype else _node(table, "cast", (at,), r.dtype, {})
            out = _node(table, "add", (out, at), r.dtype, {})
        return out
    return None


def _node(table: NodeTable, op: str, args: tuple, dtype, attrs: dict) -> LNode:
    return table.get(op, args, dtype, node_vars(op, args, attrs), attrs)


def _renamed(r: LNode, table: NodeTable, computed: set[int], loads: list[LNode]) -> Optional[LNode]:
    """r over another variable whose renamed argument shares a node of `computed` (values computed outside r)
    with the program; None if there is none."""
    u, arg = r.attrs["var"], r.args[0]
    inside = loop_topo([arg])
    used = {v for x in inside for v in x.vars} | {x.attrs["var"] for x in inside if x.op == "reduce"}
    for v in _copies(u, inside, loads):
        if v in used or v.extent != u.extent:
            continue
        memo: dict[int, LNode] = {}
        out = substituted(arg, {u: Affine.of(v)}, table, memo)
        if any(id(x) in computed for x in memo.values()):
            return _node(table, "reduce", (out,), r.dtype, {**r.attrs, "var": v})
    return None


def _copies(u: Var, inside: list[LNode], loads: list[LNode]) -> list[Var]:
    """Variables v such that some load of the argument, read with v in place of u, is a load the program has."""
    out: list[Var] = []
    for a in inside:
        if a.op != "load" or u not in a.vars:
            continue
        for b in loads:
            if b.attrs["input"] != a.attrs["input"] or b is a:
                continue
            for v in b.vars:
                sub = {u: Affine.of(v)}
                if v not in out and [e.substitute(sub) for e in a.attrs["index"]] == list(b.attrs["index"]):
                    out.append(v)
    return out
