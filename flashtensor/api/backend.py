"""`torch.compile(fn, backend="flashtensor")`: Dynamo hands us an FX graph; we compile it like any function.

Importing flashtensor registers the backend; an installed package also declares it under the
`torch_dynamo_backends` entry point, which torch loads by itself. Ops without a fused lowering in
Dynamo's graph run in eager PyTorch, exactly as under `ft.compile` (README, Fallback).
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch._dynamo.backends import registry

from .compiled import compile as ft_compile

NAME = "flashtensor"


def flashtensor_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
    """`ft.compile` of the graph. Tensors that require grad make it run the graph eagerly (api/compiled.py), which
    is what Dynamo, handing over a graph without AOTAutograd, needs for autograd to record it."""
    return ft_compile(gm.forward)


def _register() -> None:
    """Register under NAME unless torch knows it already. When torch has discovered the entry point but
    not loaded it, it is loading this module right now and registers the function itself afterwards;
    registering here too would make torch fail on a duplicate name."""
    if NAME not in registry._COMPILER_FNS and registry._BACKENDS.get(NAME) is None:
        registry.register_backend(flashtensor_backend, name=NAME)


_register()
