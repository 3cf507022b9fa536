"""Shape-generic plans: one search serves every length its guards admit (issue #22's CPU part).

The programs are written as Hugging Face and KV-cache code writes them: a causal mask whose diagonal follows
kv_len - q_len, built with finfo.min or -inf inside the function, and statistics of the probabilities.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import flashtensor as ft
from conftest import prefill_in_chunks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def h2o_finfo(q, k, v):
    """(B, H, S, D) attention with HF's finfo.min causal mask (offset for q_len < kv_len) and column sums."""
    sq, sk = q.shape[-2], k.shape[-2]
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    mask = torch.full((sq, sk), torch.finfo(s.dtype).min).triu(sk - sq + 1)
    p = F.softmax(s + mask, dim=-1, dtype=torch.float32)
    return p @ v, p.sum(dim=-2)


def _inputs(b, h, sq, sk, d=16, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * sq + sk)
    return [torch.randn(b, h, n, d, generator=g) for n in (sq, sk, sk)]


def _check(fn, compiled, args, tol=2e-5):
    for got, want in zip(compiled(*args), fn(*args)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_one_search_serves_every_length():
    """dynamic=True: lengths that are and are not multiples of every tile, q_len 1 (decode) and q_len < kv_len,
    batch and head counts 1 and 3, all from the one plan the first call searched; fresh random inputs each call,
    checked against eager."""
    fn = h2o_finfo
    c = ft.compile(fn, dynamic=True, cache=False)
    shapes = [(1, 2, 64, 64), (3, 2, 17, 17), (1, 1, 1, 50), (3, 2, 100, 100), (2, 3, 130, 130), (1, 2, 16, 64),
              (3, 1, 40, 100)]
    for k, (b, h, sq, sk) in enumerate(shapes):
        _check(fn, c, _inputs(b, h, sq, sk, seed=k))
    info = c.cache_info()
    assert info["searches"] == 1 and info["generic"] == 1, info
    assert info["hits"] == len(shapes) - 1, info
    (prog,) = c.generic_programs()
    assert not prog.plan.eager and prog.kernels, prog.notes
    assert all(k.sizes for k in prog.kernels)      # the kernels take the lengths as arguments


def test_generic_after_a_second_length():
    """By default the first call plans for its shapes; a second length of the same program plans once more,
    generic in the dimensions that changed, and every later length reuses that plan."""
    c = ft.compile(h2o_finfo, cache=False)
    for k, s in enumerate((64, 48, 100, 130, 17)):
        _check(h2o_finfo, c, _inputs(1, 1, s, s, seed=k))
    info = c.cache_info()
    assert info["searches"] == 2 and info["plans"] == 2 and info["generic"] == 1, info
    assert info["hits"] == 3, info


def test_a_generic_plan_keeps_its_constant_sizes():
    """Generic in the lengths that changed, a plan holds the head count constant: a call with another head count
    plans again, generic in heads from then on (a dimension that once changed stays generic), and matches eager."""
    c = ft.compile(h2o_finfo, cache=False)
    for k, (b, h, s) in enumerate([(1, 2, 64), (1, 2, 80), (1, 3, 80), (2, 1, 48), (2, 3, 17)]):
        _check(h2o_finfo, c, _inputs(b, h, s, s, seed=k))
    info = c.cache_info()
    assert info["searches"] == 4 and info["generic"] == 3 and info["hits"] == 1, info


def test_guards_keep_a_plan_to_the_sizes_it_serves():
    """A plan traced with q_len <= kv_len does not serve q_len > kv_len (its causal mask's skipped tiles assume
    it): that call plans again, and both match eager."""
    c = ft.compile(h2o_finfo, dynamic=True, cache=False)
    _check(h2o_finfo, c, _inputs(2, 2, 32, 64))
    _check(h2o_finfo, c, _inputs(2, 2, 80, 40))
    _check(h2o_finfo, c, _inputs(2, 2, 1, 50))
    assert c.cache_info()["searches"] == 2


def test_static_option_never_generic():
    c = ft.compile(h2o_finfo, dynamic=False, cache=False)
    for s in (32, 48, 64):
        _check(h2o_finfo, c, _inputs(1, 1, s, s))
    assert c.cache_info()["generic"] == 0 and c.cache_info()["searches"] == 3


_CHILD = """
import json, sys, torch
sys.path.insert(0, {tests!r})
import flashtensor as ft
from test_generic import _inputs, h2o_finfo
c = ft.compile(h2o_finfo, dynamic=True)
for s in {lengths!r}:
    args = _inputs(2, 2, s, s)
    for got, want in zip(c(*args), h2o_finfo(*args)):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
print(json.dumps(c.cache_info()))
"""


def test_second_process_reuses_the_generic_plan(tmp_path):
    """The generic plan goes to the on-disk cache under the program's structure and the length bucket; a new
    process with a length in that bucket loads it and searches nothing."""
    env = {**os.environ, "FLASHTENSOR_CACHE_DIR": str(tmp_path), "FLASHTENSOR_CACHE": "1", "TRITON_INTERPRET": "1"}

    def child(lengths):
        code = _CHILD.format(tests=os.path.join(ROOT, "tests"), lengths=lengths)
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = child([100, 40])
    assert first["searches"] == 1, first
    again = child([120, 40])      # 120: the bucket of 100 (128)
    assert again["searches"] == 0 and again["tunes"] == 0 and again["generic"] == 1, again


def test_torch_compile_backend_takes_dynamos_symbolic_sizes(monkeypatch):
    """torch.compile recompiles once, for a second length, with the sizes as SymInt arguments; the backend reads
    them off the tensors and plans once, generic in Dynamo's symbolic dimensions, for every later length."""
    import torch._dynamo

    from flashtensor.api import backend

    made = []
    real = backend.ft_compile

    def spy(fn, **options):
        made.append(real(fn, **options))
        return made[-1]
    monkeypatch.setattr(backend, "ft_compile", spy)
    monkeypatch.setenv("FLASHTENSOR_CACHE", "0")     # searches counted here, not read from another test's plans
    torch._dynamo.reset()
    f = torch.compile(h2o_finfo, backend="flashtensor")
    for k, s in enumerate((64, 100, 130, 48, 17)):
        args = _inputs(2, 2, s, s, seed=k)
        for got, want in zip(f(*args), h2o_finfo(*args)):
            torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert len(made) == 2            # Dynamo's static graph, then its dynamic one
    assert made[1].dims              # the dynamic graph's compiled callable is generic in Dynamo's dimensions
    info = made[1].cache_info()
    assert info["searches"] == 1 and info["generic"] == 1 and info["hits"] == 3, info
    torch._dynamo.reset()


def test_explain_names_the_generic_sizes():
    c = ft.compile(h2o_finfo, dynamic=True, cache=False)
    args = _inputs(2, 2, 24, 40)
    report = ft.explain(c, *args)
    assert set(report.generic.values()) >= {"input 0 dim 2", "input 1 dim 2"}
    assert "== generic sizes ==" in str(report)
    sizes = {n: a.shape[int(w.split()[3])] for n, w in report.generic.items() for a in [args[int(w.split()[1])]]}
    from flashtensor.ir.sizes import holds
    assert holds(report.guards, sizes)


def test_prefill_in_chunks_equals_one_shot():
    """Chunked prefill: each chunk of queries attends to the keys so far (q_len < kv_len, the causal diagonal
    offset by kv_len - q_len); the chunks' outputs and column sums, accumulated, equal the one-shot result, and
    every chunk after the second runs on one generic plan."""
    b, h, s, d, chunk = 2, 2, 96, 16, 24
    q, k, v = _inputs(b, h, s, s, d, seed=7)
    c = ft.compile(h2o_finfo, cache=False)
    outs, cols = prefill_in_chunks(c, q, k, v, chunk)
    out, col = h2o_finfo(q, k, v)
    torch.testing.assert_close(outs, out, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(cols, col, rtol=2e-5, atol=2e-5)
    info = c.cache_info()
    assert info["searches"] == 2 and info["hits"] == s // chunk - 2, info


def test_each_length_bucket_tunes_once(monkeypatch):
    """Where the device times kernels, the first call in a new length bucket tunes the generic plan's kernels
    again (its search reused), later calls in that bucket launch them. The CPU times nothing, so the test says
    the device does (the tuner itself still takes its first configuration here): a bucket's block sizes
    follow its lengths, and every call matches eager."""
    from flashtensor.api import compiled as compiled_module
    monkeypatch.setattr(compiled_module, "timed", lambda device: True)
    c = ft.compile(h2o_finfo, dynamic=True, cache=False)
    for k, s in enumerate((24, 200, 150, 20, 256)):
        _check(h2o_finfo, c, _inputs(2, 2, s, s, seed=k))
    info = c.cache_info()
    assert info["searches"] == 1 and info["tunes"] == 2 and info["generic"] == 2, info
    small, large = c.generic_programs()
    assert max(small.kernels[0].blocks.values()) == 32 and max(large.kernels[0].blocks.values()) == 128



def test_a_new_bucket_whose_tuning_fails_plans_anew(monkeypatch):
    """Tuning a generic plan for a new length bucket launches its kernels on the device (the fixup passes too, once):
    a failure there (a kernel the device cannot load) raised out of the user's call. It now costs a plan for that
    call, and the call gives eager's answer."""
    from flashtensor.api import compiled as compiled_module
    monkeypatch.setattr(compiled_module, "timed", lambda device: True)

    def broken(*args, **kwargs):
        raise RuntimeError("out of resource: shared memory")
    monkeypatch.setattr(compiled_module, "retune", broken)
    c = ft.compile(h2o_finfo, dynamic=True, cache=False)
    for k, s in enumerate((24, 200, 150)):
        _check(h2o_finfo, c, _inputs(2, 2, s, s, seed=k))
    assert c.cache_info()["searches"] == 2, c.cache_info()     # the new bucket's call planned anew


def test_a_fixup_pass_the_device_cannot_load_fails_in_planning(monkeypatch):
    """A fixup pass is launched on every call (it returns at once while every input is finite), and one the device
    could not load (327 KB of shared memory on an H100) raised in the user's first call. Planning now launches
    each once: the failure falls back to eager there, with the reason in the notes."""
    from flashtensor.runtime.launch import Launch
    real = Launch.__call__

    def no_fixups(self, buffers, fixup=False, after_prior=False):
        if fixup:
            raise RuntimeError("out of resource: shared memory")
        return real(self, buffers, fixup, after_prior)
    monkeypatch.setattr(Launch, "__call__", no_fixups)
    c = ft.compile(h2o_finfo, cache=False)
    args = _inputs(1, 2, 40, 40)
    with pytest.warns(ft.FallbackWarning, match="out of resource"):
        _check(h2o_finfo, c, args)
    assert c.program_for(args).plan.eager

def test_a_generic_plan_priced_slower_than_eager_is_priced_again_per_bucket(monkeypatch):
    """Where the device prices a plan against the function itself and eager wins, the shape-generic plan is kept
    for the sizes it serves and runs eager in its length bucket: a later length there neither searches nor tunes
    (a decode loop called with one more key each step searched again at every length). The first call in another
    bucket tunes the kernels for it and prices them again, and there the kernels win. Stand-in timings: the
    kernels 2 ms against eager's 1 ms in the first bucket, 1 against 2 in the second."""
    from flashtensor import driver
    from flashtensor.api import compiled as compiled_module
    from flashtensor.runtime.launch import Step
    for module in (driver, compiled_module):
        monkeypatch.setattr(module, "timed", lambda device: True)
    times = iter([2.0, 1.0] * 3 + [1.0, 2.0] * 3)      # three rounds of pricing per bucket

    def measure(f):
        f()
        return next(times)
    monkeypatch.setattr(driver, "call_ms", measure)
    c = ft.compile(h2o_finfo, dynamic=True, cache=False)
    _check(h2o_finfo, c, _inputs(1, 2, 24, 24, seed=1))
    launched = []
    real = Step.launch
    monkeypatch.setattr(Step, "launch", lambda self, *a, **kw: launched.append(1) or real(self, *a, **kw))
    _check(h2o_finfo, c, _inputs(1, 2, 20, 20, seed=2))
    assert not launched and c.cache_info()["searches"] == 1 and c.cache_info()["tunes"] == 1, c.cache_info()
    _check(h2o_finfo, c, _inputs(1, 2, 200, 200, seed=3))
    launched.clear()
    _check(h2o_finfo, c, _inputs(1, 2, 150, 150, seed=4))
    assert launched, "the kernels priced faster in the second bucket run there"
    info = c.cache_info()
    assert info["searches"] == 1 and info["tunes"] == 2 and info["generic"] == 2, info
    small, large = c.generic_programs()
    assert small.plan.eager and not small.launches and any("took 2.000 ms" in n for n in small.notes), small.notes
    assert not large.plan.eager and large.launches and not any("took" in n for n in large.notes), large.notes


def test_mqa_expand_and_sliced_tril_mask_go_generic():
    """GPTBigCode's multi-query attention (one kv head expanded, a bool tril mask sliced to the last q_len rows,
    filled with finfo.min through torch.where) at a second length: a size expression with no hint of its own
    (the slice's start) once crashed the call; now it plans generic and matches eager."""
    from flashtensor.bench import programs
    c = ft.compile(programs.gpt_bigcode_mqa, cache=False)
    for s in (64, 100, 40):
        fn, args = programs.make("gpt_bigcode_mqa", device="cpu", dtype=torch.float32, **{**programs.SMALL, "S": s})
        torch.testing.assert_close(c(*args), fn(*args), rtol=2e-5, atol=2e-5)
    assert c.cache_info()["generic"] == 1 and c.cache_info()["searches"] == 2


@pytest.mark.unit
def test_symbolic_matmuls_keep_their_sizes_symbolic():
    """A (B, H, S, D) @ (B, H, D, S) product traced symbolically: no size symbol is fixed to its traced value (torch
    2.11's own matmul fixed them all under size-oblivious tracing; `Matmuls` writes the product out), and a
    broadcast batch (one key head for two query heads) gives eager's shape."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from flashtensor.frontend.symbolic import Matmuls, size_oblivious, symbolic_inputs

    args = [torch.randn(1, 2, 8, 4), torch.randn(1, 1, 4, 8)]
    with size_oblivious():
        dims = frozenset((i, d) for i in range(2) for d in range(4)) - {(1, 1)}     # the broadcast head is 1
        mode, fakes = symbolic_inputs(args, dims)
        with mode, Matmuls():
            gm = make_fx(lambda a, b: a @ b, tracing_mode="real", _allow_non_fake_inputs=True)(*fakes)
    fixed = [g.expr for g in mode.shape_env.guards if g.expr.is_Equality and any(a.is_Integer for a in g.expr.args)]
    assert not fixed, fixed
    out = gm(*args)
    torch.testing.assert_close(out, args[0] @ args[1])


def attention(q, k, v):
    """Plain attention over (B, H, S, D)."""
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v


def counts_above_uniform(q, k, v):
    """CORM's idea: how many queries give each key more than twice the uniform probability, 2 / kv_len, a
    threshold the program derives from a length."""
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ v, (p > 2.0 / p.shape[-1]).sum(dim=-2)


def test_a_number_derived_from_a_length_is_computed_in_the_kernel():
    """2.0 / kv_len is a SymFloat in the generic trace: the kernel once printed it as sympy's
    FloatTrueDiv(2.0, ToFloat(s1)), a NameError in the generic plan's first launch (an internal compiler error,
    so the program planned per length). The kernel now computes it from its size arguments, in float64 as Python
    does, then float32 as a literal is: one plan serves every length, with eager's counts."""
    c = ft.compile(counts_above_uniform, dynamic=True, cache=False)
    for sq, sk in [(20, 30), (33, 47), (5, 64), (64, 17)]:
        args = _inputs(1, 2, sq, sk, seed=sk)
        (o, n), (ro, rn) = c(*args), counts_above_uniform(*args)
        torch.testing.assert_close(o, ro, rtol=2e-5, atol=2e-5)
        assert torch.equal(n, rn)
    info = c.cache_info()
    assert info["searches"] == 1 and info["generic"] == 1, info


def sima(q, k, v):
    """SimA: q and k L1-normalised over the tokens, then linear attention q (k^T v)."""
    q, k = F.normalize(q, p=1, dim=-2), F.normalize(k, p=1, dim=-2)
    return q @ (k.transpose(-2, -1) @ v)


def test_a_generic_plan_that_fuses_nothing_is_tried_once():
    """SimA normalises over the tokens, an axis a static plan holds whole in its tile (at most 256) and a generic
    one cannot, so the second length's generic trial fuses nothing. That call plans for its exact shape and runs
    in kernels without a warning (the trial's "no fused plan ... runs in eager PyTorch" was once warned, though
    the kernels ran), and a third length plans for its shape without a second trial: 4 searches, not 5."""
    c = ft.compile(sima, cache=False)
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", ft.FallbackWarning)
        for n in (40, 24, 56):
            args = [torch.randn(1, 2, n, 16, generator=g) for _ in range(3)]
            torch.testing.assert_close(c(*args), sima(*args), rtol=2e-5, atol=2e-5)
    assert not [w for w in warned if issubclass(w.category, ft.FallbackWarning)], [str(w.message) for w in warned]
    info = c.cache_info()
    assert info["searches"] == 4 and info["generic"] == 0 and info["plans"] == 3, info
    assert all(p.kernels for p in c.programs.values())
    assert [n for notes in c.refused.values() for n in notes if "held whole" in n], c.refused


def test_a_generic_plan_tiles_queries_shorter_than_the_head_dimension():
    """Traced at q_len 23 with a head dimension of 32, the schedule took the longer, static head axis as its tile
    row and put the queries in the grid: one program per query at every length the plan served. A symbolic axis
    now counts as the longest (only a tiled axis serves every length): at q_len 1000 the kernel launches one
    program per block of queries."""
    from flashtensor.ir.sizes import evaluate
    c = ft.compile(attention, cache=False)
    for sq, sk in [(73, 35), (23, 66), (40, 90)]:
        _check(attention, c, _inputs(1, 2, sq, sk, d=32))
    (prog,) = c.generic_programs()
    long = [torch.empty(1, 2, n, 32, device="meta") for n in (1000, 50, 50)]
    (kernel,) = prog.kernels
    assert evaluate(kernel.grid[0], prog.sizes(long)) <= 2 * math.ceil(1000 / 16), kernel.grid



def _decode_h2o(q, k, v):
    """h2o on (B, S, H, D) inputs, as the decode benchmark writes it: scores by transposes, the causal mask offset
    to the last q_len keys, attention and the column sums of P."""
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    s = qt @ kt.transpose(-1, -2) / math.sqrt(q.shape[-1])
    sq, sk = s.shape[-2:]
    p = F.softmax((s + torch.full((sq, sk), float("-inf")).triu(sk - sq + 1)).float(), dim=-1)
    return (p @ v.transpose(1, 2)).transpose(1, 2), p.sum(dim=2)


def test_a_one_query_generic_plan_tiles_the_head_dimension():
    """Decode (one query) with the other sizes generic: the symbolic head count, taken as the longest free axis,
    cannot be the tile row of a one-query kernel, and the schedule fell back to no row at all, one program per
    head and output channel, each recomputing the head's scores (0.75 ms for 8K keys on an H100, against 0.03 ms
    for the exact plan). The next longest axis, the head dimension, is now the row."""
    from flashtensor.ir.sizes import evaluate
    c = ft.compile(_decode_h2o, dynamic=True, cache=False)
    for h, sk in [(2, 200), (3, 77)]:
        _check(_decode_h2o, c, [x.transpose(1, 2) for x in _inputs(1, h, 1, sk, d=32, seed=sk)])
    (prog,) = c.generic_programs()
    now = prog.sizes([x.transpose(1, 2) for x in _inputs(1, 3, 1, 77, d=32)])
    row = prog.kernels[0]       # attention and the row statistics; the column sums' kernel follows
    assert evaluate(row.grid[0], now) <= 3 * evaluate(row.splits, now), (row.grid, row.blocks)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_attention(q, k, v, cos, sin):
    """Llama's rotary embedding (transformers' apply_rotary_pos_emb), q and k each at the last positions of cos
    and sin, then attention."""
    n, m = q.shape[-2], k.shape[-2]
    q = q * cos[-n:] + _rotate_half(q) * sin[-n:]
    k = k * cos[-m:] + _rotate_half(k) * sin[-m:]
    return attention(q, k, v)


def _rope_inputs(sq, sk, d=32):
    pos = torch.arange(sk, dtype=torch.float32)[:, None]
    freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angle = torch.cat((pos * freq, pos * freq), dim=-1)
    return _inputs(2, 1, sq, sk, d) + [angle.cos(), angle.sin()]


def test_rope_position_slices_go_generic():
    """cos[-n:] has length Max(0, kv - Max(0, kv - q_len)), which the trace finds equal to q_len: the loop form
    once kept that expression as the query axis's extent, so the matmul's reshape to (B * H, q_len, D) did not
    match it and the generic plan fused nothing (warned as "no fused plan" while the call planned again for its
    shape). The simpler of two equal sizes is now the axis's extent: one generic plan serves later lengths."""
    c = ft.compile(rope_attention, cache=False)
    for sq, sk in [(5, 63), (41, 50), (30, 70)]:
        args = _rope_inputs(sq, sk)
        torch.testing.assert_close(c(*args), rope_attention(*args), rtol=2e-5, atol=2e-5)
    info = c.cache_info()
    assert info["searches"] == 2 and info["generic"] == 1 and info["hits"] == 1, info


def test_a_cached_generic_plan_whose_guards_fail_is_planned_again(tmp_path, monkeypatch):
    """Another process's generic plan for the same length bucket was traced with q_len <= kv_len (its causal
    skip assumes it): a call with q_len > kv_len in that bucket once loaded it, failed its guards and planned
    for its exact shape, as did every such call after it. It now searches a generic plan of its own."""
    monkeypatch.setenv("FLASHTENSOR_CACHE_DIR", str(tmp_path))
    first = ft.compile(h2o_finfo, dynamic=True)
    _check(h2o_finfo, first, _inputs(1, 1, 100, 120))
    c = ft.compile(h2o_finfo, dynamic=True)
    for sq, sk in [(110, 100), (120, 90)]:
        _check(h2o_finfo, c, _inputs(1, 1, sq, sk))
    info = c.cache_info()
    assert info["generic"] == 1 and info["searches"] == 1 and info["hits"] == 1, info


def ranked_scores(q, k, v):
    """H2O's column sums, sorted per head (torch.sort has no lowering: it runs in eager PyTorch on the kernels'
    sums), then each batch entry's running total over heads and keys."""
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    score = p.sum(dim=-2)
    ranked = torch.sort(score, dim=-1, descending=True).values.reshape(score.shape[0], -1)
    return p @ v, ranked.cumsum(dim=-1)


def test_the_eager_remainder_of_a_generic_plan_takes_the_calls_sizes():
    """The reshape after the sort is to (B, H * kv_len): evaluated with the traced symbolic size, it raised
    "SymIntArrayRef expected to contain only concrete integers" at every length after the traced one. The
    remainder now runs at the call's sizes."""
    c = ft.compile(ranked_scores, cache=False)
    for sq, sk in [(20, 30), (33, 47), (5, 64)]:
        _check(ranked_scores, c, _inputs(2, 2, sq, sk, seed=sq))
    (prog,) = c.generic_programs()
    assert prog.launches and prog.remainder is not None and prog.remainder.generic
    assert c.cache_info()["hits"] == 1, c.cache_info()


def causal_rowmax(q, k, v):
    """A bool causal mask from torch.ones(...).triu, bottom-right aligned, and the probabilities' row maxima."""
    sq, sk = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(sq, sk, dtype=torch.bool).triu(sk - sq + 1)
    p = torch.softmax(s.masked_fill(mask, -math.inf), dim=-1)
    return p @ v, p.amax(dim=-1)


def test_fully_masked_rows_go_generic():
    """q_len > kv_len leaves the first rows wholly masked (NaN, as in eager). Traced there, the value facts summed
    the masked scores' inf over the symbolic kv_len and tested the product, a guard with sympy's oo that no printer
    took (an internal compiler error at every such length); and printing the loop form tested a diagonal against
    0, a guard q_len - kv_len - 1 != 0. Now a generic plan for q_len > kv_len serves (41, 40) too."""
    c = ft.compile(causal_rowmax, cache=False)
    for sq, sk in [(12, 4), (60, 78), (40, 12), (30, 20), (41, 40)]:
        args = _inputs(1, 1, sq, sk)
        for got, want in zip(c(*args), causal_rowmax(*args)):
            torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5, equal_nan=True)
    info = c.cache_info()
    assert info["searches"] == 3 and info["generic"] == 2 and info["hits"] == 2, info


