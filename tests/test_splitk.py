"""Split loops (flash-decoding, codegen/split.py): short queries against longer keys, the row kernel's loop over
keys split across programs and merged by the combine kernel, against eager.

The split is forced (Options.splits) at counts that do not divide the key tiles, and beyond them (pieces with no
tile, whose running max stays -inf); masks give pieces and rows with no live key. Every split kernel must merge
to the unsplit answer under the project's tolerances, NaN of a fully masked -inf row included.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import flashtensor as ft
from conftest import assert_close, prefill_in_chunks
from flashtensor import workloads
from flashtensor.codegen import split
from flashtensor.ir.sizes import evaluate
from flashtensor.runtime.launch import run_kernels
from flashtensor.schedule.schedule import build_schedule
from flashtensor.testing import as_tuple, compare_with_exact


def _scores(q, k):
    """Scores in float32 at least (float64 for the exact answer: flashtensor.testing.compare_with_exact)."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return s.float() if s.dtype in (torch.float16, torch.bfloat16) else s


def h2o(q, k, v):
    """Attention output and the column sums of P, with the causal mask offset to the last q_len keys."""
    s = _scores(q, k)
    sq, sk = s.shape[-2:]
    s = s + torch.full((sq, sk), float("-inf"), dtype=s.dtype, device=s.device).triu(sk - sq + 1)
    p = F.softmax(s, dim=-1)
    return p.to(q.dtype) @ v, p.sum(dim=-2)


def attention(q, k, v):
    """Attention alone, no mask."""
    return F.softmax(_scores(q, k), dim=-1).to(q.dtype) @ v


def window_finfo(q, k, v):
    """Hugging Face style: a finfo.min mask that keeps a window of 40 keys before each query's diagonal; the first
    query row keeps none (eager: a uniform row). Most pieces of the loop see no live key."""
    s = _scores(q, k)
    sq, sk = s.shape[-2:]
    i = torch.arange(sq)[:, None] + (sk - sq)
    j = torch.arange(sk)[None, :]
    keep = (j <= i) & (j > i - 40) & (torch.arange(sq)[:, None] > 0)
    p = F.softmax(s + torch.where(keep, 0.0, torch.finfo(torch.float32).min), dim=-1)
    return p.to(q.dtype) @ v, p.sum(dim=-2)


def masked_row(q, k, v):
    """A causal -inf mask and a first query row with every key masked: eager's NaN there (the row and its
    column sums)."""
    s = _scores(q, k)
    sq, sk = s.shape[-2:]
    s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(sk - sq + 1), float("-inf"))
    s = s.masked_fill(torch.arange(sq)[:, None] == 0, float("-inf"))
    p = F.softmax(s, dim=-1)
    return p.to(q.dtype) @ v, p.sum(dim=-2)


def _inputs(sq: int, sk: int, dtype: torch.dtype, b: int = 1, h: int = 2, d: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 31 * sq + sk)
    return [torch.randn(b, h, n, d, generator=g).to(dtype) for n in (sq, sk, sk)]


def _close(fn, out, args) -> None:
    """docs/design.md §6: eager's answer, or no farther from float64's than eager (bf16 eager is often 3-5e-3 off)."""
    exact = as_tuple(fn(*[a.double() for a in args]))
    for k, (o, r) in enumerate(zip(as_tuple(out), as_tuple(fn(*args)))):
        m = compare_with_exact(o, r, exact[k])
        assert m.ok, f"output {k}: {m.problem}"


