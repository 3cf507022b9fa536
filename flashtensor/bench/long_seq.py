"""h2o at growing sequence length on one GPU: time and peak memory of flashtensor, eager and torch.compile,
and at long lengths a check of flashtensor against a chunked float32 reference on sampled rows and columns.

    python -m flashtensor.bench.long_seq [--lengths 1024,2048,...] [--json out.json] [--plot out.png]

Peak memory is torch's max_memory_allocated during one call, reported next to the bytes of the
inputs plus outputs. A system that runs out of memory is recorded as OOM and not tried at longer lengths.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from typing import Any, Callable, Sequence

import torch

import flashtensor as ft
from flashtensor import workloads

H, D = 32, 128
LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def _time(fn, reps: int) -> float:
    """Median ms over `reps` calls after one warm-up, timed with CUDA events."""
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _peak(fn) -> int:
    """Peak bytes allocated during one call (inputs already allocated are counted)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    del out
    return torch.cuda.max_memory_allocated()


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: list[int], rows: list[int], cols: list[int],
              chunk: int = 4096) -> tuple[list[tuple[int, list[int], torch.Tensor]], torch.Tensor]:
    """Eager's h2o semantics (fp16 scores, float32 softmax) in float32 chunks, for a few heads:
    the attention output at `rows` and the column sums at `cols`."""
    S = q.shape[1]
    scale = 1 / math.sqrt(D)
    o_rows, col = [], []
    for h in heads:
        qh, kh, vh = (t[0, :, h].float() for t in (q, k, v))
        colsum = torch.zeros(S, device=q.device)
        for lo in range(0, S, chunk):
            s = (qh[lo:lo + chunk] @ kh.T).half().float()
            s = (s.half() * scale).float()                     # eager: fp16 matmul output times the scale, in fp16
            i = torch.arange(lo, min(lo + chunk, S), device=q.device)[:, None]
            s = s.masked_fill(torch.arange(S, device=q.device)[None, :] > i, -math.inf)
            p = torch.softmax(s, dim=-1)
            colsum += p.sum(0)
            sel = [r - lo for r in rows if lo <= r < lo + chunk]
            if sel:
                o_rows.append((h, [r for r in rows if lo <= r < lo + chunk], p[sel].half().float() @ vh))
        col.append(colsum[cols])
    return o_rows, torch.stack(col)


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, outs: tuple[torch.Tensor, torch.Tensor]) -> dict:
    S = q.shape[1]
    g = torch.Generator().manual_seed(S)
    heads = [0, H - 1]
    rows = sorted({0, S - 1, *torch.randint(0, S, (6,), generator=g).tolist()})
    cols = sorted({0, S - 1, *torch.randint(0, S, (6,), generator=g).tolist()})
    o_rows, col_ref = reference(q, k, v, heads, rows, cols)
    o, colsum = outs
    errs_o = []
    for h, rs, ref in o_rows:
        got = o[0, rs, h].float()
        errs_o.append(((got - ref).norm() / ref.norm()).item())
    got_col = colsum[0, heads][:, cols]
    err_col = ((got_col - col_ref).norm() / col_ref.norm()).item()
    return {"rows": rows, "cols": cols, "heads": heads, "rel_err_o": max(errs_o), "rel_err_colsum": err_col,
            "ok": max(errs_o) <= 2e-3 and err_col <= 1e-4}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    p.add_argument("--systems", default="flashtensor,eager,compile")
    p.add_argument("--check-from", type=int, default=32768, help="check against the chunked reference from this length")
    p.add_argument("--json")
    p.add_argument("--plot")
    a = p.parse_args(argv)
    systems = a.systems.split(",")
    dead: set[str] = set()
    rows = []
    compiled: dict[str, Callable] = {"flashtensor": ft.compile(workloads.h2o), "eager": workloads.h2o,
                "compile": torch.compile(workloads.h2o)}
    for S in map(int, a.lengths.split(",")):
        fn, args = workloads.make("h2o", device="cuda", dtype=torch.float16, S=S, H=H, D=D, B=1, seed=1)
        io = sum(t.numel() * t.element_size() for t in args) + args[0].numel() * 2 + H * S * 4
        for name in systems:
            row: dict[str, Any] = {"S": S, "system": name, "io_bytes": io}
            if name in dead:
                row["error"] = "skipped: out of memory at a shorter length"
                rows.append(row)
                continue
            f = compiled[name]
            try:
                with torch.no_grad():
                    outs = f(*args)
                    if name == "flashtensor" and S >= a.check_from:
                        row["check"] = check(args[0], args[1], args[2], outs)
                    del outs
                    row["peak_bytes"] = _peak(functools.partial(f, *args))
                    row["ms"] = _time(functools.partial(f, *args), reps=3 if S >= 32768 else 10)
            except torch.OutOfMemoryError:
                row["error"] = "OOM"
                dead.add(name)
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                dead.add(name)
            torch.cuda.empty_cache()
            rows.append(row)
            peak = row.get("peak_bytes", 0)     # set whenever row["ms"] is
            print(f"S={S:6d} {name:12s} " + (f"{row['ms']:10.3f} ms  peak {peak / 2**30:7.2f} GiB  "
                                              f"peak/(in+out) {peak / io:5.2f}" if "ms" in row else row["error"])
                  + (f"  check: o {row['check']['rel_err_o']:.1e}, colsum {row['check']['rel_err_colsum']:.1e}, "
                     f"{'PASS' if row['check']['ok'] else 'FAIL'}" if "check" in row else ""), flush=True)
        del args
        torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": __import__("triton").__version__, "H": H, "D": D, "dtype": "fp16", "rows": rows}
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(meta, fh, indent=1)
    if a.plot:
        plot(meta, a.plot)
    return 0 if all(r.get("check", {}).get("ok", True) for r in rows) else 1


def plot(meta: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name in dict.fromkeys(r["system"] for r in meta["rows"]):
        pts = [(r["S"], r["ms"], r["peak_bytes"] / 2**30) for r in meta["rows"] if r["system"] == name and "ms" in r]
        if pts:
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
            ax2.plot([p[0] for p in pts], [p[2] for p in pts], "o-", label=name)
    io = sorted({(r["S"], r["io_bytes"] / 2**30) for r in meta["rows"]})
    ax2.plot([x for x, _ in io], [y for _, y in io], "k--", label="inputs + outputs")
    for ax, title in ((ax1, "h2o time (ms)"), (ax2, "peak memory (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length S")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"h2o, H={meta['H']}, D={meta['D']}, fp16, {meta['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


if __name__ == "__main__":
    sys.exit(main())
