"""Graph IR: a typed, shaped DAG of tensor ops close to ATen, with a text printer.

Nodes hold their arguments positionally (other nodes or Python scalars) and op
parameters in `attrs`. The op vocabulary and its meaning live in `ir.ops`.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import torch
import torch.utils._pytree as pytree

from .ops import Op


@dataclass(eq=False)
class Node:
    op: Op
    args: tuple
    shape: tuple[int, ...]
    dtype: torch.dtype
    attrs: dict = field(default_factory=dict)
    name: str = ""
    source: str = ""  # the user's source line that produced it, when known

    def __post_init__(self) -> None:
        self.op = Op(self.op)      # a misspelt op name fails here, not as a silent fallback later

    @property
    def inputs(self) -> list["Node"]:
        return [a for a in self.args if isinstance(a, Node)]

    def __repr__(self) -> str:
        return f"%{self.name}"

    @property
    def device(self) -> torch.device:
        """Where the value lives: the device of the first input or source it derives from (a program's
        tensors share one device); the CPU for a value built from no tensor at all."""
        seen, stack = set(), [self]
        while stack:
            x = stack.pop()
            if "device" in x.attrs:
                return x.attrs["device"]
            for a in x.inputs:
                if id(a) not in seen:
                    seen.add(id(a))
                    stack.append(a)
        return torch.device("cpu")


@dataclass(frozen=True)
class Returns:
    """What the function returns, rebuilt from the values of a graph's outputs: the pytree of its return value
    (a dict, nested tuples, a tensor and an int), with `leaves` holding every non-tensor leaf as it was and
    `slots` the leaf positions of the outputs, in order."""
    spec: pytree.TreeSpec
    leaves: tuple
    slots: tuple[int, ...]

    def build(self, values: Sequence[Any]) -> Any:
        if self._plain == "leaf":       # one tensor or a flat tuple of them: no pytree walk on every call
            return values[0]
        if self._plain == "tuple":
            return tuple(values)
        leaves = list(self.leaves)
        for k, v in zip(self.slots, values):
            leaves[k] = v
        return pytree.tree_unflatten(leaves, self.spec)

    @functools.cached_property
    def _plain(self) -> str:
        every = self.slots == tuple(range(len(self.leaves)))
        if every and self.spec.is_leaf():
            return "leaf"
        if every and self.spec == pytree.tree_structure(tuple(range(len(self.leaves)))):
            return "tuple"
        return ""


@dataclass
class Graph:
    """Nodes in topological order; `inputs` are the program's tensor arguments in call order. `returns` says
    how the function's value is made of `outputs` (None: a subgraph, whose value is the tuple of them)."""
    inputs: list[Node]
    outputs: list[Node]
    nodes: list[Node]
    returns: Optional[Returns] = None
    # a shape-generic trace: the ShapeEnv whose guards say where the plan holds, and each size symbol's
    # (input, dimension) (None: every size is static)
    shape_env: Any = None
    size_sources: dict[str, tuple[int, int]] = field(default_factory=dict)

    def result(self, values: Sequence[Any]) -> Any:
        """The function's return value, given the values of `outputs`."""
        return self.returns.build(values) if self.returns else tuple(values)

    def users(self) -> dict[Node, list[Node]]:
        out: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for a in n.inputs:
                out[a].append(n)
        return out

    def __str__(self) -> str:
        return format_graph(self)


def _fmt_arg(a: Any) -> str:
    if isinstance(a, Node):
        return f"%{a.name}"
    if isinstance(a, float):
        return repr(a)
    return str(a)


def _fmt_dtype(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def format_graph(g: Graph) -> str:
    lines = ["graph(" + ", ".join(f"%{n.name}: {_fmt_dtype(n.dtype)}{list(n.shape)}" for n in g.inputs) + "):"]
    for n in g.nodes:
        if n.op == "input":
            continue
        attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs.items())
        args = ", ".join(_fmt_arg(a) for a in n.args)
        inner = ", ".join(x for x in (args, attrs) if x)
        lines.append(f"  %{n.name}: {_fmt_dtype(n.dtype)}{list(n.shape)} = {n.op}({inner})")
    lines.append("  return " + ", ".join(f"%{n.name}" for n in g.outputs))
    return "\n".join(lines)


def _fmt_attr(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return _fmt_dtype(v)
    if callable(v):
        return getattr(v, "__name__", str(v))
    if isinstance(v, torch.Tensor):
        return f"tensor{list(v.shape)}"
    return repr(v)


def topo_order(outputs: Iterable[Node], stop: set[Node] | frozenset = frozenset()) -> list[Node]:
    """Every node reachable from `outputs` without passing through `stop`, producers first."""
    order: list[Node] = []
    seen: set[int] = set()
    stack = [(n, False) for n in reversed(list(outputs))]
    while stack:
        n, done = stack.pop()
        if done:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        if n not in stop:
            stack.extend((a, False) for a in reversed(n.inputs) if id(a) not in seen)
    return order


class Builder:
    """Appends nodes with unique names; used by capture and by graph rewrites."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._count: dict[str, int] = {}

    def add(self, op: Op | str, args: tuple, shape: tuple[int, ...], dtype: torch.dtype, source: str = "",
            **attrs: Any) -> Node:
        k = self._count.get(op, 0)
        self._count[op] = k + 1
        dims = tuple(s if isinstance(s, torch.SymInt) else int(s) for s in shape)
        n = Node(Op(op), tuple(args), dims, dtype, attrs, f"{op}{k}" if k else str(op), source)
        self.nodes.append(n)
        return n

    def infinite(self, x: Node, source: str = "") -> Node:
        """Where x is +-inf (not NaN): |x| == inf, a bool of x's shape."""
        size = self.add("abs", (x,), x.shape, x.dtype, source)
        return self.add("eq", (size, math.inf), x.shape, torch.bool, source)