def efficient_attention(q, k, v):
    """Efficient attention (EA): q softmaxed over features, k over tokens, then q (k^T v)."""
    q, k = q.softmax(dim=-1), k.softmax(dim=-2)
    return q @ (k.transpose(-2, -1) @ v)


def test_generic_linear_attention_offers_the_context_kernel():
    """Traced at 11 tokens with 16 features, the partition took the feature axis for the longest and so never
    offered the candidate that computes the 16 x 16 context k^T v once in a kernel of its own, which long sequences
    need (each query tile recomputes it otherwise); the tokens, symbolic, now count as the longest. (The GPU search
    times every candidate; the CPU takes the first.)"""
    c = ft.compile(efficient_attention, cache=False)
    g = torch.Generator().manual_seed(0)
    for n in (40, 11, 70):
        args = [torch.randn(1, 2, n, 16, generator=g) for _ in range(3)]
        torch.testing.assert_close(c(*args), efficient_attention(*args), rtol=2e-5, atol=2e-5)
    (prog,) = c.generic_programs()
    assert sorted(len(kernels) for kernels in prog.plan.stages["partition"]) == [1, 2]


def attention_with_mask(q, k, v, mask):
    """Hugging Face's attention: an additive (B, 1, Sq, Sk) mask passed in, broadcast over the heads."""
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + mask, dim=-1)
    return p @ v, p.sum(dim=-2)


