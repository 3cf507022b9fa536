"""The compiler driver: a PyTorch function and example arguments to a runnable Program, as a list of stages.

    capture -> decompose -> fusable | plan cache | loop form -> precision -> rewrites -> facts
            -> partition -> schedule -> emit -> tune

Each stage is a function of the plan record (runtime/plan.py) and the call; its output is recorded on the
plan under the stage's name, so explain and the tests can read every stage's result. The driver holds no
policy: each decision lives in the module named for it (analysis/precision.py, codegen/checkplan.py,
partition/, runtime/autotune.py). The first three stages run for every new signature (the cache's key is
the decomposed graph); the rest only on a cache miss. Whatever a stage cannot handle runs in eager PyTorch,
with the reason in the plan's notes and a FallbackWarning; a program with nothing fused calls the user's own
function.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import torch

from . import knobs
from .analysis import precision
from .analysis.facts import nan_absorbing_maxima
from .caller import user_stacklevel
from .codegen.artifact import encode_kernel, with_plain_keys
from .codegen.checkplan import plan_checks
from .codegen.normalisers import folded_normalisers
from .codegen.spec import KernelSpec
from .frontend.capture import capture, fallback_notes
from .frontend.eager import parameters
from .ir import sizes
from .ir.graph import Graph, Node
from .ir.loops import LNode, LoopGraph, LOutput, stored
from .ir.reasons import reason
from .options import Options, TileConfig
from .partition.fusable import eager_handoff, fusable_part, prologue_names
from .partition.plan import KernelPlan, PartitionError, check_boundaries, partitions
from .runtime import cache as plan_cache
from .runtime.autotune import call_ms, candidates, compile_all, timed, tune
from .runtime.launch import Launch, input_buffers
from .runtime.plan import Plan, Program, before_kernels
from .runtime.remainder import compiles_remainder
from .schedule.describe import describe
from .schedule.schedule import MAX_WHOLE, Schedule, ScheduleError, build_schedule, schedulable
from .transform.decompose import decompose
from .transform.loopform import LoweringError, to_loops
from .transform.rewrite import rewrite

log = logging.getLogger("flashtensor.driver")
progress = logging.getLogger("flashtensor.progress")   # one line per tuned kernel (see flashtensor/__init__.py)


class FallbackWarning(UserWarning):
    """A piece of the program runs in eager PyTorch instead of a generated kernel."""


@dataclass
class Call:
    """What one call gives the stages: the function, its tensor arguments and where they live."""
    fn: Callable
    example: list[torch.Tensor]
    device: torch.device
    options: Options
    dynamic: frozenset[tuple[int, int]] = frozenset()    # (input, dimension) pairs traced as symbolic sizes

    def sizes(self, g: Graph) -> dict[str, int]:
        """The values of g's size symbols in this call."""
        return sizes.values(g.size_sources, self.example)

    def bucket(self, g: Graph) -> tuple:
        """This call's length bucket of g's sizes (ir.sizes.bucket), with the alignment of those striding rows."""
        return sizes.bucket(self.sizes(g), sizes.strided(g.inputs))


# ---- the stages ----------------------------------------------------------------------------------------------

def _capture(plan: Plan, call: Call) -> Graph:
    return capture(call.fn, call.example, call.dynamic)   # on fake tensors: planning never runs the program


def _decompose(plan: Plan, call: Call) -> Graph:
    return decompose(plan.captured)


def _fusable(plan: Plan, call: Call) -> Graph:
    return fusable_part(plan.decomposed)


def _loop_form(plan: Plan, call: Call) -> LoopGraph:
    loops, plan.stages["constants"] = to_loops(plan.stages["fusable"])
    return loops


def _precision(plan: Plan, call: Call) -> precision.Precision:
    return precision.decide(plan.stages["loop form"])


def _rewrites(plan: Plan, call: Call) -> LoopGraph:
    return rewrite(plan.stages["loop form"], through_half=not plan.stages["precision"].faithful)


def _facts(plan: Plan, call: Call) -> frozenset[LNode]:
    """Max reductions whose NaN the exponentials they feed carry anyway (the fast max may skip it)."""
    return frozenset(nan_absorbing_maxima(plan.stages["rewrites"]))


def _partition(plan: Plan, call: Call) -> list[list[KernelPlan]]:
    """Every candidate partition, the greedy one first."""
    return partitions(plan.stages["rewrites"], schedulable, MAX_WHOLE)


