"""Which kernel of a plan checks which input for the finite check (codegen/check.py says what it does).

Every floating input is checked once: by the first kernel whose tiles read it whole (`tile_checks`), or
else in parts, kernel k's programs checking pieces of the k-th, each part as large as the kernel's share of the
plan's parallel extent (a kernel of few programs, a pooling of column sums, reads little; an even part kept it
on a few SMs long after the others); an input a log, a square root or a division reads must also lie in that
op's domain (analysis.facts.input_domains). A plan needs the check
only where some kernel skips or constant-folds tiles by value facts. A mask read from a tensor may hold -inf
(its pre-pass reads its values, analysis/atoms.py): only NaN and +inf fail its check.
"""
from __future__ import annotations

import itertools
import math
from typing import Mapping, Optional

import torch

from ..analysis.facts import input_domains
from ..ir.loops import LNode, LoopGraph
from ..ir.sizes import hint
from ..schedule.schedule import Schedule
from .spec import CheckPlan

PARTS = 64      # the flat inputs' parts are whole 64ths


def plan_checks(loops: LoopGraph, schedules: list[Schedule], narrowed: Mapping[int, torch.dtype]) -> list[CheckPlan]:
    """Each kernel's share of the check, in plan order."""
    domains = input_domains(loops)
    moderate = {i for s in schedules for i in s.moderate}
    check = {i: _domain(domains.get(i), i in moderate) for i, (_, dt) in enumerate(loops.inputs)
             if dt.is_floating_point}
    checked = bool(check) and any(s.skip or s.special or s.runtime for s in schedules)
    shares = _shares([_parallel(s) for s in schedules]) if checked else ()
    reads = [tile_checks(s, loops.inputs) for s in schedules] if checked else []
    tiled: list[dict] = [{} for _ in schedules]
    flat = {}
    for i, dom in check.items():
        k = next((k for k, r in enumerate(reads) if i in r), None)
        if k is None:
            flat[i] = dom
        else:
            tiled[k][i] = (reads[k][i], dom)
    ftz = frozenset(i for i, dom in check.items() if dom and dom.startswith("positive")) if checked else frozenset()
    masks = _masks(schedules) - set(domains)
    return [CheckPlan(shares, k, flat, tiled[k], ftz, narrowed, masks) for k in range(len(schedules))]


def _shares(extents: list[int]) -> tuple[int, ...]:
    """Each kernel's part of the flat inputs in PARTS-ths, as near its part of the extents as whole PARTS-ths go
    (small numbers: a symbolic size times them stays within the kernel's int32 arithmetic)."""
    cuts = [0] + [round(PARTS * c / sum(extents)) for c in itertools.accumulate(extents)]
    return tuple(b - a for a, b in zip(cuts, cuts[1:]))


def _parallel(s: Schedule) -> int:
    """How many (row, batch) points the kernel's grid covers at the traced sizes, at least 1."""
    return max(1, math.prod(int(hint(v.extent)) for v in s.batch + ([s.row] if s.row is not None else [])))


def _masks(schedules: list[Schedule]) -> frozenset[int]:
    """Inputs every kernel that reads them reads only as masks (Schedule.masks): their -inf passes the check."""
    reads = [{n.attrs["input"] for n in s.nodes if n.op == "load" and n not in s.boundary} for s in schedules]
    return frozenset(i for s in schedules for i in s.masks if all(i in t.masks for t, r in zip(schedules, reads)
                                                                    if i in r))


def _domain(dom: Optional[str], moderate: bool) -> Optional[str]:
    """An input's domain, with "+moderate" where a kernel skips tiles by a huge mask constant that the input
    meets (Schedule.moderate): an input holding such values itself (a mask tensor) must not look moderate."""
    if not moderate:
        return dom
    return f"{dom}+moderate" if dom else "moderate"


def tile_checks(s: Schedule, inputs: list) -> dict[int, LNode]:
    """Inputs this kernel's tiles read whole, each with the load that does: every grid variable indexes
    it and the load's variables map one to one onto its elements, so the programs' tiles cover it without
    overlap. A load over the loop variable counts where the loop visits its tiles in order (no early
    stop); the check reads the tiles the loop skips (see check.program_check)."""
    grid = set(s.batch) | ({s.row} if s.row is not None else set())
    free = grid | set(s.whole) | ({s.loop} if s.loop is not None and not s.stepped else set())
    early = s.loop is not None and any(s.stops_early(p) for p in range(s.passes))
    out: dict[int, LNode] = {}
    for n in s.nodes:
        if n.op != "load" or n in s.boundary or n.attrs["input"] in out:
            continue
        vs = []
        for e, size in zip(n.attrs["index"], inputs[n.attrs["input"]][0]):
            if e.terms == () and e.const == 0 and size == 1:
                continue
            if len(e.terms) != 1 or e.terms[0][1] != 1 or e.const != 0 or e.terms[0][0].extent != size:
                break
            vs.append(e.terms[0][0])
        else:
            if vs and len(set(vs)) == len(vs) and grid <= set(vs) <= free and not (s.loop in vs and early):
                out[n.attrs["input"]] = n
    return out
