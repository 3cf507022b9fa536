"""The project's held programs: attention as real repositories write it, beyond the reference workloads.

Each program is a plain function in the idiom of the code its docstring names (Hugging Face transformers,
NVIDIA kvpress, research repositories), so the compiler is held to code it was not written against:
masks built with `torch.finfo(dtype).min`, GQA by expand + reshape, softmax in float32 cast back, scores
reduced into KV-cache eviction statistics. `make` builds one with inputs, as `workloads.make` does; the
runner is `flashtensor.bench.held`, the test `tests/test_held.py`.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

# ---- helpers as the model code defines them ------------------------------------------------------------------


def repeat_kv(hidden_states: Tensor, n_rep: int) -> Tensor:
    """transformers' repeat_kv: (B, Hkv, S, D) to (B, Hkv * n_rep, S, D) by expand + reshape."""
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def rotate_half(x: Tensor) -> Tensor:
    """transformers' rotate_half: the two halves of the last axis swapped, the first negated (a cat)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _rms_norm(hidden_states: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """Qwen3RMSNorm.forward: normalised in float32, cast back, then scaled."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def _window_attention(query_states: Tensor, keys: Tensor, window_size: int) -> Tensor:
    """kvpress's SnapKVPress.compute_window_attention after RoPE: the last `window_size` queries' probabilities
    over the keys before the window."""
    k_len = keys.shape[-2]
    key_states = repeat_kv(keys, query_states.shape[1] // keys.shape[1])
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(query_states.shape[-1])
    attention_mask = torch.ones_like(attn_weights) * float("-inf")
    attention_mask = torch.triu(attention_mask, diagonal=k_len - window_size + 1)
    attn_weights += attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
    return attn_weights[..., :-window_size]


# ---- the programs ---------------------------------------------------------------------------------------------


def llama_eager(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor, scaling: float) -> Tensor:
    """transformers' eager_attention_forward (Llama, Qwen2, Mistral): GQA by repeat_kv, the 4-D additive mask
    the model builds with finfo.min, softmax in float32 cast back. (It also returns the weights, which the
    caller drops unless output_attentions.)"""
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    value_states = repeat_kv(value, query.shape[1] // value.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    causal_mask = attention_mask[:, :, :, : key_states.shape[-2]]
    attn_weights = attn_weights + causal_mask
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous()


def left_padding(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor, scaling: float) -> Tensor:
    """Left-padded batch: transformers' get_extended_attention_mask, `(1.0 - mask) * finfo.min` from the
    (B, S) 0/1 padding mask, plus the causal part by masked_fill; padded query rows see only masked keys."""
    dtype = query.dtype
    min_dtype = torch.finfo(dtype).min
    padding = (1.0 - attention_mask[:, None, None, :].to(dtype)) * min_dtype
    q_len, kv_len = query.shape[-2], key.shape[-2]
    causal = torch.arange(kv_len, device=query.device)[None, :] > torch.arange(q_len, device=query.device)[:, None]
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    value_states = repeat_kv(value, query.shape[1] // value.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling + padding
    attn_weights = attn_weights.masked_fill(causal, min_dtype)
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(dtype)
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()


def masked_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor) -> Tensor:
    """GQA attention with a bool mask filled with finfo.min (transformers' eager path once a mask is built)."""
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    value_states = repeat_kv(value, query.shape[1] // value.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) / math.sqrt(query.shape[-1])
    attn_weights = attn_weights.masked_fill(mask, torch.finfo(attn_weights.dtype).min)
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()


def mistral_sliding_window(query: Tensor, key: Tensor, value: Tensor, sliding_window: int) -> Tensor:
    """Mistral's sliding window: a bool mask from aranges, masked_fill with finfo.min (transformers' sliding
    window causal mask, applied in the attention)."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    i = torch.arange(q_len, device=query.device)[:, None]
    j = torch.arange(kv_len, device=query.device)[None, :]
    mask = (j > i) | (j <= i - sliding_window)
    return masked_attention(query, key, value, mask)


def llama4_chunked(query: Tensor, key: Tensor, value: Tensor, chunk_size: int) -> Tensor:
    """Llama 4's chunked attention (transformers' chunked_causal_mask_function): each query sees the earlier keys
    of its own chunk, `q_idx // chunk_size == kv_idx // chunk_size` and causal; masked_fill with finfo.min."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    i = torch.arange(q_len, device=query.device)[:, None] + (kv_len - q_len)
    j = torch.arange(kv_len, device=query.device)[None, :]
    mask = (j > i) | (i // chunk_size != j // chunk_size)
    return masked_attention(query, key, value, mask)


def gemma2_softcap(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor, scaling: float,
                   softcap: float = 50.0) -> Tensor:
    """transformers' Gemma2 eager_attention_forward: the logits soft-capped by `tanh(s / cap) * cap` in three
    statements, then the additive 4-D mask."""
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    value_states = repeat_kv(value, query.shape[1] // value.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = attn_weights / softcap
    attn_weights = torch.tanh(attn_weights)
    attn_weights = attn_weights * softcap
    attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()


def alibi(query: Tensor, key: Tensor, value: Tensor, slopes: Tensor) -> Tensor:
    """ALiBi (Press et al.'s attention_with_linear_biases, MPT): a float32 per-head slope times (j - i), the
    causal part masked to -inf; the half scores promote to float32 where the bias is added."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    pos_q = torch.arange(q_len, device=query.device) + (kv_len - q_len)
    pos_k = torch.arange(kv_len, device=query.device)
    relative = pos_k[None, :] - pos_q[:, None]
    bias = slopes[:, None, None] * relative
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.shape[-1]) + bias
    scores = scores.masked_fill(relative > 0, float("-inf"))
    attn = F.softmax(scores.float(), dim=-1).type_as(query)
    return torch.matmul(attn, value).transpose(1, 2).contiguous()


def t5_relative_bias(query: Tensor, key: Tensor, value: Tensor, position_bias: Tensor) -> Tensor:
    """transformers' T5Attention: unscaled scores (T5 folds the scale into its weights), the (1, H, Sq, Sk)
    relative position bias added in place, softmax of `scores.float()` cast back with type_as."""
    scores = torch.matmul(query, key.transpose(3, 2))
    scores += position_bias
    attn_weights = F.softmax(scores.float(), dim=-1).type_as(scores)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous()


def streaming_sinks(query: Tensor, key: Tensor, value: Tensor, n_sink: int, window: int) -> Tensor:
    """StreamingLLM's prefill mask: each query sees the first `n_sink` tokens (attention sinks) and the last
    `window` tokens up to itself."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    i = torch.arange(q_len, device=query.device)[:, None] + (kv_len - q_len)
    j = torch.arange(kv_len, device=query.device)[None, :]
    visible = (j <= i) & ((j < n_sink) | (j > i - window))
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    value_states = repeat_kv(value, query.shape[1] // value.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) / math.sqrt(query.shape[-1])
    attn_weights = attn_weights.masked_fill(~visible, torch.finfo(attn_weights.dtype).min)
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()


def gpt_oss_sinks(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor, sinks: Tensor,
                  scaling: float) -> Tensor:
    """transformers' GptOss eager_attention_forward: a learned per-head sink logit concatenated to the
    window-masked scores, the row max subtracted, softmax in the scores' own dtype, the sink column dropped."""
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    value_states = repeat_kv(value, query.shape[1] // value.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    sink_logits = sinks.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
    combined_logits = torch.cat([attn_weights, sink_logits], dim=-1)
    combined_logits = combined_logits - combined_logits.max(dim=-1, keepdim=True).values
    probs = F.softmax(combined_logits, dim=-1, dtype=combined_logits.dtype)
    scores = probs[..., :-1]
    return torch.matmul(scores, value_states).transpose(1, 2).contiguous()


def einsum_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """lucidrains' x-transformers style: einsum scores, a bool causal mask from `ones(...).triu`, filled
    with `-finfo.max`, softmax in the input dtype, einsum back."""
    scale = q.shape[-1] ** -0.5
    sim = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    i, j = sim.shape[-2:]
    causal_mask = torch.ones((i, j), dtype=torch.bool, device=q.device).triu(j - i + 1)
    sim = sim.masked_fill(causal_mask, -torch.finfo(sim.dtype).max)
    attn = sim.softmax(dim=-1)
    return torch.einsum("bhqk,bhkd->bhqd", attn, v)


def gpt_bigcode_mqa(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """Multi-query attention (GPTBigCode / StarCoder, Falcon): one key/value head expanded to all heads, the
    causal mask applied with GPT-2's `torch.where(causal, w, finfo.min)`."""
    heads = query.shape[1]
    key = key.expand(-1, heads, -1, -1)
    value = value.expand(-1, heads, -1, -1)
    attn_weights = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(query.shape[-1])
    q_len, kv_len = query.shape[-2], key.shape[-2]
    causal = torch.tril(torch.ones(kv_len, kv_len, dtype=torch.bool, device=query.device))[kv_len - q_len:]
    mask_value = torch.full([], torch.finfo(attn_weights.dtype).min, dtype=attn_weights.dtype,
                            device=attn_weights.device)
    attn_weights = torch.where(causal, attn_weights, mask_value)
    attn_weights = F.softmax(attn_weights, dim=-1)
    return torch.matmul(attn_weights, value).transpose(1, 2).contiguous()


def cosine_attention(q: Tensor, k: Tensor, v: Tensor, logit_scale: Tensor) -> Tensor:
    """Swin Transformer V2's scaled cosine attention: F.normalize of q and k, a learned per-head temperature
    clamped and exponentiated, no mask."""
    attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
    scale = torch.clamp(logit_scale, max=math.log(1.0 / 0.01)).exp()
    attn = attn * scale
    attn = attn.softmax(dim=-1)
    return (attn @ v).transpose(1, 2).contiguous()


def sigmoid_attention(q: Tensor, k: Tensor, v: Tensor, bias: float) -> Tensor:
    """Sigmoid attention (Ramapuram et al., Apple's FlashSigmoid reference): sigmoid of the scaled scores plus
    a bias of -log(n) instead of softmax, causal positions masked to -inf first."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).triu(kv_len - q_len + 1)
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + bias
    scores = scores.masked_fill(mask, float("-inf"))
    attn = torch.sigmoid(scores)
    return (attn @ v).transpose(1, 2).contiguous()


def qk_norm(query: Tensor, key: Tensor, value: Tensor, q_weight: Tensor, k_weight: Tensor,
            attention_mask: Tensor, scaling: float) -> Tensor:
    """Qwen3 / OLMo2 qk-norm: RMSNorm of each head's q and k (`x * rsqrt(x.pow(2).mean(-1) + eps) * w`)
    before transformers' eager attention."""
    query = _rms_norm(query, q_weight)
    key = _rms_norm(key, k_weight)
    return llama_eager(query, key, value, attention_mask, scaling)


def rope_attention(query: Tensor, key: Tensor, value: Tensor, cos: Tensor, sin: Tensor, attention_mask: Tensor,
                   scaling: float) -> Tensor:
    """transformers' apply_rotary_pos_emb (rotate_half by cat) on q and k, inside the attention function."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q_embed = (query * cos) + (rotate_half(query) * sin)
    k_embed = (key * cos) + (rotate_half(key) * sin)
    return llama_eager(q_embed, k_embed, value, attention_mask, scaling)


def deepseek_mla(q_states: Tensor, k_pass: Tensor, k_rot: Tensor, value_states: Tensor, cos: Tensor, sin: Tensor,
                 attention_mask: Tensor) -> Tensor:
    """transformers' DeepseekV3Attention (multi-head latent attention) on its eager path: the query split into
    its no-RoPE and RoPE parts, the RoPE part de-interleaved (view, transpose, reshape) and rotated, one shared
    RoPE key expanded to every head, both joined back by cat, softmax in float32."""
    q_pass, q_rot = torch.split(q_states, [k_pass.shape[-1], k_rot.shape[-1]], dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    b, h, s, d = q_rot.shape
    q_rot = q_rot.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    k_rot = k_rot.view(b, 1, s, d // 2, 2).transpose(4, 3).reshape(b, 1, s, d)
    q_rot, k_rot = q_rot * cos + rotate_half(q_rot) * sin, k_rot * cos + rotate_half(k_rot) * sin
    query_states = torch.cat((q_pass, q_rot), dim=-1)
    key_states = torch.cat((k_pass, k_rot.expand(*k_pass.shape[:-1], -1)), dim=-1)
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) * query_states.shape[-1] ** -0.5
    attn_weights = F.softmax(attn_weights + attention_mask, dim=-1, dtype=torch.float32)
    return torch.matmul(attn_weights.to(query_states.dtype), value_states).transpose(1, 2).contiguous()


def _llama_probs(query: Tensor, key: Tensor, attention_mask: Tensor, scaling: float) -> Tensor:
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    return F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)


def _llama_out(attn_weights: Tensor, value: Tensor) -> Tensor:
    value_states = repeat_kv(value, attn_weights.shape[1] // value.shape[1])
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()


def h2o_heads(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor,
              scaling: float) -> tuple[Tensor, Tensor]:
    """H2O's heavy-hitter scores (h2o_hf's modify_llama): the half probabilities summed over batch and queries
    per head, `attn_weights.sum(0).sum(1)`, beside the attention output."""
    attn_weights = _llama_probs(query, key, attention_mask, scaling)
    return _llama_out(attn_weights, value), attn_weights.sum(0).sum(1)


def h2o_kv_heads(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor,
                 scaling: float) -> tuple[Tensor, Tensor]:
    """Accumulated attention per KV head (kvpress's ObservedAttentionPress with GQA): the probabilities
    reshaped to (B, Hkv, G, Sq, Sk), averaged over the group, summed over queries, divided by how many
    queries see each key."""
    attn_weights = _llama_probs(query, key, attention_mask, scaling)
    bsz, num_heads, q_len, k_len = attn_weights.shape
    grouped = attn_weights.reshape(bsz, key.shape[1], num_heads // key.shape[1], q_len, k_len)
    n_tokens_in_sum = torch.arange(k_len, 0, -1, device=query.device, dtype=attn_weights.dtype)
    scores = grouped.mean(dim=2).sum(dim=-2) / n_tokens_in_sum
    return _llama_out(attn_weights, value), scores


def snapkv_window(query_states: Tensor, keys: Tensor, window_size: int, kernel_size: int = 5) -> Tensor:
    """kvpress's SnapKVPress.score: the last window's attention averaged over its queries, smoothed by
    F.avg_pool1d, averaged over each KV head's group (view + mean)."""
    bsz, num_kv_heads, k_len, _ = keys.shape
    attn_weights = _window_attention(query_states, keys, window_size)
    scores = attn_weights.mean(dim=-2)
    scores = F.avg_pool1d(scores, kernel_size=kernel_size, padding=kernel_size // 2, stride=1)
    scores = scores.view(bsz, num_kv_heads, -1, k_len - window_size)
    return scores.mean(2)


def tova(query_states: Tensor, keys: Tensor) -> Tensor:
    """kvpress's TOVAPress.score: the last query's attention (a window of one) averaged over all heads,
    repeated for every KV head."""
    attn_weights = _window_attention(query_states, keys, 1)
    scores = attn_weights.mean(1)
    return scores.repeat(1, keys.shape[1], 1)


def keyformer_gumbel(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor, uniform: Tensor,
                     scaling: float, tau: float = 1.0) -> tuple[Tensor, Tensor]:
    """Keyformer's key scores: Gumbel noise `-log(-log(u))` added to the masked logits, a softmax at
    temperature tau, summed over queries; the attention itself is unchanged."""
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    gumbel = -torch.log(-torch.log(uniform))
    key_scores = F.softmax((attn_weights + gumbel) / tau, dim=-1, dtype=torch.float32).sum(dim=-2)
    probs = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return _llama_out(probs, value), key_scores


def attention_entropy(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor,
                      scaling: float) -> tuple[Tensor, Tensor]:
    """The entropy of each attention row, as analysis code logs it (attention-entropy collapse studies):
    `-(p * log(p + eps)).sum(-1)` over the float32 probabilities."""
    key_states = repeat_kv(key, query.shape[1] // key.shape[1])
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    probs = F.softmax(attn_weights, dim=-1, dtype=torch.float32)
    entropy = -(probs * torch.log(probs + 1e-9)).sum(dim=-1)
    return _llama_out(probs.to(query.dtype), value), entropy


def retention(q: Tensor, k: Tensor, v: Tensor, gamma: Tensor) -> Tensor:
    """RetNet's parallel retention (torchscale): a per-head decay mask `gamma ** (i - j)` on the causal part,
    its rows normalised by the root of their sums, times the scores, the rows normalised by their absolute
    sums clamped to [1, 5e4]; no softmax."""
    q_len = q.shape[-2]
    index = torch.arange(q_len, device=q.device)
    i, j = index[:, None], index[None, :]
    decay = torch.where(j <= i, gamma[:, None, None] ** (i - j), 0.0)
    decay = decay / decay.sum(dim=-1, keepdim=True).sqrt()
    qk_mat = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    qk_mat = qk_mat * decay.to(q.dtype)
    qk_mat = qk_mat / qk_mat.detach().abs().sum(dim=-1, keepdim=True).clamp(min=1, max=5e4)
    return torch.matmul(qk_mat, v).transpose(1, 2).contiguous()


def forgetting_attention(q: Tensor, k: Tensor, v: Tensor, fgate_logit: Tensor) -> Tensor:
    """The Forgetting Transformer's attention as its reference code writes it: log forget gates
    `logsigmoid(logit)` in float32, their running total along the sequence, and the score of key j at query i
    plus the total from j to i (`c[..., :, None] - c[..., None, :]`), by einsum, causal, softmax."""
    log_fgate = F.logsigmoid(fgate_logit.float())
    log_lambda = torch.cumsum(log_fgate, dim=-1)
    decay_bias = log_lambda[:, :, :, None] - log_lambda[:, :, None, :]
    s = torch.einsum("bhid,bhjd->bhij", q, k).float() * q.shape[-1] ** -0.5 + decay_bias
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1).to(v.dtype)
    return torch.einsum("bhij,bhjd->bhid", p, v)


def nanogpt_causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """nanoGPT's CausalSelfAttention (the non-flash path): a bool mask `ones(T, T).triu(1)`, masked_fill
    with -inf, softmax in the input dtype."""
    T = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    att = att.masked_fill(mask, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = att @ v
    return y.transpose(1, 2).contiguous()


def prefix_lm(query: Tensor, key: Tensor, value: Tensor, prefix_len: int) -> Tensor:
    """A prefix-LM mask (T5's prefix LM, PaliGemma, UniLM): the first `prefix_len` tokens are visible to every
    query, the rest causally; masked_fill with finfo.min."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    i = torch.arange(q_len, device=query.device)[:, None]
    j = torch.arange(kv_len, device=query.device)[None, :]
    mask = (j > i) & (j >= prefix_len)
    return masked_attention(query, key, value, mask)


def linear_elu(queries: Tensor, keys: Tensor, values: Tensor) -> Tensor:
    """fast-transformers' LinearAttention (Katharopoulos et al.): the elu(x) + 1 feature map, KV and the
    normaliser Z by einsum over (N, L, H, D) inputs; in float32, since the normaliser's sum over L * D
    overflows fp16."""
    Q = F.elu(queries.float()) + 1
    K = F.elu(keys.float()) + 1
    KV = torch.einsum("nshd,nshm->nhmd", K, values.float())
    Z = 1 / (torch.einsum("nlhd,nhd->nlh", Q, K.sum(dim=1)) + 1e-6)
    V = torch.einsum("nlhd,nhmd,nlh->nlhm", Q, KV, Z)
    return V.to(queries.dtype).contiguous()


# ---- inputs ---------------------------------------------------------------------------------------------------


class _Inputs:
    """Random inputs for one program: q (B, H, S, D), k and v (B, KV, S, D), HF-style masks and parameters."""

    def __init__(self, device: str | torch.device, dtype: torch.dtype, B: int, H: int, S: int, D: int, KV: int,
                 seed: int) -> None:
        self.device, self.dtype, self.B, self.H, self.S, self.D, self.KV = device, dtype, B, H, S, D, KV
        self.g = torch.Generator(device=device).manual_seed(seed)

    def randn(self, *shape: int, dtype: torch.dtype | None = None) -> Tensor:
        return torch.randn(*shape, generator=self.g, device=self.device, dtype=dtype or self.dtype)

    def qkv(self, kv: int | None = None, q_len: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        kv = self.KV if kv is None else kv
        return (self.randn(self.B, self.H, q_len or self.S, self.D), self.randn(self.B, kv, self.S, self.D),
                self.randn(self.B, kv, self.S, self.D))

    def causal_mask(self, window: int | None = None) -> Tensor:
        """transformers' 4-D causal mask: finfo.min above the diagonal (and `window` or more below it), zero
        elsewhere, expanded to (B, 1, S, S)."""
        min_dtype = torch.finfo(self.dtype).min
        mask = torch.triu(torch.full((self.S, self.S), min_dtype, dtype=self.dtype, device=self.device), diagonal=1)
        if window is not None:
            mask = mask + torch.tril(torch.full_like(mask, min_dtype), diagonal=-window)
        return mask[None, None, :, :].expand(self.B, 1, -1, -1)

    @property
    def scaling(self) -> float:
        return self.D ** -0.5


def _alibi_slopes(heads: int) -> list[float]:
    """Press et al.'s get_slopes for a power of two: a geometric sequence from 2^(-8 / heads)."""
    start = 2 ** (-8 / heads)
    return [start ** (h + 1) for h in range(heads)]


def _rope(x: _Inputs, dim: int | None = None) -> tuple[Tensor, Tensor]:
    """LlamaRotaryEmbedding's cos and sin (B, S, dim; D by default) at positions 0..S-1, base 10000."""
    dim = dim or x.D
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32, device=x.device) / dim))
    position_ids = torch.arange(x.S, device=x.device, dtype=torch.float32)[None, :].expand(x.B, -1)
    freqs = (inv_freq[None, :, None] @ position_ids[:, None, :]).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _t5_bias(x: _Inputs) -> Tensor:
    """A T5-style (1, H, S, S) bias: a learned table indexed by the relative position, clamped to 32 buckets."""
    table = x.randn(33, x.H)
    pos = torch.arange(x.S, device=x.device)
    bucket = (pos[None, :] - pos[:, None]).clamp(-16, 16) + 16
    return table[bucket].permute(2, 0, 1)[None].contiguous()


def _padding_mask(x: _Inputs) -> Tensor:
    """A left-padded batch's (B, S) attention mask: sequence b starts after (b + 1) * S // 16 pad tokens."""
    pos = torch.arange(x.S, device=x.device)[None, :]
    pads = (torch.arange(x.B, device=x.device)[:, None] + 1) * (x.S // 16)
    return (pos >= pads).long()


def _window(x: _Inputs) -> int:
    """The observation window of SnapKV: kvpress's default of 64, at most S // 8."""
    return min(64, x.S // 8)


Builder = Callable[[_Inputs], tuple[Callable[..., Any], tuple]]

PROGRAMS: dict[str, Builder] = {
    "llama_eager": lambda x: (llama_eager, (*x.qkv(), x.causal_mask(), x.scaling)),
    "left_padding": lambda x: (left_padding, (*x.qkv(), _padding_mask(x), x.scaling)),
    "mistral_sliding_window": lambda x: (mistral_sliding_window, (*x.qkv(), x.S // 4)),
    "llama4_chunked": lambda x: (llama4_chunked, (*x.qkv(), x.S // 4)),
    "gemma2_softcap": lambda x: (gemma2_softcap, (*x.qkv(), x.causal_mask(), x.scaling)),
    "alibi": lambda x: (alibi, (*x.qkv(kv=x.H), torch.tensor(_alibi_slopes(x.H), device=x.device))),
    "t5_relative_bias": lambda x: (t5_relative_bias, (x.randn(x.B, x.H, x.S, x.D) * x.scaling,
                                                      *x.qkv(kv=x.H)[1:], _t5_bias(x))),
    "streaming_sinks": lambda x: (streaming_sinks, (*x.qkv(), 4, x.S // 4)),
    "gpt_oss_sinks": lambda x: (gpt_oss_sinks, (*x.qkv(), x.causal_mask(window=x.S // 4), x.randn(x.H),
                                                x.scaling)),
    "einsum_attention": lambda x: (einsum_attention, x.qkv(kv=x.H)),
    "gpt_bigcode_mqa": lambda x: (gpt_bigcode_mqa, x.qkv(kv=1)),
    "cosine_attention": lambda x: (cosine_attention, (*x.qkv(kv=x.H), math.log(10.0) + 0.5 * x.randn(x.H, 1, 1))),
    "sigmoid_attention": lambda x: (sigmoid_attention, (*x.qkv(kv=x.H), -math.log(x.S))),
    "qk_norm": lambda x: (qk_norm, (*x.qkv(), 1 + 0.1 * x.randn(x.D), 1 + 0.1 * x.randn(x.D), x.causal_mask(),
                                    x.scaling)),
    "rope_attention": lambda x: (rope_attention, (*x.qkv(), *_rope(x), x.causal_mask(), x.scaling)),
    "deepseek_mla": lambda x: (deepseek_mla, (x.randn(x.B, x.H, x.S, x.D * 3 // 2), x.randn(x.B, x.H, x.S, x.D),
                                              x.randn(x.B, 1, x.S, x.D // 2), x.randn(x.B, x.H, x.S, x.D),
                                              *_rope(x, x.D // 2), x.causal_mask())),
    "h2o_heads": lambda x: (h2o_heads, (*x.qkv(), x.causal_mask(), x.scaling)),
    "h2o_kv_heads": lambda x: (h2o_kv_heads, (*x.qkv(), x.causal_mask(), x.scaling)),
    "snapkv_window": lambda x: (snapkv_window, (x.qkv(q_len=_window(x))[0], x.qkv()[1], _window(x))),
    "tova": lambda x: (tova, (x.qkv(q_len=1)[0], x.qkv()[1])),
    "keyformer_gumbel": lambda x: (keyformer_gumbel, (
        *x.qkv(), x.causal_mask(),
        torch.rand(x.B, x.H, x.S, x.S, generator=x.g, device=x.device).clamp(1e-6, 1 - 1e-6), x.scaling)),
    "attention_entropy": lambda x: (attention_entropy, (*x.qkv(), x.causal_mask(), x.scaling)),
    "retention": lambda x: (retention, (*x.qkv(kv=x.H), 1 - 2.0 ** (-5 - torch.arange(x.H, device=x.device,
                                                                                       dtype=torch.float32)))),
    "forgetting_attention": lambda x: (forgetting_attention, (*x.qkv(kv=x.H),
                                                              2 + x.randn(x.B, x.H, x.S, dtype=torch.float32))),
    "nanogpt_causal": lambda x: (nanogpt_causal, x.qkv(kv=x.H)),
    "prefix_lm": lambda x: (prefix_lm, (*x.qkv(), x.S // 4)),
    "linear_elu": lambda x: (linear_elu, tuple(t.transpose(1, 2).contiguous() for t in x.qkv(kv=x.H))),
}

NAMES = list(PROGRAMS)

SMALL = dict(B=1, H=4, S=64, D=16, KV=2)      # for the CPU interpreter
GPU = dict(B=1, H=32, S=4096, D=128, KV=8)     # Llama-3-8B's attention at 4K tokens


def make(name: str, device: str | torch.device = "cuda", dtype: torch.dtype = torch.float16, B: int = 1,
         H: int = 32, S: int = 4096, D: int = 128, KV: int = 8, seed: int = 0) -> tuple[Callable[..., Any], tuple]:
    """Return (fn, args) for held program `name`: q with H heads, k and v with KV heads (GQA) where the
    program groups heads, H heads where the model it follows has none, one for MQA."""
    return PROGRAMS[name](_Inputs(device, dtype, B, H, S, D, KV, seed))
