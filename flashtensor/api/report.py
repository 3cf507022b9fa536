"""`ft.explain`: what the compiler found and generated for one call signature."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..options import Options
from ..runtime.plan import Plan
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
    grid: tuple[int]
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
    runtime: list[str] = field(default_factory=list)   # regions over masks read from tensors, skipped at run time


class Report:
    """What the compiler found and generated for one call signature (from a fresh search or the plan cache)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.kernels: list[KernelInfo] = []
        for k in plan.kernels:
            ins: list[TensorInfo] = []
            outs: list[TensorInfo] = []
            for b in k.buffers:
                info = TensorInfo(b.name, b.shape, b.dtype, b.kind)
                (outs if b.written else ins).append(info)
            self.kernels.append(KernelInfo(k.name, k.source, k.grid, ins, outs, k.num_warps, k.num_stages, k.blocks))
        self.properties = [KernelProperties(k.name, **props)
                           for k, props in zip(plan.kernels, plan.summary.get("properties", []))]
        # a shape-generic plan: each size symbol its kernels take, as "input i dim d", and where the plan holds
        self.generic: dict[str, str] = {name: f"input {i} dim {d}"
                                        for name, (i, d) in plan.entry.get("sizes", {}).items()}
        self.guards: str = plan.entry.get("guards", "True")

    def __str__(self) -> str:
        p = self.plan
        parts = ["== captured graph ==", str(p.captured), "", "== decomposed graph ==", str(p.decomposed)]
        if "loop form" in p.summary:
            parts += ["", "== loop form ==", p.summary["loop form"]]
        if self.generic:
            parts += ["", "== generic sizes ==", ", ".join(f"{n}: {w}" for n, w in self.generic.items()),
                      f"holds where: {self.guards}"]
        for k, src, props in zip(self.kernels, p.kernels, self.properties):
            parts += ["", f"== kernel {k.name}: grid {k.grid}, {src.config} =="]
            parts += ["roles:"] + [f"  {r}" for r in props.roles]
            parts += [f"carried: {props.loop}"]
            parts += ["skipped tiles: " + (", ".join(props.skipped) or "none")]
            if props.folded:
                parts += ["constant-folded tiles: " + ", ".join(props.folded)]
            if props.runtime:
                parts += ["skipped at run time: " + ", ".join(props.runtime)]
            parts += ["reads: " + ", ".join(f"{t.name}{list(t.shape)} {t.kind}" for t in k.inputs)]
            parts += ["writes: " + ", ".join(f"{t.name}{list(t.shape)} {t.kind}" for t in k.outputs)]
            parts += ["", k.triton_source]
        if p.notes:
            parts += ["", "== notes =="] + [f"- {n}" for n in p.notes]
        return "\n".join(parts)


def explain(fn: Callable, *args: Any, **kwargs: Any) -> Report:
    """Compile `fn` (a function or an `ft.compile` result) for this call and describe the result (graphs,
    properties, plan, kernels). A plan in the on-disk cache is described as it was searched."""
    compiled = fn if isinstance(fn, Compiled) else Compiled(fn, Options())
    return Report(compiled.program_for(args, kwargs).plan)
