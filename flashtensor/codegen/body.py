"""The code and value cache of one loop body (or one block after a loop) while a kernel is emitted."""
from __future__ import annotations

from typing import Optional

from ..ir.loops import LNode, Var


class Body:
    """Code and value cache of one loop body (or one post-pass block). `region`: half-planes that hold on
    all of its tiles (their facts' constants replace values); `bounds`: its tiles may pass the loop's extent;
    `at_l0`: a body of the kernel's loop, whose tile starts at `l0` (o_L = l0 + tl.arange)."""

    def __init__(self, pass_: int, region: frozenset, bounds: bool, parent_cache: dict, at_l0: bool = False) -> None:
        self.pass_, self.region, self.bounds, self.at_l0 = pass_, region, bounds, at_l0
        self.running: dict[LNode, str] = {}     # this pass's running maxima, as this body sees them
        self.lines: list[str] = []
        self.cache: dict[int, tuple[str, list[Var]]] = {}
        self.quotients: dict[tuple, str] = {}     # exp_over's results by (id(e), id(d), tile variables)
        self.checked: dict[int, tuple[str, Optional[str]]] = {}   # checked load -> (its check line, mask)
        self.witness: dict[int, tuple[str, list[Var]]] = {}      # input -> (check term, tile), see check_by_log
        self.parent = parent_cache

    def lookup(self, n: LNode) -> Optional[tuple[str, list[Var]]]:
        return self.cache.get(id(n)) or self.parent.get(id(n))