def _masked_inputs(b, h, sq, sk):
    q, k, v = _inputs(b, h, sq, sk)
    keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    mask = (1.0 - keep.float()) * torch.finfo(torch.float32).min
    return [q, k, v, mask.expand(b, 1, sq, sk).contiguous()]


def test_dynamic_true_takes_a_mask_broadcast_over_heads():
    """dynamic=True made the mask's head axis of 1 symbolic too, which the size-oblivious trace cannot broadcast:
    the trace failed at every call and each planned for its exact shape. A size of 1 is now traced static where the
    trace fails: one plan serves batch 2, 1 and 3."""
    c = ft.compile(attention_with_mask, cache=False, dynamic=True)
    for shape in [(2, 2, 20, 30), (1, 2, 33, 47), (3, 2, 5, 64)]:
        _check(attention_with_mask, c, _masked_inputs(*shape))
    info = c.cache_info()
    assert info["searches"] == 1 and info["generic"] == 1 and info["hits"] == 2, info


def gqa_repeat_kv(q, k, v, mask):
    """Hugging Face's eager attention for grouped-query heads: repeat_kv by expand and reshape, n_rep = H // kv_heads,
    the 4D additive mask sliced to the keys, and the column sums of P."""
    def repeat_kv(x, n_rep):
        b, kvh, s, d = x.shape
        return x[:, :, None, :, :].expand(b, kvh, n_rep, s, d).reshape(b, kvh * n_rep, s, d)
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1]) + mask[:, :, :, : k.shape[-2]]
    p = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v).transpose(1, 2).contiguous(), p.sum(dim=-2)


