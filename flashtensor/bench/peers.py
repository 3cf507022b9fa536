"""The programs of real models against their peers, in one run: masks FlexAttention can express, GQA statistics,
linear attention.

    python -m flashtensor.bench.peers [--parts masks,gqa,linear] [--rows causal,window,...] [--json F] \
        [--rep N] [--rounds N] [--no-time] [--peers eager,compile,flex]

masks: each row is one attention program (a mask, and a bias or soft-cap where it has one) in three forms, as
real code writes it: the mask built inside the function from `arange` ("inside"), the same mask built as a bool
tensor outside and captured from the enclosing scope ("captured"), and Hugging Face's 4-D additive mask of 0 and
finfo.min passed in ("passed"). flashtensor and torch.compile run each form; FlexAttention runs the row once, with
the equivalent block mask (built once, untimed, as its users build it) and score_mod. gqa: kvpress's
accumulated attention per KV head (`programs.h2o_kv_heads`) with 8 KV heads against the same program with one KV
head per query head. linear: EA and SimA at the paper's shapes. Every system's output is checked against eager
under the contract (`held.check_outputs`); then, per row or part, all of them are timed in interleaved rounds
(`bench.time_rounds`). Without a GPU only the checks run, at small shapes, under Triton's interpreter, with
FlexAttention uncompiled. Exits 1 if any check of flashtensor's fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

import flashtensor as ft
from flashtensor import workloads
from flashtensor.cli.main import _use_interpreter_without_gpu

from . import bench, held, programs

FORMS = ("inside", "captured", "passed")
PARTS = ("masks", "gqa", "linear")
GPU = dict(B=1, H=32, S=4096, D=128)
SMALL = dict(B=1, H=4, S=64, D=16)
SINKS = 4          # attention sinks of the sink-plus-window row (StreamingLLM's four)
CAP = 50.0         # Gemma 2's attention logit soft-cap


# ---- the rows of the masks part --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Row:
    """One program: which keys a query sees (`visible`, of broadcasting query and key positions; S is the length)
    and what is added to or done with the scaled scores (`bias`: "", "alibi", "t5" or "softcap")."""
    visible: Callable[[Tensor, Tensor, int], Tensor]
    bias: str = ""


ROWS: dict[str, Row] = {
    "causal": Row(lambda i, j, S: j <= i),
    "window": Row(lambda i, j, S: (j <= i) & (j > i - S // 4)),
    "sinks_window": Row(lambda i, j, S: (j <= i) & ((j < SINKS) | (j > i - S // 4))),
    "prefix_lm": Row(lambda i, j, S: (j <= i) | (j < S // 4)),
    "chunked": Row(lambda i, j, S: (j <= i) & (i // (S // 4) == j // (S // 4))),     # Llama 4's, four chunks
    "alibi": Row(lambda i, j, S: j <= i, "alibi"),
    "t5_bias": Row(lambda i, j, S: j <= i, "t5"),
    "softcap": Row(lambda i, j, S: j <= i, "softcap"),
}


def _scores(row: Row, query: Tensor, key: Tensor, extra: tuple, i: Tensor, j: Tensor) -> Tensor:
    """The scaled scores with the row's bias: ALiBi's float32 slope per head times (j - i), a T5 bias tensor
    added, or Gemma 2's tanh soft-cap."""
    scores = torch.matmul(query, key.transpose(2, 3)) * query.shape[-1] ** -0.5
    if row.bias == "alibi":
        scores = scores + extra[0][:, None, None] * (j - i)
    elif row.bias == "t5":
        scores = scores + extra[0]
    elif row.bias == "softcap":
        scores = torch.tanh(scores / CAP) * CAP
    return scores


def _probs_times_values(scores: Tensor, value: Tensor) -> Tensor:
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype), value)


