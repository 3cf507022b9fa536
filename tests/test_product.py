"""The product around the compiler: the torch.compile backend, the on-disk plan cache, the debug log, the CLI."""
import json
import logging
import math
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import flashtensor as ft
import flashtensor.api.backend
from conftest import assert_close
from flashtensor import FallbackWarning, workloads
from flashtensor.cli import main as cli
from flashtensor.runtime.cache import CacheWarning

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(workloads.SMALL, S=64, N=48)  # smaller still: the interpreter's time grows with the tiles


def fresh(name: str, seed: int):
    return workloads.make(name, device="cpu", dtype=torch.float32, seed=seed, **TINY)


@pytest.fixture
def compiled_by_backend(monkeypatch):
    """The ft.compile objects the backend creates, so tests can see what it planned."""
    made = []
    real = flashtensor.api.backend.ft_compile

    def spy(fn, **options):
        made.append(real(fn, **options))
        return made[-1]
    monkeypatch.setattr(flashtensor.api.backend, "ft_compile", spy)
    torch._dynamo.reset()
    yield made
    torch._dynamo.reset()


# ---- torch.compile(fn, backend="flashtensor") ---------------------------------------------------

@pytest.mark.unit
def test_backend_is_registered_by_name():
    from torch._dynamo import lookup_backend
    assert lookup_backend("flashtensor") is flashtensor.backend.flashtensor_backend


@pytest.mark.parametrize("name", workloads.NAMES)
def test_backend_workload_matches_eager(name, compiled_by_backend):
    fn, args = fresh(name, seed=hash(name) % 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)  # snapkv's pooling: eager on purpose
        out = torch.compile(fn, backend="flashtensor")(*args)
    assert_close(out, fn(*args))
    programs = [p for c in compiled_by_backend for p in c.programs.values()]
    assert programs, "Dynamo never called the flashtensor backend"
    assert sum(len(p.kernels) for p in programs) >= 1, [p.notes for p in programs]


def sort_then_scale(x):
    values, order = torch.sort(x, dim=-1)      # no lowering, and only elementwise ops after it: nothing fuses
    return values * 2.0, order


