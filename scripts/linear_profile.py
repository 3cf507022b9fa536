"""EA and SimA on a GPU: each kernel's time at every tile configuration, its registers and spills, for float32
contractions exact ("ieee") and as 3xTF32, beside eager and torch.compile; every output checked against eager.

    python scripts/linear_profile.py [--modes ieee,tf32x3] [ea sima]

With PYTHONPATH naming another tree (a `git archive REV flashtensor` copy) it measures that tree's compiler.
"""
from __future__ import annotations

import argparse
import logging
import os

os.environ.setdefault("TRITON_INTERPRET", "0")
import torch  # noqa: E402
import triton.testing  # noqa: E402

import flashtensor as ft  # noqa: E402
from flashtensor import workloads as W  # noqa: E402


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("flashtensor.runtime.autotune").setLevel(logging.DEBUG)
    logging.getLogger("flashtensor.progress").setLevel(logging.INFO)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", default=["ea", "sima"])
    ap.add_argument("--modes", default="ieee,tf32x3")
    opts = ap.parse_args()
    print("flashtensor from", os.path.dirname(ft.__file__))
    for name in opts.names:
        fn, args = W.make(name, device="cuda", **W.PAPER)
        ref = fn(*args)
        ref64 = fn(*[a.double() for a in args]).float()
        ms = {"eager": triton.testing.do_bench(lambda: fn(*args), rep=200)}
        comp = torch.compile(fn)
        comp(*args)
        ms["torch.compile"] = triton.testing.do_bench(lambda: comp(*args), rep=200)
        for mode in opts.modes.split(","):
            c = ft.compile(fn, f32_dot=mode, eager_if_faster=False, cache=False)
            out = c(*args)
            print(f"{name} {mode}: max |ft - eager| {(out - ref).abs().max().item():.2e}, |ft - f64| "
                  f"{(out - ref64).abs().max().item():.2e}, |eager - f64| {(ref - ref64).abs().max().item():.2e}")
            ms[f"ft {mode}"] = triton.testing.do_bench(lambda: c(*args), rep=200)
            for la in c.program_for(args).launches:
                for kern in la._kernels.values():
                    print(f"  {la.source.name}: blocks {la.source.blocks}, {la.source.num_warps} warps, "
                          f"{la.source.num_stages} stages, {getattr(kern, 'n_regs', '?')} registers, "
                          f"{getattr(kern, 'n_spills', '?')} spills, shared {kern.metadata.shared} B")
        print(name, "  ".join(f"{k} {v:.3f} ms" for k, v in ms.items()), flush=True)


if __name__ == "__main__":
    main()
