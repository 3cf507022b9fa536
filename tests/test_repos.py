"""Attention as older Hugging Face models write it (GPT-2, GPT-Neo, CodeGen, Bloom, Falcon, OPT), DeepSeek's latent
attention as transformers writes it, and the Differential Transformer's and SnapKV's as their repositories do:
masks as 0-d finfo.min tensors selected by torch.where, a scale as a 0-d tensor, ALiBi by baddbmm into the bias,
bool masks filled with finfo.min or -1e9, and OPT's clamp of the masked scores at finfo.min by torch.max. Each
fuses (SnapKV's vote; its topk and gathers run in eager) and keeps eager's answer under the contract in fp32,
fp16 and bf16, rows that see no key (left padding) included."""
import math

import pytest
import torch
import torch.nn as nn

import flashtensor as ft
from flashtensor.bench.held import check_outputs
from flashtensor.bench.programs import deepseek_mla


def gpt2(query, key, value, attention_mask):
    """GPT2Attention._attn: the scale and the mask value as 0-d tensors, the causal part by torch.where."""
    attn_weights = torch.matmul(query, key.transpose(-1, -2))
    attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype)
    query_length, key_length = query.size(-2), key.size(-2)
    causal_mask = torch.tril(torch.ones((key_length, key_length), dtype=torch.bool))[
        None, None, key_length - query_length: key_length, :key_length]
    mask_value = torch.full([], torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype)
    attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
    attn_weights = nn.functional.softmax(attn_weights + attention_mask, dim=-1).type(value.dtype)
    return torch.matmul(attn_weights, value), attn_weights.sum(-2)


def gpt_neo(query, key, value, attention_mask):
    """GPTNeoSelfAttention._attn: q and k in float32, no scale, the finfo.min mask value a 0-d tensor."""
    query, key = query.to(torch.float32), key.to(torch.float32)
    attn_weights = torch.matmul(query, key.transpose(-1, -2))
    causal_mask = torch.tril(torch.ones(query.size(-2), key.size(-2), dtype=torch.bool))
    mask_value = torch.tensor(torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype)
    attn_weights = torch.where(causal_mask, attn_weights, mask_value) + attention_mask.float()
    return torch.matmul(nn.functional.softmax(attn_weights, dim=-1).to(value.dtype), value)


def codegen(query, key, value, attention_mask):
    """CodeGenAttention._attn: divided by a float32 0-d tensor, nn.Softmax as a module."""
    scale_attn = torch.sqrt(torch.tensor(query.shape[-1], dtype=torch.float32)).to(torch.get_default_dtype())
    attn_weights = torch.matmul(query.to(torch.float32), key.to(torch.float32).transpose(-1, -2)) / scale_attn
    attn_weights = nn.Softmax(dim=-1)(attn_weights + attention_mask.float()).to(value.dtype)
    return torch.matmul(attn_weights, value)


def bloom(query, key, value, alibi, attention_mask):
    """BloomAttention: ALiBi as baddbmm's input, a bool mask filled with finfo.min, softmax in float32."""
    b, h, s, d = query.shape
    scores = alibi.baddbmm(batch1=query.reshape(b * h, s, d), batch2=key.reshape(b * h, s, d).transpose(1, 2),
                           beta=1.0, alpha=1 / math.sqrt(d)).view(b, h, s, s)
    attn_weights = torch.masked_fill(scores, attention_mask, torch.finfo(scores.dtype).min)
    probs = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(probs, value)


def falcon(query, key, value, attention_mask):
    """Falcon's eager path: scores in float32 filled with -1e9."""
    scores = (query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])).float()
    return torch.softmax(scores.masked_fill(attention_mask, float("-1e9")), dim=-1).to(query.dtype) @ value


def opt(query, key, value, attention_mask):
    """OPTAttention: bmm over flattened heads, the additive mask, then the clamp at finfo.min by torch.max, and
    fp16 upcast for the softmax."""
    q, k = query.flatten(0, 1) * query.shape[-1] ** -0.5, key.flatten(0, 1)
    attn_weights = torch.bmm(q, k.transpose(1, 2)).view(*query.shape[:3], key.shape[2]) + attention_mask
    attn_weights = torch.max(attn_weights, torch.tensor(torch.finfo(attn_weights.dtype).min))
    if attn_weights.dtype == torch.float16:
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(torch.float16)
    else:
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
    return torch.matmul(attn_weights, value)


