"""`torch.compile(fn, backend="flashtensor")`: Dynamo hands us an FX graph; we compile it like any function.

Importing flashtensor registers the backend; an installed package also declares it under the
`torch_dynamo_backends` entry point, which torch loads by itself. Ops without a fused lowering in
Dynamo's graph run in eager PyTorch, exactly as under `ft.compile` (README, Fallback).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch._dynamo.backends import registry

from .compiled import compile as ft_compile

NAME = "flashtensor"


def flashtensor_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
    """`ft.compile` of the graph. Tensors that require grad make it run the graph eagerly (api/compiled.py), which
    is what Dynamo, handing over a graph without AOTAutograd, needs for autograd to record it."""
    numbers = _numbers(gm)
    compiled = ft_compile(gm.forward)
    if not numbers:
        return compiled

    def run(*args: Any) -> Any:
        return compiled(*(a.item() if i in numbers else a for i, a in enumerate(args)))
    return run


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
