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

import torch
import torch.nn.functional as F

import flashtensor as ft

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
    (prog,) = [p for ps in c.generic.values() for p in ps]
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
    outs, cols = [], torch.zeros(b, h, s)
    for start in range(0, s, chunk):
        end = start + chunk
        o, col = c(q[:, :, start:end].contiguous(), k[:, :, :end].contiguous(), v[:, :, :end].contiguous())
        outs.append(o)
        cols[..., :end] += col
    out, col = h2o_finfo(q, k, v)
    torch.testing.assert_close(torch.cat(outs, dim=2), out, rtol=2e-5, atol=2e-5)
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
    small, large = [p for ps in c.generic.values() for p in ps]
    assert max(small.kernels[0].blocks.values()) == 32 and max(large.kernels[0].blocks.values()) == 128


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