def test_the_backend_runs_a_graph_with_nothing_fused_through_inductor(compiled_by_backend, monkeypatch):
    """Where remainders are compiled (CUDA devices; forced here), a graph the backend fuses nothing of (a whole
    model's, say) runs through Inductor, not eager: its user asked for torch.compile. ft.compile keeps calling
    the function itself, as its user wrote it."""
    monkeypatch.setattr(flashtensor.driver, "compiles_remainder", lambda device, asked: True)
    x = torch.randn(5, 12)
    direct = ft.compile(sort_then_scale, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        out = torch.compile(sort_then_scale, backend="flashtensor")(x)
        direct(x)
    assert all(torch.equal(o, r) for o, r in zip(out, sort_then_scale(x)))
    (prog,) = [p for c in compiled_by_backend for p in c.programs.values()]
    optimized = torch._dynamo.eval_frame.OptimizedModule
    assert not prog.launches and isinstance(prog.fn, optimized)
    (mine,) = direct.programs.values()
    assert not isinstance(mine.fn, optimized) and mine.fn(x)[1].equal(sort_then_scale(x)[1])


def attention_with_logcumsumexp(q, k, v):
    """Attention plus a running log-sum-exp of column sums: logcumsumexp has no fused lowering."""
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ v, torch.logcumsumexp(p.sum(dim=-2), dim=-1)


def attention_with_sort(q, k, v):
    """Attention plus keys ranked by received weight: sort (values and indices) has no fused lowering."""
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    weight, order = torch.sort(p.sum(dim=-2), dim=-1, descending=True)
    return p @ v, weight, order


@pytest.mark.parametrize("fn, op", [(attention_with_logcumsumexp, "logcumsumexp"), (attention_with_sort, "sort")])
def test_unfusable_op_gives_eager_answer_through_both_entry_points(fn, op, compiled_by_backend):
    g = torch.Generator().manual_seed(len(op))
    q, k, v = (torch.randn(2, 48, 16, generator=g) for _ in range(3))
    ref = fn(q, k, v)
    with pytest.warns(FallbackWarning, match=op):
        compiled = ft.compile(fn)
        assert_close(compiled(q, k, v), ref)
    program = next(iter(compiled.programs.values()))
    assert program.kernels, "the attention before the unfusable op should still run fused"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        assert_close(torch.compile(fn, backend="flashtensor")(q, k, v), ref)
    notes = [n for c in compiled_by_backend for p in c.programs.values() for n in p.notes]
    assert any(op in n for n in notes), notes


# ---- the plan cache -----------------------------------------------------------------------------

CACHE_SCRIPT = textwrap.dedent("""
    import sys, torch
    import flashtensor as ft, flashtensor.driver as driver
    from flashtensor import workloads
    from flashtensor.runtime import cache
    from flashtensor.testing import as_tuple, compare

    # the key hashes flashtensor's own source; others edit this checkout while tests run, so pin it
    cache.versions = lambda: "pinned for the test"
    searches = []
    search = driver._search
    driver._search = lambda *a: searches.append(1) or search(*a)
    fn, args = workloads.make("h2o", device="cpu", dtype=torch.float32, seed=int(sys.argv[1]), S=64, H=2, D=32)
    compiled = ft.compile(fn)
    outs = as_tuple(compiled(*args))
    ok = all(compare(o, r).ok for o, r in zip(outs, as_tuple(fn(*args))))
    program = next(iter(compiled.programs.values()))
    print(f"searches={len(searches)} cached={program.cached} kernels={len(program.kernels)} ok={ok}")
""")


def run_script(tmp_path, seed: int, cache: Path, **env) -> subprocess.Popen:
    script = tmp_path / "compile_h2o.py"
    script.write_text(CACHE_SCRIPT)
    return subprocess.Popen([sys.executable, str(script), str(seed)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, TRITON_INTERPRET="1", FLASHTENSOR_CACHE_DIR=str(cache),
                                     PYTHONPATH=str(ROOT), **env))  # this checkout's flashtensor


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return out.strip(), err


def test_second_process_reuses_the_plan(tmp_path):
    cache = tmp_path / "cache"
    first, log1 = finish(run_script(tmp_path, 1, cache, FLASHTENSOR_DEBUG="1"))
    assert first == "searches=1 cached=False kernels=2 ok=True"
    assert "plan cache miss" in log1 and "plan cache: stored" in log1 and "loop form:" in log1
    second, log2 = finish(run_script(tmp_path, 2, cache, FLASHTENSOR_DEBUG="1"))  # new inputs, same signature
    assert second == "searches=0 cached=True kernels=2 ok=True"
    assert "plan cache hit" in log2 and "loop form:" not in log2 and "autotune" not in log2
    off, _ = finish(run_script(tmp_path, 3, cache, FLASHTENSOR_CACHE="0"))
    assert off == "searches=1 cached=False kernels=2 ok=True"


def test_concurrent_processes_compile_the_same_program(tmp_path):
    cache = tmp_path / "cache"
    procs = [run_script(tmp_path, seed, cache) for seed in (4, 5)]
    results = [finish(p)[0] for p in procs]
    assert all(r.endswith("kernels=2 ok=True") for r in results), results
    entries = list((cache / "plans").iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".plan", entries  # no temporary files left behind
    assert finish(run_script(tmp_path, 6, cache))[0] == "searches=0 cached=True kernels=2 ok=True"


def plan_file(cache: Path) -> Path:
    (entry,) = (cache / "plans").glob("*.plan")
    return entry


@pytest.mark.parametrize("damage", ["truncate", "flip", "header"])
def test_corrupt_entry_is_detected_warned_and_rebuilt(damage, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTENSOR_CACHE_DIR", str(tmp_path))
    fn, args = fresh("h2o", seed=11)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        ft.compile(fn)(*args)
    entry = plan_file(tmp_path)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-10] ^= 0xFF
    else:
        data[:4] = b"junk"
    entry.write_bytes(bytes(data))

    fn, args = fresh("h2o", seed=12)
    with pytest.warns(CacheWarning, match=entry.name) as caught:
        compiled = ft.compile(fn)
        assert_close(compiled(*args), fn(*args))
    assert "corrupt" in str(caught[0].message)
    assert not next(iter(compiled.programs.values())).cached
    again = ft.compile(fn)  # the rebuilt entry is whole again
    assert_close(again(*args), fn(*args))
    assert next(iter(again.programs.values())).cached


def test_constants_are_part_of_the_key(tmp_path, monkeypatch):
    """Two closures that differ only in a captured tensor's values must not share a cached plan."""
    monkeypatch.setenv("FLASHTENSOR_CACHE_DIR", str(tmp_path))
    g = torch.Generator().manual_seed(21)
    q, k, v = (torch.randn(2, 64, 16, generator=g) for _ in range(3))

    def biased_attention(bias):
        return lambda q, k, v: torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1) @ v

    for bias in (torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)):
        fn = biased_attention(bias)
        compiled = ft.compile(fn)
        assert_close(compiled(q, k, v), fn(q, k, v))
        assert not next(iter(compiled.programs.values())).cached
    assert len(list((tmp_path / "plans").glob("*.plan"))) == 2