def _positions(query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
    return (torch.arange(query.shape[-2], device=query.device)[:, None],
            torch.arange(key.shape[-2], device=key.device)[None, :])


def program(row: Row, form: str, S: int, device: str | torch.device) -> Callable[..., Tensor]:
    """The row's attention in one of FORMS, as a function of (query, key, value, *extra[, attention_mask])."""
    if form == "inside":
        def inside(query: Tensor, key: Tensor, value: Tensor, *extra: Tensor) -> Tensor:
            i, j = _positions(query, key)
            scores = _scores(row, query, key, extra, i, j)
            scores = scores.masked_fill(~row.visible(i, j, key.shape[-2]), torch.finfo(scores.dtype).min)
            return _probs_times_values(scores, value)
        return inside
    if form == "captured":
        pos = torch.arange(S, device=device)
        visible = row.visible(pos[:, None], pos[None, :], S)     # built once, outside, as a module would

        def captured(query: Tensor, key: Tensor, value: Tensor, *extra: Tensor) -> Tensor:
            i, j = _positions(query, key)
            scores = _scores(row, query, key, extra, i, j)
            return _probs_times_values(scores.masked_fill(~visible, torch.finfo(scores.dtype).min), value)
        return captured

    def passed(query: Tensor, key: Tensor, value: Tensor, *extra_and_mask: Tensor) -> Tensor:
        *extra, attention_mask = extra_and_mask
        i, j = _positions(query, key)
        return _probs_times_values(_scores(row, query, key, tuple(extra), i, j) + attention_mask, value)
    return passed


def inputs(row: Row, form: str, dtype: torch.dtype, device: str | torch.device, B: int, H: int, S: int, D: int,
           seed: int = 0) -> tuple:
    """q, k, v (B, H, S, D), the row's extra input (ALiBi's slopes, the T5 bias) and, passed in, the mask."""
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, D, generator=g, device=device, dtype=dtype) for _ in range(3))
    extra: tuple = ()
    if row.bias == "alibi":
        extra = (torch.tensor([2 ** (-8 * (h + 1) / H) for h in range(H)], device=device),)
    elif row.bias == "t5":
        extra = (torch.randn(1, H, S, S, generator=g, device=device, dtype=dtype),)
    if form == "passed":
        pos = torch.arange(S, device=device)
        keep = row.visible(pos[:, None], pos[None, :], S)
        mask = torch.zeros(S, S, device=device, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)
        extra += (mask[None, None].expand(B, 1, S, S),)
    return (q, k, v, *extra)


def flex(row: Row, args: tuple, compiled: bool) -> Callable[..., Tensor]:
    """FlexAttention for the row: its block mask from `visible`, its bias or cap as score_mod (after flex's own
    scale of 1/sqrt(D), as in the programs)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    q, extra = args[0], args[3:]
    S = q.shape[-2]
    block_mask = create_block_mask(lambda b, h, qi, kj: row.visible(qi, kj, S), None, None, S, S, device=q.device)
    score_mod: Callable | None = None
    if row.bias == "alibi":
        slopes = extra[0]

        def score_mod(s: Tensor, b: Tensor, h: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
            return s + slopes[h] * (kj - qi)
    elif row.bias == "t5":
        bias = extra[0]

        def score_mod(s: Tensor, b: Tensor, h: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
            return s + bias[0, h, qi, kj]
    elif row.bias == "softcap":
        def score_mod(s: Tensor, b: Tensor, h: Tensor, qi: Tensor, kj: Tensor) -> Tensor:
            return torch.tanh(s / CAP) * CAP
    attend: Any = bench._compiled_flex() if compiled else flex_attention

    def run(query: Tensor, key: Tensor, value: Tensor, *_: Tensor) -> Tensor:
        return attend(query, key, value, score_mod=score_mod, block_mask=block_mask)
    return run


# ---- building, checking and timing -----------------------------------------------------------------------------

def _record() -> dict[str, Any]:
    return {"ms": None, "ms_rounds": [], "ok": None, "error": None, "errors": [], "fused": None}


def _checked(rec: dict, fn: Callable, args: tuple, run: Callable, ref: Any) -> bool:
    """Run `run` on `args` and check it against eager's `ref` (float64 rule: `fn` on float64 copies)."""
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", ft.FallbackWarning)
            out = run(*args)
        matches = held.check_outputs(fn, args, out, ref)
    except Exception as e:  # noqa: BLE001 - a crash is a result, recorded
        rec["ok"], rec["error"] = False, bench._error(e)
        return False
    rec["errors"] = [m.error for m in matches]
    rec["ok"] = all(m.ok for m in matches)
    if not rec["ok"]:
        rec["error"] = "; ".join(m.problem for m in matches if m.problem)[:300]
    return True


