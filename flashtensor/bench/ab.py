"""A/B of compiler versions in one command, each version in its own process:

    python -m flashtensor.bench.ab h2o keyformer --trees main=scratch/main,new=.

A tree is a directory holding a `flashtensor` package: `.`, or a `git archive <ref> flashtensor` copy
(the device machine gets untracked files, not the git history). For each workload, each tree in the
order given gets a child process that runs this file as a script with the tree alone on PYTHONPATH: the
compiler it imports is the tree's and the harness is this one, so every tree is measured by the same code
and a tree needs no harness of its own (those from before flashtensor/bench have none). The child compiles
the workload without the plan cache (one tree at a time, so each tunes on a quiet GPU), checks every
output against eager and waits. Then the parent has the children time the call in turns, A B B A, for
`--rounds` rounds: timed one after the other, a process's second timing ran 0.2-8% slower than its first in
every row of an H100 run, a drift that fell on whichever tree came later; in turns it falls on each tree
alike. A row shows the median of the rounds (each a tree's mean of its two do_bench medians), their range,
the median of the rounds' ratios to the first tree, and each kernel timed alone. On a CPU,
--check-only --shape small runs the checks under Triton's interpreter.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable

if TYPE_CHECKING:     # imported lazily at run time: the worker runs whichever flashtensor is on sys.path
    from flashtensor.codegen.artifact import KernelSource
    from flashtensor.runtime.plan import Program


def worker(name: str, shape: str, rep: int | None) -> None:
    """Compile and check one workload with the flashtensor on sys.path, print its record, then (timed) answer
    the parent's requests on stdin: `call` (one do_bench median of a call) or `kernels` (each kernel alone)."""
    import torch

    import flashtensor as ft
    from flashtensor import workloads
    from flashtensor.testing import as_tuple, compare

    device = "cuda" if torch.cuda.is_available() else "cpu"
    fn, args = workloads.make(name, device=device, **(workloads.PAPER if shape == "paper" else workloads.SMALL))
    compiled = ft.compile(fn, cache=False)
    checks = [compare(o, r) for o, r in zip(as_tuple(compiled(*args)), as_tuple(fn(*args)))]
    prog = next(iter(compiled.programs.values()))
    rec = {"package": str(Path(ft.__file__).parent), "problems": [m.problem for m in checks if m.problem],
           "error": max((m.error for m in checks), default=0.0), "kernels": [la.source.name for la in prog.launches]}
    print("AB " + json.dumps(rec), flush=True)
    if rep is None:
        return
    from triton.testing import do_bench
    for request in sys.stdin:
        if request.strip() == "call":
            answer: object = do_bench(lambda: compiled(*args), warmup=25, rep=rep, return_mode="median")
        else:
            answer = kernel_lines(prog, args, max(rep // 2, 10))
        print("AB " + json.dumps(answer), flush=True)


def kernel_times(prog: Program, args: tuple, rep: int) -> list[tuple[KernelSource, float]]:
    """(KernelSource, median ms) of each of a compiled program's kernels launched alone (GPU only)."""
    from triton.testing import do_bench

    from flashtensor.runtime.launch import run_kernels
    tensors = [args[i] for i in prog.tensor_positions]
    # a base tree from before Program.kernel_inputs passed the plan's constants after the tensors
    if not hasattr(prog, "kernel_inputs"):
        bufs = run_kernels(prog.launches, tensors + prog.consts, args[0].device)
    else:       # a shape-generic program's kernels take the call's sizes
        at = prog.at(tensors)
        assert at is not None, "the program does not serve these arguments"
        sizes = at[0] if prog.generic else None
        bufs = run_kernels(prog.launches, prog.kernel_inputs(tensors, sizes), args[0].device, sizes)
    return [(la.source, do_bench(lambda: la(bufs), warmup=10, rep=rep, return_mode="median")) for la in prog.launches]


def kernel_lines(prog: Program, args: tuple, rep: int) -> list[str]:
    """kernel_times as text: each kernel's name, median ms, tiles, warps and stages."""
    return [f"{k.name} {ms:.4f} ({'x'.join(str(b) for b in k.blocks.values())}, w{k.num_warps} s{k.num_stages})"
            for k, ms in kernel_times(prog, args, rep)]


class Child:
    """One tree's worker process for one workload; `ask` sends a request and returns the answer."""

    def __init__(self, name: str, tree: str, shape: str, rep: int | None) -> None:
        env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
        # this file by path, not `-m flashtensor.bench.ab`, which would import the tree's copy of the harness;
        # a script puts its own folder first on sys.path, not the cwd, and that folder holds no flashtensor
        cmd = [sys.executable, str(Path(__file__).resolve()), name, "--worker", "--shape", shape]
        cmd += ["--check-only"] if rep is None else ["--rep", str(rep)]
        self.stderr: IO[str] = tempfile.TemporaryFile("w+")   # a file, not a pipe: warnings cannot fill it
        self.proc = subprocess.Popen(cmd, env=env, cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True)

    def answer(self) -> object | None:
        """The next `AB ` line's value, or None where the worker exited first."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("AB "):
                return json.loads(line[3:])
        return None

    def ask(self, request: str) -> object | None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> str:
        """Ends the worker; returns its exit status and last line of stderr, for a crashed row."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        rc = self.proc.wait()
        self.stderr.seek(0)
        last = self.stderr.read().strip().splitlines()[-1:]
        self.stderr.close()
        return f"rc {rc}: {last}"


def _row(name: str, label: str, rec: dict, base: list[float]) -> str:
    check = "ok" if not rec["problems"] else "FAIL: " + "; ".join(rec["problems"])
    err = "nan" if math.isnan(rec["error"]) else f"{rec['error']:.1e}"
    rounds = rec["call_ms"]
    call = f"{statistics.median(rounds):.4f} ({min(rounds):.4f}-{max(rounds):.4f})" if rounds else "-"
    # each round's ratio to the first tree's mean of the same round: a change of the clock between rounds cancels
    change = f"{statistics.median(ms / b for ms, b in zip(rounds, base)) - 1:+.1%}" if rounds and base else "-"
    return f"| {name} | {label} | {check} ({err}) | {call} | {change} | {' | '.join(rec['kernels'])} |"


def compare_trees(name: str, trees: list[list[str]], shape: str, rep: int | None, rounds: int,
                  spawn: Callable[[str, str, str, int | None], Child] = Child) -> bool:
    """Prints `name`'s rows, one per tree in order; False where a tree crashed or failed a check. `spawn`
    starts a tree's worker (a test's stand-in replaces the process)."""
    children: dict[str, Child] = {}
    recs: dict[str, dict] = {}
    failed: dict[str, str] = {}         # label: why its row has no timing
    for label, tree in trees:           # one at a time: each compiles and tunes alone
        child = spawn(name, tree, shape, rep)
        rec = child.answer()
        if not isinstance(rec, dict):
            failed[label] = f"crashed ({child.close()})"
        elif Path(rec["package"]).resolve() != (Path(tree) / "flashtensor").resolve():
            failed[label] = f"imported {rec['package']}, not the tree's package ({child.close()})"
        else:
            children[label], recs[label] = child, {**rec, "call_ms": []}

    def ask(label: str, request: str) -> object | None:     # a worker that dies fails its row
        answer = children[label].ask(request)
        if answer is None:
            failed[label] = f"crashed while timed ({children.pop(label).close()})"
        return answer

    if rep is not None:
        for _ in range(rounds):         # A B B A: a steady drift of the clock adds the same to every tree's mean
            labels = list(children)
            timed: dict[str, list] = {label: [] for label in labels}
            for label in labels + labels[::-1]:
                if label in children and (ms := ask(label, "call")) is not None:
                    timed[label].append(ms)
            for label in children:
                recs[label]["call_ms"].append(statistics.fmean(timed[label]))
        for label in list(children):
            recs[label]["kernels"] = ask(label, "kernels")
    for child in children.values():
        child.close()
    first = recs[trees[0][0]]["call_ms"] if trees[0][0] in children else []
    for label, _ in trees:
        if label in failed:
            print(f"| {name} | {label} | {failed[label]} | | | |", flush=True)
        else:
            print(_row(name, label, recs[label], first), flush=True)
    return not failed and not any(rec["problems"] for rec in recs.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashtensor.bench.ab", description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="+")
    p.add_argument("--trees", default="this=.", help="label=directory,... (default %(default)s)")
    p.add_argument("--shape", choices=["paper", "small"], default="paper")
    p.add_argument("--rep", type=int, default=100, help="do_bench rep of a call, in ms")
    p.add_argument("--rounds", type=int, default=7, help="timings of each tree's call, in turns")
    p.add_argument("--check-only", action="store_true", help="no timing (works on CPU under the interpreter)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    rep = None if args.check_only else args.rep
    if args.worker:
        worker(args.workloads[0], args.shape, rep)
        return 0
    trees = [t.split("=", 1) for t in args.trees.split(",")]
    missing = [d for _, d in trees if not (Path(d) / "flashtensor" / "__init__.py").exists()]
    if missing or any(len(t) != 2 for t in trees):
        p.error(f"--trees wants label=directory pairs of directories holding flashtensor/ (missing: {missing})")
    print(f"| workload | tree | check (max error) | call ms: median (range) of {args.rounds} rounds | "
          f"vs {trees[0][0]} | kernels: ms (blocks, warps, stages) |")
    print("|---|---|---|---|---|---|")
    ok = True
    for name in args.workloads:
        ok &= compare_trees(name, trees, args.shape, rep, args.rounds)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
