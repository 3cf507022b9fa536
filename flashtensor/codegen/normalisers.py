"""Row statistics stored once for a later kernel's normalised exponentials (forms.exp_over)."""
from __future__ import annotations

import torch

from ..ir.loops import LNode
from ..ir.ops import Op
from ..schedule.schedule import Schedule
from .forms import exp_over_parts


def folded_normalisers(schedules: list[Schedule]) -> dict[tuple[LNode, LNode], LNode]:
    """Row statistics m and d that a later kernel reads to form exp2(x - (m + log2 d)) (see
    `forms.exp_over`), both reduced by one earlier kernel: (m, d) -> a node m + log2 d, which that kernel
    stores once per row and the later one loads in place of m and d, with no log in its loop. The earlier
    kernel still stores m and d (two thin vectors) for any other reader."""
    out: dict[tuple[LNode, LNode], LNode] = {}
    for k, s in enumerate(schedules):
        for n in s.nodes:
            if n.op != "div" or (parts := exp_over_parts(*n.args)) is None:
                continue
            e, d, m = n.args[0], n.args[1], parts[1]
            if not (isinstance(m, LNode) and {m, d} <= s.plan.loads and m.vars == d.vars
                    and e.dtype == e.args[0].dtype == torch.float32) or (m, d) in out:
                continue
            if any(m in t.plan.roots and d in t.plan.roots for t in schedules[:k]):
                lg = LNode(Op.LOG2_APPROX, (d,), torch.float32, d.vars, name=f"log2_{d.name}")
                out[m, d] = LNode(Op.ADD, (m, lg), torch.float32, m.vars, name=f"lse_{m.name}")
    return out