def _offered(plan: Plan, call: Call) -> list[int]:
    """The candidates the search may try, in order: every one, or only `options.candidate` where it names one."""
    ks = list(range(len(plan.stages["partition"])))
    if call.options.candidate is not None:
        ks = ks[call.options.candidate:call.options.candidate + 1]
    return ks


def _schedule(plan: Plan, call: Call) -> dict[int, list[Schedule]]:
    """Each offered candidate's kernel schedules, by candidate index: every one that schedules on a GPU (the
    tuner times them), the first on the CPU (nothing is timed). A candidate that cannot be scheduled is
    dropped (the reason goes to the debug log, and to the note when none is left)."""
    loops, out, errors = plan.stages["rewrites"], {}, []
    for c in _offered(plan, call):
        plans = plan.stages["partition"][c]
        try:
            check_boundaries(loops, plans)
            out[c] = [build_schedule(p) for p in plans]
        except (ScheduleError, PartitionError) as e:
            log.debug("partition %d rejected: %s", c, e)
            errors.append(e)
            continue
        _log_plan(c, plans, out[c])
        if not timed(call.device):
            break
    if not out:
        raise ScheduleError("; ".join(map(str, errors)), causes=[c for e in errors for c in e.causes])
    return out


def _emit(plan: Plan, call: Call) -> dict[int, list[KernelSpec]]:
    """What the emitter is given for each kernel of each candidate."""
    loops, prec = plan.stages["rewrites"], plan.stages["precision"]
    owner: dict[LNode, list[LOutput]] = {}
    for o in loops.outputs:
        owner.setdefault(o.node, []).append(o)
    out = {}
    strided = sizes.strided(plan.captured.inputs)
    for c, schedules in plan.stages["schedule"].items():
        loaded = frozenset(stored(n) for s in schedules for n in s.plan.loads)
        checks = plan_checks(loops, schedules, prec.narrowed)
        folded = folded_normalisers(schedules)
        again = _recomputed(schedules)
        out[c] = [KernelSpec(s, f"ft_kernel{k}", loops.inputs, {r: owner[r] for r in s.plan.roots if r in owner},
                             prec.faithful, plan.stages["facts"], loaded, checks[k], folded, knobs.interpret(),
                             call.options.group_programs, call.options.fixup_programs,
                             sizes=call.sizes(plan.captured), strided=strided,
                             split_programs=call.options.split_programs,
                             splits=call.options.splits, f32_dot=call.options.float32_dot(),
                             recomputed=again)
                  for k, s in enumerate(schedules)]
    return out


def _recomputed(schedules: list[Schedule]) -> frozenset[LNode]:
    """The values more than one kernel of a candidate computes (the scores a column kernel recomputes)."""
    seen: set[LNode] = set()
    twice: set[LNode] = set()
    for s in schedules:
        for n in s.nodes:
            if n not in s.boundary:
                (twice if n in seen else seen).add(n)
    return frozenset(twice)


def _tune(plan: Plan, call: Call) -> tuple[int, list[Launch]]:
    """Emit and tune each candidate's kernels in plan order, running each so the next sees its results, and
    keep the candidate whose kernels take least time in all."""
    now = call.sizes(plan.captured)
    prologue = before_kernels(plan.decomposed, _before(plan), False)
    before = prologue(call.example, {}, now) if prologue is not None else []
    bufs = input_buffers(list(call.example) + before + [c.to(call.device) for c in plan.stages["constants"]], now)
    specs = plan.stages["emit"]
    start = time.perf_counter()
    offered = len(specs)
    progress.info("planning %d partition(s) of %d fused node(s) on %s", offered, len(plan.stages["rewrites"].nodes),
                  call.device)
    found = _compiled_candidates(specs, call.options.configs, bufs, call.device)
    best: Optional[tuple[float, int, list[Launch]]] = None
    for i, (c, kernels) in enumerate(specs.items()):
        launches = []
        for k in range(len(kernels)):
            la = tune(found[c, k], bufs, call.device, after_prior=k > 0)
            la(bufs, after_prior=k > 0)
            log.debug("kernel %d source:\n%s", k, la.source.source)
            progress.info("partition %d/%d, kernel %d/%d: %s, %.1f s", i + 1, offered, k + 1, len(kernels),
                          _tuned(la), time.perf_counter() - start)
            launches.append(la)
        total = sum(la.ms for la in launches)
        log.debug("partition %d: %d kernel(s), %.4f ms", c, len(launches), total)
        if best is None or total < best[0]:
            best = (total, c, launches)
    assert best is not None
    _compile_fixups(best[2], bufs)
    progress.info("chose %d kernel(s)%s, planned in %.1f s", len(best[2]),
                  f", {best[0]:.3f} ms" if best[0] else "", time.perf_counter() - start)
    return best[1], best[2]


