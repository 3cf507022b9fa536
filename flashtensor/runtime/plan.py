"""The plan record (every stage's output by name) and the program that runs it.

The driver fills a `Plan` stage by stage; what launching needs, and what `explain` shows of the
search (the loop form's text, each kernel's properties), is plain data in `Plan.entry`, which the
on-disk cache stores, so a plan read back in a new process launches and explains like a searched one.
A `Program` is built once from a plan and never changes: it launches the kernels and runs what is left
in eager PyTorch (runtime/remainder.py); a plan with nothing fused calls the user's own function, since
the decomposed graph evaluated op by op is slower than the ops the user wrote.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from ..codegen.artifact import INT32_REACH, KernelSource, decode_kernel
from ..ir.graph import Graph, Node
from ..ir.sizes import bucket, evaluate, holds, strided, values
from .launch import Launch, load_kernel, memoised, run_kernels
from .remainder import Remainder


@dataclass
class Plan:
    """One function at one argument signature. `stages` maps each stage's name to its output, for the stages
    that ran (a plan from the cache has capture and decompose only); `entry` is the plain-data plan: kernels
    (as dicts), constants, which buffer holds each fused output, notes, `summary` for explain,
    `evaluate_remainder` (the pricing found the evaluator faster than torch.compile for the remainder), and `eager`:
    True where nothing is fused, or where the kernels were priced slower than eager (`priced` says so; the rest of
    the entry stays, for driver.retune), and the program calls the user's function."""
    stages: dict[str, Any] = field(default_factory=dict)
    entry: dict[str, Any] = field(default_factory=dict)
    cached: bool = False          # the entry was read from the on-disk cache, not searched

    @property
    def captured(self) -> Graph:
        return self.stages["capture"]

    @property
    def decomposed(self) -> Graph:
        return self.stages["decompose"]

    @property
    def notes(self) -> list[str]:
        return self.entry.get("notes", [])

    @property
    def eager(self) -> bool:
        return self.entry.get("eager", True)

    @property
    def kernels(self) -> list[KernelSource]:
        return [decode_kernel(k) for k in self.entry.get("kernels", [])]

    @property
    def summary(self) -> dict[str, Any]:
        """What explain shows of the search: "loop form" (text) and "properties" (one dict per kernel)."""
        return self.entry.get("summary", {})


class Program:
    """Runs a plan: the kernels, then the eager remainder; or, with nothing fused, `fn` (the user's function)
    on the call's own arguments. A program serves one argument signature, non-tensor values included."""

    def __init__(self, plan: Plan, tensor_positions: list[int], device: torch.device, fn: Callable,
                 compile_remainder: bool = False) -> None:
        self.plan = plan
        self.fn = fn
        self.tensor_positions = tensor_positions     # which call arguments are the graph's tensor inputs
        g = plan.decomposed
        nodes = {n.name: n for n in g.nodes}
        self.kernels = [] if plan.eager else plan.kernels
        self.consts = [c.to(device) for c in plan.entry.get("consts", [])]
        self.launches = [Launch(k, load_kernel(k)) for k in self.kernels]
        self.results: list[tuple[Node, tuple]] = [(nodes[name], k) for name, k in plan.entry.get("results", [])]
        compiles = compile_remainder and not plan.entry.get("evaluate_remainder", False)
        self.before = [nodes[name] for name in plan.entry.get("prologue", [])]
        self.prologue = before_kernels(g, self.before, compiles)
        self.remainder = None if plan.eager else Remainder(g, [n for n, _ in self.results] + self.before, compiles)
        self.device = device
        self.compile_remainder = compile_remainder
        self.size_sources: dict[str, tuple[int, int]] = plan.entry.get("sizes", {})
        self.guards: str = plan.entry.get("guards", "True")
        self.static: list[tuple[int, int, int]] = plan.entry.get("static", [])
        self.bucket: tuple = tuple(tuple(b) for b in plan.entry.get("bucket", ()))   # the tuned bucket
        self.strided = strided(plan.captured.inputs)     # sizes whose alignment the bucket holds (ir.sizes.bucket)
        # the int32 tile offsets' reach, all kernels' in one expression (evaluated on each call)
        self._at: dict[tuple, Any] = {}      # Program.at by the tensors' shapes
        self._kept: dict[tuple, Any] = {}    # the last call's buffers and masks by thread and stream (run_kernels)
        self._steps: dict[tuple, Any] = {}   # each sizes' launches (run_kernels)
        self.reach = f"max([{', '.join(dict.fromkeys(x for k in self.kernels for x in k.reaches))}], default=0)"

    @property
    def generic(self) -> bool:
        """Whether the plan serves more than its traced sizes (its kernels take sizes as arguments)."""
        return bool(self.size_sources)

    def sizes(self, tensors: Sequence[torch.Tensor]) -> dict[str, int]:
        return values(self.size_sources, tensors)

    def at(self, tensors: Sequence[torch.Tensor]) -> Optional[tuple[dict[str, int], tuple]]:
        """The call's sizes and their length bucket where the plan serves the tensors' shapes, else None; worked
        out once per shapes."""
        return memoised(self._at, tuple([t.shape for t in tensors]), lambda: self._serves(tensors))

    def _serves(self, tensors: Sequence[torch.Tensor]) -> Optional[tuple[dict[str, int], tuple]]:
        """Where the call's sizes are those a shape-generic plan holds constant, satisfy its guards and keep its
        kernels' int32 tile offsets in range (a static plan serves its key): the sizes and their bucket."""
        if not all(tensors[i].shape[d] == n for i, d, n in self.static):
            return None
        now = self.sizes(tensors)
        if self.generic and not (holds(self.guards, now) and evaluate(self.reach, now) < INT32_REACH):
            return None
        return now, bucket(now, self.strided)

    def fits(self, args: Sequence[Any]) -> bool:
        return not self.generic or self.at([args[i] for i in self.tensor_positions]) is not None

    @property
    def notes(self) -> list[str]:
        return self.plan.notes

    @property
    def cached(self) -> bool:
        return self.plan.cached

    def kernel_inputs(self, tensors: Sequence[torch.Tensor], sizes: Optional[dict[str, int]]) -> list[torch.Tensor]:
        """What the kernels read: the program's tensors, the values of the ops run before them, the constants."""
        before = self.prologue(tensors, {}, sizes) if self.prologue is not None else []
        return list(tensors) + before + self.consts

    def run(self, args: Sequence[Any]) -> Any:
        if self.remainder is None:
            return self.fn(*args)
        tensors = [args[i] for i in self.tensor_positions]
        at = self.at(tensors)
        assert at is not None, "a program ran at sizes it does not serve"
        now = at[0]
        ins = self.kernel_inputs(tensors, now)
        bufs = run_kernels(self.launches, ins, tensors[0].device, now, self._kept, self._steps)
        env = {n: bufs[k] for n, k in self.results}
        env.update(zip(self.before, ins[len(tensors):]))
        outs = self.remainder(tensors, env, now)
        return self.plan.decomposed.result(outs)


def before_kernels(g: Graph, before: list[Node], compiled: bool) -> Optional[Remainder]:
    """The eager evaluation of the ops that run before the kernels (partition.fusable.prologue), None if none."""
    return Remainder(Graph(g.inputs, before, g.nodes), [], compiled) if before else None