def diff_transformer(q, k, v, attn_mask, lambda_q1, lambda_k1, lambda_q2, lambda_k2, subln_weight):
    """The Differential Transformer's MultiheadDiffAttn: two softmax maps per head (heads viewed in pairs), the
    second subtracted with a learned lambda, then F.rms_norm per head (its eps added in place) and the scale."""
    bsz, two_heads, tgt_len, head_dim = q.shape
    lambda_init = 0.8
    attn_weights = torch.matmul(q * head_dim ** -0.5, k.transpose(-1, -2))
    attn_weights = torch.nan_to_num(attn_weights)
    attn_weights += attn_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).type_as(attn_weights)
    lambda_1 = torch.exp(torch.sum(lambda_q1 * lambda_k1, dim=-1).float()).type_as(q)
    lambda_2 = torch.exp(torch.sum(lambda_q2 * lambda_k2, dim=-1).float()).type_as(q)
    lambda_full = lambda_1 - lambda_2 + lambda_init
    attn_weights = attn_weights.view(bsz, two_heads // 2, 2, tgt_len, tgt_len)
    attn_weights = attn_weights[:, :, 0] - lambda_full * attn_weights[:, :, 1]
    attn = nn.functional.rms_norm(torch.matmul(attn_weights, v), (v.shape[-1],), subln_weight, eps=1e-5)
    return (attn * (1 - lambda_init)).transpose(1, 2).reshape(bsz, tgt_len, two_heads * head_dim)


def _args(fn, dtype):
    b, h, s, d = 2, 2, 40, 16
    g = torch.Generator().manual_seed(len(fn.__name__))
    q, k, v = (torch.randn(b, h, s, d, generator=g).to(dtype) for _ in range(3))
    pad = torch.ones(b, s)
    pad[1, :6] = 0                                          # left padding: batch 1's first six rows see no key
    keep = torch.ones(s, s).tril().bool()[None, None] & pad[:, None, None, :].bool()
    additive = torch.zeros(b, 1, s, s, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
    padding = ((1.0 - pad[:, None, None, :]) * torch.finfo(dtype).min).to(dtype)
    if fn is bloom:
        slopes = torch.tensor([2.0 ** (-8 * (i + 1) / h) for i in range(h)])
        alibi = (slopes[:, None] * torch.arange(s)[None, :]).repeat(b, 1)[:, None, :].to(dtype)
        return q, k, v, alibi, ~keep
    if fn is deepseek_mla:
        angles = torch.randn(b, s, 16, generator=g)
        return (torch.randn(b, h, s, 48, generator=g).to(dtype), k, torch.randn(b, 1, s, 32, generator=g).to(dtype),
                v, angles.repeat(1, 1, 2).cos().to(dtype), angles.repeat(1, 1, 2).sin().to(dtype), additive)
    if fn is diff_transformer:
        lambdas = (torch.randn(d, generator=g).to(dtype) / 10 for _ in range(4))
        return (q, k, torch.randn(b, h // 2, s, 2 * d, generator=g).to(dtype),
                torch.full((s, s), -math.inf).triu(1).to(dtype), *lambdas, torch.ones(2 * d, dtype=dtype))
    if fn is falcon:
        return q, k, v, ~keep
    return q, k, v, padding if fn in (gpt2, gpt_neo) else additive


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("fn", [gpt2, gpt_neo, codegen, bloom, falcon, opt, diff_transformer, deepseek_mla],
                         ids=lambda f: f.__name__)
def test_older_models_attention_fuses_and_matches_eager(fn, dtype):
    args = _args(fn, dtype)
    compiled = ft.compile(fn, cache=False)
    out = compiled(*args)
    for m in check_outputs(fn, args, out, fn(*args)):
        assert m.ok, m.problem
    (program,) = compiled.programs.values()
    assert program.launches and not program.notes, program.notes


def snapkv_update_kv(key_states, query_states, value_states, window_size=8, max_capacity_prompt=24, kernel_size=5):
    """SnapKV's update_kv as its repository writes it: the window's scores with a causal mask added in place into
    their last keys, softmax, the vote summed over the window and pooled, then topk and gather of the kept keys."""
    head_dim = query_states.shape[-1]
    attn_weights = torch.matmul(query_states[..., -window_size:, :], key_states.transpose(2, 3)) / math.sqrt(head_dim)
    mask = torch.full((window_size, window_size), torch.finfo(attn_weights.dtype).min)
    mask_cond = torch.arange(mask.size(-1))
    mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
    attn_weights[:, :, -window_size:, -window_size:] += mask[None, None, :, :]
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
    attn_weights_sum = attn_weights[:, :, -window_size:, : -window_size].sum(dim=-2)
    attn_cache = nn.functional.avg_pool1d(attn_weights_sum, kernel_size=kernel_size, padding=kernel_size // 2,
                                          stride=1)
    indices = attn_cache.topk(max_capacity_prompt - window_size, dim=-1).indices
    indices = indices.unsqueeze(-1).expand(-1, -1, -1, head_dim)
    k_past_compress = key_states[:, :, :-window_size, :].gather(dim=2, index=indices)
    v_past_compress = value_states[:, :, :-window_size, :].gather(dim=2, index=indices)
    return (torch.cat([k_past_compress, key_states[:, :, -window_size:, :]], dim=2),
            torch.cat([v_past_compress, value_states[:, :, -window_size:, :]], dim=2))


def test_snapkv_update_kv_fuses_its_vote():
    """The vote runs in kernels (the in-place add of the mask included); only topk and the gathers that read its
    indices run in eager. float32: in half precision, votes equal after rounding may come out of topk in
    another order, as eager's on another device may."""
    g = torch.Generator().manual_seed(7)
    k, q, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(3))
    compiled = ft.compile(snapkv_update_kv, cache=False)
    for m in check_outputs(snapkv_update_kv, (k, q, v), compiled(k, q, v), snapkv_update_kv(k, q, v)):
        assert m.ok, m.problem
    (program,) = compiled.programs.values()
    assert program.launches
    assert all("aten.topk" in n or "aten.gather" in n for n in program.notes), program.notes
