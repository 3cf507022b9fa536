"""Partition: which loop nodes each kernel computes, and what crosses kernel boundaries (docs/design.md §3.4).

A kernel's parallel variables are its outputs' variables. A reduction inside it over one of
its own parallel variables needs that variable's whole range, which one program does not
have: that reduction is cut out into a kernel of its own (its result is thin, a row
statistic), and the large values around it are recomputed on both sides rather than stored.
Kernels whose parallel variables nest are merged when the schedule accepts the merge.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..ir.loops import LNode, LoopGraph, Var, loop_topo, stored
from ..ir.reasons import NoPlanError
from ..ir.sizes import hint, length, longer


class PartitionError(NoPlanError):
    """No kernel order exists for the partition (the program runs in eager PyTorch)."""


@dataclass
class KernelPlan:
    roots: list[LNode]                                   # values this kernel stores
    loads: set[LNode] = field(default_factory=set)       # values it reads from earlier kernels

    @property
    def parallel(self) -> set[Var]:
        return {v for r in self.roots for v in r.vars}


@dataclass(frozen=True)
class Cuts:
    """A candidate partition's rules: what it cuts out besides reductions over a kernel's own parallel variables
    (`_cuts`), and which merges it makes."""
    whole: int = 0              # keep reductions over a variable of at most this extent (a program holds it whole)
    nested: bool = False        # cut a sum that another sum reads (per-head column sums under a head-group sum)
    invariant: int = 0          # cut long reductions constant along the longest parallel variable (k^T v)
    operands: bool = False      # cut contraction operands computed from several loads (RoPE's rotated q and k)
    related_only: bool = False  # merge a group only into a kernel whose values it reads or that reads it


def _is_sum(n: LNode) -> bool:
    return n.op == "reduce" and n.attrs["kind"] == "sum"


def _of_statistics(n: LNode) -> bool:
    """Whether `n` reads another reduction (at any depth: the nearest one is then read through non-reductions)."""
    return any(a.op == "reduce" for a in loop_topo(n.inputs))


def _computed_operand(n: LNode, a: LNode, over: Optional[Var]) -> bool:
    """Whether `a` is an operand of the product `n` that a sum over `over` contracts, computed elementwise from
    more than one load (RoPE's rotation, a cat of de-interleaved halves; no statistics, so not probabilities) and
    constant along some variable of the product: each program of the contraction's kernel would compute it again
    for every tile of the other operand."""
    if n.op != "mul" or over is None or over not in a.vars or not set(a.vars) < set(n.vars):
        return False
    ops = [str(x.op) for x in loop_topo([a])]
    return ops.count("load") > 1 and "reduce" not in ops and "at" not in ops


def _cuts(roots: list[LNode], parallel: set[Var], produced: set[LNode],
          rules: Cuts = Cuts()) -> tuple[list[LNode], set[LNode]]:
    """Reductions over a parallel variable reachable from `roots` (stopping at `produced`), except those
    over a variable of extent at most `whole`, which a program can hold whole in its tile; with `nested`,
    also a sum that another sum reads directly (per-head column sums under a sum over a head group), or
    through elementwise values when it sums statistics and varies along the outer sum's variable (column
    sums of probabilities, pooled, then averaged over the group; not a softmax's row sum under the sum
    over keys of P @ V); with `invariant` > 0, also a reduction longer than that whose value does not vary along
    the longest parallel variable, itself longer: the grid splits it, so each program would compute the value
    again (linear attention's d x d context k^T v under an output over queries, which each query tile would
    recompute); with `operands`, also a contraction's operand computed from several loads (`_computed_operand`),
    which a kernel of its own stores once (each from `rules`)."""
    whole, nested, invariant = rules.whole, rules.nested, rules.invariant
    longest = max(parallel, key=lambda v: (length(v.extent), -v.id), default=None)
    row = longest if invariant and longest is not None and longer(longest.extent, invariant) else None
    cuts: list[LNode] = []
    seen: set[tuple[int, Optional[Var]]] = set()
    stack: list[tuple[LNode, Optional[Var]]] = [(r, None) for r in roots]
    loads: set[LNode] = set()
    while stack:
        n, over = stack.pop()       # over: the variable of the sum that reads n through elementwise values
        if (id(n), over) in seen:
            continue
        seen.add((id(n), over))
        over = n.attrs["var"] if _is_sum(n) else None if n.op == "reduce" else over
        for a in n.inputs:
            if a.op == "at":      # a stored value read at an index map: a kernel of its own computes it
                if a.args[0] not in cuts:
                    cuts.append(a.args[0])
                loads.add(a)
            elif a in produced and a not in roots:
                loads.add(a)
            elif a not in roots and (
                    (a.op == "reduce" and a.attrs["var"] in parallel and longer(a.attrs["var"].extent, whole)) or
                    (nested and _is_sum(a) and (_is_sum(n) or (over in a.vars and _of_statistics(a)))) or
                    (row is not None and a.op == "reduce" and row not in a.vars and
                     longer(a.attrs["var"].extent, invariant)) or
                    (rules.operands and _computed_operand(n, a, over))):
                if a not in cuts:
                    cuts.append(a)
                loads.add(a)
            else:
                stack.append((a, over))
    return cuts, loads


def partitions(g: LoopGraph, accept: Callable[[KernelPlan], Optional[str]], whole: int = 0) -> list[list[KernelPlan]]:
    """Candidate partitions for the tuner to time, the greedy one first. The second merges a group only
    into a kernel whose values it reads or that reads it: statistics that merely share the kernel's
    parallel variables (KeyFormer's noisy-softmax row statistics beside the attention output) get a
    kernel of their own, which recomputes the shared scores but carries less per program. The third
    keeps reductions over parallel variables of extent at most `whole` inside the kernel (a softmax
    over short rows returned whole: one pass instead of statistics, then the elementwise pass). The fourth
    cuts a sum that another sum reads, directly or through elementwise values (GQA's column sums per head,
    then the sum over the head group). The fifth
    cuts long reductions that do not vary along a kernel's longest parallel variable (`_cuts`' invariant). The
    sixth stores contraction operands computed from several loads (`_computed_operand`: RoPE's rotated queries)."""
    out: list[list[KernelPlan]] = []
    for rules in (Cuts(), Cuts(related_only=True), Cuts(whole=whole), Cuts(nested=True), Cuts(invariant=whole),
                  Cuts(operands=True)):
        try:
            plans = partition(g, accept, rules)
        except PartitionError:
            if rules != Cuts():
                continue
            raise
        if all(_grouping(plans) != _grouping(o) for o in out):
            out.append(plans)
    return out


def _grouping(plans: list[KernelPlan]) -> set[frozenset[int]]:
    return {frozenset(id(r) for r in p.roots) for p in plans}


def partition(g: LoopGraph, accept: Callable[[KernelPlan], Optional[str]], rules: Cuts = Cuts()) -> list[KernelPlan]:
    """Cover the outputs with kernels. `accept(plan)` returns None if a kernel can be scheduled,
    else the reason; merges are only kept when accepted (and, with `rules.related_only`, only between values
    one of which reads the other); `rules` says what else is cut out (`_cuts`). Kernels come out in dependency
    order."""
    groups: list[list[LNode]] = []
    work = [o.node for o in g.outputs]
    produced: set[LNode] = set()
    while work:
        r = work.pop(0)
        if r in produced:
            continue
        produced.add(r)
        cuts, _ = _cuts([r], set(r.vars), set(), rules)
        groups.append([r])
        work.extend(c for c in cuts if c not in produced)
    # group roots with nested parallel variables, largest first
    groups.sort(key=lambda gr: -len(gr[0].vars))
    kernels: list[list[LNode]] = []
    upstream = {id(r): {id(n) for n in loop_topo([r])} for gr in groups for r in gr} if rules.related_only else {}
    for i, gr in enumerate(groups):
        for k in kernels:
            related = not rules.related_only or any(
                id(gr[0]) in upstream[id(r)] or id(r) in upstream[id(gr[0])] for r in k)
            if set(gr[0].vars) <= {v for r in k for v in r.vars} and related:
                trial = KernelPlan(k + gr)
                cuts, trial.loads = _cuts(trial.roots, trial.parallel, produced, rules)
                # a merge that makes a value a cut which no kernel produces (a sum over a head group whose
                # variable the merged kernel carries) is not a kernel, nor one that closes a cycle (a kernel that
                # reads back a value it stores is one), counting the groups not placed yet as kernels of their own
                merged = [k + gr if x is k else x for x in kernels] + groups[i + 1:]
                if set(cuts) <= produced and _orderable(merged, rules) and accept(trial) is None:
                    k.extend(gr)
                    break
        else:
            kernels.append(list(gr))
    plans = [KernelPlan(k) for k in kernels]
    for p in plans:
        p.loads = _cuts(p.roots, p.parallel, produced, rules)[1]
    if _order(plans) is None:
        # reading what another kernel stores instead of recomputing it closed a cycle (a value stored by
        # one kernel that needs another's statistics): recompute such values, load only the true cuts
        for p in plans:
            p.loads = _cuts(p.roots, p.parallel, set(), rules)[1]
    ordered = _order(plans)
    if ordered is None:
        raise PartitionError("kernels would depend on each other in a cycle")
    return ordered


def _orderable(kernels: list[list[LNode]], rules: Cuts) -> bool:
    """Whether kernels of these roots have an order, each loading only the values it cannot recompute: a merge
    that closes a cycle even so is refused (a kernel that reads back a value it stores, a stored value's own
    input merged into the kernel that reads it back, or either through a value a third kernel computes: a
    forget gate's prefix sums merged with a prefix of column sums that need the gate's row statistics)."""
    plans = [KernelPlan(k) for k in kernels]
    placed = {r for k in kernels for r in k}
    for p in plans:     # a value no kernel stores is none's dependency
        p.loads = {a for a in _cuts(p.roots, p.parallel, set(), rules)[1] if stored(a) in placed}
    return _order(plans) is not None


def _order(plans: list[KernelPlan]) -> Optional[list[KernelPlan]]:
    """Plans with every kernel after the ones whose values it loads; None if they form a cycle."""
    out: list[KernelPlan] = []
    done: set[LNode] = set()
    pending = list(plans)
    while pending:
        ready = next((p for p in pending if {stored(a) for a in p.loads} <= done), None)
        if ready is None:
            return None
        out.append(ready)
        done.update(ready.roots)
        pending.remove(ready)
    return out


def check_boundaries(loops: LoopGraph, plans: list[KernelPlan]) -> None:
    """No value larger than the program's own inputs and outputs may cross a kernel boundary (docs/design.md
    §3.4): recomputing it is cheaper than writing and reading it."""
    largest = max(hint(math.prod(shape)) for shape, _ in loops.inputs + [(o.shape, None) for o in loops.outputs])
    stored = {o.node for o in loops.outputs}
    for p in plans:
        for r in p.roots:
            if r not in stored and hint(math.prod(v.extent for v in r.vars)) > largest:   # traced sizes: a cost
                what = f"plan would pass a {[v.extent for v in r.vars]} intermediate between kernels"
                raise PartitionError(what, where=r.origin)