def test_dynamic_true_plans_repeat_kv_once_for_every_group_size():
    """dynamic=True makes the head counts symbolic, and repeat_kv's reshape to kv_heads x (H // kv_heads) heads
    lines up with the queries' H only where kv_heads divides H. It was refused, so each call planned for its exact
    shape; the reshape now lowers under torch's own guard that the two are equal (sizes.guarded_same). One plan
    serves 4 heads on 2, 6 on 2 and 6 on 3 at four lengths; 4 heads on 4 (no grouping, its guards say kv < H) plan
    once more."""
    c = ft.compile(gqa_repeat_kv, cache=False, dynamic=True)
    for n, (s, h, kv) in enumerate([(32, 4, 2), (48, 6, 2), (80, 6, 3), (17, 4, 2), (40, 4, 4), (20, 4, 4)]):
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, heads, s, 16, generator=g) for heads in (h, kv, kv))
        mask = torch.full((s, s), torch.finfo(torch.float32).min).triu(1)[None, None]
        _check(gqa_repeat_kv, c, [q, k, v, mask], tol=1e-4)
    info = c.cache_info()
    assert info["searches"] == 2 and info["generic"] == 2 and info["hits"] == 4, info


def per_pair_of_heads(q, k, v):
    """Column sums of P averaged over pairs of heads (kvpress's per-KV-head scores for a model with its KV head
    count written in: the split of the head axis by 2 is fixed)."""
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ v, p.unflatten(1, (2, -1)).mean(2).sum(dim=-2)


