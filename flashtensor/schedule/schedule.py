"""Tile schedule of one kernel: grid, loop and in-tile variables, where each node is computed,
and how the loop's reductions are carried (docs/design.md §3.2, §3.3, §3.5).

A reduction over the loop variable that reads another one is carried online when a rule
applies: a factor that does not vary along the loop moves out of the sum, and a factor
exp(y - d) (or exp2) on a running max d is corrected by exp(d_old - d_new) whenever d moves.
Otherwise it waits for a later pass over the loop. Tiles where every reduction of a pass
provably adds its identity are skipped; tiles wholly inside the live region drop the
predicate. Where values are known constants but a reduction still sees something there
(CORM's `p >= thresh` with p = 0 in the masked region), tiles wholly inside that region
get a body with the constants in place, so what only feeds them is never computed.

Where no tiled loop fits, a short reduced variable may be the loop one value per step ("stepped"): its
variable is then an index, like a batch variable's, and each step works on tiles over the other variables
(an output projection summed over heads: per head, the head's slices of the operands, each a tl.dot).
"""
from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch

from ..analysis.atoms import Atom, Exists, Scope, data_free
from ..analysis.facts import Facts, Plane, Region, negate
from ..analysis.precision import kept
from ..analysis.roles import Roles, kernel_nodes, reduction_deps, roles
from ..ir.loops import Affine, LNode, Var, read_input
from ..ir.reasons import NoPlanError
from ..ir.sizes import hint, length, longer, symbolic
from ..partition.plan import KernelPlan
from . import online

log = logging.getLogger(__name__)

MAX_WHOLE = 256           # largest extent held whole in a tile
Factor = tuple[Union[LNode, float, int], int]   # (value, power +1 / -1)


class ScheduleError(NoPlanError):
    """The kernel cannot be scheduled (or emitted); the message names its values, `causes` do not."""


@dataclass
class Accum:
    node: LNode
    kind: str
    pass_: int = 0
    kept: list[Factor] = field(default_factory=list)      # summand factors computed in the loop
    pulled: list[Factor] = field(default_factory=list)    # loop-invariant factors applied after the loop
    # (running max d, "exp" or "exp2") of exp(. - d) factors
    rescale: list[tuple[LNode, str, float]] = field(default_factory=list)


