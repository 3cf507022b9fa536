"""Why a program has no fused plan, in two forms: the detail for the debug log, and a note a user can act on.

Lowering, partition and schedule each try many alternatives (every loop variable, every grid) and fail for
the same few causes, in terms of their own values (t41) and loop variables (v714). The error keeps that
detail as its message and carries its causes apart: what went wrong, phrased without internal names, and
where (the graph op and user source line a loop node comes from, `LNode.origin`). `reason` collapses them to
one clause per distinct cause.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .graph import Node

Cause = tuple[str, str]     # (what, where): where is "matmul at model.py:12: y = ..." or ""


class NoPlanError(Exception):
    """A stage found no fused plan; `str(e)` is the detail, `causes` what the user's note says."""

    def __init__(self, detail: str, cause: Optional[str] = None, where: str = "",
                 causes: Optional[Sequence[Cause]] = None) -> None:
        super().__init__(detail)
        self.causes: list[Cause] = list(causes) if causes is not None else [(cause or detail, where)]


def reason(causes: Sequence[Cause]) -> str:
    """One clause per distinct cause, in order of first appearance, each with the distinct places it comes
    from."""
    places: dict[str, list[str]] = {}
    for what, where in causes:
        seen = places.setdefault(what, [])
        if where and where not in seen:
            seen.append(where)
    return "; ".join(what + "".join(f" ({w})" for w in ws) for what, ws in places.items())


def place(node: Node) -> str:
    """A graph node as its user reads it: the op (a reduction's kind) and the source line."""
    what = node.attrs["kind"] if node.op == "reduce" else str(node.op)
    return f"{what} at {node.source}" if node.source else what
