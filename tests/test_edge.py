"""Edge values and bad input at call time: compiled results match eager exactly where eager has NaN or inf,
and what cannot run is rejected with a precise error (docs/design.md §6)."""
import math
import warnings

import pytest
import torch

import flashtensor as ft
from conftest import as_tuple, assert_close
from flashtensor import FallbackWarning, workloads
from flashtensor.analysis.facts import input_domains, narrowed_inputs
from flashtensor.frontend.capture import capture
from flashtensor.partition.fusable import fusable_part
from flashtensor.transform.decompose import decompose
from flashtensor.transform.loopform import to_loops

SEED = 4321


def qkv(*shape, seed: int = SEED, dtype=torch.float32) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).to(dtype) for _ in range(3))


def compiled(fn, *args, fused: bool = True):
    """Run `fn` through ft.compile; with `fused`, require that its plan has kernels."""
    c = ft.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        out = c(*args)
    if fused:
        (prog,) = c.programs.values()
        assert prog.launches, prog.notes
    return out


def scores_bottom_right(q, k, fill: str):
    """Causal scores with q_len aligned to the end of k; rows before the first key are fully masked."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    i = torch.arange(q.shape[-2])[:, None] + (k.shape[-2] - q.shape[-2])
    j = torch.arange(k.shape[-2])[None, :]
    if fill == "masked_fill":
        return s.masked_fill(j > i, -math.inf)
    return s + torch.zeros(s.shape[-2:]).masked_fill(j > i, -math.inf)


def stats(fill: str, maxima: bool = False):
    """Output and column sums (plans that skip masked tiles), optionally with column and row maxima."""
    def fn(q, k, v):
        p = torch.softmax(scores_bottom_right(q, k, fill), dim=-1)
        return (p @ v, p.sum(dim=-2)) + ((p.amax(dim=-2), p.amax(dim=-1)) if maxima else ())
    return fn


def skips_tiles(fn, *args) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        return any(k.assumes_finite for k in ft.explain(fn, *args).plan.kernels)


# ---- fully masked rows ---------------------------------------------------------------------------

@pytest.mark.parametrize("q_len, kv_len", [(128, 64), (67, 60)])
def test_fully_masked_rows_from_an_index_mask_give_nan_where_eager_does(q_len, kv_len):
    """q_len > kv_len with a bottom-right causal mask: the first q_len - kv_len rows have no key, so eager's
    softmax is NaN there, and so is every column statistic. Regression: the row-max fact (-inf on those rows)
    must stop tiles from being skipped (128/64 skips whole tiles), and max reductions must propagate NaN."""
    q = qkv(2, q_len, 16)[0]
    k, v = qkv(2, kv_len, 16, seed=SEED + 1)[:2]
    fn = stats("masked_fill", maxima=True)
    ref = fn(q, k, v)
    assert ref[0][:, : q_len - kv_len].isnan().all() and not ref[0][:, q_len - kv_len:].isnan().any()
    assert ref[1].isnan().all() and ref[2].isnan().all()
    assert_close(compiled(fn, q, k, v), ref)


# ---- NaN and inf in the inputs -------------------------------------------------------------------

@pytest.mark.parametrize("fill", ["masked_fill", "additive"])
@pytest.mark.parametrize("where", ["k_masked", "q_row", "v_row"])
def test_nan_in_inputs_matches_eager(fill, where):
    """A NaN in k at a key only the last queries see: masked_fill replaces it for earlier queries (no NaN
    there), while s + (-inf) keeps it (NaN in every row). Kernels that skip masked tiles cannot see the
    difference, so calls with non-finite inputs must give eager's answer either way."""
    q, k, v = qkv(1, 130, 16)
    {"k_masked": k[0, 120], "q_row": q[0, 5], "v_row": v[0, 100]}[where][3] = math.nan
    fn = stats(fill)
    assert skips_tiles(fn, *qkv(1, 130, 16))
    ref = fn(q, k, v)
    if where == "k_masked":
        assert ref[0][0, :120].isnan().all() == (fill == "additive") and ref[0][0, 120:].isnan().all()
    assert_close(compiled(fn, q, k, v), ref)


