"""Shape-generic plans measured: a sweep of lengths, generic against exact-shape kernels, and decode shapes.

    python -m flashtensor.bench.generic sweep [--names h2o,keyformer] [--lengths 50] [--lo 1024] [--hi 32768]
    python -m flashtensor.bench.generic versus [--names attn,h2o,...] [--S 4096]
    python -m flashtensor.bench.generic decode [--q 1,4,16] [--kv 8192,32768,131072] [--splits N]
    python -m flashtensor.bench.generic compile [--names attn,h2o,...] [--S 4096]
    python -m flashtensor.bench.generic host [--names h2o] [--S 1024]
    python -m flashtensor.bench.generic wide [--S 47000]
    (--small: the CPU interpreter's shapes; every mode checks its outputs against eager where eager fits)

sweep: one `ft.compile(fn, dynamic=True)` per workload called at random lengths; per call the searches and
tunes it cost (`cache_info`), and per bucket the host time of a call in it (the call's wall time without
waiting for the GPU, median over repeats). versus: each workload's kernels planned for its exact shape and
generically, timed side by side. decode: h2o with a few queries against long keys, against eager,
torch.compile, and its attention alone (compiled too) against SDPA, with the split counts of their key loops
(codegen/split.py). compile: the wall time of each workload's first call, planning included (from the on-disk
cache when an earlier process stored the plan: run it twice for cold and cached). host: the host time of a call
in a tuned bucket of a generic plan, eager's beside it, and where it goes (the functions a profile of 100 calls
spends most time in). wide: keyformer planned for its exact shape with one head whose S x S noise passes 2**31
elements, so its kernels' tile offsets are int64 (codegen/tiles.py `offset`), against eager (about 60 GB at
S=47000). Results print as lines; --json keeps the records.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import random
import re
import statistics
import sys
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

import flashtensor as ft
from flashtensor import workloads
from flashtensor.cli.main import _use_interpreter_without_gpu
from flashtensor.ir.sizes import evaluate, pow2_bucket

from . import bench
from .ab import kernel_lines

ROUNDS = 5
"""versus: timings of each system, interleaved; one timing each differs by up to 5% between runs of the same
kernels on the H200."""
ATTENTION = ["attn", "h2o", "roco", "keyformer", "snapkv", "corm", "gemma2"]


def _host_us(f: Callable[[], Any], reps: int = 50) -> float:
    """Median wall time of a call in microseconds, not waiting for the device (what the host adds)."""
    f()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e6)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return statistics.median(times)


def _ms(f: Callable[[], Any], timed: bool) -> float | None:
    if not timed:
        return None
    import triton.testing
    return float(triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median"))


def _make(name: str, device: str, dims: dict, S: int, seed: int) -> tuple[Callable, tuple]:
    return workloads.make(name, device=device, **{**dims, "S": S}, seed=seed)


def sweep(names: list[str], lengths: list[int], device: str, dims: dict) -> list[dict]:
    out = []
    for name in names:
        c = ft.compile(workloads.make(name, device=device, **{**dims, "S": lengths[0]})[0], dynamic=True)
        seen: set[int] = set()
        for k, s in enumerate(lengths):
            fn, args = _make(name, device, dims, s, k)
            before = c.cache_info()
            with torch.no_grad():
                t = time.perf_counter()
                got = c(*args)
                first = time.perf_counter() - t
                ok = bench.compare(got, fn(*args))["ok"]
            after = c.cache_info()
            rec = {"program": name, "S": s, "bucket": pow2_bucket(s), "ok": ok, "first_s": first,
                   "searches": after["searches"] - before["searches"], "tunes": after["tunes"] - before["tunes"]}
            if pow2_bucket(s) not in seen:      # one host-time reading per bucket, on a call that plans nothing
                seen.add(pow2_bucket(s))
                rec["host_us"] = _host_us(lambda: c(*args))
            out.append(rec)
            print(f"sweep {name} S={s}: {'pass' if ok else 'FAIL'}, {rec['searches']} search(es), "
                  f"{rec['tunes']} tune(s), first call {first:.2f} s"
                  + (f", host {rec['host_us']:.1f} us" if "host_us" in rec else ""), flush=True)
            bench._free()
    return out


def versus(names: list[str], S: int, device: str, dims: dict, timed: bool) -> list[dict]:
    out = []
    for name in names:
        fn, args = _make(name, device, dims, S, 0)
        exact, generic = ft.compile(fn, dynamic=False), ft.compile(fn, dynamic=True)
        with torch.no_grad():
            ref = fn(*args)
            ok = bench.compare(exact(*args), ref)["ok"] and bench.compare(generic(*args), ref)["ok"]
            times: dict[str, list] = {"exact": [], "generic": []}
            for r in range(ROUNDS if timed else 0):      # interleaved, each first in every other round: clocks drift
                order = [("exact", exact), ("generic", generic)]
                for which, c in order if r % 2 == 0 else order[::-1]:
                    times[which].append(_ms(lambda: c(*args), timed))
            kernels = {which: kernel_lines(c.held_programs()[0], args, 50) if timed else []
                       for which, c in (("exact", exact), ("generic", generic))}
        e = statistics.median(times["exact"]) if timed else None
        g = statistics.median(times["generic"]) if timed else None
        rec = {"program": name, "S": S, "ok": ok, "exact_ms": e, "generic_ms": g, "rounds_ms": times,
               "generic_over_exact": g / e if e and g else None, "kernels": kernels,
               "generic": exact.cache_info()["generic"] == 0 and generic.cache_info()["generic"] == 1}
        out.append(rec)
        print(f"versus {name}: {'pass' if ok else 'FAIL'}, exact {e} ms, generic {g} ms"
              + ("" if rec["generic"] else " (the generic call planned for its shape: no generic plan)"), flush=True)
        for which, ks in kernels.items():
            print(f"  {which}: " + "; ".join(ks), flush=True)
        bench._free()
    return out


def first_call(names: list[str], S: int, device: str, dims: dict) -> list[dict]:
    out = []
    for name in names:
        fn, args = _make(name, device, dims, S, 0)
        c = ft.compile(fn)
        with torch.no_grad():
            t = time.perf_counter()
            got = c(*args)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            first = time.perf_counter() - t
            ok = bench.compare(got, fn(*args))["ok"]
        prog = c.program_for(args)
        rec = {"program": name, "S": S, "ok": ok, "first_s": first, "from_cache": prog.cached,
               "fused": not prog.plan.eager}
        out.append(rec)
        print(f"compile {name}: {'pass' if ok else 'FAIL'}, first call {first:.2f} s "
              f"({'from the cache' if prog.cached else 'planned'}{'' if rec['fused'] else ', eager'})", flush=True)
        bench._free()
    return out


def host(names: list[str], S: int, device: str, dims: dict) -> list[dict]:
    out = []
    for name in names:
        c = ft.compile(_make(name, device, dims, S, 0)[0], dynamic=True)
        fn, args = _make(name, device, dims, S - 3, 1)      # a second length: the generic plan, tuned for its bucket
        with torch.no_grad():
            c(*_make(name, device, dims, S, 0)[1])
            ok = bench.compare(c(*args), fn(*args))["ok"]
            us, eager_us = _host_us(lambda: c(*args)), _host_us(lambda: fn(*args))
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(100):
                c(*args)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
        rec = {"program": name, "S": S - 3, "ok": ok, "host_us": us, "eager_host_us": eager_us,
               "generic": c.cache_info()["generic"], "profile": text.getvalue()}
        out.append(rec)
        print(f"host {name} S={S - 3}: {'pass' if ok else 'FAIL'}, {us:.1f} us per call (eager {eager_us:.1f} us), "
              f"{rec['generic']} generic plan(s); profile of 100 calls:\n{rec['profile']}", flush=True)
        bench._free()
    return out


def wide(S: int, device: str) -> list[dict]:
    fn, args = workloads.make("keyformer", device=device, B=1, H=1, S=S, D=128 if device == "cuda" else 32, seed=0)
    c = ft.compile(fn, dynamic=False)
    with torch.no_grad():
        t = time.perf_counter()
        got = c(*args)
        first = time.perf_counter() - t
        ok = bench.compare(got, fn(*args))["ok"]
    # a tile vector widened (Tiles.offset), not the finite check's int64 program id
    int64 = any(re.search(r"o_\w+(\[[^\]]*\])?\.to\(tl\.int64\)", k.source) for k in c.program_for(args).kernels)
    print(f"wide keyformer S={S}: {'pass' if ok else 'FAIL'}, first call {first:.1f} s, int64 tile offsets: {int64}",
          flush=True)
    return [{"program": "keyformer", "S": S, "ok": ok, "first_s": first, "int64_tiles": int64}]


def _probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """P for q_len < kv_len ((B, S, H, D) inputs): the causal mask offset to the last q_len key positions."""
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    s = (qt @ kt.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    sq, sk = s.shape[-2:]
    s = s + torch.full((sq, sk), float("-inf"), device=q.device, dtype=s.dtype).triu(sk - sq + 1)
    return F.softmax(s.float(), dim=-1)


def _h2o_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h2o for q_len < kv_len: attention and the column sums of P."""
    p = _probs(q, k)
    return (p.to(q.dtype) @ v.transpose(1, 2)).transpose(1, 2).contiguous(), p.sum(dim=2)