def test_a_static_split_of_heads_beside_symbolic_lengths_is_generic():
    """By default only the lengths become symbolic, and splitting the 4 heads into 2 x 2 is static; but the reshape
    also carries the symbolic lengths, and it was refused as a whole, so every new length searched again (kvpress's
    per-KV-head scores, a search per prompt length). Each static size is now lowered from static axes."""
    c = ft.compile(per_pair_of_heads, cache=False)
    for n, s in enumerate((32, 48, 80, 17)):
        _check(per_pair_of_heads, c, _inputs(1, 4, s, s, seed=n), tol=1e-4)
    info = c.cache_info()
    assert info["searches"] == 2 and info["generic"] == 1 and info["hits"] == 2, info


def test_dynamic_true_falls_back_to_the_lengths_that_change():
    """Under dynamic=True the head axis is symbolic, and splitting it by a constant 2 does not lower: the plan generic
    in every dimension fuses nothing. Each call then planned for its exact shape (a search per length, worse than
    the default); now the next length plans generic in the dimensions that changed, as by default, and later
    lengths reuse it."""
    c = ft.compile(per_pair_of_heads, cache=False, dynamic=True)
    for n, s in enumerate((32, 48, 80, 17)):
        _check(per_pair_of_heads, c, _inputs(1, 4, s, s, seed=n), tol=1e-4)
    info = c.cache_info()
    assert info["generic"] == 1 and info["hits"] == 2 and info["searches"] <= 2, info


