"""cat, stack, repeat and step slices, the layout ops real programs join and repeat tensors with: each lowers to
the loop form (evaluated there against eager without a kernel) and fuses, in float32 and fp16, on fresh random
inputs; a KV-cache append and a query block joined along the row axis cover the tiled variables, not only the
head dimension held whole."""
import math

import pytest
import torch

from conftest import compiled_matches_eager
from flashtensor.frontend.capture import capture
from flashtensor.ir.loops import evaluate_loops
from flashtensor.testing import compare
from flashtensor.transform.decompose import decompose
from flashtensor.transform.loopform import to_loops


def rand(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def kv_cache_append(q, past_k, past_v, k, v):
    """A decoder step with a cache (transformers' DynamicCache.update): the new keys and values joined after the
    cached ones along the sequence, then attention over all of them."""
    return attention(q, torch.cat([past_k, k], dim=-2), torch.cat([past_v, v], dim=-2))


def joined_queries(q1, q2, k, v):
    """Two query blocks joined along the row axis (uneven sizes: tiles straddle the seam)."""
    return attention(torch.cat((q1, q2), dim=2), k, v)


def stacked_heads(a, b, k, v):
    """Heads built separately and stacked on a new head axis; a scaled copy joins along the head dimension."""
    q = torch.stack([a, b * 0.5], dim=1)
    return attention(torch.cat([q, q * 2.0], dim=-1), torch.cat([k, k], dim=-1), v)


def repeated_scores(q, k):
    """kvpress's TOVA spelling: row statistics repeated for every KV head (`scores.repeat(1, n, 1)`)."""
    p = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    return p.mean(dim=-2).repeat(1, 3, 1)


def every_other(x, w):
    """Step slices (GPT-J's x[..., ::2], x[..., 1::2]) scaled by a weight, stacked and interleaved back."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2 * w[1::2], x1 * w[::2]), dim=-1).flatten(-2)


def gptj_rope_attention(q, k, v, sin, cos):
    """GPT-J's apply_rotary_pos_emb (rotate_every_two: step-2 slices stacked and flattened back) on q and k,
    whose scores then contract the rotated head dimension."""
    def rotate_every_two(x):
        x1, x2 = x[:, :, :, ::2], x[:, :, :, 1::2]
        return torch.stack((-x2, x1), dim=-1).flatten(-2)
    q, k = q * cos + rotate_every_two(q) * sin, k * cos + rotate_every_two(k) * sin
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def reversed_quarters(q, k):
    """Step-4 slices from every start, stacked in reverse and flattened: each group of four of the head
    dimension reversed, read as q and k are loaded for their scores."""
    def flip4(x):
        return torch.stack([x[..., i::4] for i in (3, 2, 1, 0)], dim=-1).flatten(-2)
    return torch.softmax(flip4(q) @ flip4(k).transpose(-2, -1), dim=-1).sum(dim=-2)


def window_mask_added(q, k, m):
    """SnapKV's in-place add of a causal mask into the window's last keys (`w[..., -8:, -8:] += mask`: a tensor
    written into a window, a slice_scatter of it and a copy), and the first query's scores replaced by the
    second's (a select_scatter of a tensor): the base around each window joined by a cat."""
    w = q @ k.transpose(-1, -2) / 4.0
    w[:, :, -8:, -8:] += m
    w[:, :, 0] = w[:, :, 1]
    return torch.softmax(w, dim=-1).sum(dim=-2)


CASES = {
    "kv_cache_append": (kv_cache_append, lambda dt: (rand(1, 2, 40, 16, seed=1, dtype=dt),
                                                      rand(1, 2, 29, 16, seed=2, dtype=dt),
                                                      rand(1, 2, 29, 16, seed=3, dtype=dt),
                                                      rand(1, 2, 40, 16, seed=4, dtype=dt),
                                                      rand(1, 2, 40, 16, seed=5, dtype=dt))),
    "joined_queries": (joined_queries, lambda dt: (rand(2, 2, 37, 16, seed=6, dtype=dt),
                                                    rand(2, 2, 30, 16, seed=7, dtype=dt),
                                                    rand(2, 2, 48, 16, seed=8, dtype=dt),
                                                    rand(2, 2, 48, 16, seed=9, dtype=dt))),
    "stacked_heads": (stacked_heads, lambda dt: (rand(1, 24, 8, seed=10, dtype=dt), rand(1, 24, 8, seed=11, dtype=dt),
                                                  rand(1, 2, 40, 8, seed=12, dtype=dt),
                                                  rand(1, 2, 40, 8, seed=13, dtype=dt))),
    "repeated_scores": (repeated_scores, lambda dt: (rand(2, 24, 16, seed=14, dtype=dt),
                                                      rand(2, 40, 16, seed=15, dtype=dt))),
    "every_other": (every_other, lambda dt: (rand(2, 24, 16, seed=16, dtype=dt), rand(16, seed=17, dtype=dt))),
    "gptj_rope_attention": (gptj_rope_attention, lambda dt: (*(rand(1, 2, 40, 16, seed=s, dtype=dt) for s in (18, 19, 20)),
                                                              rand(40, 16, seed=21, dtype=dt).sin(),
                                                              rand(40, 16, seed=21, dtype=dt).cos())),
    "window_mask_added": (window_mask_added, lambda dt: (rand(2, 2, 24, 16, seed=24, dtype=dt),
                                                          rand(2, 2, 40, 16, seed=25, dtype=dt),
                                                          torch.zeros(8, 8).masked_fill(
                                                              torch.ones(8, 8, dtype=torch.bool).triu(1), -1e4)
                                                          .to(dt))),
    "reversed_quarters": (reversed_quarters, lambda dt: (rand(2, 24, 16, seed=22, dtype=dt),
                                                          rand(2, 40, 16, seed=23, dtype=dt))),
}


@pytest.mark.unit
@pytest.mark.parametrize("name", CASES)
def test_loop_form_of_joins_matches_eager(name):
    """The loop form alone (ir.loops.evaluate_loops, no kernel): pieces read past their range load 0 there, and
    the cat's where never picks them."""
    fn, make = CASES[name]
    args = make(torch.float32)
    loops, consts = to_loops(decompose(capture(fn, args)))
    (out,) = evaluate_loops(loops, [*args, *consts])
    m = compare(out, fn(*args))
    assert m.ok, m.problem


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", CASES)
def test_joins_fuse_and_match_eager(name, dtype):
    fn, make = CASES[name]
    _, compiled = compiled_matches_eager(fn, make(dtype))
    (program,) = compiled.programs.values()
    assert program.launches and not program.notes, program.notes
    if fn not in (repeated_scores, every_other):
        assert all("tl.dot(" in launch.source.source for launch in program.launches)
