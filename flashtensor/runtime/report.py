"""`ft.explain`: what the compiler found and generated for one call signature."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..pipeline import Program
from .compiled import Compiled


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str        # "input" (program input), "output" (program output), "intermediate" (between kernels)


@dataclass
class KernelInfo:
    name: str
    triton_source: str
    grid: tuple[int, int]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    num_warps: int
    num_stages: int
    blocks: dict[str, int]


@dataclass
class KernelProperties:
    name: str
    roles: list[str]            # one line per loop variable
    loop: str                   # the loop variable and how its reductions are carried
    skipped: list[str]          # regions whose tiles the loop skips
    folded: list[str]           # regions whose tiles run a body with the facts' constants in place


class Report:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.kernels: list[KernelInfo] = []
        self.properties: list[KernelProperties] = []
        for k in program.kernels:
            ins, outs = [], []
            for b in k.buffers:
                info = TensorInfo(b.name, b.shape, b.dtype, b.kind)
                (outs if b.written else ins).append(info)
            self.kernels.append(KernelInfo(k.name, k.source, k.grid, ins, outs, k.num_warps, k.num_stages, k.blocks))
        for k, s in zip(program.kernels, program.schedules):
            carried = []
            for a in s.accums.values():
                how = [f"{a.kind} over {s.loop} (pass {a.pass_ + 1})"]
                if a.rescale:
                    how.append("rescaled by running max " + ", ".join(d.name for d, _ in a.rescale))
                if a.pulled:
                    how.append(f"{len(a.pulled)} loop-invariant factor(s) moved out of the sum")
                if s.stops_early(a.pass_):
                    how.append("the loop stops once every one is true")
                carried.append(f"{a.node.name}: " + "; ".join(how))
            self.properties.append(KernelProperties(
                k.name, s.roles.describe() + [f"{v}<{v.extent}>: batch (one program per value and row tile)" for v in s.batch],
                f"loop over {s.loop} in {s.passes} pass(es): " + ("; ".join(carried) or "no reductions"),
                [f"{h} >= 0" for h in s.skip], [f"{h} >= 0" for h in s.special]))

    def __str__(self) -> str:
        p = self.program
        parts = ["== captured graph ==", str(p.captured), "", "== decomposed graph ==", str(p.decomposed)]
        if p.loops is not None:
            parts += ["", "== loop form ==", str(p.loops)]
        for k, src, props in zip(self.kernels, p.kernels, self.properties):
            parts += ["", f"== kernel {k.name}: grid {k.grid}, {src.config} =="]
            parts += ["roles:"] + [f"  {r}" for r in props.roles]
            parts += [f"carried: {props.loop}"]
            parts += ["skipped tiles: " + (", ".join(props.skipped) or "none")]
            if props.folded:
                parts += ["constant-folded tiles: " + ", ".join(props.folded)]
            parts += ["reads: " + ", ".join(f"{t.name}{list(t.shape)} {t.kind}" for t in k.inputs)]
            parts += ["writes: " + ", ".join(f"{t.name}{list(t.shape)} {t.kind}" for t in k.outputs)]
            parts += ["", k.triton_source]
        if p.notes:
            parts += ["", "== notes =="] + [f"- {n}" for n in p.notes]
        return "\n".join(parts)


def explain(fn: Callable, *args: Any) -> Report:
    """Compile `fn` (a function or an `ft.compile` result) for `args` and describe the result (graphs,
    properties, plan, kernels). It always plans from scratch and bypasses the plan cache (no read, no
    write): a cached plan holds only what launching needs, not the loop form and schedules shown here."""
    if isinstance(fn, Compiled):
        fn = Compiled(fn.fn, **{**fn.options, "cache": False})
    else:
        fn = Compiled(fn, cache=False)
    return Report(fn.program_for(args))
