"""A/B of compiler versions in one command, each version in its own process:

    python -m flashtensor.bench.ab h2o keyformer --trees main=scratch/main,new=.

A tree is a directory holding a `flashtensor` package: `.`, or a `git archive <ref> flashtensor` copy
(the device machine gets untracked files, not the git history). For each workload, each tree in the
order given gets a child process that runs this file as a script with the tree alone on PYTHONPATH: the
compiler it imports is the tree's and the harness is this one, so every tree is measured by the same code
and a tree needs no harness of its own (those from before flashtensor/bench have none). The child compiles
the workload without the plan cache, checks every output against eager, times the call twice and each
kernel alone (triton's do_bench, medians), and the parent prints one table. Machines of one device session
differ by a few percent, so compare versions within one command. On a CPU, --check-only --shape small runs
the checks under Triton's interpreter.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # imported lazily at run time: the worker runs whichever flashtensor is on sys.path
    from flashtensor.codegen.artifact import KernelSource
    from flashtensor.runtime.plan import Program


def worker(name: str, shape: str, rep: int | None) -> dict:
    """Compile, check and time one workload with the flashtensor on sys.path."""
    import torch

    import flashtensor as ft
    from flashtensor import workloads
    from flashtensor.testing import as_tuple, compare

    device = "cuda" if torch.cuda.is_available() else "cpu"
    fn, args = workloads.make(name, device=device, **(workloads.PAPER if shape == "paper" else workloads.SMALL))
    compiled = ft.compile(fn, cache=False)
    checks = [compare(o, r) for o, r in zip(as_tuple(compiled(*args)), as_tuple(fn(*args)))]
    rec = {"package": str(Path(ft.__file__).parent), "problems": [m.problem for m in checks if m.problem],
           "error": max((m.error for m in checks), default=0.0), "call_ms": [], "kernels": []}
    prog = next(iter(compiled.programs.values()))
    if rep is not None:
        from triton.testing import do_bench
        rec["call_ms"] = [do_bench(lambda: compiled(*args), warmup=25, rep=rep, return_mode="median") for _ in range(2)]
        rec["kernels"] = [f"{k.name} {ms:.4f} ({'x'.join(str(b) for b in k.blocks.values())}, "
                          f"w{k.num_warps} s{k.num_stages})" for k, ms in kernel_times(prog, args, max(rep // 2, 10))]
    else:
        rec["kernels"] = [la.source.name for la in prog.launches]
    return rec


def kernel_times(prog: Program, args: tuple, rep: int) -> list[tuple[KernelSource, float]]:
    """(KernelSource, median ms) of each of a compiled program's kernels launched alone (GPU only)."""
    from triton.testing import do_bench

    from flashtensor.runtime.launch import run_kernels
    tensors = [args[i] for i in prog.tensor_positions]
    # a base tree from before Program.kernel_inputs passed the plan's constants after the tensors
    ins = prog.kernel_inputs(tensors, None) if hasattr(prog, "kernel_inputs") else tensors + prog.consts
    bufs = run_kernels(prog.launches, ins, args[0].device)
    return [(la.source, do_bench(lambda: la(bufs), warmup=10, rep=rep, return_mode="median")) for la in prog.launches]


def _row(name: str, label: str, rec: dict) -> str:
    check = "ok" if not rec["problems"] else "FAIL: " + "; ".join(rec["problems"])
    err = "nan" if math.isnan(rec["error"]) else f"{rec['error']:.1e}"
    call = " / ".join(f"{ms:.4f}" for ms in rec["call_ms"]) or "-"
    return f"| {name} | {label} | {check} ({err}) | {call} | {' | '.join(rec['kernels'])} |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashtensor.bench.ab", description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="+")
    p.add_argument("--trees", default="this=.", help="label=directory,... (default %(default)s)")
    p.add_argument("--shape", choices=["paper", "small"], default="paper")
    p.add_argument("--rep", type=int, default=100, help="do_bench rep of a call, in ms")
    p.add_argument("--check-only", action="store_true", help="no timing (works on CPU under the interpreter)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    rep = None if args.check_only else args.rep
    if args.worker:
        print("AB " + json.dumps(worker(args.workloads[0], args.shape, rep)), flush=True)
        return 0
    trees = [t.split("=", 1) for t in args.trees.split(",")]
    missing = [d for _, d in trees if not (Path(d) / "flashtensor" / "__init__.py").exists()]
    if missing or any(len(t) != 2 for t in trees):
        p.error(f"--trees wants label=directory pairs of directories holding flashtensor/ (missing: {missing})")
    print("| workload | tree | check (max error) | call ms | kernels: ms (blocks, warps, stages) |")
    print("|---|---|---|---|---|")
    failed = False
    for name in args.workloads:
        for label, tree in trees:
            env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
            # this file by path, not `-m flashtensor.bench.ab`, which would import the tree's copy of the harness;
            # a script puts its own folder first on sys.path, not the cwd, and that folder holds no flashtensor
            cmd = [sys.executable, str(Path(__file__).resolve()), name, "--worker", "--shape", args.shape,
                   "--rep", str(args.rep)]
            run = subprocess.run(cmd + (["--check-only"] if args.check_only else []), env=env, cwd=tree,
                                 capture_output=True, text=True)
            line = next((ln for ln in run.stdout.splitlines() if ln.startswith("AB ")), None)
            if run.returncode or line is None:
                failed = True
                last = run.stderr.strip().splitlines()[-1:]
                print(f"| {name} | {label} | crashed (rc {run.returncode}): {last} | | |")
                continue
            rec = json.loads(line[3:])
            if Path(rec["package"]).resolve() != (Path(tree) / "flashtensor").resolve():
                failed = True
                print(f"| {name} | {label} | imported {rec['package']}, not the tree's package | | |")
                continue
            failed |= bool(rec["problems"])
            print(_row(name, label, rec), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
