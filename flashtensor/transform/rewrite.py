"""Algebraic rewrites of the loop form, applied in order: each takes a loop graph and returns an equal one.

Each rule is a function `(loops, through_half) -> loops`; `through_half` says whether the kernels compute
half-precision values in float32 without rounding them (analysis/precision.py), so a rewrite may scale
through them. The emitter's local forms, which depend on how a kernel tiles its values, are a list of their
own (codegen/forms.py). Adding a rewrite: write the function, put it in REWRITES, and test it against
`ir.loops.evaluate_loops` (tests/test_exp2.py does so for exp2 folding).
"""
from __future__ import annotations

from typing import Callable

from ..ir.loops import LoopGraph
from .bound import peel_reductions, share_reductions
from .exp2 import fold_exp2
from .sums import commute_sums, merge_contractions

Rewrite = Callable[[LoopGraph, bool], LoopGraph]
REWRITES: list[tuple[str, Rewrite]] = [
    ("a reduction over a variable a few positions longer than a copy: the copy's range, the rest peeled",
     peel_reductions),
    ("a reduction over a copy of a variable: renamed onto the variable where that shares work", share_reductions),
    ("nested sums: the long variable inside", commute_sums),
    ("a contraction over three or more variables: over one merged variable where they merge", merge_contractions),
    ("exp -> exp2 with log2 e folded into the argument", fold_exp2),
]


def rewrite(loops: LoopGraph, through_half: bool) -> LoopGraph:
    """`loops` after every rewrite of REWRITES."""
    for _, rule in REWRITES:
        loops = rule(loops, through_half)
    return loops
