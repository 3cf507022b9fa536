"""The compiler pipeline end to end: capture -> decompose -> loop form -> partition ->
schedule -> Triton source -> executable Program.

Each stage's output is kept on the Program so `explain` can show it and tests can
evaluate it against eager. What a stage cannot handle falls back to eager PyTorch for
that piece, with the reason in `Program.notes` and a FallbackWarning.

Data flows one way: the search (loop form to tuned kernels) produces a plain-data plan
entry, the on-disk cache (runtime/cache.py) stores it, and the Program launches from
that entry whether it was just searched or read back by a later process. With
FLASHTENSOR_DEBUG=1 every stage's IR and the search's decisions are logged.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from .analysis.facts import input_domains, nan_absorbing_maxima, narrowed_inputs
from .codegen.emit import KernelSource, emit_kernel, folded_normalisers, tile_checks
from .codegen.schedule import MAX_WHOLE, Schedule, ScheduleError, build_schedule
from .frontend.capture import capture
from .ir.evaluate import evaluate
from .ir.graph import Graph, Node, topo_order
from .ir.loops import LNode, LOutput, LoopGraph
from .partition.plan import KernelPlan, PartitionError, partitions
from .runtime import cache as plan_cache
from .runtime.autotune import tune
from .runtime.launch import Launch, input_buffers, interpreting, load_kernel, run_kernels
from .transform.decompose import decompose
from .transform.exp2 import fold_exp2
from .transform.loopform import LoweringError, to_loops


log = logging.getLogger(__name__)
progress = logging.getLogger("flashtensor.progress")   # one line per tuned kernel (see flashtensor/__init__.py)


class FallbackWarning(UserWarning):
    """A piece of the program runs in eager PyTorch instead of a generated kernel."""


@dataclass
class Program:
    captured: Graph
    decomposed: Graph
    tensor_positions: list[int]          # which call arguments are the graph's tensor inputs
    single_output: bool
    notes: list[str] = field(default_factory=list)
    cached: bool = False                 # the plan was read from the on-disk cache, not searched
    # stage outputs of the search; left empty when the plan came from the cache
    fused: Optional[Graph] = None        # the part of `decomposed` that runs as kernels
    loops: Optional[LoopGraph] = None
    schedules: list[Schedule] = field(default_factory=list)
    # what running needs; buffers are keyed ("in", i), ("out", k), ("tmp", j) and ("finite",), the flag the
    # kernels' finite check sets (runtime/launch.py zeroes it per call)
    consts: list[torch.Tensor] = field(default_factory=list)   # already on the plan's device
    kernels: list[KernelSource] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    results: list[tuple[Node, tuple]] = field(default_factory=list)  # fused-graph output, its buffer key
    order: Optional[list[Node]] = None   # set by the first run: what it evaluates in eager, in order

    def run(self, args: Sequence[Any]) -> Any:
        tensors = [args[i] for i in self.tensor_positions]
        env: dict[Node, torch.Tensor] = {}
        if self.launches:
            bufs = run_kernels(self.launches, list(tensors) + self.consts, tensors[0].device)
            env = {n: bufs[k] for n, k in self.results}
        if self.order is None:     # the nodes eager still computes, the same on every call
            self.order = topo_order(self.decomposed.outputs, stop=set(self.decomposed.inputs) | set(env))
        outs = evaluate(self.decomposed, tensors, env, self.order)
        return outs[0] if self.single_output else tuple(outs)


def _device(example: Sequence[torch.Tensor]) -> torch.device:
    """The one device every tensor argument is on; a precise error instead of a failure inside a kernel."""
    if not example:
        raise TypeError("FlashTensor compiles functions of tensors: this call passes no tensor argument")
    devices = {t.device for t in example}
    if len(devices) > 1:
        raise ValueError("FlashTensor: all tensor arguments must be on one device, got "
                         + ", ".join(f"tensor argument {i} on {t.device}" for i, t in enumerate(example)))
    return example[0].device


def build(fn: Callable, args: list[Any], **options: Any) -> Program:
    """Capture `fn` on `args` and plan it. Non-tensor arguments are baked in as constants.
    Options: kernels=False stops after decomposition; cache=False neither reads nor writes the plan cache."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    returns_tensor = []

    def tensor_fn(*tensors):
        full = list(args)
        for i, t in zip(positions, tensors):
            full[i] = t
        out = fn(*full)
        returns_tensor.append(isinstance(out, torch.Tensor))
        return out

    example = [args[i] for i in positions]
    device = _device(example)
    captured = capture(tensor_fn, example)   # on fake tensors: planning never runs the program itself
    prog = Program(captured, decompose(captured), positions, returns_tensor[-1])
    log.debug("captured graph:\n%s", prog.captured)
    log.debug("decomposed graph:\n%s", prog.decomposed)
    for n in captured.nodes:
        if n.op == "opaque":
            prog.notes.append(f"no lowering for {n.attrs['fn']} at {n.source or 'unknown source'}; "
                              "it and what depends on it run in eager PyTorch")
    if options.get("kernels", True) and not (device.type == "cuda" or (device.type == "cpu" and interpreting())):
        prog.notes.append(f"inputs on {device}: generated kernels run on CUDA devices (on the CPU only under "
                          "TRITON_INTERPRET=1); the program runs in eager PyTorch")
    elif options.get("kernels", True):
        _plan(prog, example, args, options.get("cache", True) and plan_cache.enabled())
    for msg in prog.notes:
        warnings.warn(f"FlashTensor: {msg}", FallbackWarning, stacklevel=4)
    return prog


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


