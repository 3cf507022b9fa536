"""Decode h2o on a GPU: the tuner's time for each tile configuration of each kernel, then every kernel's device
time in ten profiled calls, for the shape-generic plan and the exact one.

    PYTHONPATH=$PWD python scripts/decode_profile.py [Q_LENxKV_LEN ...] [--heads 32] [--exact]
"""
from __future__ import annotations

import argparse
import logging
import os

os.environ.setdefault("TRITON_INTERPRET", "0")
import torch  # noqa: E402

import flashtensor as ft  # noqa: E402
from flashtensor.bench import generic as G  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shapes", nargs="*", default=["1x8192", "4x8192", "16x32768"])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--exact", action="store_true", help="the exact-shape plan too")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("flashtensor.runtime.autotune").setLevel(logging.DEBUG)
    for shape in a.shapes:
        q_len, kv = map(int, shape.split("x"))
        for dynamic in [True, False] if a.exact else [True]:
            print(f"==== q_len={q_len} kv_len={kv} dynamic={dynamic}", flush=True)
            c = ft.compile(G._h2o_rows, dynamic=dynamic, eager_if_faster=False, cache=False)
            q, k, v = (torch.randn(1, n, a.heads, 128, device="cuda", dtype=torch.float16) for n in (q_len, kv, kv))
            with torch.no_grad():
                c(q, k, v)
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        c(q, k, v)
                    torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6), flush=True)
            for kern in c.program_for((q, k, v)).kernels:
                print(kern.name, kern.grid, kern.blocks, kern.num_warps, kern.splits, flush=True)


if __name__ == "__main__":
    main()
