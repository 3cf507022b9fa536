"""What the emitter is given for one kernel, besides its tile configuration."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

import torch

from ..ir.loops import LNode, LOutput
from ..schedule.schedule import Schedule


@dataclass(frozen=True)
class CheckPlan:
    """One kernel's share of the finite check (codegen/check.py; decided across the plan by checkplan.py).
    The plan's kernels share the inputs that no kernel's tiles read whole (`flat`, input -> domain) in parts
    proportional to `shares`, this kernel checking part `part`; no shares: the plan has no check. `tiled` maps
    an input this kernel's tiles read whole to (that load, domain). Logs of inputs in `ftz` flush subnormals in
    the first pass (their check rejects subnormals too); the check tests an input in `narrowed` as its cast to
    that type (analysis.facts.narrowed_inputs); in inputs in `masks` (read only as masks, Schedule.masks) -inf
    passes."""
    shares: tuple[int, ...] = ()
    part: int = 0
    flat: Mapping[int, Optional[str]] = field(default_factory=dict)
    tiled: Mapping[int, tuple[LNode, Optional[str]]] = field(default_factory=dict)
    ftz: frozenset[int] = frozenset()
    narrowed: Mapping[int, torch.dtype] = field(default_factory=dict)
    masks: frozenset[int] = frozenset()


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of a plan. `outputs` maps a root to its program outputs (other roots are intermediates);
    `faithful` rounds half-precision values as eager does (analysis/precision.py); reductions in `nan_free`
    use the fast max that skips NaN (analysis.facts.nan_absorbing_maxima); roots in `loaded_later` are also
    stored as intermediates, in the layout later kernels read; `folded` (normalisers.py): the kernel stores
    those whose statistics it reduces and loads those whose statistics it reads. `interpret`: the kernel
    runs in Triton's interpreter (whose bf16 dots are wrong, so they run in float32 there)."""
    schedule: Schedule
    name: str
    inputs: list[tuple[tuple[int, ...], torch.dtype]]
    outputs: Mapping[LNode, list[LOutput]]
    faithful: bool = False
    nan_free: frozenset[LNode] = frozenset()
    loaded_later: frozenset[LNode] = frozenset()
    check: CheckPlan = CheckPlan()
    folded: Mapping[tuple[LNode, LNode], LNode] = field(default_factory=dict)
    interpret: bool = False
    group_programs: int = 512
    fixup_programs: int = 264
    split_programs: int = 528              # Options.split_programs
    splits: Optional[int] = None           # Options.splits
    f32_dot: str = "ieee"                  # Options.f32_dot
    recomputed: frozenset[LNode] = frozenset()     # values another kernel of the plan computes too
    sizes: Mapping[str, int] = field(default_factory=dict)   # a symbolic size's value in the bucket emitted for
    strided: frozenset[str] = frozenset()    # sizes that stride an input's rows (ir.sizes.strided)

    @property
    def aligned(self) -> list[str]:
        """The size arguments whose alignment the kernels take as ALIGN (artifact.header), in order."""
        return sorted(self.strided & set(self.sizes))
