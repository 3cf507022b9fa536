"""The compiler pipeline end to end: capture -> decompose -> loop form -> partition ->
schedule -> Triton source -> executable Program.

Each stage's output is kept on the Program so `explain` can show it and tests can
evaluate it against eager. What a stage cannot handle falls back to eager PyTorch for
that piece, with the reason in `Program.notes` and a FallbackWarning.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from .codegen.emit import KernelSource, emit_kernel
from .codegen.schedule import Schedule, ScheduleError, build_schedule
from .frontend.capture import capture
from .ir.evaluate import evaluate
from .ir.graph import Graph, Node, topo_order
from .ir.loops import LoopGraph
from .partition.plan import KernelPlan, partition
from .runtime.autotune import tune
from .runtime.launch import Launch, input_buffers, run_kernels
from .transform.decompose import decompose
from .transform.loopform import LoweringError, to_loops


class FallbackWarning(UserWarning):
    """A piece of the program runs in eager PyTorch instead of a generated kernel."""


@dataclass
class Program:
    captured: Graph
    decomposed: Graph
    tensor_positions: list[int]          # which call arguments are the graph's tensor inputs
    single_output: bool
    notes: list[str] = field(default_factory=list)
    fused: Optional[Graph] = None        # the part of `decomposed` that runs as kernels
    loops: Optional[LoopGraph] = None
    consts: list[torch.Tensor] = field(default_factory=list)
    schedules: list[Schedule] = field(default_factory=list)
    kernels: list[KernelSource] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)

    def run(self, args: Sequence[Any]) -> Any:
        tensors = [args[i] for i in self.tensor_positions]
        env: dict[Node, torch.Tensor] = {}
        if self.launches:
            device = tensors[0].device
            bufs = run_kernels(self.launches, list(tensors) + [c.to(device) for c in self.consts], device)
            env = {n: bufs[o] for n, o in zip(self.fused.outputs, self.loops.outputs)}
        outs = evaluate(self.decomposed, tensors, env)
        return outs[0] if self.single_output else tuple(outs)


def build(fn: Callable, args: list[Any], **options: Any) -> Program:
    """Capture `fn` on `args` and plan it. Non-tensor arguments are baked in as constants."""
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    def tensor_fn(*tensors):
        full = list(args)
        for i, t in zip(positions, tensors):
            full[i] = t
        return fn(*full)

    example = [args[i] for i in positions]
    with torch.no_grad():
        eager_out = fn(*args)
    single = isinstance(eager_out, torch.Tensor)
    captured = capture(tensor_fn, example)
    prog = Program(captured, decompose(captured), positions, single)
    for n in captured.nodes:
        if n.op == "opaque":
            prog.notes.append(f"no lowering for {n.attrs['fn']} at {n.source or 'unknown source'}; "
                              "it and what depends on it run in eager PyTorch")
    if options.get("kernels", True):
        _plan(prog, example)
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


def _plan(prog: Program, example: list[torch.Tensor]) -> None:
    fused = fusable_part(prog.decomposed)
    if not fused.outputs:
        return
    device = example[0].device
    try:
        loops, consts = to_loops(fused)
        schedules = [build_schedule(p) for p in partition(loops, _accept)]
        _check_intermediates(loops, schedules)
        owner = {o.node: o for o in loops.outputs}
        # fp16 only: bf16's coarser rounding at different points than eager's costs more than it buys
        faithful = any(o.dtype == torch.float32 for o in loops.outputs) and \
            any(dt == torch.float16 for _, dt in loops.inputs)
        bufs = input_buffers(list(example) + [c.to(device) for c in consts])
        launches = []
        for k, s in enumerate(schedules):
            roots = {r: owner[r] for r in s.plan.roots if r in owner}
            la = tune(lambda cfg: emit_kernel(s, f"ft_kernel{k}", loops.inputs, roots, *cfg, faithful=faithful),
                      bufs, device)
            la(bufs)
            launches.append(la)
    except (LoweringError, ScheduleError) as e:
        prog.notes.append(f"no fused plan: {e}; the program runs in eager PyTorch")
        return
    prog.fused, prog.loops, prog.consts, prog.schedules = fused, loops, consts, schedules
    prog.launches = launches
    prog.kernels = [la.source for la in launches]


def _check_intermediates(loops: LoopGraph, schedules: list[Schedule]) -> None:
    """No value larger than the program's own inputs and outputs may cross a kernel boundary (DESIGN 3.4)."""
    largest = max(math.prod(shape) for shape, _ in loops.inputs + [(o.shape, None) for o in loops.outputs])
    stored = {o.node for o in loops.outputs}
    for s in schedules:
        for r in s.plan.roots:
            if r not in stored and math.prod(v.extent for v in r.vars) > largest:
                raise ScheduleError(f"plan would pass a {[v.extent for v in r.vars]} intermediate between kernels")


def _accept(plan: KernelPlan) -> Optional[str]:
    try:
        build_schedule(plan)
        return None
    except ScheduleError as e:
        return str(e)