def test_infinite_inputs_match_eager():
    q, k, v = qkv(1, 2, 100, 16)
    q[0, 0, 3, 0], k[0, 1, 50, 2] = -math.inf, math.inf
    ref = workloads.h2o(q, k, v)
    assert any(r.isnan().any() for r in ref)
    assert_close(compiled(workloads.h2o, q, k, v), ref)


def test_finite_inputs_after_nan_inputs_run_the_kernels_again():
    """The eager detour is per call: the same plan then runs its kernels on finite inputs."""
    fn = stats("additive")
    c = ft.compile(fn)
    q, k, v = qkv(1, 130, 16)
    bad = k.clone()
    bad[0, 120, 0] = math.nan
    assert_close(c(q, bad, v), fn(q, bad, v))
    assert_close(c(q, k, v), fn(q, k, v))
    (prog,) = c.programs.values()
    assert prog.launches and any(kernel.assumes_finite for kernel in prog.kernels)
    assert len(c.programs) == 1


@pytest.mark.parametrize("value", [0.0, -2.0])
@pytest.mark.parametrize("pos", [(0, 1, 5, 290), (0, 0, 250, 10)])
def test_finite_inputs_outside_a_logs_domain_match_eager(value, pos):
    """KeyFormer's noise is finite at 0 or -2, but -log of it is +inf or NaN, and -inf + inf is NaN in the
    masked tile the kernels skip (the first position; the second is unmasked): eager's softmax row is
    NaN there, so every column sum is. The check holds the noise to log's domain as well."""
    fn, args = workloads.make("keyformer", device="cpu", dtype=torch.float32, S=300, H=2, D=16)
    c = ft.compile(fn)
    bad = [a.clone() for a in args]
    bad[3][pos] = value
    ref = fn(*bad)
    assert ref[1][pos[:2]].isnan().all() and not ref[1][0, 1 - pos[1]].isnan().any()
    for out, r in zip(c(*bad), ref):
        assert_close(out, r)
    for out, r in zip(c(*args), fn(*args)):     # and the kernels' own answer again
        assert_close(out, r)
    (prog,) = c.programs.values()
    assert prog.launches and any(kernel.assumes_finite for kernel in prog.kernels)


@pytest.mark.parametrize("pos", [(0, 1, 5, 290), (0, 0, 250, 10)])
def test_a_subnormal_under_a_log_matches_eager(pos):
    """The first pass takes logs with subnormals flushed to 0 (one GPU instruction in place of four; the
    interpreter flushes by hand), so the check sends a subnormal noise entry, in a skipped tile or a
    loaded one, to the fixup pass, whose logs keep it: -log(1e-40) is 92.1, finite, as in eager."""
    fn, args = workloads.make("keyformer", device="cpu", dtype=torch.float32, S=300, H=2, D=16)
    c = ft.compile(fn)
    bad = [a.clone() for a in args]
    bad[3][pos] = 1e-40
    ref = fn(*bad)
    assert all(r.isfinite().all() for r in ref)
    for out, r in zip(c(*bad), ref):
        assert_close(out, r)


@pytest.mark.parametrize("value,pos", [(math.nan, (0, 1, 5, 290)), (math.nan, (0, 0, 250, 10)),
                                       (math.inf, (0, 1, 130, 129))])
def test_a_check_carried_by_a_sum_catches_every_bad_value(value, pos):
    """In the loaded tiles the noise's check is carried by the row kernel's first sum over the same tile:
    the flushing log of the noise, times 0, is added into it in the first pass (NaN where the noise is not
    positive normal and finite), and the flag tests that sum; the fixup pass leaves it out. NaN noise
    makes eager's row NaN; +inf is -inf under -log, which eager's softmax takes as 0 (a skipped, a loaded
    and a diagonal tile's position)."""
    fn, args = workloads.make("keyformer", device="cpu", dtype=torch.float32, S=300, H=2, D=16)
    report = ft.explain(fn, *args)
    assert any("tl.sum(_with_check(" in kern.triton_source for kern in report.kernels)
    c = ft.compile(fn)
    bad = [a.clone() for a in args]
    bad[3][pos] = value
    ref = fn(*bad)
    assert ref[1][pos[:2]].isnan().all() == (value != math.inf) and ref[0].isfinite().all()
    for out, r in zip(c(*bad), ref):
        assert_close(out, r)


