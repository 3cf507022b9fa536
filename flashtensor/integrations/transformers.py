"""Hugging Face transformers on FlashTensor.

Importing this module registers the attention implementation "FlashTensor" with transformers' attention and
mask interfaces, so `AutoModelForCausalLM.from_config(cfg, attn_implementation="FlashTensor")` (or
`from_pretrained`, or `model.set_attn_implementation("FlashTensor")`) runs every attention layer through an
`ft.compile`d plain-PyTorch program written the way transformers' eager attention is: GQA by repeating the KV
heads, Gemma2's soft-cap, softmax in float32. Masks are built as for SDPA: none where the causal mask alone
applies (the program then builds it from indices, so the kernels skip its tiles with no S x S mask in memory),
else a bool mask (padding, Gemma2's sliding window) filled with finfo.min as eager's additive mask adds it.
`attention_statistics` asks those same compiled calls for statistics of the probabilities P, stated in plain
PyTorch, which the fused kernels compute without writing P.
"""
from __future__ import annotations

import collections
import contextlib
import functools
from typing import Any, Callable, Iterator, Optional, cast

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..api.compiled import Compiled, compile

NAME = "FlashTensor"
"""Capitalised because transformers 5 takes any implementation whose name contains "flash" for a flash-attention
kernel (`utils.generic.is_flash_attention_requested`) and fails to load "flashtensor" as one."""

Statistic = Callable[[torch.Tensor], Any]
"""A function of P, (batch, heads, q_len, kv_len) after softmax and the cast to the query's dtype, as transformers'
eager attention weights are; it returns a tensor (or a pytree of tensors) much smaller than P."""

DECODE_RATIO = 8
"""Calls whose kv length is at least DECODE_RATIO times their query length (decode steps, a short question after a
long context) run the same program in eager PyTorch, statistics included (their P is q_len x kv_len, small): until
the key loop is split across programs (docs/design.md §7) their plan fills only batch x heads programs of a GPU.
The one place that decides it is `_fused`."""

calls: collections.Counter[str] = collections.Counter()
"""Attention calls by how they ran: "compiled" (through `ft.compile`) and "eager" (see `_fused`)."""

