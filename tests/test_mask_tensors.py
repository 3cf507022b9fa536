"""Masks read from tensors skip tiles at run time (codegen/ranges.py): Hugging Face's 4-D additive mask of 0 and
finfo.min passed in, bool masks passed in (torch.where, masked_fill) and masks captured from the enclosing scope. A
pre-pass gives each row tile the loop range outside the masked tiles; a row tile with a fully masked row keeps the
full range (eager's uniform row under finfo.min, NaN under -inf); column statistics get ranges per key tile.

Each test matches eager and checks the skip three ways: explain lists the run-time regions, the pre-pass's ranges
leave out only tiles that are masked on every row (and no fully masked row's tiles), and the kernel's loop visits
exactly the tiles in those ranges (its tl.dot calls, counted in Triton's interpreter, against the same program on a
mask that masks nothing)."""
import math
import warnings

import pytest
import torch
from triton.runtime import interpreter

import flashtensor as ft
from conftest import assert_close
from flashtensor.codegen.artifact import FINITE
from flashtensor.options import TileConfig
from flashtensor.runtime import launch
from flashtensor.runtime.launch import run_kernels
from flashtensor.testing import compare_with_exact

B, H, S, D = 2, 2, 64, 16
BLOCK = 16
TILES = (TileConfig(BLOCK, BLOCK, 4, 2),)     # small tiles, so that the small shapes have tiles to skip


# ---- the programs, as transformers, kvpress and research code write them -----------------------------------------

def hf_attention(query, key, value, attention_mask):
    """transformers' eager_attention_forward: the additive mask added to the scaled scores, softmax in float32."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * D ** -0.5
    attn_weights = attn_weights + attention_mask
    attn_weights = torch.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(attn_weights, value)


def hf_h2o(query, key, value, attention_mask):
    """The same attention with H2O's column sums of the probabilities (a kernel whose loop runs over queries)."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * D ** -0.5 + attention_mask
    p = torch.softmax(attn_weights, dim=-1, dtype=torch.float32)
    return torch.matmul(p.to(query.dtype), value), p.sum(dim=-2)


def where_attention(fill):
    def fn(q, k, v, keep):
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        s = torch.where(keep, s, fill(s.dtype))
        return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v
    return fn


def masked_fill_attention(fill):
    def fn(q, k, v, keep):
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        return torch.softmax(s.masked_fill(~keep, fill(s.dtype)).float(), dim=-1).to(q.dtype) @ v
    return fn


