"""Per-kernel times and chosen configs of flashtensor's plan for some workloads (GPU only).

    python -m flashtensor.bench.breakdown h2o keyformer
"""
from __future__ import annotations

import sys

import torch

import flashtensor as ft
from flashtensor import workloads as W

from .ab import kernel_times


def main(argv: list[str] | None = None) -> int:
    for name in (argv if argv is not None else sys.argv[1:]) or ["h2o"]:
        fn, args = W.make(name, device="cuda", dtype=torch.float16, **W.PAPER)
        c = ft.compile(fn)
        c(*args)
        for k, ms in kernel_times(next(iter(c.programs.values())), args, rep=50):
            print(f"{name} {k.name}: {ms:.3f} ms grid={k.grid} blocks={k.blocks} "
                  f"warps={k.num_warps} stages={k.num_stages}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