@dataclass
class Schedule:
    plan: KernelPlan
    nodes: list[LNode]
    boundary: frozenset[LNode]
    batch: list[Var]
    row: Optional[Var]
    loop: Optional[Var]
    whole: list[Var]
    accums: dict[LNode, Accum]
    passes: int
    skip: list[Plane]             # regions (conjunctions of half-planes) where no loop reduction changes
    facts: Facts
    roles: Roles
    dots: dict[LNode, tuple]      # sum reductions emitted as tl.dot: node -> (A factors, B factors, K)
    # sums over a short variable held whole of a sum over another (a head dimension that a de-interleaving view
    # split in two): node -> that variable, summed one value at a time, each a dot or a tile sum (`_stepped_sum`)
    steps: dict[LNode, Var] = field(default_factory=dict)
    special: list[Affine] = field(default_factory=list)   # at most one half-plane with a constant-folded body
    stepped: bool = False         # the loop takes one value of its variable per step: no tile axis
    moderate: frozenset[int] = frozenset()    # inputs checked to be moderate: skips by huge constants rely on it
    # regions that hold conditions on masks read from tensors (analysis/atoms.py): a pre-pass gives each row tile
    # its loop range outside them (codegen/ranges.py)
    runtime: list[Region] = field(default_factory=list)
    masks: frozenset[int] = frozenset()       # inputs read only as such masks (their -inf is no non-finite input)

    @property
    def order(self) -> list[Var]:
        """Canonical axis order of every tile."""
        return [v for v in (self.row, None if self.stepped else self.loop) if v is not None] + self.whole

    def tile_vars(self, n: LNode) -> list[Var]:
        return [v for v in self.order if v in n.vars]

    @property
    def gap(self) -> Optional[Plane]:
        """The skipped region bounded on both sides along the loop (a gap in it), if there is one."""
        return next((r for r in self.skip if self.loop is not None and any(h.coeff(self.loop) > 0 for h in r)
                     and any(h.coeff(self.loop) < 0 for h in r)), None)

    @property
    def runtime_gap(self) -> bool:
        """Whether the loop leaves out a gap a pre-pass finds (codegen/ranges.py: the keys between attention sinks
        and a window of a mask read from a tensor): where it has run-time regions and no compile-time gap."""
        return bool(self.runtime) and self.gap is None

    def stops_early(self, pass_: int) -> bool:
        """Whether the pass's loop may stop once every accumulator holds its absorbing value: true
        when all are `any`, which stays true whatever the later tiles hold."""
        accs = [a for a in self.accums.values() if a.pass_ == pass_]
        return bool(accs) and all(a.kind == "any" for a in accs)

    def constant_on(self, n: LNode, region: frozenset) -> Optional[float]:
        """The constant `n` takes on tiles where every half-plane of `region` holds, if the facts give one."""
        for reg, value in self.facts.of(n):
            if reg and set(reg) <= region:
                return value
        return None

    def read_when_skipped(self) -> set[int]:
        """The inputs whose values would reach a loop reduction or an output on the tiles the loop skips: a
        `where` whose condition the facts fix on every skipped region reads only the branch it takes there
        (masked_fill's discarded scores), so an input only under the other branch needs no check on them."""
        regions = [frozenset(r) for r in self.skip + self.runtime]

        def taken(n: LNode) -> list[LNode]:
            if n.op == "where" and isinstance(n.args[0], LNode) and regions:
                known = {self.constant_on(n.args[0], reg) for reg in regions}
                if len(known) == 1 and (c := known.pop()) is not None:
                    return [a for a in (n.args[1] if c else n.args[2],) if isinstance(a, LNode)]
            return n.inputs
        roots = [r.args[0] for r in self.accums] + [n for n in self.plan.roots if self.loop in n.vars]
        return _inputs([r for r in roots if isinstance(r, LNode)], self.boundary, taken)


def factorize(x: Union[LNode, float, int], power: int = 1, atoms: frozenset = frozenset()) -> list[Factor]:
    """A product as its factors, seeing through mul, div and float casts, but not through `atoms`: the
    values a kernel loads from an earlier one are factors as they stand, since the nodes inside them are
    not the kernel's. A value every plan rounds (analysis.precision.kept: float32 q cast to fp16, an fp16
    product that may overflow) stays a factor: eager's later ops read the rounded values, and a dot then
    takes them in that type."""
    if isinstance(x, LNode) and x not in atoms and not kept(x):
        if x.op == "mul":
            return factorize(x.args[0], power, atoms) + factorize(x.args[1], power, atoms)
        if x.op == "div":
            return factorize(x.args[0], power, atoms) + factorize(x.args[1], -power, atoms)
        if x.op == "cast" and x.dtype.is_floating_point and x.args[0].dtype.is_floating_point:
            inner = factorize(x.args[0], power, atoms)
            # eager rounds a narrowed product whole: a constant factor split off into the other operand of a dot
            # would add a rounding there (v / 9 in bf16), unless it is a power of two
            if x.dtype in (torch.float16, torch.bfloat16) and x.dtype != x.args[0].dtype and \
                    any(_inexact_constant(f) for f, _ in inner):
                return [(x, power)]
            return inner
    return [(x, power)]


def _inexact_constant(f: Union[LNode, float, int]) -> bool:
    """A factor with no variable that is not known to be a power of two (scaling by one is exact)."""
    v = f.attrs["value"] if isinstance(f, LNode) and f.op == "scalar" else f
    if isinstance(v, LNode):
        return not v.vars
    return not (isinstance(v, (int, float)) and math.isfinite(v) and v != 0 and math.frexp(abs(v))[0] == 0.5)


