"""Benchmark flashtensor against its peers on one GPU in one run, checking every result against eager first.

    python -m flashtensor.bench.bench [WORKLOADS...] [--shape paper|small] [--dtype fp16] \
        [--peers eager,compile,max-autotune,flex,sdpa] [--json bench.json] [--plot bench.png] [--rep 200] \
        [--rounds 3] [--no-ft]

Each workload's systems are built and checked first, then timed in interleaved rounds, and with `sdpa` among
the peers SDPA on attn's inputs is timed in the same rounds as every attention workload: the device's clocks
drift over a run, so a ratio compares times taken side by side, not minutes apart.
A system that raises (out of memory, unsupported program) is recorded with its error and the run goes on.
Without a GPU only `--check-only` runs: the correctness checks under the Triton interpreter.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import gc
import inspect
import json
import math
import os
import statistics
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

from flashtensor import testing
from flashtensor.testing import as_tuple

from . import to_markdown
from .to_markdown import LABELS

PEERS = ["eager", "compile", "max-autotune", "flex", "sdpa"]
DEFAULT_PEERS = "eager,compile,flex,sdpa"  # max-autotune compiles for minutes per workload: opt in
CUDA_ONLY = ("flex", "sdpa")
FLEX = ("attn", "gemma2")  # the programs FlexAttention can express
SDPA = ("attn",)
YARDSTICK = "sdpa-attn"  # SDPA on attn's inputs, timed beside another workload (see run_workload)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
BOOL_TOL = 1e-3  # booleans may flip where eager's value sits within rounding of the threshold (docs/design.md §6)


def compare(out: Any, ref: Any, first_only: bool = False) -> dict:
    """Check outputs against eager's: rel err per float output (inf where NaN/inf positions differ),
    mismatch fraction per bool output."""
    outs, refs = as_tuple(out), as_tuple(ref)
    if first_only:
        outs, refs = outs[:1], refs[:1]
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs, eager has {len(refs)}")
    errs, mismatch, ok = [], [], True
    for o, r in zip(outs, refs):
        if o.shape != r.shape or o.dtype != r.dtype:
            raise ValueError(f"output {tuple(o.shape)} {o.dtype}, eager has {tuple(r.shape)} {r.dtype}")
        if r.dtype == torch.bool:
            mismatch.append((o != r).float().mean().item())
            ok = ok and mismatch[-1] <= BOOL_TOL
        else:
            m = testing.compare(o, r)
            errs.append(math.inf if math.isnan(m.error) else m.error)
            ok = ok and m.ok
    return {"rel_err": errs, "bool_mismatch": mismatch, "ok": ok}


@functools.cache
def _compiled_flex() -> Callable:
    """flex_attention compiled once, as its docs recommend; eager flex materialises the full score matrix."""
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention)


def _flex(name: str, fn: Callable, args: tuple) -> Callable:
    """FlexAttention for attn (causal block mask) and gemma2 (plus tanh soft-cap score_mod, after flex's own scale)."""
    from torch.nn.attention.flex_attention import create_block_mask
    q, k = args[0], args[1]
    offset = k.shape[1] - q.shape[1]  # the workloads' causal mask is aligned bottom-right
    mask = create_block_mask(lambda b, h, qi, ki: ki <= qi + offset, None, None, q.shape[1], k.shape[1],
                             device=q.device)
    score_mod: Callable | None = None
    if name == "gemma2":
        cap = inspect.signature(fn).parameters["cap"].default

        def soft_cap(s, b, h, qi, ki):
            return torch.tanh(s / cap) * cap
        score_mod = soft_cap
    flex = _compiled_flex()

    def run(q, k, v):
        o = flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod, block_mask=mask)
        return o.transpose(1, 2).contiguous()
    return run


def _sdpa(q, k, v):
    # is_causal aligns top-left; the workloads align bottom-right, the same only because their q_len == kv_len
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return o.transpose(1, 2).contiguous()


def applies(system: str, name: str) -> bool:
    """Whether `system` can run workload `name` at all."""
    return {"flex": name in FLEX, "sdpa": name in SDPA}.get(system, True)


def build(system: str, name: str, fn: Callable, args: tuple) -> Callable:
    """The callable that `system` runs for workload `name`, same arguments as `fn`."""
    if system == "eager":
        return fn
    if system == "compile":
        return torch.compile(fn)
    if system == "max-autotune":
        return torch.compile(fn, mode="max-autotune-no-cudagraphs")
    if system == "flex":
        return _flex(name, fn, args)
    if system == "sdpa":
        return _sdpa
    import flashtensor as ft
    return ft.compile(fn)


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _error(e: Exception) -> str:
    msg = str(e).strip()
    return f"{type(e).__name__}: {msg.splitlines()[0] if msg else ''}"[:500]


