"""Generated kernels against eager under Triton's CPU interpreter (docs/design.md §3, §6).

Every program here must run through fused kernels (no eager fallback for the fused part),
never pass an Sq x Skv intermediate between kernels, and match eager on fresh random inputs.
"""
import math
import re
import warnings

import pytest
import torch
import triton
import triton.language as tl

import flashtensor as ft
from conftest import assert_close, each_partition
from flashtensor import knobs
from flashtensor import workloads as W
from flashtensor.codegen.artifact import FINITE
from flashtensor.codegen.triton_helpers import _div_as_eager, _max_nan, _max_over, _min_nan, _min_over, _scale_f16
from flashtensor.runtime.launch import run_kernels

FAMILY = ["attn", "h2o", "roco", "keyformer", "snapkv", "corm", "gemma2"]


def _run(fn, args, expect_kernels=True, **options):
    ref = fn(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = ft.compile(fn, **options)
        report = ft.explain(compiled, *args)
        out = compiled(*args)
    assert_close(out, ref)
    prog = report.plan
    if expect_kernels:
        assert report.kernels, f"no kernels: {prog.notes}"
        assert not [n for n in prog.notes if "no fused plan" in n], prog.notes
    return report


def _no_quadratic(report, sq, skv):
    for k in report.kernels:
        for t in k.inputs + k.outputs:
            if t.kind == "intermediate":
                assert math.prod(t.shape) < sq * skv, f"{k.name} passes {t.name}{list(t.shape)}"


@pytest.mark.parametrize("name", FAMILY)
@pytest.mark.parametrize("S,B,dtype", [(100, 2, torch.float32), (64, 1, torch.float16)])
def test_family_matches_eager(name, S, B, dtype):
    fn, args = W.make(name, device="cpu", dtype=dtype, S=S, H=2, D=32, B=B, seed=S + B)
    report = _run(fn, args)
    _no_quadratic(report, S, S)
    assert any(p.skipped for p in report.properties), "the causal mask should let the loop skip tiles"
    # these inputs are finite and inside their ops' domains: the in-kernel check must not flag them (a
    # false alarm sends every call to the fixup pass, which the outputs alone would not show)
    prog = ft.compile(fn).program_for(args)
    bufs = run_kernels(prog.launches, [args[i] for i in prog.tensor_positions] + prog.consts, args[0].device)
    assert bufs[FINITE].item() == 0


@pytest.mark.parametrize("name", ["h2o", "roco"])
def test_float32_inputs_cast_to_fp16_inside_the_program(name):
    """The workload called on float32 q, k, v that it casts to fp16 itself: eager's matmuls read the
    rounded values, so the kernels' dots take the casts in fp16, as they take fp16 inputs (the column sums
    missed the 1e-4 contract, 1.0e-4 and 2.9e-4, when the dots read the float32 loads)."""
    fn, args = W.make(name, device="cpu", dtype=torch.float32, S=150, H=2, D=32, B=2, seed=5)

    def cast_inside(q, k, v):
        return fn(q.half(), k.half(), v.half())

    report = _run(cast_inside, args)
    assert all('input_precision="ieee"' not in k.triton_source for k in report.kernels)


@pytest.mark.parametrize("name", ["attn", "h2o", "roco", "gemma2"])
def test_q_shorter_than_kv(name):
    fn, _ = W.make(name, device="cpu", dtype=torch.float32, S=8, H=2, D=32)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, n, 2, 32, generator=g) for n in (50, 130, 130))
    _no_quadratic(_run(fn, (q, k, v)), 50, 130)


