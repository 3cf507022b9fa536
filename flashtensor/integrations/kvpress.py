"""kvpress's attention-scored presses on FlashTensor's fused statistics.

The one change to a kvpress program is the import:

    from kvpress import ObservedAttentionPress            # needs attn_implementation="eager": P in every layer
    from flashtensor.integrations.kvpress import ObservedAttentionPress     # any attn_implementation

The presses here are kvpress's own classes (same fields, same `with press(model):` and pipeline use, same
scores); inside the `with` block the model runs on the "FlashTensor" attention implementation, whose compiled
attention also returns the statistic of P the press reads, so no layer writes P (on the GPU; on the CPU the same
kernels run in Triton's interpreter). ObservedAttentionPress (H2O) reads column sums; SnapKVPress and
PyramidKVPress the mean of the last `window_size` rows; TOVAPress the last row.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Iterator, Optional

import kvpress
import torch
from torch import nn
from transformers import PreTrainedModel

from .transformers import Recorder, Statistic, attention_statistics


def _column_sums(p: torch.Tensor) -> torch.Tensor:
    return p.sum(dim=-2)


@functools.cache
def _window_mean(window: int) -> Statistic:
    """The mean of P's last `window` query rows; one function per window, so each is one compiled program."""

    def window_mean(p: torch.Tensor) -> torch.Tensor:
        return p[..., -window:, :].mean(dim=-2)

    return window_mean


class _Fused(kvpress.ScorerPress):
    """Runs kvpress's own scoring on a statistic the compiled attention computed, not on P. The statistic
    (batch, heads, kv_len) is handed to kvpress's `score` as one row of attention weights, (batch, heads, 1, kv_len):
    what each press reads of P (a sum over the query rows, the last rows' mean, the last row) gives the statistic
    back from that row, so the indices kvpress keeps are those its eager path keeps."""

    _recorder: Optional[Recorder] = None

    def statistic(self) -> Statistic:
        raise NotImplementedError

    @contextlib.contextmanager
    def __call__(self, model: PreTrainedModel) -> Iterator[None]:
        with attention_statistics(model, attentions=self.statistic()) as recorder, super().__call__(model):
            self._recorder = recorder
            try:
                yield
            finally:
                self._recorder = None

    def score(self, module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              attentions: Optional[torch.Tensor], kwargs: dict[str, Any]) -> torch.Tensor:
        """Outside this press's own `with` block (inside another press that calls it) kvpress scores as it would."""
        if self._recorder is not None:
            attentions = self._recorder[module]["attentions"].unsqueeze(-2)
        return super().score(module, hidden_states, keys, values, attentions, kwargs)


class ObservedAttentionPress(_Fused, kvpress.ObservedAttentionPress):
    """H2O: the mean attention each key receives, from P's column sums."""

    def statistic(self) -> Statistic:
        return _column_sums


class SnapKVPress(_Fused, kvpress.SnapKVPress):
    """SnapKV: the attention of the last `window_size` queries."""

    def statistic(self) -> Statistic:
        return _window_mean(self.window_size)


class PyramidKVPress(SnapKVPress, kvpress.PyramidKVPress):
    """PyramidKV: SnapKV's scores with a budget per layer (kvpress's `compress`)."""


class TOVAPress(_Fused, kvpress.TOVAPress):
    """TOVA: the last query's attention, averaged over heads."""

    def statistic(self) -> Statistic:
        return _window_mean(1)
