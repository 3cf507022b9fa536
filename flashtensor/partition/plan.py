"""Partition: which loop nodes each kernel computes, and what crosses kernel boundaries (DESIGN 3.4).

A kernel's parallel variables are its outputs' variables. A reduction inside it over one of
its own parallel variables needs that variable's whole range, which one program does not
have: that reduction is cut out into a kernel of its own (its result is thin, a row
statistic), and the large values around it are recomputed on both sides rather than stored.
Kernels whose parallel variables nest are merged when the schedule accepts the merge.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..ir.loops import LNode, LoopGraph, Var


@dataclass
class KernelPlan:
    roots: list[LNode]                                   # values this kernel stores
    loads: set[LNode] = field(default_factory=set)       # values it reads from earlier kernels

    @property
    def parallel(self) -> set[Var]:
        return {v for r in self.roots for v in r.vars}


def _cuts(roots: list[LNode], parallel: set[Var], produced: set[LNode]) -> tuple[list[LNode], set[LNode]]:
    """Reductions over a parallel variable reachable from `roots` (stopping at `produced`)."""
    cuts: list[LNode] = []
    seen: set[int] = set()
    stack = list(roots)
    loads: set[LNode] = set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        for a in n.inputs:
            if a in produced and a not in roots:
                loads.add(a)
            elif a.op == "reduce" and a.attrs["var"] in parallel and a not in roots:
                cuts.append(a)
                loads.add(a)
            else:
                stack.append(a)
    return cuts, loads


def partition(g: LoopGraph, accept: Callable[[KernelPlan], Optional[str]]) -> list[KernelPlan]:
    """Cover the outputs with kernels. `accept(plan)` returns None if a kernel can be scheduled,
    else the reason; merges are only kept when accepted. Kernels come out in dependency order."""
    groups: list[list[LNode]] = []
    work = [o.node for o in g.outputs]
    produced: set[LNode] = set()
    while work:
        r = work.pop(0)
        if r in produced:
            continue
        produced.add(r)
        cuts, _ = _cuts([r], set(r.vars), set())
        groups.append([r])
        work.extend(c for c in cuts if c not in produced)
    # group roots with nested parallel variables, largest first
    groups.sort(key=lambda gr: -len(gr[0].vars))
    kernels: list[list[LNode]] = []
    for gr in groups:
        for k in kernels:
            if set(gr[0].vars) <= {v for r in k for v in r.vars}:
                trial = KernelPlan(k + gr)
                trial.loads = _cuts(trial.roots, trial.parallel, produced)[1]
                if accept(trial) is None:
                    k.extend(gr)
                    break
        else:
            kernels.append(list(gr))
    plans = []
    for k in kernels:
        p = KernelPlan(k)
        p.loads = _cuts(k, p.parallel, produced)[1]
        plans.append(p)
    return _order(plans)


def _order(plans: list[KernelPlan]) -> list[KernelPlan]:
    out: list[KernelPlan] = []
    done: set[LNode] = set()
    pending = list(plans)
    while pending:
        for p in pending:
            if p.loads <= done:
                out.append(p)
                done.update(p.roots)
                pending.remove(p)
                break
        else:
            raise RuntimeError("kernels depend on each other in a cycle")
    return out
