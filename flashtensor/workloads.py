"""Reference workloads (the project's own copy of shared/workloads.py): the attention variants that motivate
property-aware fusion.

Each builder returns (fn, inputs) where fn(*inputs) is plain PyTorch eager code.
Shapes follow the published evaluation: batch 1, 32 heads, head dim 128,
4096 queries and keys, fp16; EA and SimA use (64, 784, 128) fp32 activations.
"""
import math
from typing import Any, Callable, TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor


def _causal(q_len, kv_len, device, dtype):
    m = torch.full((q_len, kv_len), -torch.inf, device=device, dtype=dtype)
    return torch.triu(m, diagonal=kv_len - q_len + 1)


def _probs(q, k, scale):
    # q, k: (B, S, H, D) -> scores, probs (B, H, Sq, Skv)
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    s = torch.matmul(qt, kt.transpose(-2, -1)) * scale
    s = s + _causal(q.shape[1], k.shape[1], q.device, q.dtype)
    return s, F.softmax(s.float(), dim=-1)


def _out(p, v, dtype):
    return torch.matmul(p.to(dtype), v.transpose(1, 2)).transpose(1, 2).contiguous()


def attn(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    s, p = _probs(q, k, 1 / math.sqrt(q.shape[-1]))
    return _out(p, v, q.dtype)


def h2o(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    s, p = _probs(q, k, 1 / math.sqrt(q.shape[-1]))
    return _out(p, v, q.dtype), p.sum(dim=2)


def roco(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    s, p = _probs(q, k, 1 / math.sqrt(q.shape[-1]))
    return _out(p, v, q.dtype), p.sum(dim=2), (p * p).sum(dim=2)


def keyformer(q: Tensor, k: Tensor, v: Tensor, noise: Tensor, tau: float = 1.5) -> tuple[Tensor, Tensor]:
    s, p = _probs(q, k, 1 / math.sqrt(q.shape[-1]))
    g = -noise.log()
    kf = F.softmax((s.float() + g) / tau, dim=-1).sum(dim=2)
    return _out(p, v, q.dtype), kf


def snapkv(q: Tensor, k: Tensor, v: Tensor, window: int = 5) -> tuple[Tensor, Tensor]:
    s, p = _probs(q, k, 1 / math.sqrt(q.shape[-1]))
    col = p.sum(dim=2)
    return _out(p, v, q.dtype), F.avg_pool1d(col, window, stride=1, padding=window // 2)


def corm(q: Tensor, k: Tensor, v: Tensor, thresh: Tensor) -> tuple[Tensor, Tensor]:
    s, p = _probs(q, k, 1 / math.sqrt(q.shape[-1]))
    return _out(p, v, q.dtype), (p >= thresh).any(dim=2)


def gemma2(q: Tensor, k: Tensor, v: Tensor, cap: float = 50.0) -> Tensor:
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    s = torch.matmul(qt, kt.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = torch.tanh(s / cap) * cap
    s = s + _causal(q.shape[1], k.shape[1], q.device, q.dtype)
    p = F.softmax(s.float(), dim=-1)
    return _out(p, v, q.dtype)


def _linear_attn(x, w_qkv, b_qkv, w_o, b_o, heads, feature):
    B, N, C = x.shape
    qkv = F.linear(x, w_qkv, b_qkv).view(B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]  # (B, h, N, d)
    q, k = feature(q, k)
    ctx = torch.matmul(k.transpose(-2, -1), v)  # (B, h, d, d)
    y = torch.matmul(q, ctx).transpose(1, 2).reshape(B, N, C)
    return F.linear(y, w_o, b_o)


def ea(x: Tensor, w_qkv: Tensor, b_qkv: Tensor, w_o: Tensor, b_o: Tensor) -> Tensor:
    # efficient attention: softmax over features for q, over tokens for k
    return _linear_attn(x, w_qkv, b_qkv, w_o, b_o, 4,
                        lambda q, k: (q.softmax(dim=-1), k.softmax(dim=-2)))


def sima(x: Tensor, w_qkv: Tensor, b_qkv: Tensor, w_o: Tensor, b_o: Tensor) -> Tensor:
    # softmax-free attention: L1-normalise q and k over tokens
    return _linear_attn(x, w_qkv, b_qkv, w_o, b_o, 4,
                        lambda q, k: (F.normalize(q, p=1, dim=-2), F.normalize(k, p=1, dim=-2)))


class Shapes(TypedDict):
    """The keyword arguments of `make` that size a workload."""
    S: int
    H: int
    D: int
    B: int
    N: int
    BL: int


PAPER = Shapes(S=4096, H=32, D=128, B=1, N=784, BL=64)   # the published evaluation shapes
SMALL = Shapes(S=128, H=2, D=32, B=1, N=96, BL=2)         # for CPU tests under the Triton interpreter


def make(name: str, device: str | torch.device = "cuda", S: int = 4096, H: int = 32, D: int = 128, B: int = 1,
         N: int = 784, BL: int = 64, dtype: torch.dtype = torch.float16,
         seed: int = 0) -> tuple[Callable[..., Any], tuple[Tensor, ...]]:
    """Return (fn, args). S/H/D/B shape the attention family; BL x N x 128 is the EA/SimA input."""
    g = torch.Generator(device=device).manual_seed(seed)

    def r(*shape, dt=dtype):
        return torch.randn(*shape, generator=g, device=device, dtype=dt)

    if name in ("ea", "sima"):
        f32 = torch.float32
        x = r(BL, N, 128, dt=f32)
        args = (x, r(384, 128, dt=f32) * 0.05, r(384, dt=f32) * 0.05,
                r(128, 128, dt=f32) * 0.05, r(128, dt=f32) * 0.05)
        return globals()[name], args
    q, k, v = r(B, S, H, D), r(B, S, H, D), r(B, S, H, D)
    if name == "keyformer":
        return keyformer, (q, k, v, 1 + r(B, H, S, S, dt=torch.float32).abs())
    if name == "corm":
        thresh = 1.0 / torch.arange(1, S + 1, device=device, dtype=torch.float32)[:, None].expand(S, S).contiguous()
        return corm, (q, k, v, thresh)
    return globals()[name], (q, k, v)


NAMES = ["attn", "h2o", "roco", "keyformer", "snapkv", "corm", "gemma2", "ea", "sima"]
