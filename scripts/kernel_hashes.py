"""Hash every kernel the compiler generates for the reference workloads, the held programs and the fuzzer's finds.

For each of the nine workloads (small shapes in float32, the paper's shapes in fp16 on meta tensors: nothing
runs), each held program (flashtensor/bench/programs.py, small shapes in fp16 and bf16) and each find, every
partition candidate, every kernel and every tile configuration, it emits the Triton source and records a SHA-256
of the kernel's body (the `@triton.jit` function; loop variables renamed in order of first use, since their
numbers come from a process-wide counter) with its grid, blocks, warps, stages and buffers.

A change to the compiler that should leave kernels alone is checked by comparing two runs:

    TRITON_INTERPRET=1 .venv/bin/python scripts/kernel_hashes.py before.json     # at the old commit
    TRITON_INTERPRET=1 .venv/bin/python scripts/kernel_hashes.py after.json --compare before.json

TRITON_INTERPRET changes bf16 dots (the interpreter's are wrong, so they run in float32): run both ways.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from flashtensor import driver, workloads  # noqa: E402
from flashtensor.bench import programs  # noqa: E402
from flashtensor.codegen.kernel import emit_kernel  # noqa: E402
from flashtensor.options import CONFIGS  # noqa: E402


def _norm(text: str) -> str:
    names: dict[str, str] = {}
    return re.sub(r"(?<![A-Za-z0-9])v\d+\b", lambda m: names.setdefault(m.group(0), f"V{len(names)}"), text)


def _record(spec: Any, cfg: Any) -> dict:
    src = emit_kernel(spec, cfg)
    body = _norm(src.source[src.source.index("@triton.jit\ndef "):])
    return {"body": hashlib.sha256(body.encode()).hexdigest()[:16],
            "meta": [list(src.grid), src.num_warps, src.num_stages, _norm(repr(src.blocks)), src.assumes_finite,
                     src.fixup, [(b.name, list(b.shape), str(b.dtype), b.kind, b.written) for b in src.buffers]]}


def kernels(name: str, fn: Callable, args: list, out: dict) -> None:
    """Every kernel of every candidate partition of fn(*args), at every tile configuration, into `out`."""
    for k, plan in driver.candidate_plans(fn, args):
        for specs in plan.stages["emit"].values():
            for spec in specs:
                for c, cfg in enumerate(CONFIGS):
                    out[f"{name}/cand{k}/{spec.name}/cfg{c}"] = _record(spec, cfg)


def _paper(name: str) -> tuple[Callable, list]:
    """The paper's shapes on the meta device: capture and planning run on fake tensors."""
    fn, _ = workloads.make(name, device="cpu", dtype=torch.float16, **workloads.SMALL)
    p = workloads.PAPER
    meta = dict(device="meta")
    if name in ("ea", "sima"):
        return fn, [torch.empty(p["BL"], p["N"], 128, **meta), torch.empty(384, 128, **meta), torch.empty(384, **meta),
                    torch.empty(128, 128, **meta), torch.empty(128, **meta)]
    q = torch.empty(p["B"], p["S"], p["H"], p["D"], dtype=torch.float16, **meta)
    args = [q, q.clone(), q.clone()]
    if name == "keyformer":
        args.append(torch.empty(p["B"], p["H"], p["S"], p["S"], **meta))
    if name == "corm":
        args.append(torch.empty(p["S"], p["S"], **meta))
    return fn, args


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", help="where to write the hashes")
    ap.add_argument("--compare", help="an earlier run's JSON: report every kernel that differs, exit 1 if any")
    a = ap.parse_args()
    import test_fuzz

    import fuzz_programs
    out: dict = {}
    for name in workloads.NAMES:
        fn, args = workloads.make(name, device="cpu", dtype=torch.float32, **workloads.SMALL)
        kernels(f"{name}/small", fn, list(args), out)
        kernels(f"{name}/paper", *_paper(name), out)
    for name in programs.NAMES:
        for dtype in (torch.float16, torch.bfloat16):
            fn, args = programs.make(name, device="cpu", dtype=dtype, **programs.SMALL)
            kernels(f"held/{name}/{str(dtype)[6:]}", fn, list(args), out)
    for fid, spec in zip(test_fuzz.FOUND_IDS, test_fuzz.FOUND):
        kernels(f"fuzz/{fid}", fuzz_programs.flat(spec), list(fuzz_programs.inputs(spec)), out)
    text = json.dumps(out, indent=1, sort_keys=True)
    Path(a.json).write_text(text)
    out = json.loads(text)       # compared as read back (tuples become lists)
    print(f"{len(out)} kernel sources")
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        differ = sorted(k for k in old.keys() | out.keys() if old.get(k) != out.get(k))
        for k in differ:
            print("differs:", k)
        print(f"{len(differ)} of {len(old.keys() | out.keys())} differ")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