def _plan(prog: Program, example: list[torch.Tensor], args: list[Any], use_cache: bool) -> None:
    """Give `prog` its kernels: from the plan cache when it has them, else by searching (then cached)."""
    fused = fusable_part(prog.decomposed)
    if not fused.outputs:
        return
    key = plan_cache.key(prog.decomposed, args) if use_cache else None
    entry = plan_cache.load(key) if key else None
    prog.cached = entry is not None
    if entry is None:
        entry = _search(prog, fused, example)
        if key:
            plan_cache.store(key, entry)
    device = example[0].device
    nodes = {n.name: n for n in prog.decomposed.nodes}
    prog.notes += entry["notes"]
    prog.consts = [c.to(device) for c in entry["consts"]]
    prog.kernels = [plan_cache.decode_kernel(k) for k in entry["kernels"]]
    prog.launches = [Launch(k, load_kernel(k)) for k in prog.kernels]
    prog.results = [(nodes[name], k) for name, k in entry["results"]]


def _timed(device: torch.device) -> bool:
    """Whether the search times every partition (on a GPU) or takes the first (on the CPU, where the
    interpreter's times say nothing)."""
    return device.type == "cuda" and not interpreting()


def _search(prog: Program, fused: Graph, example: list[torch.Tensor]) -> dict:
    """Loop form, partition, schedule, emission and tuning; keeps the stage outputs on `prog` and
    returns the plan as a cache entry (plain data)."""
    device = example[0].device
    try:
        loops, consts = to_loops(fused)
        # fp16 only: bf16's coarser rounding at different points than eager's costs more than it buys. An
        # input cast to fp16 is rounded whatever the outputs: its zeros and infs are eager's (a log of them)
        narrowed = narrowed_inputs(loops)
        faithful = (any(o.dtype == torch.float32 for o in loops.outputs) and
                    any(dt == torch.float16 for _, dt in loops.inputs)) or torch.float16 in narrowed.values()
        loops = fold_exp2(loops, through_half=not faithful)
        log.debug("loop form:\n%s", loops)
        nan_free = frozenset(nan_absorbing_maxima(loops))
        bufs = input_buffers(list(example) + [c.to(device) for c in consts])
        candidates = partitions(loops, _accept, MAX_WHOLE)
        if not _timed(device):
            candidates = candidates[:1]
        start = time.perf_counter()
        progress.info("planning %d partition(s) of %d fused node(s) on %s", len(candidates), len(loops.nodes), device)
        best, errors = None, []
        for c, plans in enumerate(candidates):
            try:
                schedules = [build_schedule(p) for p in plans]
                _check_intermediates(loops, schedules)
            except ScheduleError as e:
                log.debug("partition %d rejected: %s", c, e)
                errors.append(str(e))
                continue
            _log_plan(c, plans, schedules)
            launches = _tune_kernels(loops, schedules, faithful, narrowed, nan_free, bufs, device,
                                     lambda k, la: progress.info(
                                         "partition %d/%d, kernel %d/%d: %s, %.1f s", c + 1, len(candidates), k + 1,
                                         len(schedules), _tuned(la), time.perf_counter() - start))
            total = sum(la.ms for la in launches)
            log.debug("partition %d: %d kernel(s), %.4f ms", c, len(launches), total)
            if best is None or total < best[0]:
                best = (total, schedules, launches)
        if best is None:
            raise ScheduleError("; ".join(errors))
        _, schedules, launches = best
        kernels = [la.source for la in launches]
        progress.info("chose %d kernel(s)%s, planned in %.1f s", len(kernels),
                      f", {best[0]:.3f} ms" if best[0] else "", time.perf_counter() - start)
    except (LoweringError, PartitionError, ScheduleError) as e:
        log.debug("no fused plan: %s", e)
        return {"kernels": [], "consts": [], "results": [],
                "notes": [f"no fused plan: {e}; the program runs in eager PyTorch"]}
    except Exception as e:  # a bug in a stage must cost the user speed, not the answer
        log.exception("internal compiler error")
        return {"kernels": [], "consts": [], "results": [],
                "notes": [f"internal compiler error ({type(e).__name__}: {e}), please report it; "
                          "the program runs in eager PyTorch"]}
    prog.fused, prog.loops, prog.schedules = fused, loops, schedules
    keys = _buffer_keys(loops)
    kernels = [dataclasses.replace(k, buffers=[dataclasses.replace(b, source=keys(b.source)) for b in k.buffers])
               for k in kernels]
    return {"kernels": [plan_cache.encode_kernel(k) for k in kernels], "consts": [c.cpu() for c in consts],
            "results": [(n.name, ("out", i)) for i, n in enumerate(fused.outputs)], "notes": []}


