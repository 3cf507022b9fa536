"""`torch.compile(fn, backend="flashtensor")`: Dynamo hands us an FX graph; we compile it like any function."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from .runtime.compiled import compile as ft_compile


def flashtensor_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[torch.Tensor]) -> Callable:
    return ft_compile(gm.forward)