def noisy_row_max(q, k, noise):
    """The largest of each row's exp(s) / noise: the noise's log (flushing, in exp2's argument), and no sum
    for its check to ride on."""
    s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1) * 0.25
    return torch.exp(s + torch.full((q.shape[1], k.shape[1]), -math.inf).triu(1) - noise.log()).amax(dim=-1)


def test_a_logs_check_without_a_sum_to_carry_it_matches_eager():
    """With only a row max over the noisy scores, the log's check of a loaded tile is summed on its own: a
    subnormal there goes to the fixup pass, whose log keeps it (the interpreter's NaN-propagating max is
    slow, so one case)."""
    value, pos = 1e-40, (0, 0, 150, 10)
    g = torch.Generator().manual_seed(SEED)
    q, k = (torch.randn(1, 200, 2, 16, generator=g) for _ in range(2))
    noise = 0.5 + torch.rand(1, 2, 200, 200, generator=g)
    assert any("= _log2_approx(" in kern.triton_source and "tl.sum(_with_check(" not in kern.triton_source
               for kern in ft.explain(noisy_row_max, q, k, noise).kernels)
    bad = noise.clone()
    bad[pos] = value
    assert_close(compiled(noisy_row_max, q, k, bad), noisy_row_max(q, k, bad))


def masked_softmax_with(op: str):
    def fn(q, k, v, w):
        s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)
        extra = 1 / w if op == "reciprocal" else w.sqrt()
        p = torch.softmax(s + torch.full((q.shape[1], k.shape[1]), -math.inf).triu(1) + extra, dim=-1)
        return p @ v.transpose(1, 2)
    return fn


@pytest.mark.parametrize("op,value,pos", [("reciprocal", 0.0, (0, 1, 5, 290)), ("reciprocal", math.inf, (0, 0, 250, 10)),
                                          ("sqrt", -1.0, (0, 1, 5, 290)), ("sqrt", math.nan, (0, 0, 250, 10))])
def test_skipped_tiles_held_to_a_divisors_or_a_roots_domain(op, value, pos):
    """The loop over skipped tiles keeps a running minimum of the domain's measure (|w| for a divisor, w
    for a square root) beside the sum of w * 0: 1 / 0 is inf and sqrt(-1) NaN, NaN with the mask's -inf
    in the skipped tile (the first position), so eager's row is NaN; in the loaded tile (the second) the
    kernels compute what eager does."""
    g = torch.Generator().manual_seed(SEED)
    q, k, v = (torch.randn(1, 300, 2, 16, generator=g) for _ in range(3))
    w = 0.5 + torch.rand(1, 2, 300, 300, generator=g)
    fn = masked_softmax_with(op)
    bad = w.clone()
    bad[pos] = value
    ref = fn(q, k, v, bad)
    assert_close(compiled(fn, q, k, v, bad), ref)
    assert_close(compiled(fn, q, k, v, w), fn(q, k, v, w))


def test_skipped_tiles_checked_with_fewer_queries_than_keys():
    """100 queries against 300 keys, batch 2: the causal mask's diagonal is offset by 200, so the row tiles
    skip the loop tiles right of it, a part tile among them; a bad noise entry in a skipped tile, at a part
    tile's edge or in a loaded one still gives eager's answer."""
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(2, 100, 2, 16, generator=g)
    k, v = (torch.randn(2, 300, 2, 16, generator=g) for _ in range(2))
    noise = 0.5 + torch.rand(2, 2, 100, 300, generator=g)
    c = ft.compile(workloads.keyformer)
    for pos in [None, (0, 1, 5, 290), (1, 0, 0, 299), (1, 1, 50, 260), (0, 1, 3, 203), (1, 0, 64, 100)]:
        bad = noise.clone()
        if pos is not None:
            bad[pos] = 0.0
        ref = workloads.keyformer(q, k, v, bad)
        assert pos is None or ref[1][pos[:2]].isnan().all()
        for out, r in zip(c(q, k, v, bad), ref):
            assert_close(out, r)