def systems(fn: Callable, args: tuple, peers: list[str], flex_run: Callable | None,
            variants: dict[str, dict] | None = None) -> tuple[dict, dict]:
    """Each system's record and callable for one program, checked against eager: "ft", "ft/NAME" for each of
    `variants` (flashtensor with those compile options), and of `peers` "eager", "compile" and (where given)
    "flex"."""
    with torch.no_grad():
        ref = fn(*args)
    ours = {"ft": ft.compile(fn), **{f"ft/{k}": ft.compile(fn, **o) for k, o in (variants or {}).items()}}
    made: dict[str, Any] = {**ours, "eager": fn, "compile": torch.compile(fn)}   # compiled when run
    if flex_run is not None:
        made["flex"] = flex_run
    recs, runs = {}, {}
    for name in list(ours) + [p for p in peers if p in made]:
        recs[name] = rec = _record()
        if _checked(rec, fn, args, made[name], ref):
            runs[name] = (made[name], args)
    for name, compiled in ours.items():
        prog = compiled.program_for(list(args))
        recs[name].update(fused=held.outcome(prog), kernels=len(prog.launches))
    return recs, runs


def _timed(recs: dict, runs: dict, rep: int | None, rounds: int) -> None:
    """Time `runs` in interleaved rounds into `recs` (skipped where rep is None: no GPU, or --no-time)."""
    if rep is not None and runs:
        bench.time_rounds(runs, recs, rep, rounds)
    bench._free()


def masks_part(out: dict, rows: list[str], peers: list[str], dims: dict, dtype: torch.dtype, device: str,
               rep: int | None, rounds: int, say: Callable[[str], None]) -> None:
    """Per row into `out`, flashtensor and torch.compile in each form, eager (inside) and FlexAttention, timed
    side by side."""
    for name in rows:
        row = ROWS[name]
        recs, runs = {}, {}
        for form in FORMS:
            fn = program(row, form, dims["S"], device)
            args = inputs(row, form, dtype, device, **dims)
            flex_run = flex(row, args, compiled=device == "cuda") if form == "inside" else None
            got, timed = systems(fn, args, [p for p in peers if p != "eager" or form == "inside"], flex_run)
            for system, rec in got.items():
                key = system if system in ("eager", "flex") else f"{system}/{form}"
                recs[key] = rec
                if system in timed:
                    runs[key] = timed[system]
        torch._dynamo.reset()
        _timed(recs, runs, rep, rounds)
        out[name] = recs
        say(f"masks {name}: " + _line(recs))