def _before(plan: Plan) -> list[Node]:
    """The decomposed graph's ops that run in eager before the kernels, whose values the kernels read."""
    names = {n.name: n for n in plan.decomposed.nodes}
    return [names[k] for k in prologue_names(plan.stages["fusable"])]


def _compiled_candidates(specs: Mapping[int, list[KernelSpec]], configs: Sequence[TileConfig], bufs: dict,
                         device: torch.device) -> dict[tuple[int, int], list[Launch]]:
    """Each partition's kernels (by partition and position) at every configuration, their buffers allocated and
    all of them compiled side by side at once, for tune() to time one by one."""
    found = {(c, k): candidates(spec, configs, device)
             for c, kernels in specs.items() for k, spec in enumerate(kernels)}
    for las in found.values():
        for la in las:
            la.allocate(bufs, device)
    compile_all([(la, bufs, False, k > 0) for (_, k), las in found.items() for la in las if len(las) > 1])
    return found


def _compile_fixups(launches: list[Launch], bufs: dict) -> None:
    """The chosen kernels' fixup passes compiled side by side, before the plan's first run needs them, then each
    launched once (it returns at once while the finite flag is clear): a fixup pass the device cannot load (its
    shared memory) fails here, where the search falls back to eager, not in the user's first call."""
    fixups = [la for la in launches if la.source.fixup]
    compile_all([(la, bufs, True, True) for la in fixups])
    for la in fixups:
        la(bufs, fixup=True, after_prior=True)


FRONT: list[tuple[str, Callable[[Plan, Call], Any]]] = [
    ("capture", _capture), ("decompose", _decompose), ("fusable", _fusable)]
SEARCH: list[tuple[str, Callable[[Plan, Call], Any]]] = [
    ("loop form", _loop_form), ("precision", _precision), ("rewrites", _rewrites), ("facts", _facts),
    ("partition", _partition), ("schedule", _schedule), ("emit", _emit), ("tune", _tune)]


def _run(stages: list[tuple[str, Callable[[Plan, Call], Any]]], plan: Plan, call: Call) -> None:
    for name, stage in stages:
        plan.stages[name] = stage(plan, call)
        if name in ("capture", "decompose", "rewrites"):
            log.debug("%s:\n%s", {"rewrites": "loop form"}.get(name, name + "d graph"), plan.stages[name])


# ---- the driver ----------------------------------------------------------------------------------------------

def build(fn: Callable, args: list[Any], options: Options = Options(), warned: Optional[set[str]] = None,
          dynamic: frozenset[tuple[int, int]] = frozenset(), unfused: Optional[Callable] = None,
          per_call: Callable[[], object] = lambda: None) -> Program:
    """Capture `fn` on `args` and plan it. Non-tensor arguments are baked in as constants. Each note is warned
    once per `warned` (the compiled callable's set of notes warned so far); none where `warned` is None (a trial
    plan, whose notes the caller reads). The (argument, dimension) pairs in `dynamic` are symbolic: the plan
    serves every size its guards admit (`Program.fits`). Where the program runs unfused (nothing fused, or priced
    slower than the function), it calls `fn`, or `unfused` (the same function compiled by torch.compile: the
    backend's) where the remainder would be compiled too. `per_call` is the caller's own work on each call before
    the program runs (the compiled callable's guard key and lookup): pricing times it with the plan."""
    tensor_fn, positions = _of_tensors(fn, args)
    example = [args[i] for i in positions]
    where = {p: k for k, p in enumerate(positions)}
    call = Call(tensor_fn, example, _device(example), options,
                frozenset((where[i], d) for i, d in dynamic if i in where))
    plan = Plan()
    _run(FRONT, plan, call)
    fused = plan.stages["fusable"]
    notes = fallback_notes(plan.captured, frozenset(f"{n.attrs['fn']} at {n.source}" for n in _before(plan)))
    device = call.device
    compiles = compiles_remainder(device, options.compile_remainder)
    unfused = unfused if unfused is not None and compiles else fn
    program = _programs(plan, positions, device, unfused, compiles)

    if options.kernels and not (device.type == "cuda" or (device.type == "cpu" and knobs.interpret())):
        notes.append(f"inputs on {device}: generated kernels run on CUDA devices (on the CPU only under "
                     "TRITON_INTERPRET=1); the program runs in eager PyTorch")
    elif options.kernels and fused.outputs:
        handoff = eager_handoff(plan.decomposed, fused)
        if handoff:
            notes.append(handoff)
        else:
            _plan(plan, call, args, options.cache and knobs.cache(),
                  lambda entry: _priced(plan, entry, program, unfused, args, call_ms, per_call))
    plan.entry["notes"] = list(dict.fromkeys(notes + plan.entry.get("notes", [])))
    if warned is not None:
        warn_notes(plan.notes, warned)
    return program()


