"""Column sums of softmax probabilities at extreme logits (float32 scores times t): eager's and flashtensor's
distance from the float64 answer, side by side (docs/design.md §6: no farther than eager's).

    python scripts/extreme_logits.py            # on a GPU machine; on the CPU under Triton's interpreter
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flashtensor as ft  # noqa: E402
from flashtensor.options import CONFIGS  # noqa: E402
from flashtensor.testing import rel_err  # noqa: E402


def scaled_h2o(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = q @ k.transpose(-1, -2) * t
    n = q.shape[-2]
    i = torch.arange(n, device=q.device)[:, None]
    j = torch.arange(n, device=q.device)[None, :]
    p = torch.softmax(s.masked_fill(j > i, float("-inf")), dim=-1)
    return p @ v, p.sum(dim=-2)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = 1000 if device == "cuda" else 200
    print("| t | eager o | eager column sums | flashtensor o | flashtensor column sums |")
    print("|---|---|---|---|---|")
    for t in (1.0, 100.0, 1000.0):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 4, n, 64 if device == "cuda" else 32, generator=g).to(device) for _ in range(3))
        exact = scaled_h2o(q.double(), k.double(), v.double(), t)
        eager = scaled_h2o(q, k, v, t)
        fused = ft.compile(scaled_h2o, cache=False, configs=[CONFIGS[0]], eager_if_faster=False)(q, k, v, t)
        cells = [f"{rel_err(a.double(), r):.1e}" for a, r in zip(list(eager) + list(fused), list(exact) * 2)]
        print(f"| {t:g} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