def _reaches(n, targets: set[LNode], boundary: frozenset[LNode], memo: dict) -> set[LNode]:
    if not isinstance(n, LNode) or n in boundary:
        return set()
    if id(n) in memo:
        return memo[id(n)]
    out = {n} & targets
    if n not in targets:
        for a in n.inputs:
            out |= _reaches(a, targets, boundary, memo)
    memo[id(n)] = out
    return out


def _dot_split(factors: list[Factor], tile: list[Var], k: Var) -> Optional[tuple]:
    """Split a product over three tile variables into operands over (M, K) and (K, N)."""
    others = [v for v in tile if v is not k]
    if len(others) != 2:
        return None
    m, n = others
    a, b = [], []
    for f, p in factors:
        vs = set(f.vars) if isinstance(f, LNode) else set()
        if n not in vs:
            a.append((f, p))
        elif m not in vs:
            b.append((f, p))
        else:
            return None
    if not a or not b:
        return None
    return a, b, k


def build_schedule(plan: KernelPlan, loop_choice: Optional[Var] = None) -> Schedule:
    boundary = frozenset(plan.loads)
    nodes = kernel_nodes(plan.roots, boundary)
    compute = [n for n in nodes if n not in boundary]
    role = roles(plan.roots, nodes, boundary)
    parallel = set(role.parallel)
    # batch variables: shared by both operands of a contraction and not contracted
    dot_batch: set[Var] = set()
    for n in compute:
        if n.op == "reduce" and n.attrs["kind"] == "sum" and contraction(n, boundary):
            fs = [set(f.vars) for f, _ in factorize(n.args[0], atoms=boundary) if isinstance(f, LNode)]
            dot_batch |= set.intersection(*fs) - {n.attrs["var"]}
    free = [v for v in role.parallel if v not in dot_batch]
    # a parallel variable the kernel also reduces over (a short axis the partition kept inside, or row
    # statistics merged in as roots) is held whole, so it cannot be the grid's row; _finish checks that
    # it fits (MAX_WHOLE)
    inner = {n.attrs["var"] for n in compute if n.op == "reduce"} & set(free)
    # the longest free variable is the row; where its tile cannot be built, the next longest (a symbolic head
    # count of a one-query kernel is "longest" but sits in one operand only, beside the head dim)
    rows = sorted((v for v in free if v not in inner), key=lambda v: (length(v.extent), -v.id), reverse=True)
    all_vars = {v for n in nodes for v in n.vars} | {n.attrs["var"] for n in compute if n.op == "reduce"}
    reduced = sorted({n.attrs["var"] for n in compute if n.op == "reduce"} - parallel,
                     key=lambda v: (not symbolic(v.extent), -hint(v.extent), v.id))   # a symbolic size is long
    candidates = [loop_choice] if loop_choice else (reduced or [None])
    # parallel variables held in the tile beside the row variable unless that breaks the tile shape; then
    # those that sit in one operand with the row (GQA's head-group index next to the query index), then all
    # of them but those reduced inside go to the grid instead
    extras: list[tuple[set[Var], Optional[Var]]] = []
    tried: list[Optional[Var]] = list(rows) or [None]
    for row in tried:
        beside_row = {v for n in compute if n.op == "reduce" and n.attrs["kind"] == "sum"
                      for f, _ in factorize(n.args[0], atoms=boundary) if isinstance(f, LNode) and row in f.vars
                      for v in f.vars if v in free and v is not row}
        to_grid = [set(), beside_row, set(free) - {row} - inner]
        extras += [(e, row) for k, e in enumerate(to_grid) if e not in to_grid[:k]]
    # last, the rows too go to the grid (a short head-group index chosen as the row of a kernel that holds the
    # keys whole and loops over queries), which leaves the tile to the loop and the variables held whole
    if rows:
        extras.append((set(free) - inner, None))
    # stepped loops come last, the shortest first, over a short reduced variable that is a batch variable of a
    # contraction (both operands carry it): each step is then a matmul of its own slices
    stepped = [] if loop_choice else sorted((v for v in reduced if v in dot_batch and not longer(v.extent, MAX_WHOLE)),
                                            key=lambda v: (v.extent, v.id))
    tries = [(e, r, loop, False) for e, r in extras for loop in candidates] + \
        [(e, r, loop, True) for e, r in extras for loop in stepped]
    errors, causes = [], []
    for extra, row_var, loop, step in tries:
        batch = sorted((parallel & dot_batch) | (parallel - set(free)) | extra, key=lambda v: v.id)
        whole = sorted(all_vars - set(batch) - {row_var, loop}, key=lambda v: v.id)
        try:
            return _finish(plan, nodes, compute, boundary, batch, row_var, loop, whole, role, step)
        except ScheduleError as e:
            grid = f", {sorted(extra, key=lambda v: v.id)} in the grid" if extra else ""
            errors.append(f"{'stepped ' if step else ''}loop over {loop}{grid}: {e}")
            causes += e.causes
    raise ScheduleError("; ".join(errors), causes=causes)


