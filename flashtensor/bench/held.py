"""Check the project's held programs (flashtensor/bench/programs.py) against eager, and time them on a GPU.

    python -m flashtensor.bench.held [NAMES...] [--dtypes fp16,bf16] [--shape small|gpu] [--json F] [--rep N] \
        [--rounds N] [--no-time] [--lengths S,S,...] [--peers compile]

For each program and dtype: eager runs, `ft.compile` runs, and every output is checked under the contract
(flashtensor.testing.compare_with_exact, float64 rule included); the plan says whether it fused (every
piece in kernels), partly fused or fell back to eager, and why. On a GPU eager and flashtensor are then
timed in interleaved rounds (bench.time_rounds). With --lengths, the same compiled callable then runs and is
checked at each of those sequence lengths, and the record counts its plan searches (`cache_info`): a
shape-generic plan serves them all, unless the program's own numbers change with the length (a window of
S // 4). A crash is a result, reported in the table, and fails the run like a wrong answer does: the exit
status is 1 if any check fails. Without a GPU only the checks run,
at the small shapes, under Triton's interpreter.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import sys
import time
import warnings
from typing import Any, Callable, Sequence

import torch

import flashtensor as ft
from flashtensor import testing
from flashtensor.cli.main import _use_interpreter_without_gpu
from flashtensor.frontend.capture import BEFORE_KERNELS
from flashtensor.options import CONFIGS, TileConfig
from flashtensor.runtime.plan import Program
from flashtensor.testing import as_tuple

from . import bench, programs

SHAPES = {"small": programs.SMALL, "gpu": programs.GPU}


def exact_args(args: tuple) -> tuple:
    """The inputs as float64 copies, for the exact answer (integer masks and Python numbers as they are)."""
    return tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def outcome(prog: Program) -> str:
    """fused (every piece in kernels, but ops on the inputs that run before them), partial (some piece in eager)
    or fallback (all eager), from the plan."""
    if not prog.launches:
        return "fallback"
    return "partial" if any(BEFORE_KERNELS not in n for n in prog.notes) else "fused"


def check_outputs(fn: Callable, args: tuple, out: Any, ref: Any) -> list[testing.Match]:
    """Each output against eager under the contract; the float64 answer is computed once, and only where
    an output misses eager."""
    outs, refs = as_tuple(out), as_tuple(ref)
    if len(outs) != len(refs):
        return [testing.Match(float("nan"), 0.0, f"{len(outs)} outputs, eager gives {len(refs)}")]
    exact = functools.cache(lambda: as_tuple(fn(*exact_args(args))))
    matches = []
    for k, (o, r) in enumerate(zip(outs, refs)):
        m = testing.compare(o, r)
        matches.append(m if m.ok else testing.compare_with_exact(o, r, exact()[k], testing.narrowest(args)))
    return matches


def run_program(name: str, dtype: str, dims: dict, device: str, lengths: tuple[int, ...] = (),
                peers: tuple[str, ...] = (), configs: Sequence[TileConfig] = CONFIGS) -> tuple[dict, dict]:
    """Build, run and check one program (then the same compiled callable at each of `lengths`); returns its record
    and what to time (empty after a crash). With "compile" among `peers`, torch.compile of the program is checked
    too and timed beside them (a wrong or failing peer is recorded, and fails nothing). `configs`: the tiles the
    kernels may take (the tuner's by default)."""
    rec: dict[str, Any] = {"program": name, "dtype": dtype, "status": None, "notes": "", "ok": False,
                           "outputs": [], "error": None, "eager": None, "flashtensor": None, "searches": None}
    try:
        fn, args = programs.make(name, device=device, dtype=bench.DTYPES[dtype], **dims)
        with torch.no_grad():
            ref = fn(*args)
    except Exception as e:  # noqa: BLE001
        rec["error"] = "eager: " + bench._error(e)
        return rec, {}
    try:
        compiled = ft.compile(fn, configs=configs)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", ft.FallbackWarning)
            out = compiled(*args)
        prog = compiled.program_for(args)
        matches = check_outputs(fn, args, out, ref)
    except Exception as e:  # noqa: BLE001  (a crash is a result: the table reports it)
        rec["error"] = bench._error(e)
        return rec, {}
    rec["status"] = outcome(prog)
    rec["notes"] = "; ".join(prog.notes)[:200]
    rec["outputs"] = [{"error": m.error, "tol": m.tol, "against": m.against, "problem": m.problem} for m in matches]
    internal = [n for n in prog.notes if n.startswith("internal compiler error")]
    rec["ok"] = all(m.ok for m in matches) and not internal
    if internal:
        rec["error"] = internal[0][:200]
    for s in lengths:
        try:
            fn_s, args_s = programs.make(name, device=device, dtype=bench.DTYPES[dtype], **{**dims, "S": s})
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore", ft.FallbackWarning)
                ref_s, out_s = fn_s(*args_s), compiled(*args_s)
            bad = [m.problem for m in check_outputs(fn_s, args_s, out_s, ref_s) if not m.ok]
        except Exception as e:  # noqa: BLE001
            bad = [bench._error(e)]
        if bad:
            rec["ok"], rec["error"] = False, f"at S={s}: {bad[0]}"[:200]
    rec["searches"] = compiled.cache_info()["searches"]
    runs = {"eager": (fn, args), "flashtensor": (compiled, args)}
    if "compile" in peers:
        rec["compile"] = {"ms": None, "ms_rounds": [], "error": None, "wrong": None}
        try:
            inductor = torch.compile(fn)
            with torch.no_grad():
                wrong = [m.problem for m in check_outputs(fn, args, inductor(*args), ref) if not m.ok]
            rec["compile"]["wrong"] = wrong[0][:200] if wrong else None
            runs["compile"] = (inductor, args)
        except Exception as e:  # noqa: BLE001
            rec["compile"]["error"] = bench._error(e)
    return rec, runs


def retry_out_of_memory(run: Callable[[], tuple[dict, dict]], pauses: Sequence[float],
                        sleep: Callable[[float], None] = time.sleep) -> tuple[dict, dict]:
    """`run()` (run_program's record and runs), run again after each pause while its record says CUDA ran out of
    memory: in held_gpu.sh's parallel phase twelve processes share one GPU, and an H100's 80 GB held a bf16
    program's float64 check beside the others' peaks only some of the time."""
    rec, runs = run()
    for pause in pauses:
        if "OutOfMemoryError" not in (rec["error"] or ""):
            break
        del runs
        bench._free()
        sleep(pause)
        rec, runs = run()
    return rec, runs


def time_program(rec: dict, runs: dict, rep: int, rounds: int) -> None:
    """Eager and flashtensor in `rounds` interleaved rounds; ms is the median of the rounds' medians."""
    recs: dict[str, dict[str, Any]] = {k: rec.get(k) or {"ms": None, "ms_rounds": [], "error": None} for k in runs}
    bench.time_rounds(runs, recs, rep, rounds)
    for k, r in recs.items():
        rec[k] = r


def _cell_error(rec: dict) -> str:
    worst = max(rec["outputs"], key=lambda o: o["error"] if o["error"] == o["error"] else float("inf"),
                default=None)
    if worst is None:
        return "-"
    return f"{worst['error']:.1e}" + (" vs float64" if worst["against"] == "float64" else "")


def _ms(rec: dict, system: str) -> float | None:
    r = rec[system]
    return r["ms"] if r and not r["error"] else None


def ratio(rec: dict) -> float | None:
    """Eager's time over flashtensor's: at least 1 where flashtensor is at least as fast as eager."""
    e, f = _ms(rec, "eager"), _ms(rec, "flashtensor")
    return e / f if e and f else None


def slower_than_eager(results: dict) -> list[str]:
    """The programs of a run (its JSON) that ran slower than eager, by name: gpu_check.sh's held part times them
    again alone."""
    return sorted({rec["program"] for rec in results["programs"] if (r := ratio(rec)) is not None and r < 1})


def fmt(x: float | None) -> str:
    """A time or ratio for a table: three decimals below 1, two above; '-' for none."""
    return "-" if x is None else (f"{x:.3f}" if x < 1 else f"{x:.2f}")


def markdown(results: dict) -> str:
    """The results as a table, then each program's notes, problems and crashes."""
    inductor = any("compile" in rec for rec in results["programs"])
    lines = [f"Held programs on {results['device']}, {results['shape']} shapes {results['dims']}, "
             f"{results['date']}.", "",
             "| program | dtype | fused? | check | error | eager ms | flashtensor ms | ratio (eager / ft) |" +
             (" torch.compile ms | compile / ft |" if inductor else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if inductor else "")]
    details = []
    for rec in results["programs"]:
        check = "pass" if rec["ok"] else ("crash" if rec["error"] and rec["status"] is None else "FAIL")
        r = ratio(rec)
        cells = [rec["program"], rec["dtype"], rec["status"] or "-", check, _cell_error(rec),
                 fmt(_ms(rec, "eager")), fmt(_ms(rec, "flashtensor")), "-" if r is None else f"{r:.2f}x"]
        if inductor:
            c, f = _ms(rec, "compile") if rec.get("compile") else None, _ms(rec, "flashtensor")
            wrong = " ✗" if (rec.get("compile") or {}).get("wrong") else ""
            cells += [fmt(c) + wrong, "-" if not (c and f) else f"{c / f:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
        said = [rec["error"]] if rec["error"] else []
        said += [f"output {k}: {o['problem']}" for k, o in enumerate(rec["outputs"]) if o["problem"]]
        said += [rec["notes"]] if rec["notes"] and rec["notes"] not in said else []
        details += [f"- {rec['program']} / {rec['dtype']}: {s}" for s in said]
    return "\n".join(lines + ([""] + details if details else []))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashtensor.bench.held", description=__doc__.splitlines()[0])
    p.add_argument("programs", nargs="*", help="default: all of flashtensor.bench.programs.NAMES")
    p.add_argument("--dtypes", default="fp16,bf16", help=f"comma-separated, from {','.join(bench.DTYPES)}")
    p.add_argument("--shape", choices=list(SHAPES), help="default: gpu on a GPU, small on the CPU")
    p.add_argument("--json", default="", help="write every record here ('' for none)")
    p.add_argument("--rep", type=int, default=100, help="do_bench rep, in ms (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, choices=range(1, 100), metavar="N",
                   help="time each system N times, interleaved; report the median (default %(default)s)")
    p.add_argument("--no-time", action="store_true",
                   help="compile and check only: several such processes at once fill Triton's kernel cache, "
                        "so that one timing process after them compiles nothing")
    p.add_argument("--peers", default="", help="'compile': torch.compile checked and timed beside them too")
    p.add_argument("--lengths", default="", help="comma-separated sequence lengths to run and check the same "
                   "compiled callable at after the first call (shape-generic plans)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    device = _use_interpreter_without_gpu()   # restarts the process once where triton was loaded without it
    cuda = device == "cuda"
    shape = args.shape or ("gpu" if cuda else "small")
    names = args.programs or programs.NAMES
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [n for n in names if n not in programs.PROGRAMS] + [d for d in dtypes if d not in bench.DTYPES]
    if unknown:
        parser.error(f"unknown program or dtype: {', '.join(unknown)}")
    if not cuda and shape == "gpu":
        parser.error("the gpu shapes need a GPU: under the interpreter they would run for hours")
    import triton

    if not cuda:   # the interpreter computes masked-off lanes too (pyproject.toml filters the same in the tests)
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="triton.runtime.interpreter")
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "shape": shape, "dims": SHAPES[shape],
        "timed": cuda and not args.no_time, "rep_ms": args.rep, "rounds": args.rounds, "programs": []}
    total = len(names) * len(dtypes)
    for n in names:
        for d in dtypes:
            lengths = tuple(int(s) for s in args.lengths.split(",") if s)
            # beside other processes (--no-time) a CUDA out-of-memory error is retried after a pause, alone not
            rec, runs = retry_out_of_memory(
                functools.partial(run_program, n, d, SHAPES[shape], device, lengths, tuple(args.peers.split(","))),
                (10, 20, 40) if args.no_time else ())
            if cuda and runs and not args.no_time:
                time_program(rec, runs, args.rep, args.rounds)
            results["programs"].append(rec)
            r = ratio(rec)
            problems = ([rec["error"]] if rec["error"] else []) + [o["problem"] for o in rec["outputs"] if o["problem"]]
            said = "pass" if rec["ok"] else "FAIL: " + "; ".join(problems)
            print(f"[{len(results['programs'])}/{total}] {n} {d}: {rec['status'] or 'crash'}, {said}, "
                  f"error {_cell_error(rec)}" + (f", {r:.2f}x eager" if r else "") +
                  (f", {rec['searches']} search(es) for {1 + len(lengths)} lengths" if lengths else ""), flush=True)
            del runs
            bench._free()
            if args.json:  # after every program, so that an interrupted run keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(results, f, indent=1)
    print()
    print(markdown(results), flush=True)
    return 0 if all(rec["ok"] for rec in results["programs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
