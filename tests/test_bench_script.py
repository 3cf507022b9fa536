"""flashtensor.bench: the BENCHMARKS.md renderer on made-up numbers, and the CPU check-only path end to end."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flashtensor
from flashtensor.bench import bench, to_markdown

ROOT = Path(__file__).resolve().parents[1]


def _rec(ms, err=1e-4, ok=True, error=None):
    return {"ms": ms, "rel_err": [err], "bool_mismatch": [], "ok": ok, "error": error}


def synthetic() -> dict:
    return {
        "date": "2030-01-02T03:04:05+00:00", "device": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0",
        "cuda": "13.0", "shape": "paper", "dims": {"S": 4096, "H": 32}, "dtype": "fp16", "rep_ms": 200,
        "timed": True, "ceilings": {"matmul_tflops": 671.3, "copy_tbps": 4.213},
        "systems": ["eager", "compile", "sdpa", "flashtensor"],
        "workloads": {
            "attn": {"eager": _rec(6.4), "compile": _rec(1.6), "sdpa": _rec(0.25), "flashtensor": _rec(0.32)},
            "h2o": {"eager": _rec(7.2), "compile": _rec(2.4), "flashtensor": _rec(0.5, err=3e-2, ok=False)},
            "ea": {"eager": _rec(0.55), "compile": _rec(0.44),
                   "flashtensor": _rec(None, error="OutOfMemoryError: CUDA out of memory")},
        },
    }


@pytest.mark.unit
def test_markdown_has_numbers_and_ratios():
    md = to_markdown.markdown(synthetic())
    assert "NVIDIA H200, 2030-01-02T03:04:05+00:00" in md
    assert "671 TFLOP/s" in md and "4.21 TB/s" in md
    attn = next(line for line in md.splitlines() if line.startswith("| attn | 6.40"))
    # 6.4 / 0.32 = 20x over eager, 1.6 / 0.32 = 5x over torch.compile, 0.32 / 0.25 = 1.28 of SDPA
    assert attn == "| attn | 6.40 | 1.60 | 0.250 | 0.320 | 20.00x | 5.00x | 1.28 |"
    h2o = next(line for line in md.splitlines() if line.startswith("| h2o | 7.20"))
    assert h2o == "| h2o | 7.20 | 2.40 | - | 0.500 ✗ | 14.40x | 4.80x | 2.00 |"
    ea = next(line for line in md.splitlines() if line.startswith("| ea | 0.550"))
    assert ea == "| ea | 0.550 | 0.440 | - | error | - | - | - |"
    assert "| h2o | 1.0e-04 | 1.0e-04 | - | 3.0e-02 ✗ |" in md
    assert "- ea / flashtensor: OutOfMemoryError: CUDA out of memory" in md


@pytest.mark.unit
def test_markdown_takes_each_workloads_own_yardstick():
    """A run that timed SDPA on attn beside a workload divides by that time, and shows it."""
    res = synthetic()
    res["rounds"] = 3
    res["workloads"]["h2o"]["sdpa-attn"] = _rec(0.2)
    md = to_markdown.markdown(res)
    assert "each the median of 3 rounds" in md
    lines = md.splitlines()
    assert "| attn | 6.40 | 1.60 | 0.250 | 0.320 | 20.00x | 5.00x | 0.250 | 1.28 |" in lines
    assert "| h2o | 7.20 | 2.40 | - | 0.500 ✗ | 14.40x | 4.80x | 0.200 | 2.50 |" in lines
    assert "| ea | 0.550 | 0.440 | - | error | - | - | - | - |" in lines


@pytest.mark.unit
def test_rounds_interleave_and_take_the_median(monkeypatch):
    """time_rounds: round r starts at the r-th system, every system once per round, the median kept; a system
    whose timing raises keeps its error and no time."""
    import triton.testing
    order, clock = [], iter([5.0, 1.0, 9.0, 2.0, 3.0, 4.0, 8.0, 7.0, 6.0])

    def fake(fn, **kw):
        fn()
        return next(clock)

    monkeypatch.setattr(triton.testing, "do_bench", fake)

    def boom():
        raise RuntimeError("out of memory")

    runs = {s: (lambda s=s: order.append(s), ()) for s in "abc"}
    recs = {s: {"ms": None, "ms_rounds": [], "error": None} for s in "abcd"}
    runs["d"] = (boom, ())
    bench.time_rounds(runs, recs, rep=10, rounds=3)
    assert order == list("abc" "bca" "cab")
    # d raises in round 0 (taking no time) and is skipped after: round 1 runs b c a, round 2 c a b
    assert recs["a"]["ms_rounds"] == [5.0, 4.0, 7.0] and recs["a"]["ms"] == 5.0
    assert recs["b"]["ms_rounds"] == [1.0, 2.0, 6.0] and recs["b"]["ms"] == 2.0
    assert recs["c"]["ms_rounds"] == [9.0, 3.0, 8.0] and recs["c"]["ms"] == 8.0
    assert recs["d"]["ms"] is None and "out of memory" in recs["d"]["error"]


@pytest.mark.unit
def test_plot_or_skip(tmp_path):
    pytest.importorskip("matplotlib")
    bench.plot(synthetic(), str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0


@pytest.mark.unit
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_refuses_timing_on_cpu():
    assert bench.main(["attn"]) == 2


def test_check_only_one_workload(tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "flashtensor.bench.bench", "attn", "--check-only", "--shape", "small",
           "--dtype", "fp32", "--peers", "eager", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "[1/2] attn / eager ..." in proc.stdout and "[2/2] attn / flashtensor ..." in proc.stdout
    res = json.loads(out.read_text())
    assert res["systems"] == ["eager", "flashtensor"] and not res["timed"]
    attn = res["workloads"]["attn"]
    assert attn["eager"]["rel_err"] == [0.0] and attn["eager"]["ok"]
    assert attn["flashtensor"]["error"] is None and attn["flashtensor"]["ok"]
    assert attn["flashtensor"]["rel_err"][0] <= 1e-4


def test_ab_checks_each_tree_in_its_own_process(tmp_path):
    """flashtensor/bench/ab.py on the CPU: each tree's own package is imported in its child process (a copy of
    flashtensor whose compile is broken must fail its row, and only its row, also without a harness of its own:
    the child runs the A/B's); a directory without the package is refused."""
    broken = tmp_path / "broken"
    shutil.copytree(ROOT / "flashtensor", broken / "flashtensor", ignore=shutil.ignore_patterns("bench"))
    driver = broken / "flashtensor" / "driver.py"
    driver.write_text(driver.read_text() + "\n\ndef build(*a, **k):\n    raise RuntimeError('broken on purpose')\n")
    cmd = [sys.executable, "-m", "flashtensor.bench.ab", "attn", "--trees", f"here={ROOT},broken={broken}",
           "--check-only", "--shape", "small"]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| attn |")]
    assert len(rows) == 2 and rows[0].startswith("| attn | here | ok (") and "ft_kernel0" in rows[0], rows
    assert rows[1].startswith("| attn | broken | crashed") and "broken on purpose" in rows[1], rows
    refused = subprocess.run([sys.executable, "-m", "flashtensor.bench.ab", "attn", "--trees", f"x={tmp_path}",
                              "--check-only"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "holding flashtensor/" in refused.stderr


def test_ab_workers_answer_the_timing_turns(tmp_path):
    """flashtensor/bench/ab.py's timed path end to end on the CPU: a tree whose sitecustomize stands do_bench in
    (it runs the call once and returns 1 ms; CUDA events do not exist here) answers every turn over its pipes, and
    each row has the rounds' median, no change against itself, and the kernel alone."""
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "flashtensor").symlink_to(ROOT / "flashtensor")
    (tree / "sitecustomize.py").write_text(
        "import triton.testing\n\n\ndef do_bench(fn, warmup=25, rep=100, return_mode='median'):\n"
        "    fn()\n    return 1.0\n\n\ntriton.testing.do_bench = do_bench\n")
    cmd = [sys.executable, "-m", "flashtensor.bench.ab", "attn", "--trees", f"a={tree},b={tree}", "--shape",
           "small", "--rep", "5", "--rounds", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| attn |")]
    assert [r.split(" | ")[1:5] for r in rows] == [[label, r.split(" | ")[2], "1.0000 (1.0000-1.0000)", "+0.0%"]
                                                  for label, r in zip("ab", rows)], rows
    assert all(r.split(" | ")[2].startswith("ok (") and "ft_kernel0 1.0000 (" in r for r in rows), rows


@pytest.mark.unit
def test_ab_times_the_trees_in_turns_through_the_gpu_drift(tmp_path, capsys):
    """flashtensor/bench/ab.py's timing: a clock that slows each call by 1% makes a tree timed after another look
    7% slower; timed in turns (A B B A), two equal trees come out within 1.5%, and a tree 5% slower shows +4% to
    +6%. A worker that dies while timed fails its row, and only its row."""
    from flashtensor.bench import ab
    clock = {"calls": 0}
    asked: list[tuple[str, str]] = []

    class Stand:   # a worker without a process: its call takes its tree's time, slowed by the calls before it
        def __init__(self, name: str, tree: str, shape: str, rep: int | None) -> None:
            self.tree = tree

        def answer(self) -> dict:
            return {"package": str(Path(self.tree) / "flashtensor"), "problems": [], "error": 1e-4,
                    "kernels": ["ft_kernel0"]}

        def ask(self, request: str) -> object:
            asked.append((Path(self.tree).name, request))
            if Path(self.tree).name == "dies":
                return None
            clock["calls"] += 1
            slower = 1.05 if Path(self.tree).name == "slow" else 1.0
            return 1.0 * slower * 1.01 ** clock["calls"] if request == "call" else ["ft_kernel0 0.9000"]

        def close(self) -> str:
            return "rc 1: ['gone']"

    trees = [[t, str(tmp_path / t)] for t in ("base", "same", "slow", "dies")]
    assert not ab.compare_trees("h2o", trees, "paper", 30, 7, spawn=Stand)
    rows = {ln.split(" | ")[1]: ln for ln in capsys.readouterr().out.splitlines()}
    change = {t: float(rows[t].split(" | ")[4].rstrip("%")) for t in ("same", "slow")}
    assert abs(change["same"]) < 1.5 and 4 < change["slow"] < 6, rows
    assert rows["base"].startswith("| h2o | base | ok (1.0e-04) | 1.") and "ft_kernel0 0.9000" in rows["base"]
    assert "crashed while timed (rc 1: ['gone'])" in rows["dies"], rows
    assert asked[:3] == [("base", "call"), ("same", "call"), ("slow", "call")]
    assert asked[4:7] == [("slow", "call"), ("same", "call"), ("base", "call")]   # the next turn runs backwards


@pytest.mark.unit
def test_bench_runs_from_the_package_alone(tmp_path):
    """`python -m flashtensor bench` needs only the installed package: a copy of flashtensor/ alone on
    PYTHONPATH, run from another folder, no repository root on sys.path. The harness must come from the copy:
    an editable install's finder would otherwise supply a missing flashtensor.bench from its own checkout."""
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    shutil.copytree(Path(flashtensor.__file__).parent, site / "flashtensor",
                    ignore=shutil.ignore_patterns("__pycache__"))
    elsewhere.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site), TRITON_INTERPRET="1")
    where = subprocess.run([sys.executable, "-c", "import flashtensor.bench.bench as b; print(b.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()) == site / "flashtensor" / "bench" / "bench.py"
    proc = subprocess.run([sys.executable, "-m", "flashtensor", "bench", "--help"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--check-only" in proc.stdout and "python -m flashtensor.bench.bench" in proc.stdout


@pytest.mark.unit
def test_bench_exits_nonzero_when_flashtensor_fails_its_check(monkeypatch, capsys):
    """A wrong flashtensor answer makes bench exit 1 (a peer's failure does not: it is a measurement)."""
    real = bench.build

    def build(system, name, fn, args):
        f = real(system, name, fn, args) if system != "flashtensor" else fn
        return (lambda *a: f(*a) * 2) if system == "flashtensor" else f

    monkeypatch.setattr(bench, "build", build)
    argv = ["attn", "--check-only", "--shape", "small", "--dtype", "fp32", "--peers", "eager", "--json", "", "--plot", ""]
    assert bench.main(argv) == 1
    assert "failed the correctness check on attn" in capsys.readouterr().err
    monkeypatch.setattr(bench, "build", lambda system, name, fn, args: real(system, name, fn, args) if system != "flashtensor" else fn)
    assert bench.main(argv) == 0


def test_generic_sweep_plans_once_and_checks_every_length(tmp_path):
    """The shape-generic benchmark's sweep (what the GPU run measures per bucket), at the interpreter's shapes:
    every length passes against eager and only the first call searches."""
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, "-m", "flashtensor.bench.generic", "sweep", "--small", "--lengths", "3", "--names", "h2o",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="1", FLASHTENSOR_CACHE="0"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = json.loads(out.read_text())["records"]
    assert [r["ok"] for r in recs] == [True] * 3
    assert [r["searches"] for r in recs] == [1, 0, 0]


def test_generic_decode_splits_the_key_loop(tmp_path):
    """The decode benchmark (the GPU's decode measurement, at the interpreter's shapes): h2o and its attention alone
    match eager, with their key loops split."""
    out = tmp_path / "decode.json"
    cmd = [sys.executable, "-m", "flashtensor.bench.generic", "decode", "--small", "--q", "4", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, TRITON_INTERPRET="1", FLASHTENSOR_CACHE="0"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = json.loads(out.read_text())["records"]
    assert recs and all(r["ok"] and r["splits"] and min(r["splits"] + r["attn_splits"]) > 1 for r in recs), recs


def test_peers_checks_every_form_and_flexattention_against_eager(tmp_path):
    """Issue 21's comparison at the interpreter's shapes: each masks row in its three forms fuses wholly and matches
    eager, FlexAttention's block mask and score_mod match eager (so the GPU run compares equal programs), and the
    GQA and linear-attention parts fuse and match."""
    from flashtensor.bench import peers
    out = tmp_path / "peers.json"
    assert peers.main(["--peers", "eager,flex", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["masks"]) == set(peers.ROWS)
    for name, recs in res["masks"].items():
        assert {f"ft/{f}" for f in peers.FORMS} | {"eager", "flex"} == set(recs), name
        assert all(r["ok"] for r in recs.values()), (name, recs)
        assert all(recs[f"ft/{f}"]["fused"] == "fused" for f in peers.FORMS), name
    assert all(r["ok"] for r in res["gqa"].values())
    assert res["gqa"]["ft/gqa"]["fused"] == res["gqa"]["ft/mha"]["fused"] == "fused"
    assert all(r["ok"] for recs in res["linear"].values() for r in recs.values())
    assert {recs["ft"]["fused"] for recs in res["linear"].values()} == {"fused"}


@pytest.mark.unit
def test_peers_report_gives_issue_21s_ratios():
    from flashtensor.bench import peers

    def rec(ms, ok=True):
        return dict(peers._record(), ms=ms, ok=ok, fused="fused")
    masks = {name: {"eager": rec(6.0), "flex": rec(0.4), **{f"ft/{f}": rec(0.2 if name == "causal" else 0.07)
                                                             for f in peers.FORMS},
                    **{f"compile/{f}": rec(2.0) for f in peers.FORMS}} for name in ("causal", "sinks_window")}
    masks["causal"]["ft/passed"] = rec(0.5, ok=False)
    results = {"device": "NVIDIA H200", "date": "2030-01-02", "dims": peers.GPU, "dtype": "fp16", "masks": masks,
               "gqa": {"ft/gqa": rec(0.9), "ft/mha": rec(0.8), "compile/gqa": rec(3.6)},
               "linear": {"ea": {"ft": rec(0.1), "compile": rec(0.25), "eager": rec(0.3)}}}
    md = peers.markdown(results)
    assert "| causal | inside | 6.00 | 2.00 | 0.400 | 0.200 | pass | 2.00x | 10.00x |" in md
    assert "| causal | passed | 6.00 | 2.00 | 0.400 | - | FAIL" in md
    assert "sinks + window over causal (flashtensor; at most 0.4): inside 0.350, captured 0.350, passed -" in md
    assert "GQA over MHA (flashtensor; at most 1.15): 1.12" in md
    assert "| ea | 0.300 | 0.250 | 0.100 | pass | 2.50x |" in md
    assert [r["ok"] for r in peers._ft_records(results)].count(False) == 1
