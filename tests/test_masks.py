"""Masks as real code builds them: huge finite constants (torch.finfo(dtype).min, -finfo.max, -1e9) added or
filled in, HF-style padding masks, fully masked rows. Eager keeps every such value finite, so the kernels must
too: log2 e folded into the constant would overflow float32 (NaN everywhere, or an fp64 literal in a kernel)."""
import math
import re

import pytest
import torch

import flashtensor as ft
from conftest import compiled_matches_eager

B, H, S, D = 2, 2, 70, 16


def _padded(q, k, v, mask):
    """Hugging Face's padding idiom: (1 - mask) * finfo.min added to the scores."""
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    s = s + (1.0 - mask[:, None, None, :].to(s.dtype)) * torch.finfo(s.dtype).min
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def _causal_full(q, k, v):
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    causal = torch.full((S, S), torch.finfo(s.dtype).min, dtype=s.dtype).triu(1)
    return torch.softmax(s + causal, dim=-1) @ v


def _filled(value):
    def fn(q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        causal = torch.ones(S, S, dtype=torch.bool).triu(1)
        fill = value(s.dtype) if callable(value) else value
        return torch.softmax(s.masked_fill(causal, fill), dim=-1) @ v
    return fn


def _inputs(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(3)]


def _check(fn, args):
    prog = compiled_matches_eager(fn, args)[1].program_for(args)
    assert prog.launches, prog.notes                        # fused, not a fallback
    for k in prog.kernels:                                  # no literal float32 cannot hold (Triton makes it fp64)
        for lit in re.findall(r"(?<![\w.])-?\d+\.\d*e\+(\d+)", k.source):
            assert int(lit) <= 38, k.source
    return prog


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("padded", [0, 5, S], ids=["none", "five", "all"])
def test_padding_mask_of_finfo_min(dtype, padded):
    q, k, v = _inputs(dtype, padded)
    mask = torch.ones(B, S)
    mask[:, S - padded:] = 0            # padded keys; with all of them masked every row is fully masked
    _check(_padded, (q, k, v, mask))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_causal_mask_of_finfo_min_is_one_online_pass(dtype):
    prog = _check(_causal_full, _inputs(dtype, 1))
    assert "in 1 pass(es)" in ft.explain(ft.compile(_causal_full, cache=False), *_inputs(dtype, 1)).properties[0].loop
    assert prog.kernels


@pytest.mark.parametrize("fill", [lambda dt: torch.finfo(dt).min, lambda dt: -torch.finfo(dt).max, -1e9, -math.inf],
                         ids=["finfo.min", "-finfo.max", "-1e9", "-inf"])
def test_masked_fill_constants(fill):
    _check(_filled(fill), _inputs(torch.float32, 2))