def captured_attention(keep, fill):
    """A bool mask built outside the function and captured (kvpress, research code): a constant of the plan."""
    def fn(q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        s = s.masked_fill(~keep, fill(s.dtype))
        return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v
    return fn


FINFO_MIN = lambda dt: torch.finfo(dt).min      # noqa: E731
NEG_INF = lambda dt: -math.inf                  # noqa: E731
MINUS_1E9 = lambda dt: -1e9                     # noqa: E731


# ---- the masks: which keys each query keeps, (B, 1, S, S) ----------------------------------------------------------

def _index():
    return torch.arange(S)[:, None], torch.arange(S)[None, :]


def causal():
    i, j = _index()
    return (j <= i).expand(B, 1, S, S)


def window(w=20):
    i, j = _index()
    return ((j <= i) & (j > i - w)).expand(B, 1, S, S)


def sinks(n_sink=4, w=16):
    i, j = _index()
    return ((j <= i) & ((j < n_sink) | (j > i - w))).expand(B, 1, S, S)


def left_padding(lengths=(S, S - 21)):
    """transformers' causal mask of a left-padded batch: sequence b's first S - lengths[b] keys are padding, and its
    padded query rows keep no key (fully masked rows)."""
    i, j = _index()
    pads = torch.tensor([S - n for n in lengths])[:, None, None, None]
    return (j <= i) & (j >= pads)


MASKS = {"causal": causal, "window": window, "sinks": sinks, "left_padding": left_padding}


def _additive(keep, dtype):
    """The 4-D additive mask transformers builds for eager attention: 0 where kept, finfo(dtype).min elsewhere."""
    return torch.where(keep, 0.0, torch.finfo(dtype).min).to(dtype)


def _qkv(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(3)]


# ---- how the checks see a plan -------------------------------------------------------------------------------------

def _compiled(fn, args, tiles=TILES):
    """ft.compile at the small tiles, called once, matching eager (bf16 by docs/design.md §6's float64 rule: eager's
    bf16 is itself 3-5e-3 from the exact answer, and the interpreter's further)."""
    compiled = ft.compile(fn, cache=False, configs=tiles)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(*args)
    ref = fn(*args)
    if args[0].dtype == torch.bfloat16:
        exact = fn(*[a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args])
        m = compare_with_exact(out, ref, exact)
        assert m.ok, m.problem
    else:
        assert_close(out, ref)
    prog = compiled.program_for(args)
    assert prog.launches, prog.notes
    return compiled, prog


def _run(prog, args) -> tuple[dict, int]:
    """One run of the plan's kernels in Triton's interpreter: every buffer (the pre-passes' ranges among them) and
    the tl.dot calls made, which count the loop tiles the kernels visit."""
    tensors = [args[i] for i in prog.tensor_positions]
    count = [0]
    dot = interpreter.InterpreterBuilder.create_dot

    def counted(self, *a, **k):
        count[0] += 1
        return dot(self, *a, **k)
    interpreter.InterpreterBuilder.create_dot = counted
    try:
        bufs = run_kernels(prog.launches, tensors + prog.consts, tensors[0].device, prog.sizes(tensors))
    finally:
        interpreter.InterpreterBuilder.create_dot = dot
    return bufs, count[0]


def _buffers(prog, args):
    return _run(prog, args)[0]


def _ranges(bufs: dict, prog) -> list[torch.Tensor]:
    """Each kernel's run-time ranges (batch entries, row tiles, 2) in `bufs`, in plan order (None for a kernel
    without)."""
    return [next((bufs[b.source] for b in k.buffers if b.source[0] == "ranges"), None) for k in prog.kernels]


def _check_ranges(r: torch.Tensor, masked: torch.Tensor, transposed: bool = False, rows: int = BLOCK,
                  split: int = 1) -> tuple[int, int]:
    """The ranges of a kernel over query tiles looping over keys (or, transposed, over key tiles looping over queries)
    against eager's masked elements (batch entries, S, S), one range [lo, hi) less a gap [ga, gb) per block of
    `rows` rows (`split` of them a row tile of the kernel): every loop position they leave out is masked on every
    row of its block, a query row with no key kept (whose row max eager takes over masked scores) is never left
    out, and the run [fa, fb) that runs without the mask keeps every element. Returns the loop tiles the kernel visits (the union of its row tile's ranges, less the gap they share) and
    all of them."""
    full = masked.all(-1)                                   # (batch entries, queries): fully masked rows
    grid = masked.transpose(-1, -2) if transposed else masked
    n = masked.shape[-1]
    visited = total = 0
    for b in range(r.shape[0]):
        for t in range(r.shape[1]):
            lo, hi, ga, gb, fa, fb = (r[b, t].tolist() + [0, 0])[:6]
            block = grid[b, t * rows:(t + 1) * rows]
            out = [x for x in range(n) if not lo <= x < hi or ga <= x < gb]
            assert block[:, out].all(), (b, t, lo, hi, ga, gb)
            assert not block[:, fa:fb].any(), (b, t, fa, fb)      # a run of tiles the masks keep whole
            if transposed:
                assert not full[b, out].any(), (b, t, lo, hi, ga, gb)
            elif full[b, t * rows:(t + 1) * rows].any():
                assert lo == 0 and hi >= n and ga == gb, (b, t, lo, hi, ga, gb)
        for t in range(0, r.shape[1], split):
            tile = r[b, t:t + split]
            lo, hi = tile[:, 0].min().item(), min(tile[:, 1].max().item(), n)
            ga = min(max(tile[:, 2].max().item(), lo), hi)
            gb = max(ga, min(tile[:, 3].min().item(), hi))
            visited += max(0, math.ceil(hi / BLOCK) - lo // BLOCK) - (gb - ga) // BLOCK
            total += math.ceil(n / BLOCK)
    return visited, total


def _skips(fn, args, masked, none, tiles=TILES, rows=BLOCK) -> None:
    """fn(*args) matches eager, explain lists run-time regions, its ranges leave out masked tiles only, and the
    kernel visits exactly the tiles in them: its dots against those of fn on `none`, the arguments with a mask that
    masks nothing."""
    compiled, prog = _compiled(fn, args, tiles)
    props = ft.explain(compiled, *args).properties
    assert props[0].runtime and not props[0].skipped, props
    bufs, dots = _run(prog, args)
    visited, total = _check_ranges(_ranges(bufs, prog)[0], masked, rows=rows, split=tiles[0].block_row // rows)
    assert visited < total
    # the mask is an input: the same callable's plan for it (the same one where the strides match) visits every tile
    assert dots * total == _run(compiled.program_for(none), none)[1] * visited


# ---- additive masks passed in ----------------------------------------------------------------------------------------

# every mask in float32; in half precision (its own finfo.min) the two with fully masked rows and a gap
@pytest.mark.parametrize("mask, dtype", [
    pytest.param(m, dt, id=f"{name}-{m}")
    for name, dt, masks in (("fp32", torch.float32, list(MASKS)), ("fp16", torch.float16, ["left_padding", "sinks"]),
                            ("bf16", torch.bfloat16, ["left_padding", "sinks"]))
    for m in masks])
def test_hf_additive_masks_skip_their_masked_tiles(mask, dtype):
    keep = MASKS[mask]()
    q, k, v = _qkv(dtype)
    _skips(hf_attention, (q, k, v, _additive(keep, dtype)), ~keep[:, 0], (q, k, v, _additive(keep | True, dtype)))


def test_a_row_tile_is_read_by_blocks_of_32_rows():
    """A row tile of 64 is two pre-pass programs of 32 rows (so that every multiprocessor reads); the kernel takes
    the union of their ranges. At 160 keys, with 40 of them padding in one sequence."""
    n = 160
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    keep = (j <= i) & (j >= torch.tensor([0, 40])[:, None, None, None])
    g = torch.Generator().manual_seed(9)
    q, k, v = [torch.randn(B, H, n, D, generator=g).half() for _ in range(3)]
    _skips(hf_attention, (q, k, v, _additive(keep, torch.float16)), ~keep[:, 0],
           (q, k, v, _additive(keep | True, torch.float16)), tiles=(TileConfig(64, BLOCK, 4, 2),), rows=32)


def test_sinks_and_a_window_leave_a_gap():
    """StreamingLLM's sinks and window as a mask passed in: a row tile past the window keeps the sink tile and the
    window's; the keys between are a gap its loop steps over."""
    keep = sinks()
    q, k, v = _qkv(torch.float32, 10)
    args = (q, k, v, _additive(keep, torch.float32))
    _skips(hf_attention, args, ~keep[:, 0], (q, k, v, _additive(keep | True, torch.float32)))
    prog = _compiled(hf_attention, args)[1]
    r = _ranges(_buffers(prog, args), prog)[0]
    assert (r[..., 3] > r[..., 2]).any(), r


def test_tiles_the_mask_keeps_run_without_it_and_the_longest_first():
    """The pre-pass also finds each row tile's longest run of tiles whose every element the mask keeps (0 added):
    one loop of the kernel runs them without loading the mask, as FlexAttention's full blocks do. And it sorts the
    row tiles by their ranges, so that the longest start first: causal, the last row tile first."""
    keep = causal()
    q, k, v = _qkv(torch.float32, 11)
    args = (q, k, v, _additive(keep, torch.float32))
    _, prog = _compiled(hf_attention, args)
    kernel = prog.kernels[0]
    mask = next(b.name for b in kernel.buffers if b.source == ("in", 3))
    start = kernel.source.index("    else:\n        fin = 1")         # the first pass, to the pre-passes' code
    first = kernel.source[start:kernel.source.index("@triton.jit", start)]
    loops = first.split("for n0 in ")[1:]
    assert any(f"tl.load({mask} " not in loop for loop in loops) and any(f"tl.load({mask} " in loop for loop in loops)
    bufs = _buffers(prog, args)
    r = next(t for key, t in bufs.items() if key[0] == "ranges")
    assert (r[..., 5] > r[..., 4]).any(), r
    order = next(t for key, t in bufs.items() if key[0] == "order")
    assert order.tolist() == [list(range(S // BLOCK))[::-1]] * B, order


def test_left_padded_rows_are_uniform_as_eager():
    """A padded query row keeps no key: eager's finfo.min absorbs its scores, so its probabilities are uniform over
    every key. Its row tile computes every tile (the test above checks the range), and the rows match eager."""
    keep = left_padding()
    q, k, v = _qkv(torch.float32, 1)
    mask = _additive(keep, torch.float32)
    p = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + mask, dim=-1)
    assert torch.allclose(p[1, :, :21], torch.full_like(p[1, :, :21], 1 / S))
    _compiled(hf_attention, (q, k, v, mask))


def extended_mask_attention(query, key, value, attention_mask):
    """transformers' get_extended_attention_mask: `(1 - mask) * finfo.min` from the (B, S) 0/1 padding mask, the
    causal part by masked_fill from indices (a compile-time region beside the run-time one)."""
    min_dtype = torch.finfo(query.dtype).min
    padding = (1.0 - attention_mask[:, None, None, :].to(query.dtype)) * min_dtype
    q_len, kv_len = query.shape[-2], key.shape[-2]
    causal = torch.arange(kv_len)[None, :] > torch.arange(q_len)[:, None]
    scores = (torch.matmul(query, key.transpose(2, 3)) * D ** -0.5 + padding).masked_fill(causal, min_dtype)
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype), value)


@pytest.mark.parametrize("length", [50, 100])
def test_padded_rows_at_a_length_off_the_tiles(length):
    """Padded rows (uniform in eager) in a row tile whose causal part ends past the extent, at a length that is not
    a multiple of the tile: the empty folded segment starts off the tiles, and its loop ran the last tile again
    (a padded row then weighed that tile's keys twice)."""
    g = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(B, H, length, D, generator=g) for _ in range(3))
    pads = torch.tensor([[3], [length - 1]])         # the second sequence: one token, rows in the last row tile
    mask = (torch.arange(length)[None, :] >= pads).long()
    _, prog = _compiled(extended_mask_attention, (q, k, v, mask))      # matches eager
    assert prog.kernels[0].prologues, prog.notes                       # the padding's ranges found at run time


def softcapped_attention(query, key, value, attention_mask):
    """Gemma2's eager attention: the scaled scores soft-capped (divide, tanh, multiply), then the additive mask."""
    s = torch.matmul(query, key.transpose(2, 3)) * D ** -0.5
    s = torch.tanh(s / 20.0) * 20.0 + attention_mask
    return torch.matmul(torch.softmax(s, dim=-1, dtype=torch.float32).to(query.dtype), value)


@pytest.mark.parametrize("program, rounded_in_kept_run", [(softcapped_attention, False), (hf_h2o, True)])
def test_scores_round_as_eager_outside_the_kept_run(program, rounded_in_kept_run):
    """fp16 scores a passed mask is added to round as eager's do, each step (precision.mask_deciding: a fully
    masked row spreads its probability over the keys whose fp16 score is above -16). On the run of tiles the mask
    keeps whole, s + 0 is s and the rounding decides nothing: a kernel that alone computes the scores leaves it out
    there (the bulk of a causal mask's tiles), while H2O's, whose column kernel recomputes the row kernel's scores,
    keep it on every tile, so that both see the same values. Fully masked rows match eager either way."""
    q, k, v = _qkv(torch.float16, 3)
    _, prog = _compiled(program, (q, k, v, _additive(left_padding(), torch.float16)))
    for kernel in prog.kernels:
        loops = kernel.source.split("for n0 in tl.range(")[1:]
        kept = [body.count(".to(tl.float16).to(tl.float32)") for body in loops if body.startswith("fa0 ")]
        rest = [body.count(".to(tl.float16).to(tl.float32)") for body in loops if not body.startswith("fa0 ")]
        assert kept and min(rest) > 0, (kept, rest)
        assert (min(kept) > 0) == rounded_in_kept_run, (kept, rest)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_padded_rows_keep_the_folded_keys_in_half_precision(dtype):
    """Left-padded rows in fp16 and bf16 at tiles that fold the keys past the diagonal (masked_fill's finfo.min,
    a compile-time region): eager's padded rows are uniform over every key, those tiles' too. In fp16 the folded
    constant, finfo.min times log2 e, once rounded to -inf in the facts, and those rows dropped every key past
    their diagonal tile (the held program left_padding on the GPU, 5.8 from eager)."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(3))
    mask = (torch.arange(S)[None, :] >= torch.tensor([[20], [3]])).long()
    _compiled(extended_mask_attention, (q, k, v, mask))      # matches eager


@pytest.mark.parametrize("mask", ["causal", "left_padding"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_column_sums_skip_by_ranges_over_query_tiles(mask, dtype):
    """H2O's column sums loop over queries per key tile: the ranges are transposed (per key tile, the first and last
    query tile that keeps one of its keys), and a fully masked query row (uniform in eager, so it adds 1 / S to every
    column) is in every key tile's range."""
    keep = MASKS[mask]()
    q, k, v = _qkv(dtype, 2)
    args = (q, k, v, _additive(keep, dtype))
    compiled, prog = _compiled(hf_h2o, args)
    assert len(prog.kernels) == 2 and all(p.runtime for p in ft.explain(compiled, *args).properties)
    rows, cols = _ranges(_buffers(prog, args), prog)
    assert _check_ranges(rows, ~keep[:, 0])[0] < _check_ranges(rows, ~keep[:, 0])[1]
    visited, total = _check_ranges(cols, ~keep[:, 0], transposed=True)
    assert visited < total


# ---- bool masks passed in, and captured ------------------------------------------------------------------------------

@pytest.mark.parametrize("fill", [FINFO_MIN, NEG_INF, MINUS_1E9], ids=["finfo.min", "-inf", "-1e9"])
@pytest.mark.parametrize("build", [where_attention, masked_fill_attention], ids=["where", "masked_fill"])
@pytest.mark.parametrize("mask", ["causal", "sinks"])
def test_bool_masks_passed_in_skip_their_masked_tiles(mask, build, fill):
    keep = MASKS[mask]()
    q, k, v = _qkv(torch.float32, 3)
    _skips(build(fill), (q, k, v, keep), ~keep[:, 0], (q, k, v, keep | True))


@pytest.mark.parametrize("fill", [FINFO_MIN, NEG_INF], ids=["finfo.min", "-inf"])
def test_fully_masked_bool_rows_match_eager(fill):
    """A query row that keeps no key: uniform under finfo.min, NaN under -inf, as eager; the kernel's other rows
    still skip."""
    keep = left_padding()
    q, k, v = _qkv(torch.float32, 4)
    _skips(where_attention(fill), (q, k, v, keep), ~keep[:, 0], (q, k, v, keep | True))


@pytest.mark.parametrize("fill", [FINFO_MIN, NEG_INF], ids=["finfo.min", "-inf"])
@pytest.mark.parametrize("mask", ["causal", "window", "sinks"])
def test_captured_index_masks_skip_their_tiles_at_compile_time(mask, fill):
    """The mask built outside and captured, (S, S), shared by the batch and the heads: its values follow the
    positions (transform/constants.py), so it becomes index comparisons and skips as a mask built from arange does,
    at compile time, with no pre-pass; the kernel visits the same tiles as that program's."""
    keep = MASKS[mask]()[0, 0].clone()
    q, k, v = _qkv(torch.float32, 5)
    compiled, prog = _compiled(captured_attention(keep, fill), (q, k, v))
    props = ft.explain(compiled, q, k, v).properties[0]
    assert props.skipped and not props.runtime, props
    assert not any(p.name.endswith("_ranges") for la in prog.launches for p in la.source.prologues)
    built = {"causal": lambda i, j: j <= i, "window": lambda i, j: (j <= i) & (j > i - 20),
             "sinks": lambda i, j: (j <= i) & ((j < 4) | (j > i - 16))}[mask]

    def inside(q, k, v):
        i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        return torch.softmax(s.masked_fill(~built(i, j), fill(s.dtype)).float(), dim=-1).to(q.dtype) @ v
    _, reference = _compiled(inside, (q, k, v))
    assert _run(prog, (q, k, v))[1] == _run(reference, (q, k, v))[1]


def test_a_captured_mask_of_no_index_form_skips_at_run_time():
    """Packed documents (a block-diagonal causal mask, captured): no band, sink or prefix form gives it, so it stays
    a constant and the pre-pass gives each row tile its range."""
    i, j = _index()
    keep = (j <= i) & (i // 24 == j // 24)
    q, k, v = _qkv(torch.float32, 6)
    fn = captured_attention(keep, FINFO_MIN)
    compiled, prog = _compiled(fn, (q, k, v))
    assert ft.explain(compiled, q, k, v).properties[0].runtime
    bufs, dots = _run(prog, (q, k, v))
    visited, total = _check_ranges(_ranges(bufs, prog)[0], ~keep[None])
    assert visited < total
    _, unmasked = _compiled(captured_attention(torch.ones(S, S, dtype=torch.bool), FINFO_MIN), (q, k, v))
    assert dots < _run(unmasked, (q, k, v))[1]


@pytest.mark.parametrize("chunk", [
    pytest.param(lambda i, c: i // c, id="floor_divide"),
    pytest.param(lambda i, c: torch.div(i, c, rounding_mode="floor"), id="div-floor")])
def test_a_chunked_mask_built_inside_skips_at_run_time(chunk):
    """Llama 4's chunked attention, built inside from indices: (j <= i) & (i // c == j // c). Floor division has no
    half-plane, so the mask is computed in the kernels and a pre-pass gives each row tile its range (before capture
    lowered the division, eager built the S x S mask on every call): the kernel visits exactly the tiles that keep
    a key, fewer than the causal program's."""
    def masked(keep):
        def fn(q, k, v):
            i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
            s = q @ k.transpose(-1, -2) / math.sqrt(D)
            return torch.softmax(s.masked_fill(~keep(i, j), torch.finfo(s.dtype).min).float(), dim=-1).to(q.dtype) @ v
        return fn

    q, k, v = _qkv(torch.float32, 6)
    compiled, prog = _compiled(masked(lambda i, j: (j <= i) & (chunk(i, 24) == chunk(j, 24))), (q, k, v))
    assert not prog.before and not prog.plan.notes, prog.plan.notes     # nothing of the mask runs in eager
    props = ft.explain(compiled, q, k, v).properties[0]
    assert props.runtime, props
    _, causal = _compiled(masked(lambda i, j: j <= i), (q, k, v))
    dots, causal_dots = _run(prog, (q, k, v))[1], _run(causal, (q, k, v))[1]
    i, j = _index()
    keep = (j <= i) & (i // 24 == j // 24)
    tiles = keep.reshape(S // BLOCK, BLOCK, S // BLOCK, BLOCK).any(3).any(1)     # row tile x key tile: any kept
    causal_tiles = (j <= i).reshape(S // BLOCK, BLOCK, S // BLOCK, BLOCK).any(3).any(1)
    assert dots * causal_tiles.sum() == causal_dots * tiles.sum(), (dots, causal_dots)


def test_one_generic_plan_serves_every_length():
    """dynamic=True: the query length is a size argument (the mask's last dimension, the keys, stays static), the
    range buffers' shapes size expressions allocated at launch; lengths that are and are not multiples of the tiles
    and past the length the kernels were emitted for, q_len < kv_len (a mask of every query's keys, with left
    padding), from the one plan, against eager, each call skipping."""
    compiled = ft.compile(hf_attention, dynamic=True, cache=False, configs=TILES)
    for seed, (sq, sk) in enumerate([(80, 80), (37, 80), (64, 80), (150, 80)]):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(B, H, sq, D, generator=g)
        k, v = (torch.randn(B, H, sk, D, generator=g) for _ in range(2))
        i, j = torch.arange(sq)[:, None] + (sk - sq), torch.arange(sk)[None, :]
        keep = (j <= i) & (j >= torch.tensor([0, sk // 3])[:, None, None, None])
        args = (q, k, v, _additive(keep, torch.float32))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = compiled(*args)
        assert_close(out, hf_attention(*args))
        prog = compiled.program_for(args)
        assert prog.generic and prog.kernels[0].prologues, prog.notes
        visited, total = _check_ranges(_ranges(_buffers(prog, args), prog)[0], ~keep[:, 0])
        assert visited < total
    assert compiled.cache_info()["searches"] == 1, compiled.cache_info()


# ---- what the finite check still does -----------------------------------------------------------------------------

def test_an_additive_mask_of_minus_inf_passes_the_finite_check():
    """torch.nn.Transformer.generate_square_subsequent_mask: 0 and -inf. The pre-pass reads the mask's -inf as
    masked, so the finite check lets it pass: no fixup pass runs (the flag stays 0)."""
    keep = causal()
    q, k, v = _qkv(torch.float32, 6)
    args = (q, k, v, torch.where(keep, 0.0, -math.inf))
    _, prog = _compiled(hf_attention, args)
    assert _buffers(prog, args)[FINITE].item() == 0


def test_a_nan_score_still_takes_the_fixup_pass():
    """A NaN in k at a key the mask hides: eager's s + finfo.min is NaN there, and so its row. The skipped tile
    would lose it; the finite check finds it and the fixup pass computes every tile."""
    keep = causal()
    q, k, v = _qkv(torch.float32, 7)
    k[0, 0, S - 1, 0] = math.nan          # only the last query keeps this key
    args = (q, k, v, _additive(keep, torch.float32))
    _, prog = _compiled(hf_attention, args)
    assert _buffers(prog, args)[FINITE].isnan().all()


def t5_bias_attention(q, k, v, position_bias):
    """T5's relative position bias added to the scores, then a causal mask of finfo.min built inside."""
    s = q @ k.transpose(-1, -2) + position_bias
    i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    return torch.softmax(s.masked_fill(j > i, torch.finfo(s.dtype).min).float(), dim=-1).to(q.dtype) @ v


@pytest.mark.parametrize("bad", ["none", "finfo.min", "inf", "nan"])
def test_a_bias_past_moderate_takes_the_fixup_pass(bad):
    """A bias per batch entry and head (read once, so not a run-time mask): skipping the tiles the causal mask
    fills with finfo.min is exact while every kept score is moderate, so the bias is checked to be at most MODERATE
    in magnitude (one running minimum of -|x|) on the tiles the kernel computes (the fill discards its values on
    the tiles it skips: test_masks.test_values_a_mask_discards_are_not_checked). A row whose kept scores are all
    finfo.min (HF folds its mask into T5's bias) is uniform over every key in eager, the skipped ones too: the
    check sends it to the fixup pass, as it does an inf or NaN on a kept tile. A normal bias passes (flag 0)."""
    q, k, v = _qkv(torch.float32, 11)
    bias = torch.randn(B, H, S, S, generator=torch.Generator().manual_seed(12))
    value = {"finfo.min": torch.finfo(torch.float32).min, "inf": math.inf, "nan": math.nan}
    if bad != "none":
        bias[1, 1, S - 5, : S - 4] = value[bad]
    args = (q, k, v, bias)
    _, prog = _compiled(t5_bias_attention, args)
    assert not ft.explain(ft.compile(t5_bias_attention, cache=False, configs=TILES), *args).properties[0].runtime
    flag = _buffers(prog, args)[FINITE]
    assert flag.isnan().all() if bad != "none" else flag.item() == 0


# ---- what does not skip at run time --------------------------------------------------------------------------------

def test_a_mask_per_head_is_read_once_not_twice():
    """A (B, H, S, S) mask shares no batch variable: a pre-pass would read it once more, as much as the kernel does
    (a bias per head rarely masks), so it skips nothing; it still matches eager."""
    keep = causal().expand(B, H, S, S).contiguous()
    q, k, v = _qkv(torch.float32, 8)
    compiled, _ = _compiled(hf_attention, (q, k, v, _additive(keep, torch.float32)))
    assert not ft.explain(compiled, q, k, v, _additive(keep, torch.float32)).properties[0].runtime


def test_a_mask_passed_again_unwritten_keeps_its_tile_ranges(monkeypatch):
    """The layers of a model pass one attention mask: a call that reads the same mask tensor as the last call at the
    same sizes, unwritten since, keeps that call's tile ranges and launches no pre-pass (runtime/launch.py); a mask
    written in place (here to keep every key, so stale ranges would still skip the window's masked tiles), another
    tensor of the same values, one made under inference_mode (no version to compare) and any while a CUDA graph is
    captured are read again. Every call matches eager."""
    q, k, v = _qkv(torch.float32)
    mask = _additive(window(), torch.float32)
    compiled, _ = _compiled(hf_attention, [q, k, v, mask])
    names: list[str] = []
    step = launch.Step.launch

    def counted(self, buffers):
        names.append(getattr(self.fn, "__name__", ""))
        step(self, buffers)
    monkeypatch.setattr(launch.Step, "launch", counted)

    def prepasses(m) -> int:
        names.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = compiled(q, k, v, m)
        assert_close(out, hf_attention(q, k, v, m))
        return sum(n.endswith("_ranges") for n in names)
    assert prepasses(mask) == 0           # _compiled's call read it
    mask.zero_()
    assert prepasses(mask) == 1
    assert prepasses(mask) == 0
    again = _additive(window(), torch.float32)
    assert prepasses(again) == 1
    with torch.inference_mode():
        frozen = again.clone()
    assert [prepasses(frozen) for _ in range(2)] == [1, 1]
    monkeypatch.setattr(launch, "_capturing", lambda device: True)   # a CUDA graph's replay reads the mask anew
    assert [prepasses(again) for _ in range(2)] == [1, 1]