def noisy_colsums_of_half_noise(q, k, noise, tau=1.5):
    """KeyFormer's noisy column sums with the float32 noise cast to fp16 before its log."""
    s = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s + torch.full((q.shape[1], k.shape[1]), float("-inf")).triu(1)
    g = -noise.half().log().float()
    return torch.softmax((s + g) / tau, dim=-1).sum(dim=2)


@pytest.mark.parametrize("pos,value", [((0, 1, 5, 290), 1e-9), ((0, 0, 250, 10), 1e-9),
                                       ((0, 1, 5, 290), 1e6), ((0, 0, 250, 10), 1e-6)])
def test_an_input_cast_to_fp16_is_checked_and_rounded_as_cast(pos, value):
    """fp16(1e-9) is 0, so eager's -log is +inf: NaN in the masked tile the kernels skip (the first
    position), and +inf - +inf, NaN, in the loaded one. fp16(1e6) is inf and fp16(1e-6) a subnormal. The
    check tests the noise as cast (analysis.facts.narrowed_inputs) and the kernels round the cast as eager
    does, though every input and output is float32."""
    g = torch.Generator().manual_seed(SEED)
    q, k = (torch.randn(1, 300, 2, 16, generator=g) for _ in range(2))
    noise = 0.5 + torch.rand(1, 2, 300, 300, generator=g)
    c = ft.compile(noisy_colsums_of_half_noise)
    bad = noise.clone()
    bad[pos] = value
    ref = noisy_colsums_of_half_noise(q, k, bad)
    assert ref[pos[:2]].isnan().all() == (value == 1e-9)
    assert_close(c(q, k, bad), ref)
    assert_close(c(q, k, noise), noisy_colsums_of_half_noise(q, k, noise))
    report = ft.explain(noisy_colsums_of_half_noise, q, k, noise)
    assert any(".to(tl.float16).to(tl.float32)" in kern.triton_source for kern in report.kernels)


def test_a_bias_cast_to_fp16_that_overflows_in_a_skipped_tile_matches_eager():
    """No log here: fp16(1e6) is inf, and -inf + inf is NaN in the masked tile the kernels skip, so the
    finiteness check alone must test the bias as cast."""
    g = torch.Generator().manual_seed(SEED)
    q, k = (torch.randn(1, 300, 2, 16, generator=g) for _ in range(2))
    bias = torch.randn(1, 2, 300, 300, generator=g)

    def fn(q, k, bias):
        s = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)) / 4.0
        s = s + torch.full((300, 300), float("-inf")).triu(1) + bias.half().float()
        return torch.softmax(s, dim=-1).sum(dim=2)

    c = ft.compile(fn)
    bad = bias.clone()
    bad[0, 1, 5, 290] = 1e6
    ref = fn(q, k, bad)
    assert ref[0, 1].isnan().all() and not ref[0, 0].isnan().any()
    assert_close(c(q, k, bad), ref)
    assert_close(c(q, k, bias), fn(q, k, bias))


def banded_noisy_colsums(q, k, noise):
    """Column sums of a softmax over a band of 40 keys (j <= i, j >= i - 40) with -log(noise) added:
    the row kernel's loop skips tiles both before and after the band."""
    S = q.shape[1]
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)
    s = s + torch.where((j > i) | (j < i - 40), -math.inf, 0.0) - noise.log()
    return torch.softmax(s, dim=-1).sum(dim=2)


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0])
def test_an_input_checked_on_the_tiles_is_checked_where_they_skip(value):
    """The noise is checked on the tiles the row kernel loads and, for the tiles it skips, by the check's
    own loads (codegen.checkplan.tile_checks). Under the interpreter the row tiles are 128 and the loop's 64,
    so the band of rows 128-255 skips columns 0-63 and 256-299 (a part tile): a bad value in either,
    at their edges, in a computed tile's masked corner or inside the band gives eager's answer (a NaN
    in every column sum of that head, or for inf, where -log gives -inf, finite sums)."""
    g = torch.Generator().manual_seed(SEED)
    q, k = (torch.randn(1, 300, 2, 16, generator=g) for _ in range(2))
    noise = 0.5 + torch.rand(1, 2, 300, 300, generator=g)
    c = ft.compile(banded_noisy_colsums)
    c(q, k, noise)
    (prog,) = c.programs.values()
    assert prog.launches and any(kernel.assumes_finite for kernel in prog.kernels)
    for pos in [(130, 0), (130, 63), (130, 64), (200, 256), (255, 299), (299, 299), (0, 299), (100, 90)]:
        bad = noise.clone()
        bad[0, 1, pos[0], pos[1]] = value
        ref = banded_noisy_colsums(q, k, bad)
        assert ref[0, 1].isnan().all() != (value == math.inf) and not ref[0, 0].isnan().any()  # -log inf: p = 0
        assert_close(c(q, k, bad), ref)
    assert_close(c(q, k, noise), banded_noisy_colsums(q, k, noise))


