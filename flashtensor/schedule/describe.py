"""A schedule's properties in words (explain's `roles:`, `carried:`, `skipped tiles:` lines), as plain data
the plan cache can store."""
from __future__ import annotations

from ..analysis.atoms import show
from .schedule import Schedule


def describe(s: Schedule) -> dict[str, list[str] | str]:
    """roles (one line per loop variable), loop (the loop and how its reductions are carried), skipped and
    folded (the half-planes whose tiles the loop skips, or runs with the facts' constants in place), runtime (the
    regions over masks read from tensors whose tiles a pre-pass finds and the loop skips)."""
    carried = []
    for a in s.accums.values():
        how = [f"{a.kind} over {s.loop} (pass {a.pass_ + 1})"]
        if a.rescale:
            how.append("rescaled by running max " + ", ".join(d.name for d, _, _ in a.rescale))
        if a.pulled:
            how.append(f"{len(a.pulled)} loop-invariant factor(s) moved out of the sum")
        if s.stops_early(a.pass_):
            how.append("the loop stops once every one is true")
        carried.append(f"{a.node.name}: " + "; ".join(how))
    return {
        "roles": s.roles.describe() + [f"{v}<{v.extent}>: batch (one program per value and row tile)" for v in s.batch],
        "loop": f"loop over {s.loop}{', one value per step' if s.stepped else ''} in {s.passes} pass(es): "
                + ("; ".join(carried) or "no reductions"),
        "skipped": [" and ".join(f"{h} >= 0" for h in reg) for reg in s.skip],
        "folded": [f"{h} >= 0" for h in s.special],
        "runtime": [" and ".join(map(show, reg)) for reg in s.runtime],
    }