def attention_argmax(q, k, v):
    """Attention and each query's most attended key (argmax has no lowering: eager reads the probabilities)."""
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ v, p.argmax(dim=-1)


def test_a_generic_plan_hands_eager_no_more_than_its_inputs():
    """With 8 keys and 32 features the probabilities are smaller than the queries, so the kernels compute them and
    eager takes their argmax. The generic plan traced at 10 keys once did so at every length: at 100 keys it handed
    eager a probability matrix larger than every input, which saves nothing over eager. Each comparison is now a
    guard: that call plans again and, like an exact-shape plan there, runs as written."""
    c = ft.compile(attention_argmax, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ft.FallbackWarning)
        for sq, sk in [(40, 8), (30, 10), (60, 100)]:
            args = _inputs(1, 1, sq, sk, d=32)
            out, ref = c(*args), attention_argmax(*args)
            torch.testing.assert_close(out[0], ref[0], rtol=2e-5, atol=2e-5)
            assert torch.equal(out[1], ref[1])
        short, long = (c.program_for(_inputs(1, 1, sq, sk, d=32)) for sq, sk in [(35, 9), (60, 100)])
    assert short.generic and short.launches and short.remainder is not None     # kernels, then eager's argmax
    assert not long.launches, long.notes                                        # the function as written


def bshd_capped(q, k, v):
    """(B, S, H, D) inputs transposed to (B, H, S, D), soft-capped scores."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    s = torch.tanh(q @ k.transpose(-1, -2) / 5.0) * 5.0
    return (torch.softmax(s, dim=-1) @ v).transpose(1, 2)


def test_a_length_the_trace_fixes_is_traced_static():
    """At one key torch's matmul of the transposed inputs guards kv_len == 1 midway through the trace, so the
    graph had the symbol before that point and 1 after: the loop form found the axes did not line up, and the
    generic trial warned "no fused plan" (the call then planned for its shape and ran fused). A size the trace
    fixes is now traced static: that trial is the call's exact plan, nothing is refused, and later lengths go
    generic."""
    c = ft.compile(bshd_capped, cache=False)
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", ft.FallbackWarning)
        for sq, sk in [(1, 74), (1, 1), (1, 30), (1, 50)]:
            args = [torch.randn(2, n, 2, 32, generator=g) for n in (sq, sk, sk)]
            torch.testing.assert_close(c(*args), bshd_capped(*args), rtol=2e-5, atol=2e-5)
    assert not [w for w in warned if issubclass(w.category, ft.FallbackWarning)], [str(w.message) for w in warned]
    info = c.cache_info()
    assert info["searches"] == 3 and info["generic"] == 1 and info["hits"] == 1, info


def _noise_scores(q, k, v, noise):
    """Keyformer's Gumbel-perturbed column sums: a (B, H, S, S) noise input, the largest tensor a kernel indexes."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return F.softmax(s, dim=-1) @ v, F.softmax(s - noise.log(), dim=-1).sum(dim=-2)


def test_offsets_past_int32_widen_or_refuse_the_plan():
    """A batch or head index times its stride passes 2**31 (the noise of 4 heads at 28K tokens): the program's own
    indices are int64 in every kernel. Within one head a tile offset passes 2**31 only past 46341 tokens: the
    generic plan says it does not fit there (a call then plans for its shape), and an exact plan's kernels index
    in int64 where its shapes need it."""
    fn = _noise_scores
    c = ft.compile(fn, dynamic=True, cache=False)
    for k, s in enumerate((40, 72)):
        q, kk, v = _inputs(1, 2, s, s, seed=k)
        noise = torch.rand(1, 2, s, s, generator=torch.Generator().manual_seed(k)) + 0.01
        _check(fn, c, [q, kk, v, noise], tol=2e-4)
    (prog,) = c.generic_programs()
    src = "\n".join(k.source for k in prog.kernels)
    assert "tl.cast(i_" in src and ", tl.int64)" in src      # scalar indices widened before they scale

    def meta(s, h=4):
        return [torch.empty(1, h, s, 16, device="meta")] * 3 + [torch.empty(1, h, s, s, device="meta")]
    assert prog.fits(meta(28694)) and prog.fits(meta(46340))
    assert not prog.fits(meta(46341))      # 46341**2 > 2**31: one head's S x S noise, int32 tiles