def _programs(plan: Plan, positions: list[int], device: torch.device, fn: Callable,
              compile_remainder: bool) -> Callable[[], Program]:
    """The program of the plan's entry as it is when called: the one pricing timed, if it is that entry's (its
    remainder's torch.compile is then done once)."""
    made: list[tuple[dict, Program]] = []

    def program() -> Program:
        if not made or made[-1][0] is not plan.entry:
            made[:] = [(plan.entry, Program(plan, positions, device, fn, compile_remainder))]
        return made[-1][1]
    return program


def retune(prog: Program, args: list[Any], options: Options,
           per_call: Callable[[], object] = lambda: None) -> Optional[Program]:
    """A shape-generic program whose kernels are tuned again for the length bucket of `args`, its search reused
    (the first call in a bucket tunes, later ones launch), and the new entry cached under that bucket; None
    where the program was read from the cache (no search to reuse) or emitting would specialise a size."""
    plan = prog.plan
    if "emit" not in plan.stages or not prog.generic:
        return None
    tensors = [args[i] for i in prog.tensor_positions]
    now = prog.sizes(tensors)
    bucket = sizes.bucket(now, prog.strided)
    env = plan.captured.shape_env
    guards = len(env.guards)
    chosen = plan.stages["tune"][0]
    bufs = input_buffers(prog.kernel_inputs(tensors, now), now)
    specs = [dataclasses.replace(spec, sizes=now) for spec in plan.stages["emit"][chosen]]
    found = _compiled_candidates({chosen: specs}, options.configs, bufs, prog.device)
    launches = []
    for k in range(len(specs)):
        la = tune(found[chosen, k], bufs, prog.device, after_prior=k > 0)
        la(bufs, after_prior=k > 0)
        launches.append(la)
    _compile_fixups(launches, bufs)
    if len(env.guards) != guards:
        log.debug("emitting for bucket %s specialised a size; planning anew", bucket)
        return None
    kernels = with_plain_keys([la.source for la in launches], _buffer_keys(plan.stages["rewrites"]))
    fused = {k: v for k, v in plan.entry.items() if k != "priced"}     # priced again at these sizes
    entry = {**fused, "eager": False, "kernels": [encode_kernel(k) for k in kernels], "bucket": list(bucket),
             "notes": [n for n in plan.entry["notes"] if n != plan.entry.get("priced")]}
    new = Plan(plan.stages, entry)
    program = _programs(new, prog.tensor_positions, prog.device, prog.fn, prog.compile_remainder)
    if timed(prog.device) and options.eager_if_faster:
        new.entry = _priced(new, entry, program, prog.fn, args, call_ms, per_call)
    if options.cache and knobs.cache():
        plan_cache.store(plan_cache.key(plan.decomposed, args, options.key(), bucket), new.entry)
    return program()


# rounds of timing the plan and the function itself, alternately, each priced by its best: a host-bound call's
# time per call varies by tens of microseconds from one measurement to the next
_PRICE_ROUNDS = 3