programs: dict[tuple[Statistic, ...], Compiled] = {}
"""The compiled programs, one per set of statistics computed, shared by every layer and model. `Compiled.programs`
holds each one's plans by call signature, which includes the scale and the soft-cap by value (a sliding window is
in the mask)."""


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(batch, kv_heads, s, d) -> (batch, kv_heads * groups, s, d), each KV head serving `groups` query heads."""
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


@functools.cache
def _program(statistics: tuple[Statistic, ...], weights: bool) -> Callable:
    """The attention program as plain PyTorch: what `ft.compile` fuses. It returns the output
    (batch, q_len, heads, head_dim), P itself only when `weights` (output_attentions; never compiled), and each
    statistic of P."""

    def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: Optional[torch.Tensor],
                  causal: bool, scaling: float, softcap: Optional[float], dropout: float) -> tuple:
        groups = query.shape[1] // key.shape[1]
        scores = torch.matmul(query, _repeat_kv(key, groups).transpose(2, 3)) * scaling
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        q_len, kv_len = scores.shape[-2:]
        if causal:          # the last q_len positions of kv_len: query i sees keys up to kv_len - q_len + i
            i = torch.arange(q_len, device=scores.device)[:, None] + (kv_len - q_len)
            scores = scores.masked_fill(torch.arange(kv_len, device=scores.device) > i, torch.finfo(scores.dtype).min)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        p = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        p = nn.functional.dropout(p, p=dropout, training=dropout > 0)
        out = torch.matmul(p, _repeat_kv(value, groups)).transpose(1, 2).contiguous()
        return out, p if weights else None, tuple(fn(p) for fn in statistics)

    return attention


def _compiled(statistics: tuple[Statistic, ...]) -> Compiled:
    if statistics not in programs:
        programs[statistics] = compile(_program(statistics, False))
    return programs[statistics]


class Recorder:
    """What one `attention_statistics` block asked for, and the statistics each attention layer's latest call gave
    (a prefill sets them; a later decode step in the same block replaces them)."""

    def __init__(self, model: nn.Module, statistics: dict[str, Statistic]) -> None:
        self.statistics = statistics
        self._owned = {id(m) for m in model.modules()}
        self.results: dict[nn.Module, dict[str, Any]] = {}

    def owns(self, module: nn.Module) -> bool:
        return id(module) in self._owned

    def __getitem__(self, layer: int | nn.Module) -> dict[str, Any]:
        """The statistics of an attention module, or of the one whose `layer_idx` is `layer`."""
        for module, stats in self.results.items():
            if module is layer or getattr(module, "layer_idx", None) == layer:
                return stats
        raise KeyError(f"no attention call of layer {layer} ran with statistics: is the model's attention "
                       f"implementation {NAME!r} (transformers' AttentionInterface)?")


_active: list[Recorder] = []


@contextlib.contextmanager
def attention_statistics(model: PreTrainedModel, **statistics: Statistic) -> Iterator[Recorder]:
    """Within the block, every attention call of `model` also computes each named statistic of its probabilities,
    fused with the attention on the GPU, and the yielded `Recorder` holds them per layer:

        with attention_statistics(model, h2o=lambda p: p.sum(dim=-2)) as stats:
            model(input_ids, attention_mask=attention_mask)
        stats[0]["h2o"]     # layer 0: (batch, heads, kv_len)

    The model runs on the "FlashTensor" attention implementation inside the block (and on its own again after).
    Reuse one function object per statistic: each distinct set of statistics is its own compiled program."""
    recorder = Recorder(model, statistics)
    with _implementation(model, NAME):
        _active.append(recorder)
        try:
            yield recorder
        finally:
            _active.remove(recorder)


@contextlib.contextmanager
def _implementation(model: PreTrainedModel, name: str) -> Iterator[None]:
    previous = model.config._attn_implementation
    if previous == name:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def _fused(query: torch.Tensor, key: torch.Tensor, dropout: float, weights: bool) -> bool:
    """Whether a call runs the compiled program (else the same program in eager PyTorch): not when it must return
    P (output_attentions), not under dropout (random), not for decode-shaped calls (DECODE_RATIO)."""
    return not weights and dropout == 0 and query.shape[2] * DECODE_RATIO > key.shape[2]


def attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      softcap: Optional[float] = None, **kwargs: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """transformers' attention-interface signature: query (batch, heads, q_len, head_dim), key and value
    (batch, kv_heads, kv_len, head_dim), the bool mask of `sdpa_mask` (True: attend; a sliding window, in kwargs,
    is already in it) or None where the causal mask alone applies, as SDPA's `is_causal`; returns the output
    (batch, q_len, heads, head_dim) and P only under output_attentions."""
    if scaling is None:
        scaling = cast(int, module.head_dim) ** -0.5
    recorders = [r for r in _active if r.owns(module)]
    statistics = tuple(dict.fromkeys(fn for r in recorders for fn in r.statistics.values()))
    weights = bool(kwargs.get("output_attentions"))
    causal = attention_mask is None and query.shape[2] > 1 and getattr(module, "is_causal", True)
    args = (query, key, value, attention_mask, causal, scaling, softcap, dropout)
    if _fused(query, key, dropout, weights):
        calls["compiled"] += 1
        out, p, values = _compiled(statistics)(*args)
    else:
        calls["eager"] += 1
        out, p, values = _program(statistics, weights)(*args)
    for r in recorders:
        r.results[module] = {name: values[statistics.index(fn)] for name, fn in r.statistics.items()}
    return out, p


AttentionInterface.register(NAME, attention_forward)
AttentionMaskInterface.register(NAME, sdpa_mask)
