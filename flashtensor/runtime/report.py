"""`ft.explain`: what the compiler found and generated for one call signature."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..pipeline import Program
from .compiled import Compiled


@dataclass
class Report:
    program: Program
    kernels: list = field(default_factory=list)
    properties: list = field(default_factory=list)

    def __str__(self) -> str:
        p = self.program
        parts = ["== captured graph ==", str(p.captured), "", "== decomposed graph ==", str(p.decomposed)]
        if p.notes:
            parts += ["", "== notes =="] + [f"- {n}" for n in p.notes]
        return "\n".join(parts)


def explain(fn: Callable, *args: Any) -> Report:
    """Compile `fn` for `args` and describe the result (graphs, properties, plan, kernels)."""
    c = fn if isinstance(fn, Compiled) else Compiled(fn)
    return Report(c.program_for(args))