def prepare(system: str, name: str, fn: Callable, args: tuple, ref: Any) -> tuple[dict, Callable | None]:
    """Build `system`'s callable for `name` and check one run against eager; the callable is None where
    either raised (the error is recorded: an OOM or unsupported program is a result, not a crash)."""
    rec: dict[str, Any] = {"ms": None, "ms_rounds": [], "rel_err": None, "bool_mismatch": None, "ok": None,
                           "error": None}
    try:
        f = build(system, name, fn, args)
        rec.update(compare(f(*args), ref, first_only=system in CUDA_ONLY))
        return rec, f
    except Exception as e:  # noqa: BLE001
        rec["error"] = _error(e)
        return rec, None


def time_rounds(runs: dict, recs: dict, rep: int, rounds: int) -> None:
    """Time each callable of `runs` (key: (callable, args)) once per round, round r starting at the r-th key,
    so that none always runs first or always after the same one; its record's ms is the median of its
    rounds' do_bench medians (warmup 25 ms, `rep` ms each)."""
    import triton.testing
    keys = list(runs)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            f, args = runs[k]
            if recs[k]["error"]:
                continue
            try:
                recs[k]["ms_rounds"].append(
                    triton.testing.do_bench(lambda: f(*args), warmup=25, rep=rep, return_mode="median"))
            except Exception as e:  # noqa: BLE001
                recs[k]["error"] = _error(e)
    for k in keys:
        if not recs[k]["error"]:
            recs[k]["ms"] = statistics.median(recs[k]["ms_rounds"])


