"""Run the fuzzer's campaign (tests/test_fuzz.py) in several processes at once, each with its own seed, and sum them.

    python scripts/fuzz_campaign.py --processes 8 --examples 200     # on the GPU machine: compiled kernels
    .venv/bin/python scripts/fuzz_campaign.py -p 2 -n 150             # on the CPU: kernels interpreted

Process i runs the campaign with FLASHTENSOR_FUZZ_SEED=seed+i, so each draws other programs; where there are
GPUs, it sees GPU i % count alone (CUDA_VISIBLE_DEVICES). Each prints one line "fuzz: fused N, partial N,
fallback N, tried N, expected N, expected_fused N"; this prints those lines and their sum, the end of the output
of every process that failed (with hypothesis's reproduction), and exits 1 if any failed.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--processes", type=int, default=4)
    ap.add_argument("-n", "--examples", type=int, default=100, help="programs per process")
    ap.add_argument("--seed", type=int, default=0, help="the first process's seed")
    ap.add_argument("--dtypes", help="FLASHTENSOR_FUZZ_DTYPES, e.g. fp16,bf16")
    a = ap.parse_args()
    import torch
    gpus = torch.cuda.device_count()
    procs = []
    for i in range(a.processes):
        env = dict(os.environ, FLASHTENSOR_FUZZ_SEED=str(a.seed + i), FLASHTENSOR_FUZZ_EXAMPLES=str(a.examples))
        if a.dtypes:
            env["FLASHTENSOR_FUZZ_DTYPES"] = a.dtypes
        env.setdefault("TRITON_INTERPRET", "0" if gpus else "1")    # tests/conftest.py would default it to 1
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_fuzz.py",
               "-k", "test_random_programs_match_eager"]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    total: Counter = Counter()
    failed = 0
    for i, proc in enumerate(procs):
        out, _ = proc.communicate()
        lines = [m.group(0) for m in re.finditer(r"fuzz: .*", out)]     # (after a progress dot, maybe)
        for ln in lines:
            total.update({k: int(v) for k, v in re.findall(r"(\w+) (\d+)", ln)})
        print(f"seed {a.seed + i}: {lines[-1] if lines else 'no summary'} (exit {proc.returncode})")
        if proc.returncode:
            failed += 1
            # pytest's captured log of a failing test (torch's DEBUG records) would fill the tail
            print("\n".join([ln for ln in out.splitlines() if not re.match(r"(DEBUG|INFO) ", ln)][-60:]))
    print("fuzz: " + ", ".join(f"{k} {v}" for k, v in total.items()) + f"; {failed} of {len(procs)} processes failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