def test_cache_off_by_option_and_explain_works_from_the_cache(tmp_path, monkeypatch):
    """cache=False writes no plan; explain plans like ft.compile, and a plan read back from the cache is
    explained as it was searched (loop form, every kernel's properties)."""
    monkeypatch.setenv("FLASHTENSOR_CACHE_DIR", str(tmp_path))
    fn, args = fresh("attn", seed=13)
    assert_close(ft.compile(fn, cache=False)(*args), fn(*args))
    assert not (tmp_path / "plans").exists() or not list((tmp_path / "plans").iterdir())
    searched = ft.explain(fn, *args)
    assert not searched.plan.cached and searched.properties and "loop form" in searched.plan.stages
    again = ft.explain(fn, *args)
    assert again.plan.cached and "loop form" not in again.plan.stages
    assert str(again) == str(searched) and len(again.properties) == len(again.kernels) >= 1


# ---- FLASHTENSOR_DEBUG / the "flashtensor" logger -----------------------------------------------

def test_debug_log_shows_every_stage_and_decision(caplog, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHTENSOR_CACHE_DIR", str(tmp_path))
    caplog.set_level(logging.DEBUG, logger="flashtensor")
    fn, args = fresh("h2o", seed=14)
    ft.compile(fn)(*args)
    text = caplog.text
    for stage in ("captured graph:", "decomposed graph:", "plan cache miss", "loop form:", "merge accepted",
                  "kernel 0 plan:", "kernel 1 schedule:", "kernel 0 source:", "@triton.jit",
                  "autotune ft_kernel0", "plan cache: stored"):
        assert stage in text, stage
    ours = [r for r in caplog.records if "graph:" in r.getMessage() or r.getMessage().startswith(("kernel ", "autotune"))]
    assert ours and all(r.name.startswith("flashtensor") for r in ours)


def test_debug_log_gives_the_reason_a_merge_is_rejected(caplog):
    def column_total_times_row_total(q, k):
        """The column sum of q cannot join the attention kernel: that kernel's grid splits the rows (300 of
        them, too many to hold whole in a tile)."""
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ k + q.sum(-2, keepdim=True)

    caplog.set_level(logging.DEBUG, logger="flashtensor")
    q, k = torch.randn(2, 300, 16), torch.randn(2, 300, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        assert_close(ft.compile(column_total_times_row_total, cache=False)(q, k), column_total_times_row_total(q, k))
    rejected = [r.getMessage() for r in caplog.records if r.getMessage().startswith("merge rejected")]
    assert rejected and all("): " in m and m.split("): ", 1)[1] for m in rejected), rejected


def test_debug_env_var_logs_to_stderr_and_is_silent_when_off(tmp_path):
    code = "import torch, flashtensor as ft; print(ft.compile(lambda x: torch.softmax(x, -1))(torch.randn(4, 40)).shape)"
    for debug, expect in (("1", True), ("0", False)):
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, TRITON_INTERPRET="1", FLASHTENSOR_DEBUG=debug,
                                       FLASHTENSOR_CACHE_DIR=str(tmp_path)))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "torch.Size([4, 40])"
        assert ("[flashtensor.driver] captured graph:" in proc.stderr) is expect, proc.stderr


