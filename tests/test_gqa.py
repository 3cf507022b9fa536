"""Statistics of attention probabilities over a GQA head group or over all heads, as KV-cache methods score
them per kv head (H2O, SnapKV, RoCo; token-importance maps): the mean over the group or the heads comes
before the column sums in the program, and the kernels sum per head first (transform/sums.py), then over
the group in a thin kernel (partition/plan.py's nested cut). No Sq x Sk value crosses a kernel boundary.
An output projection after GQA attention contracts over the kv head, the group and the head dimension at once:
one merged variable (transform/sums.py's merge_contractions), the attention output stored between kernels."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import compiled_matches_eager

B, KV, G, S, D = 2, 2, 3, 70, 16


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers' repeat_kv: (B, KV, S, D) -> (B, KV * n_rep, S, D)."""
    b, kv, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


def _probs(q, k):
    s = q @ repeat_kv(k, G).transpose(2, 3) / math.sqrt(D)
    causal = torch.full((S, S), -math.inf).triu(1)
    return torch.softmax((s + causal).float(), dim=-1)


def h2o_per_kv_head(q, k, v):
    p = _probs(q, k)
    out = (p.to(q.dtype) @ repeat_kv(v, G)).transpose(1, 2).contiguous()
    scores = p.view(B, KV, G, S, S).mean(dim=2).sum(dim=2)          # (B, KV, S)
    return out, scores


def group_sum_then_col_sum(q, k, v):
    p = _probs(q, k)
    return p.view(B, KV, G, S, S).sum(dim=2).sum(dim=2)


def mean_over_heads(q, k, v):
    """A token-importance map: the mean over every head of the column sums."""
    return _probs(q, k).mean(dim=1).sum(dim=1)


def snapkv_window(q, k, v, window=8):
    p = _probs(q, k)
    obs = p[..., -window:, :].sum(dim=-2)                            # the last queries' attention
    return obs.view(B, KV, G, S).mean(dim=2)


def normalised_then_group_mean(q, k, v):
    """kvpress's observed attention for GQA: column sums over the number of queries that see each key, then the
    mean over the group (elementwise values between the two sums)."""
    seen = torch.arange(S, 0, -1, dtype=torch.float32)
    return (_probs(q, k).sum(dim=-2) / seen).view(B, KV, G, S).mean(dim=2)


@pytest.mark.parametrize("fn", [h2o_per_kv_head, group_sum_then_col_sum, mean_over_heads, snapkv_window,
                                normalised_then_group_mean])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_group_statistics_fuse_with_thin_boundaries(fn, dtype):
    g = torch.Generator().manual_seed(7)
    q = torch.randn(B, KV * G, S, D, generator=g).to(dtype)
    k, v = (torch.randn(B, KV, S, D, generator=g).to(dtype) for _ in range(2))
    prog = compiled_matches_eager(fn, (q, k, v))[1].program_for((q, k, v))
    assert prog.launches and not prog.notes, prog.notes
    for kern in prog.kernels:
        for b in kern.buffers:
            if b.kind == "intermediate":
                assert math.prod(b.shape) < S * S, (kern.name, b.shape)


def _attention_out(q, k, v):
    p = _probs(q, k)
    return p, (p.to(q.dtype) @ repeat_kv(v, G)).transpose(1, 2).reshape(B, S, KV * G * D)


def projected(q, k, v, w):
    return F.linear(_attention_out(q, k, v)[1], w)


def projected_with_weights(q, k, v, w):
    p, o = _attention_out(q, k, v)
    return F.linear(o, w), p


@pytest.mark.parametrize("fn", [projected, projected_with_weights])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_output_projection_fuses(fn, dtype):
    g = torch.Generator().manual_seed(8)
    q = torch.randn(B, KV * G, S, D, generator=g).to(dtype)
    k, v = (torch.randn(B, KV, S, D, generator=g).to(dtype) for _ in range(2))
    w = (torch.randn(KV * G * D, KV * G * D, generator=g) / (KV * G * D) ** 0.5).to(dtype)
    prog = compiled_matches_eager(fn, (q, k, v, w))[1].program_for((q, k, v, w))
    assert prog.launches and not prog.notes, prog.notes
