"""Loop-form IR: every value is a function of named loop variables (docs/design.md §3.1).

Layout ops are gone here: a program input is read through an affine index map
(`load`), index tensors are affine expressions of variables (`iota`), a matmul
is a product followed by a sum over its contracted variable, and each
reduction removes exactly one variable. Program outputs name, for each of
their dimensions, the variables (row-major) that index it.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch

from .ops import BINARY, UNARY, Op
from .sizes import symbolic

_ids = itertools.count()


class Var:
    """A loop variable: an index running over range(extent)."""

    __slots__ = ("id", "extent", "name")

    def __init__(self, extent: int, name: str = "") -> None:
        self.id = next(_ids)
        self.extent: Any = extent if isinstance(extent, torch.SymInt) else int(extent)   # int, or a SymInt
        self.name = name or f"v{self.id}"

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class Affine:
    """sum(coeff * var) + const over loop variables. The constant and coefficients may be symbolic sizes (a
    diagonal kv_len - q_len + 1, a stride); two affines are equal when they are the same expression."""
    terms: tuple[tuple[Var, Any], ...] = ()
    const: Any = 0          # an int, or a torch.SymInt

    def _key(self) -> tuple:
        return tuple((v.id, _hashable(c)) for v, c in self.terms), _hashable(self.const)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Affine) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @staticmethod
    def of(v: Var) -> "Affine":
        return Affine(((v, 1),), 0)

    @property
    def vars(self) -> list[Var]:
        return [v for v, _ in self.terms]

    def __add__(self, other: "Affine") -> "Affine":
        acc: dict[Var, int] = {}
        for v, c in self.terms + other.terms:
            acc[v] = acc.get(v, 0) + c
        return Affine(tuple((v, c) for v, c in acc.items() if c), self.const + other.const)

    def scale(self, k: int) -> "Affine":
        return Affine(tuple((v, c * k) for v, c in self.terms if c * k), self.const * k)

    def substitute(self, sub: dict[Var, "Affine"]) -> "Affine":
        out = Affine((), self.const)
        for v, c in self.terms:
            out = out + (sub[v] if v in sub else Affine.of(v)).scale(c)
        return out

    def coeff(self, v: Var) -> int:
        return dict(self.terms).get(v, 0)

    def __str__(self) -> str:
        """Printed without deciding on a symbolic size (a test of it would be a guard of the plan)."""
        parts = [(f"{c}*{v}" if symbolic(c) or c != 1 else f"{v}") for v, c in self.terms]
        if symbolic(self.const) or self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(eq=False)
class LNode:
    op: Op                       # load | iota | scalar | cast | where | reduce | elementwise ops
    args: tuple                  # LNodes (or Python scalars for binary ops)
    dtype: torch.dtype
    vars: tuple[Var, ...]        # the variables this value depends on, by id
    attrs: dict = field(default_factory=dict)
    name: str = ""
    origin: str = ""             # the graph op and user source line it comes from, for notes (see `stamp`)

    def __post_init__(self) -> None:
        self.op = Op(self.op)

    @property
    def inputs(self) -> list["LNode"]:
        return [a for a in self.args if isinstance(a, LNode)]

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(eq=False)
class LOutput:
    node: LNode
    dims: list[list[Var]]        # per output dimension: the variables indexing it, row-major
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class LoopGraph:
    inputs: list[tuple[tuple[int, ...], torch.dtype]]
    nodes: list[LNode]
    outputs: list[LOutput]

    def __str__(self) -> str:
        return format_loops(self)


def loop_topo(roots: Sequence[LNode], stop: set[LNode] | frozenset = frozenset()) -> list[LNode]:
    """Nodes reachable from `roots`, producers first; nodes in `stop` are included but not entered."""
    order: list[LNode] = []
    seen: set[int] = set()

    def visit(n: LNode) -> None:
        if id(n) in seen:
            return
        seen.add(id(n))
        if n not in stop:
            for a in n.inputs:
                visit(a)
        order.append(n)

    for r in roots:
        visit(r)
    return order


def stamp(node: LNode, origin: str) -> None:
    """Give `node` and the nodes it reads that have no origin yet this one: a lowering or rewrite calls it on
    what it produced, so every node names the op it comes from (never part of a node's identity)."""
    stack = [node] if origin else []
    while stack:
        n = stack.pop()
        if not n.origin:
            n.origin = origin
            stack += n.inputs


class NodeTable:
    """Hash-consing for loop nodes: asking twice for a structurally equal node gives the first one, so a
    value that several rewrites reach is computed once."""

    def __init__(self) -> None:
        self.nodes: dict[tuple, LNode] = {}

    def get(self, op: Op | str, args: tuple, dtype: torch.dtype, vars_: tuple[Var, ...], attrs: dict) -> LNode:
        key = _key(op, args, dtype, attrs)
        hit = self.nodes.get(key)
        if hit is None:
            hit = self.nodes[key] = LNode(Op(op), args, dtype, vars_, attrs)
        return hit

    def add(self, n: LNode) -> None:
        """Make an existing node the one that `get` gives for its structure (a rewrite then reuses it)."""
        self.nodes.setdefault(_key(n.op, n.args, n.dtype, n.attrs), n)


def _key(op: Op | str, args: tuple, dtype: torch.dtype, attrs: dict) -> tuple:
    return (Op(op), tuple(id(a) if isinstance(a, LNode) else ("s", type(a).__name__, _hashable(a)) for a in args),
            dtype, tuple(sorted((k, _hashable(v)) for k, v in attrs.items())))


def _hashable(v):
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, Var):
        return ("var", v.id)
    if isinstance(v, float) and v != v:
        return "nan"
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return "sym", str(v.node.expr)
    return v