def test_progress_lines_while_planning_and_none_from_the_cache(tmp_path):
    """FLASHTENSOR_PROGRESS=1 prints a line per tuned kernel and the choice while a plan is searched; a
    process that reads the plan back prints none, and FLASHTENSOR_PROGRESS=0 silences the search."""
    code = "import torch, flashtensor as ft; print(ft.compile(lambda x: torch.softmax(x, -1))(torch.randn(4, 40)).shape)"
    for cache, setting, expect in (("a", "1", True), ("a", "1", False), ("b", "0", False)):
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, TRITON_INTERPRET="1", FLASHTENSOR_PROGRESS=setting,
                                       FLASHTENSOR_CACHE_DIR=str(tmp_path / cache)))
        assert proc.returncode == 0, proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("flashtensor: ")]
        if expect:
            assert lines[0].startswith("flashtensor: planning 1 partition(s)"), proc.stderr
            tuned = [ln for ln in lines if "partition 1/1, kernel " in ln and "not timed on this device (blocks" in ln]
            assert tuned and lines[1:-1] == tuned, proc.stderr
            assert lines[-1].startswith(f"flashtensor: chose {len(tuned)} kernel(s), planned in"), proc.stderr
        else:
            assert not lines, proc.stderr


# ---- the command line ---------------------------------------------------------------------------

def test_cli_explain_workload(capsys):
    assert cli.main(["explain", "h2o"]) == 0
    text = capsys.readouterr().out
    for part in ("== captured graph ==", "== decomposed graph ==", "== loop form ==", "== kernel ft_kernel0",
                 "roles:", "skipped tiles:", "writes:", "@triton.jit"):
        assert part in text, part


def test_cli_explain_function_in_a_file(tmp_path, capsys):
    (tmp_path / "mine.py").write_text(textwrap.dedent("""
        import torch

        def tempered(q, k, v):
            return torch.softmax(q @ k.transpose(-1, -2) * 0.3, dim=-1) @ v

        def tempered_inputs():
            return torch.randn(3, 50, 16), torch.randn(3, 40, 16), torch.randn(3, 40, 16)
    """))
    assert cli.main(["explain", f"{tmp_path / 'mine.py'}:tempered"]) == 0
    text = capsys.readouterr().out
    assert "graph(%input: float32[3, 50, 16], %input1: float32[3, 40, 16], %input2: float32[3, 40, 16])" in text
    assert "== kernel ft_kernel0" in text and "@triton.jit" in text and "roles:" in text
    with pytest.raises(SystemExit, match="defines no function"):
        cli.main(["explain", f"{tmp_path / 'mine.py'}:missing"])


def test_cli_bench_writes_json_by_default_and_shows_progress(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["bench", "attn", "--check-only", "--shape", "small", "--dtype", "fp32", "--peers", "eager"]
    assert cli.main(args) == 0
    out = capsys.readouterr()
    assert "[1/2] attn / eager ..." in out.out and "[2/2] attn / flashtensor ..." in out.out
    assert "no plot" in out.err  # check-only times nothing
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["workloads"]["attn"]["flashtensor"]["ok"]


@pytest.mark.unit
def test_cli_bench_help_is_the_benchmarks_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "--check-only" in text and "default bench.json" in text and "default bench.png" in text


@pytest.mark.unit
def test_bench_plot_without_matplotlib_says_so(tmp_path, monkeypatch, capsys):
    from flashtensor.bench import bench
    from test_bench_script import synthetic
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert bench.plot(synthetic(), str(tmp_path / "p.png")) is False
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()