def per_key_weighted_attention(q, k, v, w):
    """Causal attention with -log(w[j]) added per key: no grid variable indexes w, so the flat check
    covers it (codegen.checkplan.tile_checks)."""
    S = q.shape[1]
    s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)
    return torch.softmax(s + torch.full((S, S), -math.inf).triu(1) - w.log(), dim=-1) @ v.transpose(1, 2)


@pytest.mark.parametrize("value", [math.nan, 0.0])
def test_an_input_checked_in_parts_is_held_to_its_domain(value):
    """w[290] lies in a tile the first 256 queries skip; a NaN there, or a 0 (-log 0 = inf, and
    -inf + inf = NaN in their masked tile), makes every output row NaN in eager."""
    g = torch.Generator().manual_seed(SEED)
    q, k, v = (torch.randn(1, 300, 2, 16, generator=g) for _ in range(3))
    w = 0.5 + torch.rand(300, generator=g)
    c = ft.compile(per_key_weighted_attention)
    assert_close(c(q, k, v, w), per_key_weighted_attention(q, k, v, w))
    bad = w.clone()
    bad[290] = value
    ref = per_key_weighted_attention(q, k, v, bad)
    assert ref.isnan().all()
    assert_close(c(q, k, v, bad), ref)


@pytest.mark.unit
def test_input_domains_follow_the_ops_that_read_an_input():
    """log and rsqrt need positive values, sqrt non-negative ones, a divisor non-zero ones; through casts;
    an input read by several such ops needs all; one read only by arithmetic needs nothing."""
    def fn(a, b, c, d, e):
        return a.log() + (b * 2).sqrt() + c.sqrt() / d.double().float() + e.rsqrt() + 1 / e.sqrt() + b

    xs = [torch.rand(4, 8) + 0.5 for _ in range(5)]
    loops, _ = to_loops(fusable_part(decompose(capture(fn, xs))))
    assert input_domains(loops) == {0: "positive", 2: "nonneg", 3: "nonzero", 4: "positive"}


@pytest.mark.unit
def test_narrowed_inputs_name_the_narrowest_cast_of_each_input():
    """A cast to a type with a smaller range narrows an input (float32 to fp16 or bf16, bf16 to fp16); a
    widening one, or a cast of a computed value, does not."""
    def fn(a, b, c, d):
        return (a.half().float() + a.bfloat16().float() + b.bfloat16().half().float() + c.double().float()
                + (d * 2).half().float())

    xs = [torch.rand(4, 8) + 0.5 for _ in range(4)]
    loops, _ = to_loops(fusable_part(decompose(capture(fn, xs))))
    assert narrowed_inputs(loops) == {0: torch.float16, 1: torch.float16}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_very_large_logits_do_not_overflow(dtype):
    """Scores of order 1e4 (q scaled by 1e3 in fp32, by 30 in fp16): the running max keeps exp finite."""
    q, k, v = qkv(1, 90, 2, 32, dtype=dtype)
    q = q * (1e3 if dtype == torch.float32 else 30.0)
    ref = workloads.h2o(q, k, v)
    assert all(torch.isfinite(r).all() for r in ref)
    assert_close(compiled(workloads.h2o, q, k, v), ref)


# ---- empty dimensions ----------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("name", ["attn", "h2o"])
@pytest.mark.parametrize("empty", ["batch", "queries", "keys", "queries and keys"])
def test_empty_dimensions_give_eagers_result(name, empty):
    """Size-0 batch, queries or keys: eager's softmax over no keys is empty and p @ v is zeros; regression:
    the decomposed softmax's max over no elements raised in amax instead."""
    fn = getattr(workloads, name)
    q, k, v = qkv(1, 40, 2, 16)
    if empty == "batch":
        q, k, v = q[:0], k[:0], v[:0]
    if "queries" in empty:
        q = q[:, :0]
    if "keys" in empty:
        k, v = k[:, :0], v[:, :0]
    ref = fn(q, k, v)
    out = compiled(fn, q, k, v, fused=False)
    assert_close(out, ref)
    assert all(torch.equal(o, r) for o, r in zip(as_tuple(out), as_tuple(ref)))