def ceilings() -> dict:
    """What the device can do at best: fp16 matmul TFLOP/s (8192^3) and copy TB/s (2 GiB, read + write)."""
    from triton.testing import do_bench
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    t = do_bench(functools.partial(torch.matmul, a, b), return_mode="median")
    tflops = 2 * n ** 3 / (t * 1e-3) / 1e12
    del a, b
    src = torch.empty(2 ** 31, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    t = do_bench(functools.partial(dst.copy_, src), return_mode="median")
    tbps = 2 * src.nbytes / (t * 1e-3) / 1e12
    del src, dst
    _free()
    return {"matmul_tflops": tflops, "copy_tbps": tbps}


class Progress:
    """One flushed line per step, since a compile can take minutes; a tqdm bar alongside when tqdm is installed
    and stderr is a terminal (in a captured log the bar's redraws would bury the lines)."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.bar = total, 0, None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, file=sys.stderr, leave=False)
            except ImportError:
                pass

    def _print(self, line: str) -> None:
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
            sys.stdout.flush()
        else:
            print(line, flush=True)

    def start(self, name: str, system: str) -> None:
        self.done += 1
        self._print(f"[{self.done}/{self.total}] {name} / {LABELS[system]} ...")

    def finish(self, rec: dict) -> None:
        if rec["error"]:
            text = rec["error"]
        else:
            checks = [f"rel err {e:.1e}" for e in rec["rel_err"]] + \
                [f"bool mismatch {m:.1e}" for m in rec["bool_mismatch"]]
            text = ", ".join(checks) + ("" if rec["ok"] else " FAILED")
        self._print("    " + text)
        if self.bar is not None:
            self.bar.update(1)

    def timed(self, name: str, recs: dict) -> None:
        """One line per timed system: its median and rounds, or the error its timing raised."""
        for s, rec in recs.items():
            rounds = " / ".join(f"{x:.3f}" for x in rec["ms_rounds"])
            text = f"{rec['ms']:.3f} ms (rounds {rounds})" if rec["ms"] is not None else rec["error"]
            self._print(f"    {name} / {LABELS[s]}: {text}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_workload(name: str, systems: list[str], make_kw: dict, rep: int | None, rounds: int,
                 progress: Progress, yardstick: bool) -> dict:
    """Every applicable system on one workload, against eager's output computed once; timed (unless rep is
    None) in `rounds` interleaved rounds, with SDPA on attn's inputs beside them (key "sdpa-attn") where
    `yardstick` asks for it and the workload is not attn itself."""
    from flashtensor import workloads
    fn, args = workloads.make(name, **make_kw)
    ref = fn(*args)
    torch._dynamo.reset()  # this workload's compiles start from scratch, independent of the ones before
    out, runs = {}, {}
    for s in systems:
        if applies(s, name):
            progress.start(name, s)
            out[s], f = prepare(s, name, fn, args, ref)
            progress.finish(out[s])
            if f is not None:
                runs[s] = (f, args)
    if yardstick and rep is not None and name != "attn" and name not in to_markdown.LINEAR:
        attn, attn_args = workloads.make("attn", **make_kw)
        progress.start(name, YARDSTICK)
        out[YARDSTICK], f = prepare("sdpa", "attn", attn, attn_args, attn(*attn_args))
        progress.finish(out[YARDSTICK])
        if f is not None:
            runs[YARDSTICK] = (f, attn_args)
    if rep is not None and runs:
        time_rounds(runs, out, rep, rounds)
        progress.timed(name, {s: out[s] for s in runs})
    del fn, args, ref, runs
    _free()
    return out


def plot(results: dict, path: str) -> bool:
    """Bar chart of each system's speedup over eager per workload, log y-axis; False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"bench: matplotlib is not installed, so no plot was written to {path} "
              "(pip install matplotlib; the JSON and the table above have every number)", file=sys.stderr)
        return False
    names = list(results["workloads"])
    systems = [s for s in results["systems"] if s != "eager"]
    width = 0.8 / max(len(systems), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names)), 4.0))
    for i, s in enumerate(systems):
        bars = [(j + (i - (len(systems) - 1) / 2) * width, to_markdown.speedup(results, n, s))
                for j, n in enumerate(names)]
        bars = [(x, y) for x, y in bars if y]
        if bars:
            ax.bar([x for x, _ in bars], [y for _, y in bars], width, label=LABELS[s])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylabel("speedup over eager")
    ax.set_title(f"{results['device']}, {results['shape']} shapes, {results['dtype']}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return True


def _write(results: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashtensor.bench.bench", description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="*", help="default: all of flashtensor.workloads.NAMES")
    p.add_argument("--shape", choices=["paper", "small"], default="paper")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp16", help="attention family; ea/sima are always fp32")
    p.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma-separated, from {','.join(PEERS)}")
    p.add_argument("--no-ft", action="store_true", help="leave flashtensor out")
    p.add_argument("--rep", type=int, default=200, help="do_bench rep, in ms")
    p.add_argument("--rounds", type=int, default=3, choices=range(1, 100), metavar="N",
                   help="time each system N times, interleaved; report the median (default %(default)s)")
    p.add_argument("--json", default="bench.json",
                   help="write every measurement here ('' for none; default %(default)s)")
    p.add_argument("--plot", default="bench.png",
                   help="write a PNG bar chart of speedups over eager here "
                        "('' for none; default %(default)s; needs matplotlib)")
    p.add_argument("--check-only", action="store_true", help="correctness checks only, no timing (works on CPU)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.check_only:
        print("bench: no CUDA device, so nothing to time. On CPU only the correctness checks run: "
              "--check-only --shape small --dtype fp32", file=sys.stderr)
        return 2
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read by triton when flashtensor defines its kernels
    import triton

    from flashtensor import workloads

    names = args.workloads or list(workloads.NAMES)
    unknown = [n for n in names if n not in workloads.NAMES]
    peers = [p for p in args.peers.split(",") if p]
    unknown += [p for p in peers if p not in PEERS]
    if unknown:
        parser.error(f"unknown workload or peer: {', '.join(unknown)}")
    if not cuda and any(p in CUDA_ONLY for p in peers):
        print(f"bench: skipping {', '.join(p for p in peers if p in CUDA_ONLY)}: CUDA only", flush=True)
        peers = [p for p in peers if p not in CUDA_ONLY]
    systems = peers + ([] if args.no_ft else ["flashtensor"])
    dims = dict(workloads.PAPER if args.shape == "paper" else workloads.SMALL)
    make_kw = dict(dims, device="cuda" if cuda else "cpu", dtype=DTYPES[args.dtype])
    rep = None if args.check_only else args.rep

    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "shape": args.shape, "dims": dims, "dtype": args.dtype, "rep_ms": args.rep, "rounds": args.rounds,
        "timed": rep is not None,
        "ceilings": None, "systems": systems, "workloads": {},
    }
    if rep is not None:
        results["ceilings"] = c = ceilings()
        print(f"ceilings: fp16 matmul {c['matmul_tflops']:.0f} TFLOP/s, device copy {c['copy_tbps']:.2f} TB/s",
              flush=True)

    # SDPA on attn is every attention workload's yardstick, timed in each one's rounds (run_workload)
    yardstick = "sdpa" in peers and rep is not None
    extra = sum(yardstick and n != "attn" and n not in to_markdown.LINEAR for n in names)
    progress = Progress(extra + sum(applies(s, n) for n in names for s in systems))
    for n in names:
        results["workloads"][n] = run_workload(n, systems, make_kw, rep, args.rounds, progress, yardstick)
        if args.json:  # after every workload, so that an interrupted run keeps what it measured
            _write(results, args.json)
    progress.close()

    print()
    print(to_markdown.markdown(results), flush=True)
    if args.json:
        print(f"bench: results in {args.json}")
    if args.plot:
        if rep is None:
            print("bench: --check-only measures no times; no plot", file=sys.stderr)
        elif plot(results, args.plot):
            print(f"bench: plot in {args.plot}")
    failed = [n for n, w in results["workloads"].items() if "flashtensor" in w and not w["flashtensor"]["ok"]]
    if failed:
        print(f"bench: flashtensor failed the correctness check on {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
