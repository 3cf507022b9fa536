"""Conditions on the data: where a mask read from a tensor holds, as the value facts' regions see it (docs/design.md
§3.5).

Index comparisons give half-planes, which bound the loop at compile time. A mask passed in as a tensor, or captured
from the enclosing scope (a constant input of the plan), gives none: each of its elements is a condition of its own
(`Atom`). A bool value computed from the data alone is true or false there; a float one added to the scores is hugely
negative (at most -HUGE, finfo.min or -inf in Hugging Face's additive mask) or moderate there. A row max is moderate
where some element of its row is (`Exists`, the projection `facts._exists` makes of a region that holds atoms). A
region that holds such conditions is skipped at run time: a pre-pass over the mask gives each row tile the loop range
outside it (codegen/ranges.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from ..ir.loops import Affine, LNode, Var
from ..ir.sizes import longer

HUGE = 2.0 ** 15       # a finite mask constant at least this large (finfo.min of every float type, -1e9) is huge
MODERATE = 2.0 ** 14   # the inputs a skip by a huge constant relies on are checked to be at most this large

# each test as Triton prints it over the value (codegen/ranges.py) and explain shows it
TESTS = {"true": "!= 0", "false": "== 0", "huge": f"<= {-HUGE}", "above": f">= {-MODERATE}", "below": f"<= {MODERATE}",
         "zero": "== 0"}
KEPT = {"false": "true", "true": "false", "huge": "zero"}    # a masking test's value where the mask keeps an element


@dataclass(frozen=True)
class Atom:
    """Where `node`, a mask computed from the data alone, passes `test` at the element's own index: a bool one is
    true or false there, a float one added to the scores is hugely negative ("huge"), moderate from below ("above")
    or above ("below"), or 0 ("zero": the element is kept, and the mask adds nothing)."""
    node: LNode
    test: str

    @property
    def vars(self) -> list[Var]:
        return list(self.node.vars)

    def negated(self) -> Optional["Atom"]:
        """The complement, for a bool test (a magnitude test has none: between -HUGE and -MODERATE neither holds)."""
        flip = {"true": "false", "false": "true"}.get(self.test)
        return Atom(self.node, flip) if flip else None

    def __str__(self) -> str:
        return f"{self.node.name} {TESTS[self.test]}"


@dataclass(frozen=True)
class Exists:
    """Where some value of `var` satisfies `region` (half-planes and atoms, no further Exists): a row of the mask
    with an unmasked element, on which the row's max is moderate."""
    var: Var
    region: tuple[Union[Affine, Atom], ...]

    @property
    def vars(self) -> list[Var]:
        return sorted({w for c in self.region for w in c.vars} - {self.var}, key=lambda v: v.id)

    def __str__(self) -> str:
        return f"some {self.var}: (" + " and ".join(show(c) for c in self.region) + ")"


Cond = Union[Affine, Atom, Exists]


def show(c: Cond) -> str:
    """A condition in words: a half-plane as `e >= 0`, an atom by its test."""
    return f"{c} >= 0" if isinstance(c, Affine) else str(c)


def data_free(region: tuple) -> bool:
    """Whether a region is half-planes only (the compile-time loop bounds take it)."""
    return all(isinstance(c, Affine) for c in region)


@dataclass(frozen=True)
class Scope:
    """What a kernel's run-time masks may vary along: its batch variables, row and loop (a pre-pass tiles the row
    and loop as the kernel does); the values it loads from earlier kernels, which a pre-pass cannot compute."""
    batch: tuple[Var, ...]
    row: Var
    loop: Var
    boundary: frozenset[LNode]


# ops whose values no half-plane bounds: loads, and the integer rounding of index arithmetic (a chunked mask's
# i // chunk == j // chunk); a mask computed from them is an atom, its tiles skipped by a pre-pass at run time
_UNBOUNDED = ("load", "trunc_div", "fmod")


def masks(nodes: list[LNode], scope: Scope) -> tuple[set[LNode], set[LNode]]:
    """The kernel's masks read from tensors: bool values computed from the data alone (loads, indices, constants and
    elementwise ops, over the scope's variables), and such float values added to values that are not (the scores).
    Each must be shared along some batch variable (a mask broadcast over heads): its pre-pass then reads a fraction
    of what the kernel reads, where a bias per head would be read twice over for nothing (it rarely masks)."""
    allowed = set(scope.batch) | {scope.row, scope.loop}
    evaluable: dict[int, bool] = {}
    data: dict[int, bool] = {}
    for n in nodes:
        ok = n not in scope.boundary and n.op != "reduce" and set(n.vars) <= allowed and \
            all(evaluable.get(id(a), False) for a in n.inputs)
        evaluable[id(n)] = ok
        data[id(n)] = ok and (n.op in _UNBOUNDED or any(data[id(a)] for a in n.inputs))

    def shared(n: LNode) -> bool:
        return data.get(id(n), False) and any(v not in n.vars and longer(v.extent, 1) for v in scope.batch)

    bools = {n for n in nodes if n.dtype == torch.bool and shared(n)}
    addends = {a for n in nodes if n.op in ("add", "sub") and not evaluable[id(n)]
               for k, a in enumerate(n.args) if (k == 0 or n.op == "add") and isinstance(a, LNode)
               and a.dtype.is_floating_point and shared(a)}
    return bools, addends


def kept(region: tuple) -> list[Atom]:
    """The atoms that hold where a region's masks keep an element (a bool mask true where the region needs it false,
    a mask added to the scores 0 where it needs it hugely negative): tiles where they all do run without the masks."""
    return [Atom(c.node, KEPT[c.test]) for c in region if isinstance(c, Atom) and c.test in KEPT]


def classes(n: LNode) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """The magnitude classes (Magnitudes: above, below, huge) of a float mask added to the scores: its own atoms."""
    return [(Atom(n, "above"),)], [(Atom(n, "below"),)], [((Atom(n, "huge"),), -HUGE)]