# ---- bad input at call time ----------------------------------------------------------------------

@pytest.mark.unit
def test_inputs_on_a_device_without_kernels_run_eagerly_with_the_reason():
    q, k, v = (t.to("meta") for t in qkv(1, 40, 2, 16))
    with pytest.warns(FallbackWarning, match="inputs on meta"):
        out = ft.compile(workloads.h2o)(q, k, v)
    ref = workloads.h2o(q, k, v)
    assert [(o.device.type, o.shape, o.dtype) for o in out] == [(r.device.type, r.shape, r.dtype) for r in ref]


@pytest.mark.unit
def test_values_made_from_intermediates_live_on_the_inputs_device():
    """zeros_like and triu of a computed value build index tensors and constants; in eager evaluation they
    must land on the inputs' device (they were put on the CPU: a device mismatch on any other device)."""
    def fn(q, k):
        s = q @ k.transpose(-2, -1)
        return torch.zeros_like(s) + s.triu(1)
    q, k = torch.randn(8, 4, device="meta"), torch.randn(8, 4, device="meta")
    with pytest.warns(FallbackWarning, match="inputs on meta"):
        assert ft.compile(fn)(q, k).device.type == "meta"


@pytest.mark.unit
def test_mixed_devices_raise_eagers_own_error():
    """Eager rejects attn of a CPU q and a meta k: the compiled call raises eager's exception, noted with the
    call (tests/test_capture.py runs a program of two devices that eager accepts)."""
    q, k, v = qkv(1, 40, 2, 16)
    with pytest.raises(RuntimeError, match="device meta") as caught:
        ft.compile(workloads.attn)(q, k.to("meta"), v)
    assert "attn(q: float32[1, 40, 2, 16] on cpu, k: float32[1, 40, 2, 16] on meta" in caught.value.__notes__[0]


@pytest.mark.unit
def test_no_tensor_argument_is_rejected():
    with pytest.raises(TypeError, match="no tensor argument"):
        ft.compile(lambda x: x * 2.0)(3.0)


def test_strided_inputs_match_eager_and_get_their_own_plan():
    """A transposed-then-transposed-back k and a q sliced with a step have the logical shape of the
    contiguous ones but other strides: each gets a plan, and every result matches eager."""
    q, k, v = qkv(1, 80, 2, 32)
    c = ft.compile(workloads.h2o)
    k_strided = k.transpose(1, 2).contiguous().transpose(1, 2)
    q_sliced = torch.randn(1, 160, 2, 32)[:, ::2]
    v_narrow = torch.randn(1, 80, 2, 64)[..., 16:48]
    for args in ((q, k, v), (q, k_strided, v), (q_sliced, k, v), (q, k, v_narrow)):
        assert not all(a.is_contiguous() for a in args) or args[1] is k
        assert_close(c(*args), workloads.h2o(*args))
    assert len(c.programs) == 4


def test_dtype_and_shape_changes_between_calls_replan():
    c = ft.compile(workloads.h2o)
    for shape, dtype in (((1, 64, 2, 16), torch.float32), ((1, 64, 2, 16), torch.float16),
                         ((2, 50, 1, 16), torch.float16), ((1, 64, 2, 16), torch.float32)):
        args = qkv(*shape, dtype=dtype, seed=SEED + len(c.programs))
        out = c(*args)
        assert all(o.dtype == r.dtype for o, r in zip(out, workloads.h2o(*args)))
        assert_close(out, workloads.h2o(*args))
    assert c.cache_info()["plans"] == 3      # the new shape of fp16 is the second of its structure: generic
    assert c.cache_info()["generic"] == 1


