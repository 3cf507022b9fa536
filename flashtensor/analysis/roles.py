"""Dimension roles inside one kernel (docs/design.md §3.2) and the dependencies between its reductions (3.3).

parallel: every stored value carries the variable and nothing reduces it -> the grid;
reduced: a reduction inside removes it -> a loop, or an in-tile reduction when small;
reused: some operands carry it and others do not -> those are re-read by every program along it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.loops import LNode, Var, loop_topo


@dataclass
class Roles:
    parallel: list[Var]
    reduced: list[Var]
    reused: dict[Var, list[str]] = field(default_factory=dict)   # var -> operands re-read along it

    def describe(self) -> list[str]:
        out = [f"{v}<{v.extent}>: parallel" for v in self.parallel]
        out += [f"{v}<{v.extent}>: reduced" for v in self.reduced]
        out += [f"{v}<{v.extent}>: reused by {', '.join(ops)}" for v, ops in self.reused.items()]
        return out


def kernel_nodes(roots: list[LNode], boundary: frozenset[LNode]) -> list[LNode]:
    """Nodes a kernel computes, producers first, stopping at values it loads from earlier kernels."""
    return loop_topo(roots, boundary)


def roles(roots: list[LNode], nodes: list[LNode], boundary: frozenset[LNode]) -> Roles:
    parallel = sorted({v for r in roots for v in r.vars}, key=lambda v: v.id)
    reduced = sorted({n.attrs["var"] for n in nodes if n.op == "reduce" and n not in boundary}, key=lambda v: v.id)
    leaves = [n for n in nodes if n.op == "load" or n in boundary]
    reused: dict[Var, list[str]] = {}
    for v in parallel:
        readers = [n for n in leaves if v not in n.vars and n.vars]
        if readers and any(v in n.vars for n in leaves):
            reused[v] = [n.name for n in readers]
    return Roles(parallel, reduced, reused)


def reduction_deps(nodes: list[LNode], loop_var: Var, boundary: frozenset[LNode]) -> dict[LNode, set[LNode]]:
    """For each reduction over `loop_var`: the reductions over the same variable its argument reads."""
    reds = [n for n in nodes if n.op == "reduce" and n.attrs["var"] is loop_var and n not in boundary]
    deps: dict[LNode, set[LNode]] = {}
    for r in reds:
        found: set[LNode] = set()
        stack, seen = [r.args[0]], set()
        while stack:
            n = stack.pop()
            if id(n) in seen or n in boundary:
                continue
            seen.add(id(n))
            if n in reds:
                found.add(n)
                continue
            stack.extend(n.inputs)
        deps[r] = found
    return deps
