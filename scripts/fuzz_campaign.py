"""Run the fuzzer's campaign (tests/test_fuzz.py) in several processes at once, each with its own seed, and sum them.

    python scripts/fuzz_campaign.py --processes 8 --examples 200     # on the GPU machine: compiled kernels
    python scripts/fuzz_campaign.py -p 14 -n 40 --seconds 540        # stop at 9 minutes, count what finished
    python scripts/fuzz_campaign.py --seeds 103,107 --dtypes fp16      # replay two processes of a campaign
    .venv/bin/python scripts/fuzz_campaign.py -p 2 -n 150             # on the CPU: kernels interpreted

Process i runs the campaign with FLASHTENSOR_FUZZ_SEED=seed+i (or the i-th of --seeds), so each draws other
programs; where there are GPUs, it sees GPU i % count alone (CUDA_VISIBLE_DEVICES). Each writes a line per program
as it ends (FLASHTENSOR_FUZZ_LOG), and each failing program's spec and error, going on to the next
(FLASHTENSOR_FUZZ_KEEP_GOING); this prints each process's counts and their sum, those failures, the end of the
output of a process that failed otherwise, and exits 1 if any program failed, a process failed, or fewer than the
test's floor of the programs expected to fuse fused. With --seconds, processes still running then are stopped
and their finished programs counted.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR = 0.9         # tests/test_fuzz.py's FUSED_FLOOR


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--processes", type=int, default=4)
    ap.add_argument("-n", "--examples", type=int, default=100, help="programs per process")
    ap.add_argument("--seed", type=int, default=0, help="the first process's seed")
    ap.add_argument("--seeds", help="the processes' seeds, comma-separated (instead of --processes and --seed)")
    ap.add_argument("--dtypes", help="FLASHTENSOR_FUZZ_DTYPES, e.g. fp16,bf16")
    ap.add_argument("--seconds", type=float, help="stop the processes still running after this long")
    a = ap.parse_args()
    import torch
    gpus = torch.cuda.device_count()
    logs = Path(tempfile.mkdtemp(prefix="fuzz-"))
    procs = []
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else [a.seed + i for i in range(a.processes)]
    for i, sd in enumerate(seeds):
        env = dict(os.environ, FLASHTENSOR_FUZZ_SEED=str(sd), FLASHTENSOR_FUZZ_EXAMPLES=str(a.examples),
                   FLASHTENSOR_FUZZ_LOG=str(logs / f"{i}.log"), FLASHTENSOR_FUZZ_KEEP_GOING="1")
        if a.dtypes:
            env["FLASHTENSOR_FUZZ_DTYPES"] = a.dtypes
        env.setdefault("TRITON_INTERPRET", "0" if gpus else "1")    # tests/conftest.py would default it to 1
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(i % gpus)
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_fuzz.py",
               "-k", "test_random_programs_match_eager"]
        out = open(logs / f"{i}.out", "w")
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True), out))
    deadline = time.monotonic() + a.seconds if a.seconds else None
    stopped = set()
    for i, (proc, out) in enumerate(procs):
        try:
            proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stopped.add(i)
        out.close()
    total: Counter = Counter()
    failed = False
    for i, (proc, _) in enumerate(procs):
        log = logs / f"{i}.log"
        lines = log.read_text().split("\n") if log.exists() else []
        got = Counter(ln.split()[0] for ln in lines if ln)
        got["expected"] = sum(ln.endswith(" 1") for ln in lines)
        got["expected_fused"] = sum(ln == "fused 1" for ln in lines)
        got["tried"] = sum(1 for ln in lines if ln)
        total.update(got)
        how = "stopped at the time limit" if i in stopped else f"exit {proc.returncode}"
        print(f"seed {seeds[i]}: " + ", ".join(f"{k} {v}" for k, v in sorted(got.items())) + f" ({how})")
        fails, unfused = logs / f"{i}.log.fails", logs / f"{i}.log.unfused"
        for listed in (fails, unfused):       # failures, then programs expected to fuse that did not
            if listed.exists():
                print(listed.read_text(), end="")
        if got["fail"] or (i not in stopped and proc.returncode):
            failed = True
        if i not in stopped and proc.returncode and not fails.exists():
            # pytest's captured log of a failing test (torch's DEBUG records) would fill the tail
            text = (logs / f"{i}.out").read_text().splitlines()
            print("\n".join([ln for ln in text if not re.match(r"(DEBUG|INFO) ", ln)][-60:]))
    short = total["expected_fused"] < FLOOR * total["expected"]
    verdict = ("; FAILED" if failed else "") + (f"; fewer than {FLOOR:.0%} of those expected to fuse fused"
                                               if short else "")
    print("fuzz: " + ", ".join(f"{k} {v}" for k, v in sorted(total.items())) +
          f"; {len(stopped)} of {len(procs)} processes stopped at the time limit" + verdict)
    return 1 if failed or short else 0


if __name__ == "__main__":
    sys.exit(main())
