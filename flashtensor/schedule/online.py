"""Online rules: how a sum over the loop variable keeps a factor that reads another reduction over it.

A factor of a summand that depends on a reduction over the same loop variable (a softmax's running max
or its normaliser) is not known until that reduction has seen every tile. A rule says how the sum can
still be accumulated in the same pass: each takes the factor, its power (+1 multiplies, -1 divides) and
the loop's `Site`, and returns a `Carry`, or None when it does not apply. `_carry` in schedule.py tries
`ONLINE_RULES` in order; a factor no rule carries waits for a later pass over the loop (always correct).
Adding one: write the function, put it in ONLINE_RULES, test it against the loop-form evaluator
(tests/test_online.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ..ir.loops import LNode, Var


@dataclass(frozen=True)
class Carry:
    """How one factor is kept: in the loop as it is (the default), moved out and applied after the loop
    (`pulled`), or in the loop with the accumulator rescaled whenever a running max moves (`rescale`: the
    max, the exponential's base, "exp" or "exp2", and the positive constant k of exp((y - d) * k))."""
    pulled: bool = False
    rescale: Optional[tuple[LNode, str, float]] = None
    waits: frozenset[LNode] = frozenset()     # reductions the factor reads that must finish in an earlier pass


@dataclass
class Site:
    """The loop a sum is carried in: its variable, the kernel's reductions over it, and `touched(f)`, those
    that f reads."""
    loop: Var
    reductions: set[LNode]
    touched: Callable[[object], set[LNode]]


def independent(f: object, power: int, site: Site) -> Optional[Carry]:
    """A factor that reads no reduction over the loop: computed in the loop like any value."""
    return Carry() if not site.touched(f) else None


def loop_invariant(f: object, power: int, site: Site) -> Optional[Carry]:
    """A factor that does not vary along the loop (a row normaliser): sum_j (e_j / l) v_j = (sum_j e_j v_j) / l."""
    return Carry(pulled=True) if isinstance(f, LNode) and site.loop not in f.vars else None


def running_max(f: object, power: int, site: Site) -> Optional[Carry]:
    """exp((y - d) * k) for a max d over the loop, a constant k > 0 (1, or log2 e where folding it into y would
    overflow) and y that reads d in no way: when the running max moves from d_old to d_new, everything accumulated
    so far is multiplied by exp((d_old - d_new) * k). Reductions y reads (a first max subtracted before the
    softmax takes its own: GPT-OSS's) wait for an earlier pass, where they are constants."""
    if not (isinstance(f, LNode) and f.op in ("exp", "exp2") and power == 1 and isinstance(f.args[0], LNode)):
        return None
    x, k = f.args[0], 1.0
    if x.op == "mul" and isinstance(x.args[0], LNode) and isinstance(x.args[1], float) and x.args[1] > 0:
        x, k = x.args[0], x.args[1]
    if x.op != "sub":
        return None
    y, d = x.args
    if d in site.reductions and d.attrs["kind"] == "max" and d not in site.touched(y):
        return Carry(rescale=(d, f.op, k), waits=frozenset(site.touched(y)))
    return None


OnlineRule = Callable[[object, int, Site], Optional[Carry]]
ONLINE_RULES: list[OnlineRule] = [independent, loop_invariant, running_max]