def _log_plan(c: int, plans: list[KernelPlan], schedules: list[Schedule]) -> None:
    if not log.isEnabledFor(logging.DEBUG):
        return
    for k, (p, s) in enumerate(zip(plans, schedules)):
        log.debug("partition %d kernel %d plan: stores %s, loads %s", c, k, p.roots, sorted(p.loads, key=lambda n: n.name))
        log.debug("partition %d kernel %d schedule: batch %s, row %s, loop %s, whole %s, %d pass(es), %d dot(s), skip %s",
                  c, k, s.batch, s.row, s.loop, s.whole, s.passes, len(s.dots), [str(h) for h in s.skip])


def _tuned(la: Launch) -> str:
    how = la.source.config
    return f"{la.ms:.3f} ms ({how})" if la.ms else f"not timed on this device ({how})"


def _tune_kernels(loops: LoopGraph, schedules: list[Schedule], faithful: bool, narrowed: dict,
                  nan_free: frozenset, bufs: dict, device: torch.device,
                  tuned: Callable[[int, Launch], None]) -> list[Launch]:
    """Emit and tune each kernel in plan order, running it so the next one sees its results; `tuned`
    hears of each. The check tests an input that a cast narrows (`narrowed`) as narrowed."""
    owner: dict[LNode, list[LOutput]] = {}
    for o in loops.outputs:
        owner.setdefault(o.node, []).append(o)
    loaded = frozenset(n for s in schedules for n in s.plan.loads)
    # the finite check (codegen.emit.emit_kernel): every floating input is checked once, by the first
    # kernel whose tiles read it whole (codegen.emit.tile_checks), or else in equal parts, kernel k's
    # programs checking pieces of the k-th; an input a log, a square root or a division reads must also
    # lie in that op's domain
    domains = input_domains(loops)
    check = {i: domains.get(i) for i, (_, dt) in enumerate(loops.inputs) if dt.is_floating_point}
    slots = len(schedules) if check and any(s.skip or s.special for s in schedules) else 0
    reads = [tile_checks(s, loops.inputs) for s in schedules] if slots else []
    tiled: list[dict] = [{} for _ in schedules]
    flat = {}
    for i, dom in check.items():
        k = next((k for k, r in enumerate(reads) if i in r), None)
        if k is None:
            flat[i] = dom
        else:
            tiled[k][i] = (reads[k][i], dom)
    folded = folded_normalisers(schedules)
    ftz = frozenset(i for i, dom in check.items() if dom == "positive") if slots else frozenset()
    launches = []
    for k, s in enumerate(schedules):
        roots = {r: owner[r] for r in s.plan.roots if r in owner}
        la = tune(lambda cfg: emit_kernel(s, f"ft_kernel{k}", loops.inputs, roots, *cfg, faithful=faithful,
                                          nan_free=nan_free, loaded_later=loaded, slots=slots, check=flat,
                                          part=k, tiled=tiled[k], folded=folded, ftz=ftz, narrowed=narrowed),
                  bufs, device)
        la(bufs)
        log.debug("kernel %d source:\n%s", k, la.source.source)
        tuned(k, la)
        launches.append(la)
    return launches


def _buffer_keys(loops: LoopGraph) -> Callable[[Any], tuple]:
    """Plain keys for the emitter's buffer sources: ("in", i) stays, the k-th loop output becomes ("out", k),
    an intermediate node ("tmp", j) in order of first use."""
    keys: dict[Any, tuple] = {o: ("out", i) for i, o in enumerate(loops.outputs)}

    def of(source: Any) -> tuple:
        if isinstance(source, tuple):
            return source
        return keys.setdefault(source, ("tmp", len(keys) - len(loops.outputs)))
    return of


def _check_intermediates(loops: LoopGraph, schedules: list[Schedule]) -> None:
    """No value larger than the program's own inputs and outputs may cross a kernel boundary (DESIGN 3.4)."""
    largest = max(math.prod(shape) for shape, _ in loops.inputs + [(o.shape, None) for o in loops.outputs])
    stored = {o.node for o in loops.outputs}
    for s in schedules:
        for r in s.plan.roots:
            if r not in stored and math.prod(v.extent for v in r.vars) > largest:
                raise ScheduleError(f"plan would pass a {[v.extent for v in r.vars]} intermediate between kernels")


def _accept(plan: KernelPlan) -> Optional[str]:
    """The partition search's test for a merge: can the merged kernel be scheduled?"""
    try:
        build_schedule(plan)
    except ScheduleError as e:
        log.debug("merge rejected (stores %s): %s", plan.roots, e)
        return str(e)
    log.debug("merge accepted: stores %s", plan.roots)
    return None