def _run(fn, args, splits: int | None, **options):
    c = ft.compile(fn, cache=False, splits=splits, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = c(*args)
    _close(fn, out, args)
    (prog,) = c.held_programs()
    assert not prog.plan.eager, prog.notes
    return prog


def _split_kernels(prog) -> list[str]:
    return [k.name for k in prog.kernels if k.combine is not None]


CASES = [   # (program, q_len, kv_len, dtype, splits)
    (h2o, 1, 64, torch.float32, 2), (h2o, 4, 150, torch.float32, 3), (h2o, 16, 300, torch.float16, 7),
    (h2o, 17, 200, torch.bfloat16, 3), (h2o, 4, 100, torch.float16, 1),
    (attention, 1, 300, torch.float16, 7), (attention, 16, 130, torch.float32, 2),
    (attention, 17, 64, torch.bfloat16, 7), (attention, 4, 257, torch.float32, 3),
    (window_finfo, 4, 300, torch.float32, 7), (window_finfo, 17, 150, torch.float16, 3),
    (window_finfo, 1, 200, torch.float32, 2),
    (masked_row, 16, 200, torch.float32, 3), (masked_row, 4, 64, torch.float16, 2),
]


@pytest.mark.parametrize("fn,sq,sk,dtype,splits", CASES,
                         ids=[f"{c[0].__name__}-q{c[1]}-kv{c[2]}-{str(c[3])[6:]}-s{c[4]}" for c in CASES])
def test_split_matches_eager(fn, sq, sk, dtype, splits):
    prog = _run(fn, _inputs(sq, sk, dtype), splits)
    assert bool(_split_kernels(prog)) == (splits != 1), [k.config for k in prog.kernels]


def test_split_grid_and_explain():
    """The split kernel launches its row tiles times the split count, and explain says so."""
    args = _inputs(4, 200, torch.float32)
    prog = _run(h2o, args, 3)
    row = next(k for k in prog.kernels if k.combine is not None)
    assert row.splits == 3 and row.combine.name.endswith("_combine")
    assert row.grid[0] == 3 * row.combine.grid[0]
    report = str(ft.explain(ft.compile(h2o, cache=False, splits=3), *args))
    assert "loop split 3 ways" in report


def test_sizes_choose_the_split():
    """Unforced, a few programs over a long loop split (decode's shape); a full grid does not (prefill)."""
    assert _split_kernels(_run(attention, _inputs(1, 1200, torch.float32, h=1), None, split_programs=4))
    assert not _split_kernels(_run(attention, _inputs(64, 1200, torch.float32, h=4), None, split_programs=4))


def test_generic_plan_splits_at_run_time():
    """A shape-generic plan computes its split count from the call's sizes: one plan serves a decode-like call
    that splits and a longer query that does not, both matching eager."""
    c = ft.compile(h2o, cache=False, dynamic=True, split_programs=8)
    counts = []
    for sq, sk in ((2, 520), (40, 520), (3, 600)):
        args = _inputs(sq, sk, torch.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert_close(c(*args), h2o(*args))
        (prog,) = c.generic_programs()
        row = next(k for k in prog.kernels if k.combine is not None)
        counts.append(evaluate(row.splits, prog.sizes(args)))
        # the pieces' scratch is allocated only where the loop splits: in one piece the kernel writes none
        tensors = [args[i] for i in prog.tensor_positions]
        bufs = run_kernels(prog.launches, tensors + prog.consts, tensors[0].device, prog.sizes(args))
        scratch = [b.numel() for k, b in bufs.items() if isinstance(k, tuple) and k[0] == "split" and row.name in k]
        assert scratch and all((n == 1) == (counts[-1] == 1) for n in scratch), (counts[-1], scratch)
    assert c.cache_info()["searches"] == 1
    assert counts[0] > 1 and counts[1] == 1 and counts[2] > 1, counts


def test_fixup_pass_merges_again():
    """A non-finite input: the fixup pass recomputes every piece and the combine merges them again."""
    args = _inputs(4, 150, torch.float32)
    args[1][0, 1, 70, 3] = float("nan")
    _run(masked_row, args, 3)


@pytest.mark.unit
def test_only_one_pass_of_mergeable_reductions_splits():
    """splittable: a one-pass loop of sums and maxima splits; a loop with a second pass does not."""
    from flashtensor import driver

    def two_pass(q, k):
        s = _scores(q, k)
        return (s - s.amax(dim=-1, keepdim=True)).pow(2).sum(dim=-1)

    for fn, args, want in ((attention, _inputs(4, 100, torch.float32), True),
                           (two_pass, _inputs(4, 100, torch.float32)[:2], False)):
        (_, plan), *_ = driver.candidate_plans(fn, args)
        got = [split.splittable(build_schedule(p)) for p in plan.stages["partition"][0]]
        assert any(got) == want, got


def test_prefill_in_chunks_with_split_loops():
    """Chunked prefill with every key loop split: each chunk's outputs and column sums, accumulated over the
    chunks, equal the one-shot result."""
    b, h, s, chunk = 1, 2, 96, 16
    q, k, v = _inputs(s, s, torch.float32, b, h, seed=3)
    c = ft.compile(h2o, cache=False, splits=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs, cols = prefill_in_chunks(c, q, k, v, chunk)
    out, col = h2o(q, k, v)
    torch.testing.assert_close(outs, out, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(cols, col, rtol=2e-5, atol=2e-5)
    assert c.cache_info()["generic"] == 1


@pytest.mark.parametrize("name", [n for n in workloads.NAMES if n != "ea"])    # ea: sima's kernels, 4x the time
def test_reference_workloads_split_three_ways(name):
    """Every reference workload with every loop that can split split three ways (skipped and constant-folded
    tiles, an early-stopping `any`, KeyFormer's noise check, linear attention's context) matches eager."""
    fn, args = workloads.make(name, device="cpu", dtype=torch.float16, **workloads.SMALL)
    c = ft.compile(fn, cache=False, splits=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_close(c(*args), fn(*args))
    (prog,) = c.programs.values()
    assert _split_kernels(prog)


def hf_h2o(q, k, v, mask):
    """transformers' eager attention with its additive mask passed in, and the column sums of P."""
    p = F.softmax(_scores(q, k) + mask, dim=-1)
    return p.to(q.dtype) @ v, p.sum(dim=-2)


@pytest.mark.parametrize("kind", ["padding", "sinks"])
def test_masks_read_from_tensors_split(kind):
    """A mask passed in, whose tiles a pre-pass skips at run time (left padding; StreamingLLM's sinks and window, a
    gap), with the loop split: pieces wholly inside the padding or the gap hold no live key."""
    b, sq, sk = 2, 17, 200
    i, j = torch.arange(sq)[:, None] + (sk - sq), torch.arange(sk)[None, :]
    keep = (j <= i) & ((j >= torch.tensor([0, 70])[:, None, None, None]) if kind == "padding"
                       else ((j < 4) | (j > i - 40)))
    mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min).expand(b, 1, sq, sk).contiguous()
    prog = _run(hf_h2o, _inputs(sq, sk, torch.float32, b) + [mask], 3)
    assert any(k.prologues for k in prog.kernels if k.combine is not None), [k.name for k in prog.kernels]


@pytest.mark.unit
@pytest.mark.parametrize("sq,sk,split", [(1, 32768, True), (16, 131072, True), (4096, 4096, False), (1, 128, False)])
def test_the_sizes_choose_decode_splits_on_the_h200(sq, sk, split):
    """At the GPU's shapes (B=1, H=32, D=128, fp16; meta tensors, nothing runs) the row kernel of a decode or a short
    chunk splits its key loop to about Options.split_programs programs, and prefill's (1024 programs) does not, nor
    a loop of too few tiles; the column kernel never splits."""
    from flashtensor import driver
    from flashtensor.codegen.kernel import emit_kernel
    from flashtensor.options import CONFIGS

    q, k = (torch.empty(1, 32, n, 128, dtype=torch.float16, device="meta") for n in (sq, sk))
    (_, plan), *_ = driver.candidate_plans(h2o, [q, k, k.clone()])
    row, col = (emit_kernel(spec, CONFIGS[0]) for spec in plan.stages["emit"][0])
    assert (row.splits != 1) == split and col.splits == 1, (row.splits, col.splits)
    if split:
        assert row.grid[0] * 4 >= 528 and row.combine is not None, row.grid


@pytest.mark.unit
def test_configurations_that_split_differently_get_their_own_scratch():
    """The tuner runs every configuration on one set of buffers, allocated by the first that needs each key. At
    decode's shapes with 2K keys the loop block decides the count (64-key tiles: 8 pieces of 4, 32-key tiles: 16),
    so the pieces' scratch buffers must differ by count: a shared one sized for 8 pieces took 16 (out of bounds
    on the GPU)."""
    from flashtensor import driver
    from flashtensor.codegen.kernel import emit_kernel
    from flashtensor.options import CONFIGS

    q, k = (torch.empty(1, 32, n, 128, dtype=torch.float16, device="meta") for n in (4, 2048))
    (_, plan), *_ = driver.candidate_plans(attention, [q, k, k.clone()])
    (spec,) = plan.stages["emit"][0]
    wide, narrow = (emit_kernel(spec, c) for c in (CONFIGS[0], CONFIGS[4]))     # 64- and 32-key loop tiles
    assert (wide.splits, narrow.splits) == (8, 16), (wide.splits, narrow.splits)
    scratch = {k.splits: {b.source: b.shape for b in k.buffers if b.source[0] == "split"} for k in (wide, narrow)}
    assert scratch[8] and scratch[16] and not set(scratch[8]) & set(scratch[16]), scratch
    assert all(shape[0] == n for n, bufs in scratch.items() for shape in bufs.values())
