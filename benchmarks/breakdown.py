"""Per-kernel times and chosen configs of flashtensor's plan for some workloads (GPU only).

    python -m benchmarks.breakdown h2o keyformer
"""
from __future__ import annotations

import sys

import torch
import triton.testing

import flashtensor as ft
from flashtensor import workloads as W
from flashtensor.runtime.launch import run_kernels


def main(argv: list[str] | None = None) -> int:
    for name in (argv if argv is not None else sys.argv[1:]) or ["h2o"]:
        fn, args = W.make(name, device="cuda", dtype=torch.float16, **W.PAPER)
        c = ft.compile(fn)
        c(*args)
        prog = next(iter(c.programs.values()))
        bufs = run_kernels(prog.launches, [args[i] for i in prog.tensor_positions] + prog.consts, args[0].device)
        for la in prog.launches:
            ms = triton.testing.do_bench(lambda: la(bufs), warmup=10, rep=50, return_mode="median")
            k = la.source
            print(f"{name} {k.name}: {ms:.3f} ms grid={k.grid} blocks={k.blocks} warps={k.num_warps} stages={k.num_stages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