def _priced(plan: Plan, entry: dict, program: Callable[[], Program], fn: Callable, args: list[Any],
            measure: Callable[[Callable[[], Any]], float], per_call: Callable[[], object]) -> dict:
    """The searched entry, or an eager one where the user's own function is faster on this call's inputs (timed on
    the GPU): launches that dominate a small program, a recompute that costs more than it saves, a remainder
    that eager PyTorch runs better. The tuner prices kernels against each other; this prices the plan against
    not compiling at all, so a compiled call is never slower than eager. Where eager runs out of memory (P at 32K
    tokens), the plan stands. A torch.compile'd remainder is timed in the evaluator too, and the entry says
    `evaluate_remainder` where that is faster: a call of the compiled graph of SnapKV's pooled window scores cost
    0.14 to 0.27 ms of host time on the H200's host, more than a few small ops evaluated one by one. The plan's
    time includes `per_call`, the compiled callable's guards: 15-20 us a call, which decided a host-bound
    program (snapkv_window on an H100, 0.90x eager)."""
    if entry["eager"]:
        return entry
    plan.entry = entry
    prog = program()

    def run() -> Any:
        per_call()
        return prog.fits(args) and prog.run(args)     # with the checks a call makes
    fused_ms = evaluated_ms = eager_ms = math.inf
    for _ in range(_PRICE_ROUNDS):
        fused_ms = min(fused_ms, measure(run))
        rem = prog.remainder
        compiled = rem.compiled if rem is not None else None
        if rem is not None and compiled is not None:     # and with the remainder in the evaluator
            rem.compiled = None
            evaluated_ms = min(evaluated_ms, measure(run))
            rem.compiled = compiled
        try:
            eager_ms = min(eager_ms, measure(lambda: fn(*args)))
        except torch.OutOfMemoryError:      # eager cannot run this call at all (a long S x S): the kernels win
            log.debug("plan %.4f ms, the function itself out of memory", fused_ms)
            return entry
    log.debug("plan %.4f ms (%.4f ms evaluating its remainder), the function itself %.4f ms", fused_ms,
              evaluated_ms, eager_ms)
    if evaluated_ms < fused_ms:
        entry = plan.entry = {**entry, "evaluate_remainder": True}
        fused_ms = evaluated_ms
    if eager_ms >= fused_ms:
        return entry
    note = (f"the fused kernels took {fused_ms:.3f} ms and eager PyTorch {eager_ms:.3f} ms on this device; the "
            "program runs in eager PyTorch")
    # the rest of the entry stays: a shape-generic one still says which sizes it serves, and is priced again for
    # another length bucket (retune)
    return {**entry, "eager": True, "priced": note, "notes": entry["notes"] + [note]}


def candidate_plans(fn: Callable, args: list[Any], options: Options = Options(),
                    dynamic: frozenset[tuple[int, int]] = frozenset()) -> Iterator[tuple[int, Plan]]:
    """Each partition candidate's plan for fn(*args), searched up to its kernel specs and not tuned, on the
    arguments' device (meta tensors work: nothing runs), generic in the (tensor argument, dimension) pairs of
    `dynamic`. For tools that read the generated kernels without running them (scripts/kernel_hashes.py,
    scripts/compile_sm90.py); those that do not schedule are left out."""
    tensor_fn, positions = _of_tensors(fn, args)
    example = [args[i] for i in positions]
    k, count = 0, 1
    while k < count:
        call = Call(tensor_fn, example, torch.device("cpu"), dataclasses.replace(options, candidate=k), dynamic)
        plan = Plan()
        _run(FRONT, plan, call)
        if not plan.stages["fusable"].outputs:
            return
        try:
            _run(SEARCH[:-1], plan, call)      # every stage but tune
        except (LoweringError, PartitionError, ScheduleError):
            if "partition" not in plan.stages:
                return
        count = len(plan.stages["partition"])
        if "emit" in plan.stages:       # a candidate that does not schedule is skipped, as the search skips it
            yield k, plan
        k += 1