def _finish(plan, nodes, compute, boundary, batch, row, loop, whole, role, stepped=False) -> Schedule:
    grid = set(batch) | {row}
    for n in compute:
        if n.op == "reduce" and n.attrs["var"] in grid:
            raise ScheduleError(f"{n.name} reduces {n.attrs['var']}, which the grid splits across programs",
                                "a reduction over an axis that the grid splits across programs", n.origin)
    if any(n.dtype == torch.float64 for n in nodes):
        raise ScheduleError("float64 has no fused lowering (tl.dot accumulates in float32)")
    for v in whole:
        if longer(v.extent, MAX_WHOLE):
            raise ScheduleError(f"variable {v} of extent {v.extent} would have to be held whole in a tile",
                                f"an axis of extent {v.extent} would have to be held whole in a tile "
                                f"(at most {MAX_WHOLE})")
    if any(v in batch for v in ([loop] if loop else [])):
        raise ScheduleError("loop variable is also a batch variable")
    scope = Scope(tuple(batch), row, loop, boundary) if row is not None and loop is not None and not stepped else None
    sched = Schedule(plan, nodes, boundary, batch, row, loop, whole, {}, 1, [], Facts(scope).run(nodes), role, {},
                     stepped=stepped)
    # contractions -> tl.dot, and the tile-rank limit everywhere else
    dot_args: set[int] = set()
    used = Counter(id(a) for x in compute for a in x.inputs) + Counter(id(r) for r in plan.roots)
    for n in compute:
        if (k1 := _stepped_sum(sched, n, boundary, used)) is not None:
            sched.steps[n] = k1
    inners = {id(n.args[0]) for n in sched.steps}
    for n in compute:
        if n.op == "reduce" and n.attrs["kind"] == "sum" and id(n) not in inners:
            inner = n.args[0] if n in sched.steps else n
            tv = [v for v in sched.tile_vars(inner.args[0]) if v is not sched.steps.get(n)]
            if len(tv) == 3 and inner.attrs["var"] in tv:
                split = _dot_split(factorize(inner.args[0], atoms=boundary), tv, inner.attrs["var"])
                if split is None:
                    raise ScheduleError(f"{n.name}: a sum over a three-variable product that is not a contraction",
                                        "a sum over a product of three loop variables that is not a contraction",
                                        n.origin)
                sched.dots[n] = split
                dot_args |= {id(inner), id(inner.args[0])} | {id(f) for f in _chain(inner.args[0], boundary)}
            elif n in sched.steps:
                dot_args.add(id(inner))     # summed in the step's tile, never a tile of its own
            elif _per_element(n, boundary, set(batch)):
                raise ScheduleError(f"{n.name}: a contraction with both free variables in the grid {batch}",
                                    "a matmul that would run one program per element of its result, without "
                                    "tl.dot", n.origin)
    stepped = {id(x): k for r, k in sched.steps.items() for x in kernel_nodes([r.args[0].args[0]], boundary)}
    for n in nodes:       # an earlier kernel's value read back counts too: its load is a tile like any other
        if id(n) not in dot_args and len([v for v in sched.tile_vars(n) if v is not stepped.get(id(n))]) > 2:
            raise ScheduleError(f"{n.name} would need a tile over {sched.tile_vars(n)}",
                                "a value outside a matmul would need a tile over three loop variables", n.origin)
    if loop is not None:
        _carry(sched, compute, boundary, loop)
    return sched