@pytest.mark.unit
def test_an_exact_plan_past_int32_in_one_head_widens_its_tile_offsets():
    """At 47000 tokens one head's S x S noise has 2.2e9 elements: an exact plan's kernels index the noise tile in
    int64 (meta tensors: emitted, nothing runs), while at 40000 (1.6e9) they stay int32."""
    import re

    from flashtensor import driver
    from flashtensor.codegen.kernel import emit_kernel
    from flashtensor.options import CONFIGS

    def widened(s):
        args = [torch.empty(1, 1, s, 64, device="meta") for _ in range(3)] + [torch.empty(1, 1, s, s, device="meta")]
        (_, plan), *_ = driver.candidate_plans(_noise_scores, args)
        sources = [emit_kernel(spec, CONFIGS[0]).source for spec in plan.stages["emit"][0]]
        return any(re.search(r"o_\w+(\[[^\]]*\])?\.to\(tl\.int64\)", src) for src in sources)
    assert widened(47000) and not widened(40000)


@pytest.mark.unit
def test_a_size_hint_is_a_python_number_and_a_sympy_size_prints_as_one_operand(monkeypatch):
    """torch 2.11's size_hint gives a sympy Integer: a group count made from one, times a SymInt, was a sympy
    product that kernels' placement printed as sympy does, `pid // 18*((s + 15)//16)`, which Python and Triton
    read as (pid // 18) * ..., so a column kernel's programs past its first group placed themselves in none (the
    H100 campaign's argmax find). A hint is a Python number, and a sympy size prints through the size printer."""
    import sympy
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.sym_node import SymNode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from flashtensor.ir import sizes
    env = ShapeEnv()
    sym = env.create_symbol(21, ConstantSource("s"))
    ntiles = (env.create_symintnode(sym, hint=21) + 15) // 16
    span = sympy.Integer(18) * ntiles
    assert sizes.symbolic(span)
    for pid in (0, 17, 18, 35):
        assert eval(f"pid // {sizes.source(span)}", {}, {"pid": pid, str(sym): 21}) == 0
    monkeypatch.setattr(SymNode, "hint", property(lambda self: None))   # no hint kept: the shape environment's
    name = "guarding_hint_or_throw" if hasattr(env, "guarding_hint_or_throw") else "size_hint"
    monkeypatch.setattr(env, name, lambda e: sympy.Integer(2))
    assert type(sizes.hint(ntiles)) is int and sizes.hint(ntiles) == 2


def _segment_loads(src: str, start: str) -> list[str]:
    """The tl.load lines of every loop of `src` whose range starts at `start` (a segment of the key loop)."""
    lines, out = src.splitlines(), []
    for i, ln in enumerate(lines):
        if ln.lstrip().startswith(f"for l0 in tl.range(tl.multiple_of({start},"):
            depth = len(ln) - len(ln.lstrip())
            for body in lines[i + 1:]:
                if len(body) - len(body.lstrip()) <= depth:
                    break
                out += [body] if "tl.load(" in body else []
    return out


def test_the_bulk_of_a_generic_loop_loads_without_bounds_tests():
    """A generic kernel's loop tiles in its head and bulk segments all lie inside the length (both end by the last
    whole tile), so their loads test no bound there, in every kernel (the column kernel's load of the statistics
    the first kernel stored too), while the tail segment [ta, hi), which holds the partial last tile (and the
    head's tiles past it), keeps the test. The column kernel's head is the causal diagonal: only its mask. Every load in the loop takes its key rows at l0 * stride plus a tile of offsets
    that no step changes (the stride is a size: a head count times the head dimension), not (l0 + r) * stride
    per element. Every length still matches eager."""
    c = ft.compile(h2o_finfo, dynamic=True, cache=False)
    for k, s in enumerate((50, 64, 100)):
        _check(h2o_finfo, c, _inputs(1, 2, s, s, seed=k))
    (prog,) = c.generic_programs()
    assert len(prog.kernels) > 1        # the column sums' kernel loads the row statistics the first one stored
    for k in prog.kernels:
        head, bulk, tail = (_segment_loads(k.source, start) for start in ("lo", "ua", "ta"))
        assert head and bulk and tail
        assert not any("mask=" in ln for ln in head + bulk), head + bulk
        assert all("mask=" in ln for ln in tail), tail


def test_loop_rows_strided_by_a_size_step_from_one_offset_tile():
    """(B, S, H, D) inputs, as models hold them before `transpose(1, 2)`: a key row is H * D elements after the one
    before, a size in a generic plan. Every load in the key loop takes its rows at l0 * stride plus a tile of
    offsets that no step changes, not (l0 + r) * stride per element (a multiply per element and step); every
    length still matches eager."""
    def attention(q, k, v):
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        p = F.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
        return (p @ v).transpose(1, 2), p.sum(dim=-2)

    c = ft.compile(attention, dynamic=True, cache=False)
    for k, (s, h) in enumerate(((50, 2), (64, 3), (100, 2))):
        g = torch.Generator().manual_seed(k)
        _check(attention, c, [torch.randn(1, s, h, 16, generator=g) for _ in range(3)])
    (prog,) = c.generic_programs()
    loads = [ln for k in prog.kernels for start in ("lo", "ua", "ta") for ln in _segment_loads(k.source, start)
             if "inp1" in ln or "inp2" in ln]
    assert loads and all("tl.cast(l0, tl.int64) * " in ln and "tl.arange(0, " in ln for ln in loads), loads