def var_union(*groups: Sequence[Var]) -> tuple[Var, ...]:
    seen = {v.id: v for g in groups for v in g}
    return tuple(seen[k] for k in sorted(seen))


def node_vars(op: str, args: tuple, attrs: dict) -> tuple[Var, ...]:
    """The variables a computed node depends on: its operands', less the one a reduction removes; an `at` node's
    are its stored value's, with those its index map replaces swapped for the map's, and those it merges (`merged`:
    adjacent variables of the stored value read as one row-major variable) for the one."""
    vs = var_union(*(a.vars for a in args if isinstance(a, LNode)))
    if op == "reduce":
        return tuple(v for v in vs if v is not attrs["var"])
    if op == "at":
        index = dict(attrs["map"])
        group, var = attrs.get("merged", ((), None))
        return var_union([v for v in vs if v not in index and v not in group], *(e.vars for e in index.values()),
                         [var] if var is not None else [])
    return vs


# the attr of a node that every plan rounds to its half type (analysis/precision.py marks it); rewrites rebuild a
# node with its attrs, so the mark stays with the value. UNDER_MASKS as its value: rounded for a mask added to it
ROUNDS = "rounds"
UNDER_MASKS = "under masks"
# the attr of a value whose every use only adds it, scaled at most, to others (analysis/precision.py marks it): its
# absolute error is what reaches a result, so kernels may take a form that is exact only to an absolute error
ABSOLUTE = "absolute"


def format_node(n: LNode) -> str:
    dt = str(n.dtype).replace("torch.", "")
    if n.op == "load":
        body = f"load(in{n.attrs['input']}[" + ", ".join(str(a) for a in n.attrs["index"]) + "])"
    elif n.op == "iota":
        body = f"iota({n.attrs['expr']})"
    elif n.op == "scalar":
        body = f"scalar({n.attrs['value']!r})"
    elif n.op == "reduce":
        body = f"{n.attrs['kind']}_{n.attrs['var']}({n.args[0]!r})"
    elif n.op == "at":
        merged = [f"({', '.join(map(repr, n.attrs['merged'][0]))}) := {n.attrs['merged'][1]}"] \
            if "merged" in n.attrs else []
        body = f"at({n.args[0]!r}[" + ", ".join([f"{v} := {e}" for v, e in n.attrs["map"]] + merged) + "])"
    else:
        body = f"{n.op}(" + ", ".join(repr(a) for a in n.args) + ")"
    said = {True: "  # rounded", UNDER_MASKS: "  # rounded under masks"}.get(n.attrs.get(ROUNDS), "")
    return f"%{n.name}: {dt}[{', '.join(map(repr, n.vars))}] = {body}" + said


def format_loops(g: LoopGraph) -> str:
    vs = var_union(*(n.vars for n in g.nodes), *(d for o in g.outputs for d in o.dims))
    lines = ["loops(" + ", ".join(f"{v}<{v.extent}" for v in vs) + "):"]
    lines += ["  " + format_node(n) for n in g.nodes]
    for k, o in enumerate(g.outputs):
        dims = ", ".join("(" + ",".join(map(repr, d)) + ")" for d in o.dims)
        lines.append(f"  out{k}[{dims}] = %{o.node.name}")
    return "\n".join(lines)


def _compute_dtype(dt: torch.dtype) -> torch.dtype:
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


