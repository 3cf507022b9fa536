"""Prefill with kvpress's H2O and SnapKV presses on a model of Llama-3-8B's dimensions: kvpress's own path, SDPA
without a press, and flashtensor's presses, side by side (issue #23).

    python -m flashtensor.bench.hf_prefill [--layers 4] [--lengths 4096,16384,32768] [--presses h2o,snapkv]
                                           [--ratio 0.5] [--window 64] [--reps 3] [--json out.json]
    python -m flashtensor.bench.hf_prefill --small     # a tiny fp32 model (Triton's interpreter without a GPU)

The model is randomly initialised (`from_config`, bf16) with Llama-3-8B's widths and --layers layers. Per length
and press three systems run one prefill each, as kvpress's pipeline does it (`with press(model):
model.model(ids, past_key_values=DynamicCache())`, plus lm_head on the last position for the logits check):
(a) kvpress's own press the way kvpress runs it: ObservedAttentionPress (H2O) on attn_implementation="eager",
which writes P in every layer for the press's forward hook, and SnapKVPress on "sdpa", which recomputes the last
window's attention itself; (b) "sdpa" with no press, the lower bound; (c) flashtensor's subclass of the same
press (flashtensor.integrations.kvpress), its statistic fused into the attention. (b) runs once per length.

Time: median of --reps CUDA-event timings after a warm-up call (each system's first call, where flashtensor
plans and tunes, is timed apart as first_s); peak: max_memory_allocated over one more call, the weights
included. Agreement: per layer, the fraction of the indices (c) keeps that (a) keeps too or scores at least as
high as its lowest kept one (so ties count), the worst layer shown; logits: max |(a) - (b)| and |(c) - (b)| of
the last position. Eager H2O is skipped where its B x H x S x S scores, float32 softmax and bf16 P (8 bytes per
element) exceed the free memory. Progress lines print as each system finishes; --json keeps the records.

On the H200 (torch 2.11 and transformers 5.17 there, while kvpress 0.5.5 needs transformers < 5.3), from the
repository root with .whl/ carried (transformers 5.2.0, kvpress 0.5.5, tokenizers 0.22.2 since transformers 5.2
refuses the machine's 0.23.2, and what kvpress imports that the machine lacks: datasets, dill, multiprocess,
cachetools, fire, termcolor):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH && python3 -m flashtensor.bench.hf_prefill \
        --presses h2o --json $OUT/hf_prefill_h2o.json

and the same with --presses snapkv. One press per call because flashtensor's first call at each length plans and
tunes for about a minute per press (60-70 s each on the H200, 2026-12-02), which is most of a run: both presses
at all three lengths took about 9 minutes with 4 layers (the layer count barely changes it: every layer shares
one compiled program).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any, Callable, Optional, cast

import torch

from flashtensor.cli.main import _use_interpreter_without_gpu

from . import bench, long_seq

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072)
# initializer_range 0.2 as in tests/test_hf.py: peaked attention, so the presses' choices mean something
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=128, max_position_embeddings=256, initializer_range=0.2)
EAGER_BYTES = 8
"""Bytes per element of B x H x S x S that eager attention holds at once: its bf16 scores, the float32 softmax and
the bf16 P it casts that to."""


def _presses() -> dict[str, tuple[type, type, str]]:
    """Press name -> (kvpress's class, flashtensor's subclass, the attention implementation kvpress's runs on)."""
    import kvpress

    from flashtensor.integrations import kvpress as ft_kvpress
    return {"h2o": (kvpress.ObservedAttentionPress, ft_kvpress.ObservedAttentionPress, "eager"),
            "snapkv": (kvpress.SnapKVPress, ft_kvpress.SnapKVPress, "sdpa")}


def _model(config: dict, layers: int, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig
    with torch.device(device):      # initialised where it runs: a CPU init of 2B parameters takes minutes
        model = AutoModelForCausalLM.from_config(LlamaConfig(**config, num_hidden_layers=layers), dtype=dtype,
                                                 attn_implementation="sdpa")
    return model.eval()


def _recording(press: Any) -> dict[int, torch.Tensor]:
    """The scores `press` gives each layer on its latest prefill (kvpress's `compress` keeps their top-k)."""
    scores: dict[int, torch.Tensor] = {}
    score = press.score

    def recorded(module: torch.nn.Module, *args: Any) -> torch.Tensor:
        scores[cast(int, module.layer_idx)] = out = score(module, *args)
        return out

    press.score = recorded
    return scores


def prefill(model: Any, ids: torch.Tensor, press: Any = None) -> torch.Tensor:
    """kvpress's pipeline's prefill: the base model over the prompt, the press compressing the cache in its
    forward hooks; then the last position's logits."""
    from transformers import DynamicCache
    with press(model) if press is not None else contextlib.nullcontext():
        hidden = model.model(input_ids=ids, past_key_values=DynamicCache()).last_hidden_state
    return model.lm_head(hidden[:, -1]).float()


def _measure(label: str, S: int, fn: Callable[[], torch.Tensor], reps: int) -> dict:
    """One system at one length: its first call (where flashtensor plans; its logits are the check's), then on a
    GPU the time and the peak memory."""
    rec: dict[str, Any] = {"system": label, "S": S, "status": "ok", "ms": None, "peak_gib": None}
    try:
        t = time.perf_counter()
        rec["logits"] = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        rec["first_s"] = time.perf_counter() - t
        if torch.cuda.is_available():
            rec["ms"] = long_seq._time(fn, reps)
            rec["peak_gib"] = long_seq._peak(fn) / 2**30
    except torch.OutOfMemoryError:
        rec["status"] = "OOM"
    except Exception as e:  # a failing system is reported and the run goes on
        rec["status"] = bench._error(e)
    bench._free()
    return rec


def agreement(ref: dict[int, torch.Tensor], got: dict[int, torch.Tensor], ratio: float) -> list[float]:
    """Per layer, the fraction of the indices `got`'s top-k keeps whose score in `ref` is at least `ref`'s lowest
    kept one: 1.0 where both keep the same keys up to ties (k as kvpress's `compress` picks it)."""
    from kvpress.utils import compute_n_kept
    out = []
    for layer in sorted(ref.keys() & got.keys()):
        a, c = ref[layer].float(), got[layer].float()
        n = compute_n_kept(a.shape[-1], ratio)
        lowest = a.topk(n, dim=-1).values[..., -1:]
        out.append(float((a.gather(-1, c.topk(n, dim=-1).indices) >= lowest).float().mean()))
    return out


def _fused() -> bool:
    """Whether every plan flashtensor made for the model's attention runs generated kernels (none priced eager)."""
    from flashtensor.integrations import transformers as ft_hf
    return all(not p.plan.eager for c in ft_hf.programs.values() for p in c.programs.values())


def _skip_eager(S: int, heads: int) -> Optional[str]:
    """Why eager attention at this length is not tried (on a GPU, its probabilities beyond the free memory)."""
    if not torch.cuda.is_available():
        return None
    bench._free()
    need, free = heads * S * S * EAGER_BYTES, torch.cuda.mem_get_info()[0]
    if need <= free:
        return None
    return f"skipped (P would be {heads * S * S * 2 / 2**30:.0f} GiB, {need / 2**30:.0f} GiB with its temporaries)"


def _diff(rec: dict, base: dict) -> Optional[float]:
    if "logits" not in rec or "logits" not in base:
        return None
    return float((rec["logits"] - base["logits"]).abs().max())


def run(config: dict, layers: int, lengths: list[int], presses: list[str], ratio: float, window: int, reps: int,
        device: str, dtype: torch.dtype, seed: int = 0) -> list[dict]:
    """Every length (shortest first, so a run cut short keeps them), (b) once and then per press (c) and (a)."""
    kinds = _presses()
    model = _model(config, layers, device, dtype)
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    print(f"model: {layers} layers, {weights:.2f} GiB of weights, {dtype}, {device}", flush=True)
    gen = torch.Generator().manual_seed(seed)
    records = []
    for S in lengths:
        ids = torch.randint(config["vocab_size"], (1, S), generator=gen).to(device)
        with torch.no_grad():
            model.set_attn_implementation("sdpa")
            base = _measure("sdpa", S, lambda: prefill(model, ids), reps)
            _progress(base)
            for name in presses:
                theirs, ours, implementation = kinds[name]
                fields: dict[str, Any] = {"compression_ratio": ratio}
                if name == "snapkv":
                    fields["window_size"] = window
                press_c, press_a = ours(**fields), theirs(**fields)
                scores_c, scores_a = _recording(press_c), _recording(press_a)
                c = _measure("flashtensor", S, lambda: prefill(model, ids, press_c), reps)
                c["fused"] = _fused()
                _progress(c, name)
                skip = _skip_eager(S, config["num_attention_heads"]) if implementation == "eager" else None
                a: dict[str, Any]
                if skip:
                    a = {"system": "kvpress", "S": S, "status": skip, "ms": None, "peak_gib": None}
                else:
                    model.set_attn_implementation(implementation)
                    a = _measure("kvpress", S, lambda: prefill(model, ids, press_a), reps)
                    model.set_attn_implementation("sdpa")
                _progress(a, name)
                ok = a["status"] == c["status"] == "ok"
                rec: dict[str, Any] = {"S": S, "press": name, "kvpress": a, "sdpa": base, "flashtensor": c,
                                       "agreement": agreement(scores_a, scores_c, ratio) if ok else [],
                                       "logits_diff_kvpress": _diff(a, base),
                                       "logits_diff_flashtensor": _diff(c, base)}
                records.append(rec)
                for system in (a, c):
                    system.pop("logits", None)
                print(f"S={S} {name}: kept-index agreement per layer {[round(x, 4) for x in rec['agreement']]}, "
                      f"last logits max |diff| vs sdpa: kvpress {rec['logits_diff_kvpress']}, "
                      f"flashtensor {rec['logits_diff_flashtensor']}", flush=True)
            base.pop("logits", None)
    return records


def _progress(rec: dict, press: str = "") -> None:
    ms = f"{rec['ms']:.2f} ms" if rec.get("ms") is not None else "untimed"
    peak = f", peak {rec['peak_gib']:.2f} GiB" if rec.get("peak_gib") is not None else ""
    first = f", first call {rec['first_s']:.1f} s" if "first_s" in rec else ""
    fused = "" if "fused" not in rec else ("" if rec["fused"] else " (a plan ran eager)")
    status = "" if rec["status"] == "ok" else f" {rec['status']}"
    print(f"S={rec['S']} {press or '-'} {rec['system']}:{status} {ms}{peak}{first}{fused}", flush=True)


def _cell(rec: dict, key: str, digits: int) -> str:
    """A number, or why there is none: in full in the time column, its first word in the others."""
    if rec["status"] != "ok":
        return rec["status"][:80] if key == "ms" else rec["status"].split()[0].rstrip(":")
    return "-" if rec.get(key) is None else f"{rec[key]:.{digits}f}"


def _ratio(x: dict, y: dict) -> str:
    return f"{x['ms'] / y['ms']:.2f}x" if x.get("ms") and y.get("ms") else "-"


def markdown(records: list[dict], press: str) -> str:
    """One table per press: times, the ratios the issue asks about, peak memory, agreement with kvpress."""
    rows = ["| S | (a) kvpress ms | (b) sdpa ms | (c) flashtensor ms | (c)/(b) | (a)/(c) | (a) GiB | (b) GiB | "
            "(c) GiB | kept agree (worst layer) | logits diff (a), (c) vs (b) |", "|" + "---|" * 11]
    for r in (r for r in records if r["press"] == press):
        a, b, c = r["kvpress"], r["sdpa"], r["flashtensor"]
        agree = f"{min(r['agreement']):.4f}" if r["agreement"] else "-"
        diffs = ", ".join("-" if d is None else f"{d:.3g}"
                          for d in (r["logits_diff_kvpress"], r["logits_diff_flashtensor"]))
        rows.append(f"| {r['S']} | {_cell(a, 'ms', 2)} | {_cell(b, 'ms', 2)} | {_cell(c, 'ms', 2)} | "
                    f"{_ratio(c, b)} | {_ratio(a, c)} | {_cell(a, 'peak_gib', 2)} | {_cell(b, 'peak_gib', 2)} | "
                    f"{_cell(c, 'peak_gib', 2)} | {agree} | {diffs} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashtensor.bench.hf_prefill", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lengths", default="4096,16384,32768")
    p.add_argument("--presses", default="h2o,snapkv")
    p.add_argument("--ratio", type=float, default=0.5, help="compression ratio: the fraction of the cache dropped")
    p.add_argument("--window", type=int, default=64, help="SnapKV's window_size")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--small", action="store_true", help="a tiny fp32 model, 2 layers, lengths 64,128 (CPU)")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    device = _use_interpreter_without_gpu()
    presses = [x for x in args.presses.split(",") if x]
    if args.small:
        config, layers, lengths, window, dtype = SMALL, 2, [64, 128], 8, torch.float32
    else:
        config, layers, window, dtype = LLAMA3_8B, args.layers, args.window, torch.bfloat16
        lengths = [int(x) for x in args.lengths.split(",")]
    records = run(config, layers, lengths, presses, args.ratio, window, args.reps, device, dtype)
    for name in presses:
        print(f"\n{name} (compression ratio {args.ratio}, {layers} layers):\n{markdown(records, name)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "layers": layers,
                       "config": config, "ratio": args.ratio, "window": window, "records": records}, f, indent=1)
    return 0 if all(r[s]["status"] == "ok" or r[s]["status"].startswith("skipped")
                    for r in records for s in ("kvpress", "sdpa", "flashtensor")) else 1


if __name__ == "__main__":
    sys.exit(main())