def test_bf16_against_float64():
    """bf16 eager is itself ~4e-3 from the exact answer at these shapes, so the fused result is held
    to the exact answer instead: no worse than eager's own error plus 2e-3."""
    fn, args = W.make("h2o", device="cpu", dtype=torch.bfloat16, S=80, H=2, D=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ft.compile(fn)(*args)
    ref, exact = fn(*args), fn(*[a.double() for a in args])
    for o, r, x in zip(out, ref, exact):
        err = lambda a: ((a.double() - x).norm() / x.norm()).item()
        assert err(o) <= err(r) + 2e-3, (err(o), err(r))


# --- variants that are not in the reference set -------------------------------------------

def _scores(q, k):
    return torch.matmul(q.transpose(1, 2), k.transpose(1, 2).transpose(-2, -1)) / math.sqrt(q.shape[-1])


def sliding_window_colmax(q, k, v, window=24):
    """Band mask (causal and at most `window` back) and the column max of the probabilities."""
    s = _scores(q, k)
    i = torch.arange(q.shape[1])[:, None]
    j = torch.arange(k.shape[1])[None, :]
    s = s.masked_fill((j > i) | (j < i - window), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ v.transpose(1, 2)).transpose(1, 2), p.amax(dim=2)


def alibi_entropy(q, k, v, slope=0.05):
    """An index-derived bias (ALiBi-like) under a causal mask, and each query's attention entropy."""
    s = _scores(q, k)
    i = torch.arange(q.shape[1])[:, None]
    j = torch.arange(k.shape[1])[None, :]
    s = s - slope * (i - j).float()
    s = s.masked_fill(j > i, float("-inf"))
    p = torch.softmax(s, dim=-1)
    ent = -(p * torch.log(p + 1e-9)).sum(dim=-1)
    return (p @ v.transpose(1, 2)).transpose(1, 2), ent


def prefix_lm_sigmoid_count(q, k, v, prefix=20):
    """Prefix-LM mask, sigmoid scores, and how many queries give each key more than 1/S weight."""
    s = torch.sigmoid(_scores(q, k)) * 4.0
    i = torch.arange(q.shape[1])[:, None]
    j = torch.arange(k.shape[1])[None, :]
    s = s.masked_fill((j > i) & (j >= prefix), float("-inf"))
    p = torch.softmax(s, dim=-1)
    return (p @ v.transpose(1, 2)).transpose(1, 2), (p > 1.0 / k.shape[1]).float().sum(dim=2)


def score_variance(q, k, v):
    """Variance of the raw scores along keys: needs the mean first, so the compiler makes two passes."""
    s = _scores(q, k)
    mu = s.mean(dim=-1, keepdim=True)
    return ((s - mu) ** 2).mean(dim=-1)


def gqa_h2o(q, k, v):
    """Grouped-query attention (each k, v head serves two query heads, by expand) with H2O's column sums:
    the group index sits beside the query index in q's tile, so the schedule moves it to the grid."""
    B, S, H, D = q.shape
    k, v = (t[:, :, : H // 2, None].expand(B, S, H // 2, 2, D).reshape(B, S, H, D) for t in (k, v))
    s = _scores(q, k) + torch.full((S, S), float("-inf")).triu(1)
    p = torch.softmax(s, dim=-1)
    return (p @ v.transpose(1, 2)).transpose(1, 2), p.sum(dim=2)


@pytest.mark.parametrize("fn", [sliding_window_colmax, alibi_entropy, prefix_lm_sigmoid_count, score_variance, gqa_h2o])
def test_own_variants(fn):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 90, 2, 32, generator=g) for _ in range(3))
    report = _run(fn, (q, k, v))
    _no_quadratic(report, 90, 90)
    if fn is score_variance:
        assert "2 pass(es)" in report.properties[0].loop


def row_threshold_counts(q, k, v, t):
    """Per query, whether any key and how many keys get at least weight t: masked keys have p = 0, and
    `0 >= t` depends on t, so masked tiles cannot be skipped; they run with p = 0 folded in."""
    s = _scores(q, k) + torch.full((q.shape[1], k.shape[1]), float("-inf")).triu(k.shape[1] - q.shape[1] + 1)
    p = torch.softmax(s, dim=-1)
    return (p >= t).any(dim=-1), (p < t).float().sum(dim=-1)


@pytest.mark.parametrize("q_len,kv_len", [(70, 70), (37, 101), (101, 64)])
@pytest.mark.parametrize("fn", [W.corm, row_threshold_counts])
def test_constant_folded_region_matches_eager(fn, q_len, kv_len):
    """Tiles wholly inside the masked region run a body where p is the constant 0 (no q k^T there); the
    threshold is negative in places so `0 >= t` is true on some masked tiles and false on others."""
    g = torch.Generator().manual_seed(q_len + kv_len)
    q = torch.randn(1, q_len, 2, 32, generator=g)
    k, v = (torch.randn(1, kv_len, 2, 32, generator=g) for _ in range(2))
    t = torch.rand(q_len, kv_len, generator=g) * 0.2 - 0.02
    report = _run(fn, (q, k, v, t))
    assert any(p.folded for p in report.properties), [str(p) for p in report.properties]
    assert "constant-folded tiles:" in str(report)
    if fn is W.corm:   # an inf key gives NaN probabilities in eager, where the folded body would say p = 0
        k[0, kv_len - 3, 1, 5] = float("inf")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = ft.compile(fn)(q, k, v, t)
        assert torch.equal(out[1], fn(q, k, v, t)[1])


_SETTLES = {"at once": lambda i: torch.full_like(i, -1.0),     # every p >= -1: true on the first tile
            "partway": lambda i: 0.9 / (i + 1),                # about a row's uniform share: true after a few rows
            "never": lambda i: torch.full_like(i, 2.0)}        # no p reaches 2: the loop runs to the end


def all_below(q, k, v, t):
    """CORM's complement through `all`, which capture writes as not any(not x)."""
    s = _scores(q, k) + torch.full((q.shape[1], k.shape[1]), float("-inf")).triu(1)
    return (torch.softmax(s, dim=-1) < t).all(dim=-2)


@pytest.mark.parametrize("fn", [W.corm, all_below])
@pytest.mark.parametrize("when", list(_SETTLES))
def test_any_along_the_loop_stops_once_settled(when, fn):
    """An `any` carried along the loop cannot change once every accumulator of the tile is true, so the
    loop runs as a while that stops there (constant-folded tiles last). Thresholds that settle it at
    once, partway through and never all give eager's answer."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 150, 2, 32, generator=g) for _ in range(3))
    t = _SETTLES[when](torch.arange(150, dtype=torch.float32)[:, None].expand(150, 150))
    report = _run(fn, (q, k, v, t))
    assert "stops once every one is true" in str(report)
    assert any("while (l0 <" in k.triton_source for k in report.kernels)


def test_column_sums_fold_the_row_normaliser_into_the_exponent():
    """exp2(x - m) / l with per-row m and l >= 0 is emitted as exp2(x - (m + log2 l)); the kernel that
    reduces m and l stores m + log2 l once per row, and the column sums load it instead of taking a log in
    every step. Fully masked rows (l = 0, m = -inf) still give eager's NaN."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 77, 2, 32, generator=g) for _ in range(3))

    def fn(q, k, v):
        s = _scores(q, k) + torch.full((77, 77), float("-inf")).triu(1)
        s = s.masked_fill(torch.arange(77)[:, None] < 5, float("-inf"))   # the first five queries see no key
        return torch.softmax(s, dim=-1).sum(dim=2)
    report = _run(fn, (q, k, v))
    sources = [k.triton_source for k in report.kernels]
    assert sum("_log2_approx(red_" in src for src in sources) == 1, sources    # once per row, after its loop
    assert any(re.search(r"lse_\d+ = tl\.load\(", src) for src in sources)
    assert not any(re.search(r"lse_\d+ = .*_log2_approx\(", src) for src in sources)
    assert torch.isnan(ft.compile(fn)(q, k, v)).all() == torch.isnan(fn(q, k, v)).all()


def test_a_probability_used_twice_is_exponentiated_once():
    """RoCo sums p and p * p over the queries: its column kernel loads the row statistic and takes p's
    exponential once per tile step, and both sums read it, with the results eager gives."""
    fn, args = W.make("roco", device="cpu", dtype=torch.float32, S=70, H=2, D=32, B=2, seed=3)
    report = _run(fn, args)
    cols = [k.triton_source for k in report.kernels if "tl.dot" in k.triton_source and "* p_" in k.triton_source]
    assert cols, [k.triton_source for k in report.kernels]
    for step in cols[0].split("for l0 in ")[1:]:
        assert step.count("tl.exp2(") == 1, step
        assert re.search(r"\b(p_\d+) \* \1\b", step), step


def _written(q, k, v, form):
    s = _scores(q, k) + torch.full((q.shape[1], k.shape[1]), float("-inf")).triu(1)
    if form == "windows":                      # fuses: each write becomes a select over an index range
        s[..., :5, 30:] = float("-inf")
        s[:, 1, 7] = 2.0
        s[..., -3:, :40] = torch.tensor(1.5)
        s[:, :, :, 60:] = -2.0
    elif form == "same-dim nesting":           # the inner write is shifted along the outer slice: a cat
        s[..., 2:50][..., 3:9] = -1.0
    else:                                      # strided: eager
        s[..., ::2] = 0.5
    p = torch.softmax(s, dim=-1)
    return (p @ v.transpose(1, 2)).transpose(1, 2), p.sum(dim=2)


@pytest.mark.parametrize("form", ["windows", "same-dim nesting", "strided"])
def test_slice_assignments_match_eager(form):
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 70, 2, 16, generator=g) for _ in range(3))
    fn = lambda q, k, v: _written(q, k, v, form)
    if form != "strided":
        report = _run(fn, (q, k, v))
        assert not report.plan.notes and all(n.op != "opaque" for n in report.plan.captured.nodes)
    else:
        ref = fn(q, k, v)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = ft.compile(fn)
            out = compiled(q, k, v)
        assert_close(out, ref)
        assert any("scatter" in n for n in next(iter(compiled.programs.values())).notes)


