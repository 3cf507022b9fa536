"""`python -m flashtensor explain|bench|demo`: the compiler from a shell.

Without a GPU, generated Triton kernels can only run in Triton's CPU
interpreter, which `triton.jit` picks when a kernel is defined. Python imports
the `flashtensor` package before this module, so `main` cannot set
TRITON_INTERPRET early enough by import order alone: if triton is already
loaded without it, `main` restarts the process once with it set.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

import flashtensor as ft
from flashtensor import knobs, workloads
from flashtensor.testing import as_tuple, compare


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{str(x.dtype).replace('torch.', '')}{list(x.shape)}"
    return repr(x)


# ---- commands ------------------------------------------------------------------------------------

def _workload(name: str, device: str) -> tuple[Callable, tuple]:
    """The paper's shapes in fp16 on CUDA; small float32 ones that the interpreter can run on CPU."""
    if device == "cuda":
        return workloads.make(name, device="cuda", dtype=torch.float16, **workloads.PAPER)
    return workloads.make(name, device="cpu", dtype=torch.float32, **workloads.SMALL)


def cmd_demo(args: argparse.Namespace, device: str) -> int:
    fn, inputs = _workload(args.workload, device)
    print(f"built {args.workload} on {device}: inputs " + ", ".join(_describe(a) for a in inputs))
    print(f"capturing and compiling {args.workload} ...")
    fast = ft.compile(fn)
    start = time.perf_counter()
    outs = as_tuple(fast(*inputs))
    print(f"compiled and ran in {time.perf_counter() - start:.2f} s")
    with torch.no_grad():
        refs = as_tuple(fn(*inputs))
    print("checking every output against eager PyTorch ...")
    ok = len(outs) == len(refs)
    if not ok:
        print(f"  FAIL: {len(outs)} outputs, eager gives {len(refs)}")
    for i, (o, r) in enumerate(zip(outs, refs)):
        m = compare(o, r)
        ok &= m.ok
        verdict = "PASS" if m.ok else f"FAIL ({m.problem})"
        detail = f"rel err {m.error:.2e} (tol {m.tol:g})" if m.tol else "compared exactly"
        print(f"  output {i}: {_describe(r)}  {detail}  {verdict}")
    if device == "cuda":
        from triton.testing import do_bench
        print("timing (triton.testing.do_bench, median) ...")
        eager_ms = do_bench(lambda: fn(*inputs), return_mode="median")
        fast_ms = do_bench(lambda: fast(*inputs), return_mode="median")
        print(f"  eager {eager_ms:.3f} ms   flashtensor {fast_ms:.3f} ms   speedup {eager_ms / fast_ms:.2f}x")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _load_target(target: str, device: str) -> tuple[Callable, tuple]:
    """A workload name, or `path/to/file.py:function` whose module also defines the example inputs."""
    if target in workloads.NAMES:
        return _workload(target, device)
    path, sep, name = target.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise SystemExit(f"error: {target!r} is neither a workload ({', '.join(workloads.NAMES)}) "
                         "nor path/to/file.py:function")
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if spec is None or spec.loader is None or not Path(path).is_file():
        raise SystemExit(f"error: no such file: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise SystemExit(f"error: {path} defines no function {name!r}")
    make = getattr(module, f"{name}_inputs", None) or getattr(module, "make_inputs", None)
    if make is None:
        raise SystemExit(f"error: {path} must define {name}_inputs() or make_inputs() returning the example arguments")
    return fn, as_tuple(make())


def cmd_explain(args: argparse.Namespace, device: str) -> int:
    fn, inputs = _load_target(args.target, device)
    print(ft.explain(fn, *inputs))
    return 0


def cmd_bench(args: argparse.Namespace, device: str) -> int:
    """Thin: the harness is flashtensor.bench.bench, imported here so that the other commands do without it."""
    from flashtensor.bench import bench
    return int(bench.main(args.args) or 0)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashtensor",
                                description="FlashTensor: fused Triton kernels from plain-PyTorch attention variants.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="compile one workload, check it against eager, and time it on CUDA")
    d.add_argument("--workload", default="h2o", choices=workloads.NAMES)
    d.set_defaults(run=cmd_demo)

    e = sub.add_parser(
        "explain", help="print what the compiler found and generated for a workload or a function",
        description="Print the captured and decomposed graphs, properties, plan and kernels for TARGET.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="TARGET is a workload name (" + ", ".join(workloads.NAMES) + ") or path/to/file.py:function.\n"
               "For a file, the module must define `function` and either `function_inputs()` or\n"
               "`make_inputs()` returning the example arguments (a tuple, or a single tensor).\n"
               "Workloads use the paper's shapes in fp16 on CUDA and small float32 shapes on CPU.")
    e.add_argument("target", metavar="TARGET")
    e.set_defaults(run=cmd_explain)

    # no -h of its own: `bench --help` shows flashtensor/bench/bench.py's options, where they are defined
    b = sub.add_parser("bench", add_help=False,
                       help="benchmark workloads against eager and peers (flashtensor/bench/bench.py)")
    b.add_argument("args", nargs=argparse.REMAINDER, metavar="WORKLOADS",
                   help="workload names and options, passed to flashtensor/bench/bench.py")
    b.set_defaults(run=cmd_bench)
    return p


def _use_interpreter_without_gpu() -> str:
    """Pick the device; on CPU force Triton's interpreter, restarting if triton was imported without it."""
    if torch.cuda.is_available():
        return "cuda"
    if not knobs.interpret():
        os.environ["TRITON_INTERPRET"] = "1"
        if "triton" in sys.modules:  # `python -m flashtensor` imported the package before main() ran
            os.execv(sys.executable, sys.orig_argv)
    return "cpu"


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if extra and args.command != "bench":
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "bench":  # options before the first workload name are not in the remainder
        args.args = extra + args.args
    device = _use_interpreter_without_gpu()
    return args.run(args, device)
