"""Which variables the schedule puts in the grid, tiles or loops over (schedule/schedule.py)."""

import pytest
import torch
import torch.nn.functional as F

import flashtensor as ft
from conftest import compiled_matches_eager


def entropy(q, k, v):
    """Attention with the entropy of each row, as analysis code logs it: its sum multiplies p by log(p + eps),
    two factors over the same variables."""
    p = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
    return p @ v, -(p * torch.log(p + 1e-9)).sum(dim=-1)


def cosine(q, k, v):
    """Cosine-similarity scores: the norms sum q * q over the head dimension."""
    s = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2) * 10.0
    return torch.softmax(s, dim=-1) @ v


def _batch_lines(fn, args):
    report = ft.explain(ft.compile(fn, cache=False), *args)
    return [line for prop in report.properties for line in prop.roles if "batch" in line]


@pytest.mark.parametrize("S", [70, 128])
def test_a_sum_of_same_variable_factors_keeps_the_query_axis_tiled(S):
    """A sum whose factors share every variable is not a matmul, so its shared variables are not the batch of
    one: the query axis stays the tiled row instead of one program per query (entropy ran at 0.31x eager on
    the H200 that way; cosine similarity put every variable in the grid, one program per score without tl.dot:
    minutes per call at S=128 in the interpreter), and the answer is eager's."""
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    for fn in (entropy, cosine):
        args = tuple(torch.randn(1, 2, S, 16, generator=g) for _ in range(3))
        compiled_matches_eager(fn, args)
        batch = _batch_lines(fn, args)
        assert not [line for line in batch if f"<{S}>" in line], (fn.__name__, batch)