def contraction(n: LNode, atoms: frozenset) -> bool:
    """Whether the sum `n` multiplies two factors that each have a variable the other lacks (a matmul, whose
    shared free variables are batch). A product whose factors nest, such as p * log(p) summed over a row or
    q * q for a norm, is elementwise along every variable: treating its shared variables as batch put the
    query axis in the grid, one program per query row."""
    fs = [set(f.vars) for f, _ in factorize(n.args[0], atoms=atoms) if isinstance(f, LNode)]
    return any(a - b and b - a for a in fs for b in fs)


def _per_element(n: LNode, atoms: frozenset, batch: set[Var]) -> bool:
    """Whether the sum `n` is a contraction (two factors, each with a variable the other lacks, summed over one
    they share) whose free variables are both split across programs: each program then computes one element
    of the product from one row of each operand, with no tile to reuse them in and no tl.dot. Cosine
    similarity did that: its norms' sums of squares look like contractions sharing every variable, so every
    parallel variable went to the grid (2048 programs at S=32, 18 s per call in the interpreter; a 22-minute
    first call at S=128). Such a kernel is never better than eager."""
    k = n.attrs["var"]
    fs = [set(f.vars) for f, p in factorize(n.args[0], atoms=atoms) if isinstance(f, LNode) and p > 0 and k in f.vars]
    return any((a - b) & batch and (b - a) & batch for a in fs for b in fs)


def _stepped_sum(sched: Schedule, n: LNode, atoms: frozenset, used: Counter) -> Optional[Var]:
    """k1 where n sums over k1, a short variable held whole, a sum over k2 (also whole, read by n alone) whose
    summand's tile would be wider than a tile or a dot allows with k1 in it: n is then summed one value of k1 at a
    time, each step a dot or a tile sum over k2. A head dimension split in two by a de-interleaving view (DeepSeek's
    RoPE part, GPT-J's every-other rotation) makes its scores such a double sum."""
    if not (n.op == "reduce" and n.attrs["kind"] == "sum"):
        return None
    k1, inner = n.attrs["var"], n.args[0]
    if not (isinstance(inner, LNode) and inner.op == "reduce" and inner.attrs["kind"] == "sum" and inner not in atoms
            and used[id(inner)] == 1 and k1 in sched.whole and inner.attrs["var"] in sched.whole
            and not longer(k1.extent, 16)):
        return None
    tv = sched.tile_vars(inner.args[0])
    if len(tv) < 3 or (len(tv) == 3 and _dot_split(factorize(inner.args[0], atoms=atoms), tv, inner.attrs["var"])):
        return None     # a tile or a dot as it stands
    return k1 if len(tv) <= 4 else None


def _chain(x, atoms: frozenset) -> list[LNode]:
    """The mul/div/cast nodes a factorised product passes through (never materialised)."""
    out = []
    while isinstance(x, LNode) and x not in atoms and x.op in ("mul", "div", "cast"):
        out.append(x)
        if x.op == "cast":
            x = x.args[0]
        else:
            out += _chain(x.args[1], atoms)
            x = x.args[0]
    return out