def gqa_part(peers: list[str], dims: dict, dtype: torch.dtype, device: str, rep: int | None, rounds: int,
             say: Callable[[str], None]) -> dict:
    """h2o_kv_heads with a quarter as many KV heads as query heads (GQA) and with as many (no groups)."""
    recs, runs = {}, {}
    for label, kv in (("gqa", max(1, dims["H"] // 4)), ("mha", dims["H"])):
        fn, args = programs.make("h2o_kv_heads", device=device, dtype=dtype, KV=kv, **dims)
        got, timed = systems(fn, args, peers, None)
        for system, rec in got.items():
            recs[f"{system}/{label}"] = rec
            if system in timed:
                runs[f"{system}/{label}"] = timed[system]
    torch._dynamo.reset()
    _timed(recs, runs, rep, rounds)
    say("gqa: " + _line(recs))
    return recs


def linear_part(out: dict, peers: list[str], small: bool, device: str, rep: int | None, rounds: int,
                say: Callable[[str], None]) -> None:
    """EA and SimA (float32) at the paper's shapes into `out`, against torch.compile and eager; flashtensor also
    with its float32 contractions on the tensor cores ("ft/tf32x3", Options.f32_dot), its kernels kept even where
    eager is faster, so that their time shows."""
    shape = workloads.SMALL if small else workloads.PAPER
    for name in ("ea", "sima"):
        fn, args = workloads.make(name, device=device, N=shape["N"], BL=shape["BL"])
        recs, runs = systems(fn, args, peers, None, {"tf32x3": {"f32_dot": "tf32x3", "eager_if_faster": False}})
        torch._dynamo.reset()
        _timed(recs, runs, rep, rounds)
        out[name] = recs
        say(f"linear {name}: " + _line(recs))


def _line(recs: dict) -> str:
    def cell(k: str, r: dict) -> str:
        state = f"{r['ms']:.3f} ms" if r["ms"] is not None else ("pass" if r["ok"] else f"FAIL ({r['error']})")
        return f"{k} {state}" + (f" [{r['fused']}]" if r.get("fused") and r["fused"] != "fused" else "")
    return ", ".join(cell(k, r) for k, r in recs.items())


# ---- the report ------------------------------------------------------------------------------------------------

def _ms(recs: dict, key: str) -> float | None:
    r = recs.get(key)
    return r["ms"] if r and r["ok"] else None


def _fmt(x: float | None, unit: str = "") -> str:
    return held.fmt(x) + (unit if x is not None else "")


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def markdown(results: dict) -> str:
    """Tables per part, with the ratios issue 21 asks for: Flex / ft (at least 1), torch.compile / ft (more than
    1), sinks-plus-window / causal (at most 0.4), GQA / MHA (at most 1.15), EA and SimA compile / ft (at least 2)."""
    lines: list[str] = [f"{results['device']}, {results['date']}, dims {results['dims']}, {results['dtype']}", ""]
    masks = results.get("masks", {})
    if masks:
        lines += ["| program | form | eager ms | torch.compile ms | FlexAttention ms | flashtensor ms | check | "
                  "Flex / ft | compile / ft |", "|---|---|---|---|---|---|---|---|---|"]
        for name, recs in masks.items():
            for form in FORMS:
                f = recs.get(f"ft/{form}", _record())
                check = "pass" if f["ok"] else f"FAIL: {f['error']}"
                if f.get("fused") and f["fused"] != "fused":
                    check += f" ({f['fused']})"
                ms_ft, ms_c = _ms(recs, f"ft/{form}"), _ms(recs, f"compile/{form}")
                lines.append(f"| {name} | {form} | {_fmt(_ms(recs, 'eager'))} | {_fmt(ms_c)} | "
                             f"{_fmt(_ms(recs, 'flex'))} | {_fmt(ms_ft)} | {check} | "
                             f"{_fmt(_over(_ms(recs, 'flex'), ms_ft), 'x')} | {_fmt(_over(ms_c, ms_ft), 'x')} |")
        if "causal" in masks and "sinks_window" in masks:
            ratios = [_over(_ms(masks["sinks_window"], f"ft/{f}"), _ms(masks["causal"], f"ft/{f}")) for f in FORMS]
            lines += ["", "sinks + window over causal (flashtensor; at most 0.4): " +
                      ", ".join(f"{f} {_fmt(r)}" for f, r in zip(FORMS, ratios))]
    gqa = results.get("gqa")
    if gqa:
        lines += ["", "| program | KV heads | eager ms | torch.compile ms | flashtensor ms | check | compile / ft |",
                  "|---|---|---|---|---|---|---|"]
        for label in ("gqa", "mha"):
            f = gqa.get(f"ft/{label}", _record())
            ms_ft, ms_c = _ms(gqa, f"ft/{label}"), _ms(gqa, f"compile/{label}")
            lines.append(f"| h2o_kv_heads | {label} | {_fmt(_ms(gqa, f'eager/{label}'))} | {_fmt(ms_c)} | "
                         f"{_fmt(ms_ft)} | {'pass' if f['ok'] else 'FAIL'} | {_fmt(_over(ms_c, ms_ft), 'x')} |")
        lines += ["", "GQA over MHA (flashtensor; at most 1.15): " +
                  _fmt(_over(_ms(gqa, "ft/gqa"), _ms(gqa, "ft/mha")))]
    linear = results.get("linear", {})
    if linear:
        lines += ["", "| program | eager ms | torch.compile ms | flashtensor ms | check | compile / ft | "
                  "flashtensor (tf32x3) ms | check | compile / ft (tf32x3) |", "|---|---|---|---|---|---|---|---|---|"]
        for name, recs in linear.items():
            ms_ft, ms_c, ms_x3 = _ms(recs, "ft"), _ms(recs, "compile"), _ms(recs, "ft/tf32x3")
            x3 = recs.get("ft/tf32x3", _record())
            lines.append(f"| {name} | {_fmt(_ms(recs, 'eager'))} | {_fmt(ms_c)} | {_fmt(ms_ft)} | "
                         f"{'pass' if recs['ft']['ok'] else 'FAIL'} | {_fmt(_over(ms_c, ms_ft), 'x')} | "
                         f"{_fmt(ms_x3)} | {'pass' if x3['ok'] else 'FAIL'} | {_fmt(_over(ms_c, ms_x3), 'x')} |")
    return "\n".join(lines)


def _ft_records(results: dict) -> list[dict]:
    """flashtensor's records (keys "ft" and "ft/FORM"), whose checks decide the exit status."""
    tables = list(results.get("masks", {}).values()) + list(results.get("linear", {}).values())
    tables += [results["gqa"]] if "gqa" in results else []
    return [r for t in tables for k, r in t.items() if k.split("/")[0] == "ft"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m flashtensor.bench.peers", description=__doc__.splitlines()[0])
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated, from %(default)s")
    p.add_argument("--rows", default=",".join(ROWS), help="the masks part's rows (default: all)")
    p.add_argument("--peers", default="eager,compile,flex", help="besides flashtensor (default %(default)s)")
    p.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    p.add_argument("--json", default="", help="write every record here ('' for none)")
    p.add_argument("--rep", type=int, default=50, help="do_bench rep, in ms (default %(default)s)")
    p.add_argument("--rounds", type=int, default=3, choices=range(1, 100), metavar="N",
                   help="time each system N times, interleaved; report the median (default %(default)s)")
    p.add_argument("--no-time", action="store_true", help="compile and check only (fills the compilers' caches)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    device = _use_interpreter_without_gpu()
    cuda = device == "cuda"
    parts = [p for p in args.parts.split(",") if p]
    rows = [r for r in args.rows.split(",") if r]
    peers = [p for p in args.peers.split(",") if p]
    unknown = [x for x in parts if x not in PARTS] + [r for r in rows if r not in ROWS] + \
        [p for p in peers if p not in ("eager", "compile", "flex")]
    if unknown:
        parser.error(f"unknown part, row or peer: {', '.join(unknown)}")
    if not cuda:   # the interpreter computes masked-off lanes too; eager flex warns that it materialises scores
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="triton.runtime.interpreter")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="triton.runtime.interpreter")
        warnings.filterwarnings("ignore", category=UserWarning, module="torch.nn.attention.flex_attention")
    import triton
    dims = GPU if cuda else SMALL
    dtype = bench.DTYPES[args.dtype]
    rep = args.rep if cuda and not args.no_time else None
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton interpreter)",
        "torch": torch.__version__, "triton": triton.__version__, "dims": dims, "dtype": args.dtype,
        "rep_ms": args.rep, "rounds": args.rounds}

    def say(line: str) -> None:
        print(line, flush=True)
        if args.json:    # after every part, so that an interrupted run keeps what it measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    if "masks" in parts:
        masks_part(results.setdefault("masks", {}), rows, peers, dims, dtype, device, rep, args.rounds, say)
    if "gqa" in parts:
        results["gqa"] = gqa_part(peers, dims, dtype, device, rep, args.rounds, say)
    if "linear" in parts:
        linear_part(results.setdefault("linear", {}), peers, not cuda, device, rep, args.rounds, say)
    say("")
    print(markdown(results), flush=True)
    return 0 if all(r["ok"] for r in _ft_records(results)) else 1


if __name__ == "__main__":
    sys.exit(main())