def test_launch_groups_cover_every_tile_once():
    """With groups of 4 programs (codegen.loop.placement), 5 heads of two row tiles launch as groups of
    2, 2 and 1 heads, longest tiles first in each; every output element must still be written once, by
    the right program."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 130, 5, 16, generator=g) for _ in range(3))
    report = _run(W.h2o, (q, k, v), group_programs=4)
    assert "gn = tl.minimum(2, 5 - g * 2)" in report.kernels[0].triton_source


@pytest.mark.parametrize("cols,kernels", [(40, 1), (300, 2)])
def test_short_rows_reduce_inside_the_kernel(cols, kernels):
    """A softmax returned whole: rows of at most MAX_WHOLE (256) columns are held whole in the tile, so
    the row statistics and the normalised values come from one kernel and one read of x; longer rows
    take a statistics kernel, then the elementwise one."""
    fn = lambda x: torch.softmax(x * 2.0, dim=-1)
    x = torch.randn(3, 37, cols, generator=torch.Generator().manual_seed(cols))
    report = _run(fn, (x,))
    assert len(report.kernels) == kernels, [p.loop for p in report.properties]


def test_report_lists_kernels():
    fn, args = W.make("h2o", device="cpu", dtype=torch.float32, S=64, H=2, D=32)
    report = _run(fn, args)
    assert len(report.kernels) == 2
    k0, k1 = report.kernels
    assert "@triton.jit" in k0.triton_source and k0.grid == (2,)    # one 128-row tile for each of 2 heads
    assert {t.kind for t in k0.outputs} == {"output", "intermediate"}
    assert {t.kind for t in k1.inputs} == {"input", "intermediate"}
    text = str(report)
    assert "skipped tiles:" in text and "rescaled by running max" in text


def test_torch_compile_backend_matches_eager():
    import flashtensor.api.backend  # noqa: F401  (the entry point needs the package installed; import is enough)
    torch._dynamo.reset()
    fn, args = W.make("h2o", device="cpu", dtype=torch.float32, S=64, H=2, D=32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.compile(fn, backend=flashtensor.api.backend.flashtensor_backend)(*args)
    assert_close(out, fn(*args))


@pytest.mark.parametrize("name", ["keyformer", "roco"])
def test_every_candidate_partition_matches_eager(name):
    """On a GPU the tuner may pick any candidate partition; each must compute the same program."""
    fn, args = W.make(name, device="cpu", dtype=torch.float32, S=70, H=2, D=32, B=2, seed=5)

    def run(k):
        report = _run(fn, args, candidate=k)
        if k < 2:
            assert len(report.kernels) == [2, 3][k]
        return report.plan
    assert each_partition(run) >= 2, "the related-merges-only candidate should differ from the greedy one"


@pytest.mark.parametrize("name", ["h2o", "keyformer", "corm", "gemma2"])
def test_every_tile_shape_the_gpu_tuner_tries(name):
    """On a GPU the tuner emits every block shape in options.CONFIGS, on the CPU only the first; each must
    compute the same program (warps and stages do not change the interpreter's result)."""
    fn, args = W.make(name, device="cpu", dtype=torch.float32, S=70, H=2, D=32, B=2, seed=7)
    for rows, cols in sorted({(c.block_row, c.block_loop) for c in ft.options.CONFIGS}):
        for k in _run(fn, args, configs=[(rows, cols, 4, 2)]).kernels:     # 70 rounds up to 128: every kernel's row and loop take the shape
            assert {rows, cols} <= set(k.blocks.values()), (rows, cols, k.name, k.blocks)


@triton.jit
def _scaled_by_helper(x_ptr, out_ptr, n, C: tl.constexpr, HI2: tl.constexpr, LO2: tl.constexpr, BLOCK: tl.constexpr):
    """Every element of x through codegen.triton_helpers._scale_f16, as generated kernels call it."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, _scale_f16(x, C, HI2, LO2), mask=offs < n)


def _rounds_like_eager(got, eager, x, lo) -> None:
    """Within one fp16 step of eager everywhere, inf where eager is, different for at most 4% of x, and
    nearly all of those where x * lo is an fp16 subnormal."""
    import numpy as np
    finite = np.isfinite(eager)
    assert np.array_equal(np.isinf(got), np.isinf(eager)) and not np.isnan(got).any()
    off = finite & (got != eager)
    step = np.spacing(np.abs(eager[off]).astype(np.float16)).astype(np.float64)
    assert (np.abs(got[off] - eager[off]) <= step).all()
    assert off.sum() <= 0.04 * finite.sum(), off.sum()
    assert (off & (np.abs(x * lo) >= 2.0 ** -14)).sum() <= 1e-3 * finite.sum()


@pytest.mark.parametrize("c", [1 / math.sqrt(128), 1 / math.sqrt(96), 1 / math.sqrt(40), 0.125, 0.1, 1 / 3, 2.5, -7.3])
def test_fp16_scale_split_rounds_like_eager(c):
    """The faithful kernels scale fp16 scores by codegen.triton_helpers._scale_f16: on the GPU fp16 x * hi +
    fp16(x * lo) in one fma (inline asm; codegen.forms.split_f16 gives c32, hi and lo, forms._pair packs hi and
    lo for it). The helper itself runs here, in a kernel of its own, on every finite fp16 x loaded as float32:
    on a GPU (TRITON_INTERPRET=0) its asm, under the interpreter its interpreted branch. It must stay within
    one fp16 step of eager's fp16(float32(x) * float32(c)), and differ at all for few x: at most 4% of them,
    nearly all where x * lo is an fp16 subnormal (there the product's rounding costs it its last bits). The
    asm's arithmetic is also modelled in float64 on the constants the kernel is given, so the CPU suite holds
    the GPU's path, and split_f16's hi and lo, to the same bounds. A constant whose remainder would be deep in
    the subnormals gets no split: the kernel keeps the float32 multiply."""
    import numpy as np

    from flashtensor.codegen.forms import _pair, split_f16
    assert split_f16(1e-3) is None
    c32, hi, lo = split_f16(c)
    hi2, lo2 = _pair(hi), _pair(lo)
    device = "cuda" if torch.cuda.is_available() and not knobs.interpret() else "cpu"
    bits = np.arange(65536, dtype=np.uint16)
    x16 = torch.from_numpy(bits.view(np.float16).copy())
    x16 = x16[torch.isfinite(x16)].to(device)
    out = torch.empty(x16.shape, dtype=torch.float32, device=device)
    _scaled_by_helper[(triton.cdiv(x16.numel(), 4096),)](x16.float(), out, x16.numel(), c32, hi2, lo2, BLOCK=4096)
    eager = (x16 * c).double().cpu().numpy()
    x = x16.double().cpu().numpy()
    _rounds_like_eager(out.double().cpu().numpy(), eager, x, lo)

    # the asm's arithmetic on the halves of hi2 and lo2 as it reads them: the packed multiply rounds once,
    # the fma is exact in float64 and rounds once
    halves = lambda p: np.array([p & 0xFFFF, (p >> 16) & 0xFFFF], dtype=np.uint16).view(np.float16).astype(np.float64)
    (h, h_), (lw, lw_) = halves(hi2), halves(lo2)
    assert h == h_ == hi and lw == lw_ == lo and c32 == float(np.float32(c))
    with np.errstate(over="ignore"):
        part = (x * lw).astype(np.float16).astype(np.float64)
        fused = (x * h + part).astype(np.float16).astype(np.float64)
    _rounds_like_eager(fused, eager, x, lo)


@pytest.mark.parametrize("c", [0.125, 1 / math.sqrt(128), 1 / 3, -7.3])
def test_fp16_scale_split_keeps_inf_and_nan(c):
    """A score that overflowed fp16 is +-inf before the scale: _scale_f16 must give eager's +-inf (and NaN for
    NaN), where the split's remainder is 0 (0.125 is exact in fp16) or of hi's other sign, so that a masked
    -inf still gives p = 0 rather than a NaN that spreads over its row. On a GPU this runs the asm."""
    from flashtensor.codegen.forms import _pair, split_f16
    c32, hi, lo = split_f16(c)
    device = "cuda" if torch.cuda.is_available() and not knobs.interpret() else "cpu"
    x16 = torch.tensor([math.inf, -math.inf, math.nan, 1.0, -2.5, 65504.0, -65504.0] * 600,
                       dtype=torch.float16, device=device)
    out = torch.empty(x16.shape, dtype=torch.float32, device=device)
    _scaled_by_helper[(triton.cdiv(x16.numel(), 4096),)](x16.float(), out, x16.numel(), c32, _pair(hi), _pair(lo),
                                                        BLOCK=4096)
    torch.testing.assert_close(out, (x16 * c).float(), rtol=0, atol=0, equal_nan=True)


@triton.jit
def _divided_by_helper(x_ptr, out_ptr, n, C: tl.constexpr, INV: tl.constexpr, BLOCK: tl.constexpr):
    """Every element of x through codegen.triton_helpers._div_as_eager, as generated kernels call it."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
    tl.store(out_ptr + offs, _div_as_eager(x, C, INV), mask=offs < n)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c", [30.0, 3, 50.0, 0.1, -7.3])
def test_quotient_by_a_number_rounds_as_eager(dtype, c):
    """A quotient by a number that eager rounds to half precision runs through codegen.lower.quotient_as_eager's
    helper: every finite value of the half type, divided in a kernel and rounded, is eager's quotient bit for bit
    on eager's own device (on the GPU, CUDA's product with c's float32 reciprocal; under the interpreter, the
    CPU's quotient)."""
    import numpy as np

    from flashtensor.codegen.lower import quotient_as_eager
    inverse = (torch.tensor(1.0) / float(c)).item()
    assert quotient_as_eager("x", c) == f"_div_as_eager(x, {float(c)!r}, {inverse!r})"
    assert quotient_as_eager("x", True) is None
    device = "cuda" if torch.cuda.is_available() and not knobs.interpret() else "cpu"
    x = torch.from_numpy(np.arange(65536, dtype=np.uint16).view(np.int16).copy()).view(dtype)
    x = x[torch.isfinite(x)].to(device)
    out = torch.empty(x.shape, dtype=torch.float32, device=device)
    _divided_by_helper[(triton.cdiv(x.numel(), 4096),)](x.float(), out, x.numel(), float(c), inverse, BLOCK=4096)
    assert torch.equal(out.to(dtype), x / c)


@triton.jit
def _reduced_by_helpers(x_ptr, out_ptr, N: tl.constexpr, COMBINE: tl.constexpr):
    """Row maxima and minima of a (4, N) tile three ways: _max_over and _min_over (here, the interpreter's form),
    with COMBINE the GPU's (tl.reduce with the NaN-propagating combine), and tl.max, which drops NaNs."""
    x = tl.load(x_ptr + tl.arange(0, 4)[:, None] * N + tl.arange(0, N)[None, :])
    rows = tl.arange(0, 4)
    tl.store(out_ptr + rows, _max_over(x, 1))
    tl.store(out_ptr + 8 + rows, _min_over(x, 1))
    tl.store(out_ptr + 16 + rows, tl.max(x, 1))
    if COMBINE:
        tl.store(out_ptr + 4 + rows, tl.reduce(x, 1, _max_nan))
        tl.store(out_ptr + 12 + rows, tl.reduce(x, 1, _min_nan))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32])