def test_rows_strided_by_a_length_are_told_aligned_where_16_divides_it(monkeypatch):
    """A (B, H, S, S) input's rows are S elements apart: a generic kernel takes S's alignment as ALIGN (bit set
    where 16 divides S, so Triton can load those rows a vector at a time), and the length bucket holds it, so a
    bucket's calls launch one compiled kernel. Lengths 48 and 64 (aligned) and 50 (not) all match eager; h2o,
    whose inputs end in the static head dimension, has no ALIGN."""
    from flashtensor.codegen import artifact
    from flashtensor.runtime import launch

    seen = []

    def spy(aligned, sizes, values):
        bits = artifact.align_bits(aligned, sizes, values)
        seen.append(bits)
        return bits
    monkeypatch.setattr(launch, "align_bits", spy)
    c = ft.compile(_noise_scores, dynamic=True, cache=False)
    buckets = {}
    for k, s in enumerate((48, 50, 64)):
        q, kk, v = _inputs(1, 2, s, s, seed=k)
        args = [q, kk, v, 1 + torch.rand(1, 2, s, s, generator=torch.Generator().manual_seed(k))]
        seen.clear()
        _check(_noise_scores, c, args)
        (prog,) = c.generic_programs()
        buckets[s] = prog.at(args)[1]
        assert seen and set(seen) == {1 if s % 16 == 0 else 0}, (s, seen)
    (name,) = prog.kernels[0].aligned
    assert prog.size_sources[name] == (3, 3)        # the noise's last extent, and only it
    assert all("ALIGN: tl.constexpr" in k.source and f"{name} = _aligned({name}, (ALIGN >> 0) & 1)" in k.source
               for k in prog.kernels)
    assert buckets[48] != buckets[50] and [b[:2] for b in buckets[48]] == [b[:2] for b in buckets[50]]
    h2o = ft.compile(h2o_finfo, dynamic=True, cache=False)
    _check(h2o_finfo, h2o, _inputs(1, 2, 48, 48))
    assert not any(k.aligned or "ALIGN" in k.source for k in h2o.generic_programs()[0].kernels)


@pytest.mark.unit
def test_a_bucket_holds_the_alignment_of_the_sizes_that_stride_rows():
    from flashtensor.codegen.artifact import align_bits
    from flashtensor.ir.sizes import bucket

    assert bucket({"s0": 48, "s1": 3}, frozenset({"s0"})) == (("s0", 64, True), ("s1", 4, False))
    assert bucket({"s0": 50, "s1": 3}, frozenset({"s0"})) == (("s0", 64, False), ("s1", 4, False))
    assert bucket({"s0": 48}) == (("s0", 64, False),)      # a size that strides no row: alignment does not count
    assert align_bits(["s0", "s2"], ["s0", "s1", "s2"], {"s0": 32, "s1": 5, "s2": 7}) == 1
    assert align_bits(["s0", "s2"], ["s0", "s1", "s2"], {"s0": 31, "s1": 5, "s2": 64}) == 2
    assert align_bits(["s0"], ["s1"], {"s0": 32, "s1": 5}) is None      # the kernel takes none: no ALIGN


@pytest.mark.unit
def test_a_value_tile_past_the_length_feeds_its_dot_as_loaded():
    """In a generic attention kernel's loops with bounds tests, the value tile is loaded with 0 past the key
    length (its bounds mask), so it feeds P @ V as loaded, half precision, rather than zeroed again through a
    float32 copy (meta tensors: emitted, nothing runs)."""
    import re

    from flashtensor import driver
    from flashtensor.codegen.kernel import emit_kernel
    from flashtensor.options import TileConfig

    def attention(q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        i = torch.arange(q.shape[-2], device=q.device)
        s = s.masked_fill(i[None, :] > i[:, None], torch.finfo(s.dtype).min)
        return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v

    args = [torch.empty(1, 4, 1000, 64, device="meta", dtype=torch.float16) for _ in range(3)]
    (_, plan), *_ = driver.candidate_plans(attention, args, dynamic=frozenset((i, 2) for i in range(3)))
    (spec,) = plan.stages["emit"][0]
    src = emit_kernel(spec, TileConfig(64, 64, 4, 2)).source
    dots = re.findall(r"tl\.dot\(op_\d+, (op_\d+), acc_", src)         # P @ V, accumulated over the key loop
    operands = {name: expr for name, expr in re.findall(r"(op_\d+) = tl\.broadcast_to\((.*), \(\d+, \d+\)\)", src)}
    assert len(dots) >= 3 and all(re.fullmatch(r"x_\d+_raw", operands[d]) for d in dots), [operands[d] for d in dots]


@pytest.mark.unit
def test_generic_kernels_read_the_statistics_they_pass_aligned_and_unmasked_in_the_bulk():
    """h2o as the GPU plans it (fp16, shape-generic lengths; meta tensors, emitted, nothing runs): the column kernel
    reads the row statistics the first kernel stored. In the bulk of its loop, where every tile lies inside the
    length, that load tests no bound either, and the buffers between kernels have rows padded to a multiple of
    ALIGN (a length's own stride would leave Triton loading them an element at a time)."""
    import re

    from flashtensor import driver, knobs, workloads
    from flashtensor.codegen.kernel import emit_kernel
    from flashtensor.ir.sizes import ALIGN, evaluate
    from flashtensor.options import TileConfig

    fn, small = workloads.make("h2o", device="cpu", S=64, H=2, D=128)
    args = [torch.empty(a.shape, dtype=torch.float16, device="meta") for a in small]
    with knobs.override(interpret=False):
        (_, plan), *_ = driver.candidate_plans(fn, args, dynamic=frozenset((i, 1) for i in range(len(args))))
        kernels = [emit_kernel(spec, TileConfig(128, 64, 8, 3)) for spec in plan.stages["emit"][0]]
    assert len(kernels) == 2
    column = kernels[1]
    stats = [ln for ln in _segment_loads(column.source, "ua") if re.search(r"tl\.load\(int\d", ln)]
    read = {b.name: b for b in column.buffers if any(f"tl.load({b.name} " in ln for ln in stats)}
    assert read and all(b.kind == "intermediate" for b in read.values())
    for length in (1, 17, 100, 4095):
        rows = [evaluate(b.shape[-1], {s: length for s in column.sizes}) for b in read.values()]
        assert all(r % ALIGN == 0 and length <= r < length + ALIGN for r in rows), (length, rows)
    assert stats and not any("mask=" in ln for ln in stats), stats
