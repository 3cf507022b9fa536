"""Where a mask's form costs time (issue 21): for each peers row and form (inside, captured, passed), flashtensor's
call time and each launch of its plan timed alone (the range pre-passes, the kernel), with the tile config chosen.

    python scripts/mask_steps.py [ROWS...]        (GPU only; default: causal window sinks_window)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "0")
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

import torch  # noqa: E402
from triton.testing import do_bench  # noqa: E402

import flashtensor as ft  # noqa: E402
from flashtensor.bench import peers  # noqa: E402
from flashtensor.runtime.launch import run_kernels  # noqa: E402


def main() -> int:
    rows = sys.argv[1:] or ["causal", "window", "sinks_window"]
    for name in rows:
        row = peers.ROWS[name]
        for form in peers.FORMS:
            fn = peers.program(row, form, peers.GPU["S"], "cuda")
            args = peers.inputs(row, form, torch.float16, "cuda", **peers.GPU)
            fast = ft.compile(fn, eager_if_faster=False)
            fast(*args)
            call = do_bench(lambda: fast(*args), warmup=25, rep=100, return_mode="median")
            prog = fast.program_for(list(args))
            ins = prog.kernel_inputs([args[i] for i in prog.tensor_positions], None)
            bufs = run_kernels(prog.launches, ins, args[0].device)
            parts = []
            for la in prog.launches:
                src = la.source
                for step in la.steps(bufs, False, False):
                    ms = do_bench(lambda: step.launch(bufs), warmup=10, rep=50, return_mode="median")
                    parts.append(f"{getattr(step.fn, '__name__', '?')} {ms * 1e3:.1f} us grid {step.grid[0]}")
                parts.append(f"[{src.name}: blocks {src.blocks} warps {src.num_warps} stages {src.num_stages}]")
            print(f"{name:13s} {form:9s} call {call:.3f} ms | " + " | ".join(parts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