def evaluate_loops(g: LoopGraph, args: Sequence[torch.Tensor],
                   env: dict[LNode, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Reference evaluator of the loop form: one torch tensor per node, one dim per variable (by id)."""
    device = args[0].device if args else torch.device("cpu")
    vals: dict[LNode, torch.Tensor] = dict(env or {})
    for n in g.nodes:
        if n not in vals:
            vals[n] = _eval_node(n, vals, args, device)
    outs = []
    for o in g.outputs:
        flat = [v for d in o.dims for v in d]
        t = _align(vals[o.node], o.node.vars, tuple(flat))
        t = t.expand([v.extent for v in flat]).reshape(o.shape).to(o.dtype)
        outs.append(t.contiguous())
    return outs


def _align(t: torch.Tensor, have: tuple[Var, ...], want: tuple[Var, ...]) -> torch.Tensor:
    """View `t` (dims = `have`) with dims in `want` order, size 1 where it does not depend on a var."""
    perm = [have.index(v) for v in want if v in have]
    t = t.permute(perm) if perm else t.reshape(())
    shape = [v.extent if v in have else 1 for v in want]
    return t.reshape(shape)


def _index_grid(expr: Affine, vars_: tuple[Var, ...], device) -> torch.Tensor:
    out = torch.full([1] * len(vars_), expr.const, dtype=torch.int64, device=device)
    for v, c in expr.terms:
        shape = [v.extent if w is v else 1 for w in vars_]
        out = out + c * torch.arange(v.extent, device=device).reshape(shape)
    return out


def outside(e: Affine, size: Any) -> tuple[bool, bool]:
    """Whether index e, over its variables' ranges, can fall below 0 and whether it can reach `size`: a piece
    of a cat read at the joined axis' index minus its offset (those reads load 0, and the cat's where does
    not pick them)."""
    low = e.const + sum(c * (v.extent - 1) for v, c in e.terms if c < 0)
    high = e.const + sum(c * (v.extent - 1) for v, c in e.terms if c > 0)
    return low < 0, high >= size


def _eval_node(n: LNode, vals, args, device) -> torch.Tensor:
    cd = _compute_dtype(n.dtype)
    if n.op == "load":
        src = args[n.attrs["input"]] if isinstance(n.attrs["input"], int) else vals[n.attrs["input"]]
        idx = [_index_grid(e, n.vars, device) for e in n.attrs["index"]]
        inside = [(i >= 0) & (i < size) for i, e, size in zip(idx, n.attrs["index"], src.shape)
                  if any(outside(e, size))]
        t = src[tuple(i.clamp(0, max(size - 1, 0)) for i, size in zip(idx, src.shape))] if idx else src.reshape(())
        for ok in inside:
            t = torch.where(ok, t, torch.zeros((), dtype=t.dtype, device=device))
        return t.expand([v.extent for v in n.vars]).to(cd)
    if n.op == "iota":
        return _index_grid(n.attrs["expr"], n.vars, device).expand([v.extent for v in n.vars]).to(cd)
    if n.op == "at":
        return _at(n, vals[n.args[0]], device).to(cd)
    if n.op == "scalar":
        return torch.tensor(n.attrs["value"], dtype=cd, device=device)
    if n.op == "reduce":
        a = n.args[0]
        x = vals[a]
        d = a.vars.index(n.attrs["var"])
        kind = n.attrs["kind"]
        if kind == "sum":
            r = x.sum(d, dtype=cd)
        elif kind == "any":
            r = x.bool().any(d)
        else:
            r = x.amax(d) if kind == "max" else x.amin(d)
        return _align(r, tuple(v for v in a.vars if v is not n.attrs["var"]), n.vars)
    ins = [_align(vals[a], a.vars, n.vars) if isinstance(a, LNode) else a for a in n.args]
    if n.op == "cast":
        return ins[0].to(n.dtype).to(cd)
    if n.op == "where":
        c, x, y = ins
        x = x if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=cd, device=device)
        y = y if isinstance(y, torch.Tensor) else torch.tensor(y, dtype=cd, device=device)
        return torch.where(c.bool(), x.to(cd), y.to(cd))
    if n.op in UNARY:
        return UNARY[n.op](ins[0]).to(cd)
    a, b = ins
    if not isinstance(a, torch.Tensor):
        a = torch.tensor(a, dtype=b.dtype, device=device)
    if n.op in ("maximum", "minimum"):
        b = b if isinstance(b, torch.Tensor) else torch.tensor(b, dtype=a.dtype, device=device)
    return BINARY[n.op](a, b).to(cd)


def _at(n: LNode, src: torch.Tensor, device) -> torch.Tensor:
    """A stored value (dims: its node's variables) read at n's index map, its merged variables as one dim; 0 where
    the index leaves its range."""
    base = n.args[0]
    index = dict(n.attrs["map"])
    if not base.vars:
        return src.reshape(()).expand([v.extent for v in n.vars])
    dims = list(base.vars)
    src = src.expand([v.extent for v in dims])
    if "merged" in n.attrs:
        group, var = n.attrs["merged"]
        at = dims.index(group[0])
        dims[at:at + len(group)] = [var]
        src = src.reshape([v.extent for v in dims])
    idx = [_index_grid(index.get(v, Affine.of(v)), n.vars, device) for v in dims]
    t = src[tuple(i.clamp(0, max(v.extent - 1, 0)) for i, v in zip(idx, dims))]
    for i, v in zip(idx, dims):
        if v in index:
            t = torch.where((i >= 0) & (i < v.extent), t, torch.zeros((), dtype=t.dtype, device=device))
    return t.expand([v.extent for v in n.vars])


def reindexed(index_map: Sequence[tuple[Var, Affine]], base: LNode, sub: dict[Var, Affine],
              expr: Optional[Callable[[Affine], Affine]] = None) -> tuple[tuple[Var, Affine], ...]:
    """An `at` node's index map (reading `base`) once `sub` replaces variables of its reader: in the map's
    expressions (by `expr`, else Affine.substitute), and for a variable of base that the read takes from its reader
    unchanged, as an entry of its own; identities left out."""
    index = {v: (expr or (lambda e: e.substitute(sub)))(e) for v, e in index_map}
    index.update({v: sub[v] for v in base.vars if v not in index and v in sub})
    return tuple(sorted(((v, e) for v, e in index.items() if e != Affine.of(v)), key=lambda x: x[0].id))


def substituted(x: LNode, sub: dict[Var, Affine], table: NodeTable, memo: dict[int, LNode]) -> LNode:
    """x with the variables of `sub` replaced by their expressions (through the table, so equal structures are the
    program's own nodes), not where a reduction binds them; `memo` keeps what one substitution made."""
    if not set(sub) & set(x.vars):
        return x
    if x.op == "reduce" and x.attrs["var"] in sub:
        return substituted(x, {v: e for v, e in sub.items() if v is not x.attrs["var"]}, table, {})
    if id(x) not in memo:
        attrs = dict(x.attrs)
        if x.op == "load":
            attrs["index"] = [e.substitute(sub) for e in x.attrs["index"]]
            memo[id(x)] = table.get(x.op, x.args, x.dtype, var_union(*(e.vars for e in attrs["index"])), attrs)
        elif x.op == "iota":
            attrs["expr"] = x.attrs["expr"].substitute(sub)
            memo[id(x)] = table.get(x.op, x.args, x.dtype, var_union(attrs["expr"].vars), attrs)
        else:
            if x.op == "at":      # the stored value stays; its read takes the expressions
                attrs["map"] = reindexed(x.attrs["map"], x.args[0], sub)
                args = x.args
            else:
                args = tuple(substituted(a, sub, table, memo) if isinstance(a, LNode) else a for a in x.args)
            memo[id(x)] = table.get(x.op, args, x.dtype, node_vars(x.op, args, attrs), attrs)
    return memo[id(x)]


def stored(n: LNode) -> LNode:
    """The value whose buffer a kernel reads for a value it loads from an earlier kernel: an `at` node's stored
    value, or the value itself."""
    return n.args[0] if n.op == "at" else n


def exact_cast(n: LNode) -> bool:
    """A float cast that keeps every value of its operand's type (fp16 or bf16 to float32)."""
    a, b = torch.finfo(n.args[0].dtype), torch.finfo(n.dtype)
    return b.max >= a.max and b.eps <= a.eps and b.smallest_normal <= a.smallest_normal


def read_input(x: object) -> Optional[int]:
    """The program input that x is, directly or through casts; None for anything computed."""
    while isinstance(x, LNode) and x.op == "cast":
        x = x.args[0]
    if isinstance(x, LNode) and x.op == "load" and isinstance(x.attrs["input"], int):
        return x.attrs["input"]
    return None


def rounds_input(n: LNode) -> bool:
    """A float cast of a program input that can change its values (float32 to fp16 or bf16): eager's
    later ops read the rounded values, so the kernels round it too, in every plan."""
    return n.op == "cast" and n.dtype.is_floating_point and n.args[0].dtype.is_floating_point and \
        not exact_cast(n) and read_input(n.args[0]) is not None


def rebuilt(g: LoopGraph, new: dict[int, LNode], prefix: str) -> LoopGraph:
    """The loop graph whose outputs are `new[id(old output node)]`, with the nodes a rewrite made (no name yet)
    named prefix0, prefix1, ... in topological order, skipping names `g` uses."""
    outputs = [LOutput(new[id(o.node)], o.dims, o.shape, o.dtype) for o in g.outputs]
    nodes = loop_topo([o.node for o in outputs])
    names = {n.name for n in g.nodes if n.name}
    k = 0
    for n in nodes:
        if not n.name:
            while f"{prefix}{k}" in names:
                k += 1
            n.name = f"{prefix}{k}"
            names.add(n.name)
    return LoopGraph(g.inputs, nodes, outputs)
