"""A fuzz find whose outputs miss the contract on a GPU only: its plan's kernels as built, then with parts of
their source swapped (Triton's fast exp2 and log for libdevice's, say), each variant's distance from eager and
from the float64 answer, and the elements farthest from eager, so that the step which moves a rounding shows.

    PYTHONPATH=$PWD python scripts/fuzz_variants.py "Spec(...)" [--output 0]
    TRITON_DEFAULT_FP_FUSION=0 PYTHONPATH=$PWD python scripts/fuzz_variants.py "Spec(...)"   # FMA contraction off

The spec is a line as the campaign logs it (tests/test_fuzz.py's failures) or a file holding one.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
# before test_fuzz imports tests/conftest.py, which defaults it to the interpreter: on a GPU that ran the plan's
# kernels nowhere, and every variant was eager's answer
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import test_fuzz  # noqa: E402

import flashtensor as ft  # noqa: E402
from flashtensor.api.compiled import Compiled  # noqa: E402
from flashtensor.options import CONFIGS  # noqa: E402
from flashtensor.runtime.launch import Launch, load_kernel  # noqa: E402
from flashtensor.testing import rel_err  # noqa: E402
from fuzz_programs import Spec, build, inputs, invoke  # noqa: E402

LIB = "tl.extra.cuda.libdevice"
EXP2 = [("tl.exp2(", f"{LIB}.exp2(")]
LOG = [("tl.log(", f"{LIB}.log("), ("_log1p(", f"{LIB}.log1p(")]
VARIANTS: dict[str, list[tuple[str, str]]] = {"as built": [], "libdevice exp2": EXP2, "libdevice log": LOG,
                                              "libdevice exp2 and log": EXP2 + LOG}


def swapped(compiled: Compiled, swaps: list[tuple[str, str]]) -> None:
    """Every held program's kernels rebuilt from their source with `swaps` applied."""
    for prog in compiled.programs.values():
        launches = []
        for la in prog.launches:
            src = la.source.source
            for old, new in swaps:
                src = src.replace(old, new)
            k = dataclasses.replace(la.source, source=src)
            launches.append(Launch(k, load_kernel(k)))
        prog.launches = launches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", help="a Spec(...) line, or a file holding one")
    ap.add_argument("--output", type=int, default=0, help="which output to compare")
    a = ap.parse_args()
    text = Path(a.spec).read_text() if os.path.exists(a.spec) else a.spec
    spec = eval(text.strip(), {"Spec": Spec, "torch": torch, "inf": float("inf"), "nan": float("nan")})
    warnings.simplefilter("ignore")
    fn, args = build(spec), inputs(spec)
    with torch.no_grad():
        ref = test_fuzz.as_tuple(invoke(spec, fn, args, spec.scale))[a.output]
        exact = test_fuzz.as_tuple(test_fuzz.exact_outputs(spec, fn, args, spec.scale))[a.output]
    print(f"eager: {rel_err(ref, exact):.4e} from float64")
    for name, swaps in VARIANTS.items():
        compiled = ft.compile(fn, cache=False, configs=[CONFIGS[spec.config]], eager_if_faster=False)
        try:
            with torch.no_grad():
                invoke(spec, compiled, args, spec.scale)
                progs = compiled.programs.values()
                if not any(prog.launches for prog in progs):
                    raise SystemExit("the plan fused nothing: " + "; ".join(n for pr in progs for n in pr.notes))
                swapped(compiled, swaps)
                got = test_fuzz.as_tuple(invoke(spec, compiled, args, spec.scale))[a.output]
        except Exception as e:  # noqa: BLE001 - libdevice has no interpreter form: that variant is reported, not run
            print(f"{name}: {type(e).__name__}: {str(e)[:120]}")
            continue
        off = (got.double() - ref.double()).abs().flatten().cpu()
        print(f"{name}: {rel_err(got, exact):.4e} from float64, {rel_err(got, ref):.4e} from eager")
        for i in off.argsort(descending=True)[:4].tolist():
            print(f"    [{i}] ft {got.flatten()[i].item():.6g}  eager {ref.flatten()[i].item():.6g}  "
                  f"float64 {exact.flatten()[i].item():.6g}")


if __name__ == "__main__":
    main()