def _carry(sched: Schedule, compute: list[LNode], boundary: frozenset[LNode], loop: Var) -> None:
    reds = [n for n in compute if n.op == "reduce" and n.attrs["var"] is loop]
    red_set = set(reds)
    deps = reduction_deps(compute, loop, boundary)
    memo: dict = {}
    site = online.Site(loop, red_set, lambda f: _reaches(f, red_set, boundary, memo))
    later: dict[LNode, set[LNode]] = {r: set() for r in reds}   # deps that need an earlier pass
    for r in reds:
        acc = Accum(r, r.attrs["kind"])
        sched.accums[r] = acc
        if acc.kind != "sum":
            later[r] = set(deps[r])
            acc.kept = [(r.args[0], 1)]
            continue
        for f, p in factorize(r.args[0], atoms=boundary):
            carry = next((c for rule in online.ONLINE_RULES if (c := rule(f, p, site)) is not None), None)
            if carry is None:             # no rule carries it: it waits for a later pass
                acc.kept.append((f, p))
                later[r] |= site.touched(f)
            elif carry.pulled:
                acc.pulled.append((f, p))
            else:
                acc.kept.append((f, p))
                later[r] |= carry.waits
                if carry.rescale:
                    acc.rescale.append(carry.rescale)
        if r in sched.dots:
            split = _dot_split(acc.kept, sched.tile_vars(r.args[0]), loop)
            if split is None:
                raise ScheduleError(f"{r.name}: contraction operands do not separate once factors move out",
                                    "a matmul whose operands do not separate once loop-invariant factors move out "
                                    "of the sum", r.origin)
            sched.dots[r] = split
    # passes: a dependency carried online shares the pass, any other needs an earlier one
    for r in reds:   # reds are in topological order
        acc = sched.accums[r]
        p = 0
        for d in deps[r]:
            p = max(p, sched.accums[d].pass_ + (1 if d in later[r] else 0))
        acc.pass_ = p
        acc.rescale = [r for r in acc.rescale if sched.accums[r[0]].pass_ == p]
    sched.passes = 1 + max((a.pass_ for a in sched.accums.values()), default=0)
    if sched.passes > 1 and len({a.pass_ for a in sched.accums.values()}) != sched.passes:
        raise ScheduleError("empty pass")
    allowed = {v for v in (sched.row, loop) if v is not None}
    if sched.stepped:     # skipped and constant-folded tiles are ranges of a tiled loop; a stepped one runs all
        return
    sched.skip, sched.runtime = _skipped(sched, reds, loop, allowed)
    sched.special = _special(sched, compute, loop, allowed)
    atoms = frozenset(sched.facts.atoms)
    if sched.skip or sched.special or sched.runtime:     # what a skip by a huge constant relies on (Facts.neutral)
        huge_max = [r for r in reds if r.attrs["kind"] == "max" and sched.facts.huge.get(r.args[0])]
        sched.moderate = frozenset(_inputs(sched.facts.vanishing + huge_max, boundary | atoms))
    # an input read only by bool masks, or added to the scores as it is, may hold -inf: the pre-pass reads its
    # values, and no fact assumes them finite (one computed from it, (1 - m) * x, stays checked)
    plain = frozenset(a for a in atoms if a in sched.facts.bools or read_input(a) is not None)
    sched.masks = frozenset(_inputs(list(plain), boundary) - _inputs(list(sched.plan.roots), boundary | plain))


def _inputs(nodes: list[LNode], boundary: frozenset[LNode],
            follow: Callable[[LNode], list[LNode]] = lambda n: n.inputs) -> set[int]:
    """The program inputs that `nodes` read, in this kernel (not through `boundary`: values loaded from earlier
    kernels, or masks whose own values a run-time skip reads), through the operands `follow` gives of each."""
    out, seen, stack = set(), set(), list(nodes)
    while stack:
        n = stack.pop()
        if id(n) in seen or n in boundary:
            continue
        seen.add(id(n))
        if n.op == "load":
            out.add(n.attrs["input"])
        stack += follow(n)
    return out