def test_nan_propagating_reductions_match_torch(dtype):
    """Kernels reduce max and min with codegen.triton_helpers._max_over / _min_over: torch's amax / amin, NaN
    wherever a row has one. Both branches of the helpers (the interpreter's tl.max plus a sum that is 0 or NaN,
    the GPU's tl.reduce with a combine function, which the interpreter also runs, slowly) give torch's answer,
    with inf and -inf rows and a NaN beside an inf; tl.max itself would drop the NaN. The interpreter cannot run
    the combine on bf16 (its bf16 NaN has no integer value), so bf16 checks the helpers alone."""
    x = torch.randn(4, 16).mul(100).to(dtype)
    if dtype.is_floating_point:
        x[1, 3], x[1, 5], x[2, 7], x[3] = math.nan, math.inf, -math.inf, -math.inf
    out = torch.zeros(20, dtype=dtype)
    combine = dtype != torch.bfloat16
    _reduced_by_helpers[(1,)](x, out, 16, combine)
    amax, amin = x.amax(1), x.amin(1)
    pairs = [(out[:4], amax), (out[8:12], amin)] + ([(out[4:8], amax), (out[12:16], amin)] if combine else [])
    for got, want in pairs:
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got[~want.isnan()], want[~want.isnan()])
    if dtype.is_floating_point:
        assert not out[16:].isnan().any() and out[17] == math.inf