def _of_tensors(fn: Callable, args: list[Any]) -> tuple[Callable, list[int]]:
    """fn as a function of its tensor arguments alone (the others baked in, as `args` has them), and where those
    stand in `args`."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    @functools.wraps(fn)      # notes and errors name the user's function and its tensors' parameters
    def tensor_fn(*tensors: torch.Tensor) -> Any:
        full = list(args)
        for i, t in zip(positions, tensors):
            full[i] = t
        return fn(*full)
    names = getattr(fn, "leaf_names", None) or parameters(fn)
    tensor_fn.arg_names = [names[i] if i < len(names) else "" for i in positions]   # type: ignore[attr-defined]
    return tensor_fn, positions


def warn_notes(notes: Iterable[str], warned: set[str]) -> None:
    """Warn each note not in `warned` (a compiled callable's notes warned so far), and add it there."""
    for msg in notes:
        if msg not in warned:
            warned.add(msg)
            warnings.warn(f"FlashTensor: {msg}", FallbackWarning, stacklevel=user_stacklevel())


def _device(example: Sequence[torch.Tensor]) -> torch.device:
    """The device of the tensor arguments (capture runs arguments on several devices in eager PyTorch)."""
    if not example:
        raise TypeError("FlashTensor compiles functions of tensors: this call passes no tensor argument")
    return example[0].device


def _plan(plan: Plan, call: Call, args: list[Any], use_cache: bool, price: Callable[[dict], dict]) -> None:
    """The plan's entry: from the plan cache when it has it, else by searching (priced against eager on a GPU),
    then cached."""
    bucket = call.bucket(plan.captured)
    key = plan_cache.key(plan.decomposed, args, call.options.key(), bucket) if use_cache else None
    entry = plan_cache.load(key) if key else None
    if entry is not None and not _admits(entry, call):
        entry = None        # traced elsewhere at other lengths of the bucket, with guards this call fails
    plan.cached = entry is not None
    if entry is None:
        entry, keep = _search(plan, call)
        if timed(call.device) and call.options.eager_if_faster:
            entry = price(entry)
        if key and keep:
            plan_cache.store(key, entry)
    plan.entry = entry


def _admits(entry: dict, call: Call) -> bool:
    """Whether a cached entry's guards hold at the call's sizes (a static entry's key holds its shapes)."""
    return sizes.holds(entry.get("guards", "True"), sizes.values(entry.get("sizes", {}), call.example))


def _search(plan: Plan, call: Call) -> tuple[dict, bool]:
    """The search stages; returns the plan as a cache entry (plain data), and whether to keep it on disk (not a
    compiler bug's fallback: the next process should plan again)."""
    try:
        _run(SEARCH, plan, call)
    except (LoweringError, PartitionError, ScheduleError) as e:
        log.debug("no fused plan: %s", e)
        return {"eager": True, "notes": [f"no fused plan: {reason(e.causes)}; the program runs in eager PyTorch"]}, True
    except Exception as e:  # a bug in a stage must cost the user speed, not the answer
        log.debug("internal compiler error", exc_info=True)
        return {"eager": True, "notes": [f"internal compiler error ({type(e).__name__}: {e}), please report it; "
                                         "the program runs in eager PyTorch"]}, False
    loops, fused = plan.stages["rewrites"], plan.stages["fusable"]
    chosen, launches = plan.stages["tune"]
    kernels = with_plain_keys([la.source for la in launches], _buffer_keys(loops))
    summary = {"loop form": str(loops), "properties": [describe(s) for s in plan.stages["schedule"][chosen]]}
    g = plan.captured
    return {"eager": False, "kernels": [encode_kernel(k) for k in kernels],
            "sizes": dict(g.size_sources), "guards": sizes.guards(g.shape_env) if g.shape_env else "True",
            "static": _static_sizes(call.example, g.size_sources),
            "bucket": list(call.bucket(g)),
            "consts": [c.cpu() for c in plan.stages["constants"]], "prologue": prologue_names(fused),
            "results": [(n.name, ("out", i)) for i, n in enumerate(fused.outputs)], "notes": [],
            "summary": summary}, True


def _static_sizes(example: list[torch.Tensor], sources: dict[str, tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(input, dimension, size) of every dimension a shape-generic plan was traced with as a constant: its kernels
    hold that size, so a call of another size there does not fit the plan."""
    symbolic = set(sources.values())
    return [(i, d, n) for i, t in enumerate(example) for d, n in enumerate(t.shape)
            if sources and (i, d) not in symbolic]


def _log_plan(c: int, plans: list[KernelPlan], schedules: list[Schedule]) -> None:
    if not log.isEnabledFor(logging.DEBUG):
        return
    for k, (p, s) in enumerate(zip(plans, schedules)):
        log.debug("partition %d kernel %d plan: stores %s, loads %s", c, k, p.roots,
                  sorted(p.loads, key=lambda n: n.name))
        log.debug("partition %d kernel %d schedule: batch %s, row %s, loop %s, whole %s, %d pass(es), skip %s",
                  c, k, s.batch, s.row, s.loop, s.whole, s.passes, [" and ".join(map(str, reg)) for reg in s.skip])


def _tuned(la: Launch) -> str:
    how = la.source.config
    return f"{la.ms:.3f} ms ({how})" if la.ms else f"not timed on this device ({how})"


def _buffer_keys(loops: LoopGraph) -> Callable[[Any], tuple]:
    """Plain keys for the emitter's buffer sources: ("in", i) stays, the k-th loop output becomes ("out", k),
    an intermediate node ("tmp", j) in order of first use."""
    keys: dict[Any, tuple] = {o: ("out", i) for i, o in enumerate(loops.outputs)}

    def of(source: Any) -> tuple:
        if isinstance(source, tuple):
            return source
        return keys.setdefault(source, ("tmp", len(keys) - len(loops.outputs)))
    return of