def _skipped(sched: Schedule, reds: list[LNode], loop: Var, allowed: set) -> tuple[list[Plane], list[Region]]:
    """Regions over (row, loop) where no reduction of any pass can change its result (Facts.neutral), none
    contained in another: those of half-planes only, which the loop leaves out (codegen/loop.py), and those that
    hold conditions on masks read from tensors, skipped at run time (`runtime`). At most one of the first may be
    bounded on both sides along the loop (a gap in it, such as the keys between attention sinks and a window)."""
    per = [{frozenset(reg) for reg in sched.facts.neutral(r) if reg and _loop_region(sched, reg, loop, allowed)}
           for r in reds]
    common = [c for c in set().union(*per) if all(any(n <= c for n in regs) for regs in per)] if per else []
    common = [c for c in common if not any(o < c for o in common)]
    out: list[Plane] = []
    gap = False
    ordered = sorted((tuple(sorted(c, key=str)) for c in common), key=lambda r: [str(h) for h in r])
    for reg in ordered:
        if not data_free(reg):
            continue
        plane = tuple(h for h in reg if isinstance(h, Affine))
        two_sided = any(h.coeff(loop) > 0 for h in plane) and any(h.coeff(loop) < 0 for h in plane)
        if not (two_sided and gap):
            gap = gap or two_sided
            out.append(plane)
    return out, [reg for reg in ordered if not data_free(reg)]


def _loop_region(sched: Schedule, reg: Region, loop: Var, allowed: set) -> bool:
    """Whether a region bounds tiles of the loop: some condition varies along it, the half-planes are over the row
    and loop, and every condition on the data is one a pre-pass evaluates over the kernel's row and loop tiles
    (an Exists over one of them, of half-planes and atoms)."""
    def fits(c: object) -> bool:
        if isinstance(c, Affine):
            return set(c.vars) <= allowed
        if isinstance(c, Exists):
            return c.var in allowed and all(fits(x) for x in c.region)
        return isinstance(c, Atom)
    return any(loop in c.vars for c in reg) and all(fits(c) for c in reg)


def _special(sched: Schedule, compute: list[LNode], loop: Var, allowed: set) -> list[Affine]:
    """The half-plane over (row, loop), neither skipped nor the bulk's, on which the facts make the most
    loop-varying values that read data (not only indices) constant; none when there is no such plane."""
    known = {h for reg in sched.skip for h in reg} | {negate(h) for reg in sched.skip for h in reg}
    data: dict[int, bool] = {}

    def reads_data(n) -> bool:
        if not isinstance(n, LNode):
            return False
        if id(n) not in data:
            data[id(n)] = n.op in ("load", "reduce") or n in sched.boundary or any(reads_data(a) for a in n.args)
        return data[id(n)]

    count: dict[Affine, int] = {}
    for n in compute:
        if loop in n.vars and reads_data(n):
            for reg, _ in sched.facts.of(n):
                h = reg[0] if len(reg) == 1 and isinstance(reg[0], Affine) else None
                if h is not None and loop in h.vars and set(h.vars) <= allowed and h not in known:
                    count[h] = count.get(h, 0) + 1
    return [max(count, key=lambda h: (count[h], str(h)))] if count else []


def schedulable(plan: KernelPlan) -> Optional[str]:
    """The partition search's test for a merge: None if the merged kernel can be scheduled, else why not."""
    try:
        build_schedule(plan)
    except ScheduleError as e:
        log.debug("merge rejected (stores %s): %s", plan.roots, e)
        return str(e)
    log.debug("merge accepted: stores %s", plan.roots)
    return None
