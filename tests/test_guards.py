"""ft.compile's calling conventions: the compiled callable calls the object it was given."""
import math

import pytest
import torch

import flashtensor as ft
from conftest import assert_close

B, H, S, D = 1, 2, 32, 16


def qkv(seed: int, s: int = S, d: int = D) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, s, d, generator=g) for _ in range(3))


def attention(q, k, v, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v


def fused(compiled) -> None:
    """Every plan of `compiled` runs generated kernels (the guards must not cost the fusion)."""
    assert compiled.programs and all(p.launches for p in compiled.programs.values()), \
        [p.notes for p in compiled.programs.values()]


# ---- callable objects, partials, keyword arguments -----------------------------------------------------------

class ScaledAttention:
    """A callable with an attribute named `fn`, which ft.compile once called instead of the object."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.fn = torch.tanh

    def __call__(self, q, k, v):
        return attention(q, k, v, self.scale)


def test_callable_object_is_what_is_called():
    obj = ScaledAttention(0.5)
    q, k, v = qkv(11)
    fast = ft.compile(obj)
    assert fast.fn is obj and fast.__wrapped__ is obj
    assert_close(fast(q, k, v), obj(q, k, v))
    fused(fast)


@pytest.mark.unit
def test_compiled_function_keeps_name_doc_and_wrapped():
    fast = ft.compile(attention)
    assert (fast.__name__, fast.__doc__, fast.__wrapped__) == ("attention", attention.__doc__, attention)
