"""`torch.compile(fn, backend="flashtensor")`: Dynamo hands us an FX graph; we compile it like any function.

Importing flashtensor registers the backend; an installed package also declares it under the
`torch_dynamo_backends` entry point, which torch loads by itself. Ops without a fused lowering in
Dynamo's graph run as under `ft.compile` (README, Fallback), except that on CUDA devices a graph with nothing
fused (a whole model's, say) runs through Inductor rather than eager: its user asked for torch.compile.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch._dynamo.backends import registry
from torch.fx._lazy_graph_module import _LazyGraphModule

from .compiled import compile as ft_compile

NAME = "flashtensor"


def flashtensor_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
    """`ft.compile` of the graph. Tensors that require grad make it run the graph eagerly (api/compiled.py), which
    is what Dynamo, handing over a graph without AOTAutograd, needs for autograd to record it. A graph Dynamo
    made shape-generic takes its sizes as SymInt arguments: they are read off the tensors instead, and the plan
    is generic in the dimensions Dynamo made symbolic, so a new length reuses it."""
    numbers = _numbers(gm)
    sizes, dims = _sizes(gm)
    inductor = torch.compile(gm)      # compiled on its first call, if one comes: gm's own code, no other graph's
    # its generated forward itself: a lazy module's forward goes through GraphModule.__call__, which prints the
    # generated code to stderr when a call raises (eager's error for a user's, which capture raises again)
    _LazyGraphModule.force_recompile(gm)
    if sizes:
        tensors = [i for i in range(len(example_inputs)) if i not in sizes]

        def with_sizes(module: Callable) -> Callable:
            def of_tensors(*ts: Any) -> Any:
                full: list[Any] = [None] * (len(ts) + len(sizes))
                for i, t in zip(tensors, ts):
                    full[i] = t
                for i, (j, d) in sizes.items():
                    full[i] = full[j].shape[d]
                return module(*full)
            of_tensors.__name__ = "forward"
            return of_tensors
        compiled = ft_compile(with_sizes(gm.forward))
        compiled.dims = frozenset((tensors.index(j), d) for j, d in dims)
        compiled.unfused = with_sizes(inductor)
    else:
        compiled = ft_compile(gm.forward)
        compiled.unfused = inductor
    if not numbers and not sizes:
        return compiled

    def run(*args: Any) -> Any:
        return compiled(*(a.item() if i in numbers else a for i, a in enumerate(args) if i not in sizes))
    return run


def _sizes(gm: torch.fx.GraphModule) -> tuple[dict[int, tuple[int, int]], set[tuple[int, int]]]:
    """Dynamo's size arguments, each as the (input, dimension) whose size it is, and the symbolic dimensions of
    the tensor inputs (both by placeholder position; empty for a graph with static shapes)."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    where: dict[str, tuple[int, int]] = {}
    dims: set[tuple[int, int]] = set()
    for i, p in enumerate(places):
        v = p.meta.get("example_value")
        if isinstance(v, torch.Tensor):
            for d, s in enumerate(v.shape):
                if isinstance(s, torch.SymInt) and s.node.expr.free_symbols:
                    where.setdefault(str(s.node.expr), (i, d))
                    dims.add((i, d))
    sizes = {i: where[str(v.node.expr)] for i, p in enumerate(places)
             if isinstance(v := p.meta.get("example_value"), torch.SymInt) and str(v.node.expr) in where}
    return sizes, dims


def _numbers(gm: torch.fx.GraphModule) -> frozenset[int]:
    """Positions of the inputs that stand for Python numbers: Dynamo passes a float argument as a 0-d tensor the
    graph reads only through `.item()`, whose symbolic value capture cannot bake in. The graph is changed to
    take the number itself, which `ft.compile` then guards by value like any other number."""
    numbers = set()
    for i, p in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        users = list(p.users)
        if users and all(u.op == "call_method" and u.target == "item" and len(u.args) == 1 for u in users):
            for u in users:
                u.replace_all_uses_with(p)
                gm.graph.erase_node(u)
            numbers.add(i)
    if numbers:
        gm.recompile()
    return frozenset(numbers)


def _register() -> None:
    """Register under NAME unless torch knows it already. When torch has discovered the entry point but
    not loaded it, it is loading this module right now and registers the function itself afterwards;
    registering here too would make torch fail on a duplicate name."""
    if NAME not in registry._COMPILER_FNS and registry._BACKENDS.get(NAME) is None:
        registry.register_backend(flashtensor_backend, name=NAME)


_register()