def test_in_place_write_to_an_intermediate_is_seen_by_later_reads():
    """`s[..., :5, :] = -inf` after the scores: eager's softmax reads the written value (NaN rows, so every
    column sum is NaN); a capture that lost the write would return finite sums."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 40, 2, 16, generator=g) for _ in range(3))

    def fn(q, k, v):
        s = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1) + torch.full((40, 40), float("-inf")).triu(1)
        s[..., :5, 30:] = 1e4
        return torch.softmax(s, dim=-1).sum(dim=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ft.compile(fn)(q, k, v)
    assert_close(out, fn(q, k, v))


@pytest.mark.unit
def test_writing_into_an_input_runs_the_function_with_a_note():
    """A function that writes into its argument (a static KV cache's index_copy_, q.mul_) runs as written, so the
    caller's tensor changes as under eager, with a note naming the argument; it used to raise."""
    def fn(q, cache, k, pos):
        cache.index_copy_(0, pos, k)
        return torch.softmax(q @ cache.transpose(-2, -1), dim=-1) @ cache
    q, cache, k, pos = torch.randn(4, 8), torch.randn(16, 8), torch.randn(3, 8), torch.tensor([2, 5, 9])
    mine, theirs = cache.clone(), cache.clone()
    with pytest.warns(ft.FallbackWarning, match="writes into its tensor argument 2 in place"):
        out = ft.compile(fn)(q, mine, k, pos)
    assert_close(out, fn(q, theirs, k, pos))
    assert torch.equal(mine, theirs)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_every_share_of_every_input_is_checked(which):
    """The finite check splits an input into shares checked by programs of different kernels, or checks
    it on the tiles a kernel loads: a NaN at the start, middle or end of any input (where the causal mask
    skips it or not) gives eager's NaNs."""
    fn, args = workloads.make("h2o", device="cpu", dtype=torch.float32, S=300, H=2, D=16, seed=which)
    # 9600 elements per input. q is checked on the row tiles of the first kernel and k on the column tiles
    # of the second (codegen.checkplan.tile_checks); each kernel checks one half of v (codegen.checkplan.plan_checks),
    # split into pieces of 800 over the 2 x 3 programs of 128 rows under the interpreter; so 799 and 800 sit
    # on either side of a boundary between two programs, 4799 and 4800 on either side of that between the
    # kernels
    c = ft.compile(fn)
    n = args[which].numel()
    for pos in (0, 799, 800, n // 2 - 1, n // 2, n // 2 + 3, n - 1):
        bad = [a.clone() for a in args]
        bad[which].view(-1)[pos] = float("nan")
        for out, ref in zip(c(*bad), fn(*bad)):
            assert_close(out, ref)


def test_a_kernel_of_few_programs_checks_a_small_share():
    """SnapKV's pooling of its column sums is a kernel over the keys alone (300 points, where the other two
    cover 2 heads x 300): it checks 13 64ths of v, not an even third, and a NaN on either side of each kernel's
    share boundary in v (at 3900 and 7650 of 9600) still gives eager's NaNs."""
    fn, args = workloads.make("snapkv", device="cpu", dtype=torch.float32, S=300, H=2, D=16, seed=3)
    c = ft.compile(fn)
    c(*args)
    (prog,) = c.programs.values()
    (specs,) = prog.plan.stages["emit"].values()
    assert [sp.check.shares for sp in specs] == [(26, 25, 13)] * 3
    for pos in (0, 3899, 3900, 7649, 7650, 9599):
        bad = [a.clone() for a in args]
        bad[2].view(-1)[pos] = float("nan")
        for out, ref in zip(c(*bad), fn(*bad)):
            assert_close(out, ref)


@pytest.mark.parametrize("programs", [1, 4])
def test_fixup_programs_loop_over_every_tile(programs):
    """The fixup pass runs few programs that loop over the tiles: with fewer programs than tiles (here
    2 x 3 rows of 128 per kernel) a NaN still gives eager's NaNs and every other value."""
    fn, args = workloads.make("h2o", device="cpu", dtype=torch.float32, S=300, H=2, D=16, seed=7)
    bad = [a.clone() for a in args]
    bad[2][0, 290, 1, 3] = float("inf")       # v: the causal mask skips it for all but the last rows
    for out, ref in zip(ft.compile(fn, fixup_programs=programs)(*bad), fn(*bad)):
        assert_close(out, ref)