def _attn_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Its attention alone (SDPA's program)."""
    return (_probs(q, k).to(q.dtype) @ v.transpose(1, 2)).transpose(1, 2).contiguous()


def _sdpa_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # the last q_len queries see every key up to their own position: bottom-right causal, as a boolean mask
    sq, sk = q.shape[1], k.shape[1]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=keep)
    return o.transpose(1, 2).contiguous()


def _split_counts(c: Any, args: tuple) -> list[int]:
    """How many programs split each split kernel's loop per row tile, in the program serving this call
    (codegen/split.py): decode's row kernel should have several."""
    prog = c.program_for(args)
    now = prog.sizes([args[i] for i in prog.tensor_positions])
    return [evaluate(k.splits, now) for k in prog.kernels if k.combine is not None]


def decode(qs: list[int], kvs: list[int], device: str, dims: dict, timed: bool, splits: int | None) -> list[dict]:
    out = []
    fast = ft.compile(_h2o_rows, dynamic=True, splits=splits)
    attn = ft.compile(_attn_rows, dynamic=True, splits=splits)
    compiled = torch.compile(_h2o_rows, dynamic=True) if timed else None
    g = torch.Generator(device=device).manual_seed(0)
    for kv in kvs:
        for q_len in qs:
            H, D, dt = dims["H"], dims["D"], bench.DTYPES.get("fp16") if timed else torch.float32
            q, k, v = (torch.randn(1, n, H, D, generator=g, device=device, dtype=dt) for n in (q_len, kv, kv))
            with torch.no_grad():
                ok = bench.compare(fast(q, k, v), _h2o_rows(q, k, v))["ok"] and \
                    bench.compare(attn(q, k, v), _attn_rows(q, k, v))["ok"]
                rec = {"q_len": q_len, "kv_len": kv, "ok": ok, "flashtensor_ms": _ms(lambda: fast(q, k, v), timed),
                       "eager_ms": _ms(lambda: _h2o_rows(q, k, v), timed),
                       "torch_compile_ms": _ms(lambda: compiled(q, k, v), timed) if compiled else None,
                       "attn_ms": _ms(lambda: attn(q, k, v), timed), "sdpa_ms": _ms(lambda: _sdpa_rows(q, k, v), timed),
                       "splits": _split_counts(fast, (q, k, v)), "attn_splits": _split_counts(attn, (q, k, v))}
            out.append(rec)
            print("decode " + ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in rec.items()), flush=True)
            bench._free()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashtensor.bench.generic", description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["sweep", "versus", "decode", "compile", "host", "wide"])
    p.add_argument("--names", default="", help="workloads (sweep: h2o,keyformer; versus: the seven attention ones)")
    p.add_argument("--lengths", type=int, default=50, help="sweep: how many random lengths")
    p.add_argument("--lo", type=int, default=1024)
    p.add_argument("--hi", type=int, default=32768)
    p.add_argument("--S", type=int, default=0,
                   help="versus, compile (4096), host (1024), wide (47000): the sequence length")
    p.add_argument("--heads", type=int, default=32, help="heads (keyformer's noise is B x H x S x S)")
    p.add_argument("--q", default="1,4,16", help="decode: query lengths")
    p.add_argument("--kv", default="8192,32768,131072", help="decode: key lengths")
    p.add_argument("--splits", type=int, default=None,
                   help="decode: force the key loop's split count (default: from the sizes; --small: 3)")
    p.add_argument("--small", action="store_true", help="tiny shapes for the CPU interpreter")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    device = _use_interpreter_without_gpu()
    timed = device == "cuda"
    dims = {"H": 2, "D": 32, "B": 1} if args.small else {"H": args.heads, "D": 128, "B": 1}
    if args.mode == "sweep":
        names = [n for n in (args.names or "h2o,keyformer").split(",") if n]
        lo, hi = (16, 160) if args.small else (args.lo, args.hi)
        draw = random.Random(0)
        lengths = [draw.randint(lo, hi) for _ in range(args.lengths)]
        recs = sweep(names, lengths, device, dims)
    elif args.mode == "wide":
        recs = wide(96 if args.small else args.S or 47000, device)
    elif args.mode == "host":
        names = [n for n in (args.names or "h2o").split(",") if n]
        recs = host(names, 96 if args.small else args.S or 1024, device, dims)
    elif args.mode in ("versus", "compile"):
        names = [n for n in (args.names or ",".join(ATTENTION)).split(",") if n]
        S = 96 if args.small else args.S or 4096
        recs = versus(names, S, device, dims, timed) if args.mode == "versus" else first_call(names, S, device, dims)
    else:
        kvs = [40, 100] if args.small else [int(x) for x in args.kv.split(",")]
        splits = 3 if args.small and args.splits is None else args.splits   # the CPU's lengths fill no GPU
        recs = decode([int(x) for x in args.q.split(",")], kvs, device, dims, timed, splits)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": args.mode, "device": torch.cuda.get_device_name() if timed else "cpu", "records": recs},
                      f, indent=1)
    return 0 if all(r["ok"] for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
