"""Render a bench.py results JSON as the BENCHMARKS.md section:

    python -m flashtensor.bench.to_markdown results.json >> BENCHMARKS.md
"""
from __future__ import annotations

import json
import sys

LABELS = {"eager": "eager", "compile": "torch.compile", "max-autotune": "max-autotune",
          "flex": "FlexAttention", "sdpa": "SDPA", "flashtensor": "flashtensor", "sdpa-attn": "SDPA on attn"}
LINEAR = ("ea", "sima")  # linear attention: SDPA's attn time is no yardstick for these (docs/design.md §4)
FAIL = "✗"


def ms(results: dict, name: str, system: str) -> float | None:
    """Median ms of one measurement, or None where it was not run or raised."""
    rec = results["workloads"].get(name, {}).get(system)
    return rec["ms"] if rec and not rec["error"] else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def speedup(results: dict, name: str, system: str) -> float | None:
    """How many times faster than eager `system` runs `name`."""
    return _ratio(ms(results, name, "eager"), ms(results, name, system))


def yardstick_ms(results: dict, name: str) -> float | None:
    """SDPA on attn, every attention-family workload's yardstick: the time taken in `name`'s own rounds
    where the run has one (bench.py's "sdpa-attn"), else attn's SDPA time or an older run's single one."""
    return ms(results, name, "sdpa-attn") or ms(results, "attn", "sdpa") or results.get("sdpa_attn_ms")


def _fmt_ms(x: float) -> str:
    return f"{x:.3f}" if x < 1 else f"{x:.2f}"


def _fmt_x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _fmt_r(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _time_cell(rec: dict | None) -> str:
    if rec is None:
        return "-"
    if rec["error"]:
        return "error"
    return _fmt_ms(rec["ms"]) + ("" if rec["ok"] else " " + FAIL)


def _check_cell(rec: dict | None) -> str:
    if rec is None:
        return "-"
    if rec["error"]:
        return "error"
    parts = [f"{max(rec['rel_err']):.1e}"] if rec["rel_err"] else []
    parts += [f"bool {max(rec['bool_mismatch']):.1e}"] if rec["bool_mismatch"] else []
    return ", ".join(parts) + ("" if rec["ok"] else " " + FAIL)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _time_table(results: dict) -> list[str]:
    systems = results["systems"]
    ft = "flashtensor" in systems
    side = any("sdpa-attn" in recs for recs in results["workloads"].values())
    yard = {n: None if n in LINEAR else yardstick_ms(results, n) for n in results["workloads"]}
    ratios = []
    if ft and "eager" in systems:
        ratios.append(("ft vs eager", lambda n: _fmt_x(speedup(results, n, "flashtensor"))))
    if ft and "compile" in systems:
        ratios.append(("ft vs torch.compile",
                       lambda n: _fmt_x(_ratio(ms(results, n, "compile"), ms(results, n, "flashtensor")))))
    if ft and side:
        ratios.append(("SDPA-attn", lambda n: "-" if (y := yard[n]) is None else _fmt_ms(y)))
    if ft and any(yard.values()):
        ratios.append(("ft / SDPA-attn", lambda n: _fmt_r(_ratio(ms(results, n, "flashtensor"), yard[n]))))
    rows = [[n] + [_time_cell(recs.get(s)) for s in systems] + [f(n) for _, f in ratios]
            for n, recs in results["workloads"].items()]
    lines = _table(["workload"] + [LABELS[s] for s in systems] + [h for h, _ in ratios], rows)
    note = f"{FAIL}: failed the correctness check below. ft vs X: X's time over flashtensor's; "
    if side:
        note += ("ft / SDPA-attn: flashtensor's time over SDPA's on attn's inputs of the same shape, timed in "
                 "the same rounds as the workload (SDPA-attn; for attn, its SDPA column).")
    else:
        single = next((y for y in yard.values() if y), None)
        note += "ft / SDPA-attn: flashtensor's time over SDPA's on attn" + \
            (f" ({_fmt_ms(single)} ms)." if single else ".")
    return lines + ["", note]


def markdown(results: dict) -> str:
    """The BENCHMARKS.md section for one bench.py run (the parsed JSON)."""
    d = results["dims"]
    dims = ", ".join(f"{k}={v}" for k, v in d.items())
    lines = [f"### {results['device']}, {results['date']}", "",
             f"torch {results['torch']}, triton {results['triton']}, CUDA {results['cuda']}; "
             f"{results['shape']} shapes ({dims}), {results['dtype']}."]
    c = results.get("ceilings")
    if c:
        lines.append(f"Ceilings: fp16 matmul {c['matmul_tflops']:.0f} TFLOP/s, device copy {c['copy_tbps']:.2f} TB/s.")
    lines.append("")
    if results["timed"]:
        rounds = results.get("rounds", 1)
        each = f"; each the median of {rounds} rounds that time every system in turn:" if rounds > 1 else ":"
        lines += [f"Median ms of triton do_bench (warmup 25 ms, rep {results['rep_ms']} ms){each}", ""]
        lines += _time_table(results) + [""]
    systems = results["systems"]
    rows = [[n] + [_check_cell(recs.get(s)) for s in systems] for n, recs in results["workloads"].items()]
    lines += ["Correctness vs eager: relative error ||out-ref||/||ref|| in float32 (max over outputs; "
              "FlexAttention and SDPA: attention output only), boolean outputs: fraction mismatched. "
              "Tolerance fp16/bf16 2e-3, fp32 1e-4.", ""]
    lines += _table(["workload"] + [LABELS[s] for s in systems], rows)
    errors = [f"- {n} / {LABELS[s]}: {rec['error']}"
              for n, recs in results["workloads"].items() for s, rec in recs.items() if rec["error"]]
    if errors:
        lines += ["", "Errors:", ""] + errors
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m flashtensor.bench.to_markdown results.json >> BENCHMARKS.md", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        sys.stdout.write(markdown(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
