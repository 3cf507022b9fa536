"""A fuzz find whose outputs miss the contract on a GPU only: its plan's kernels as built, then with parts of
their source swapped (Triton's fast exp2 and log for libdevice's, say), then as the interpreter's plan emits them
(its dots of float32 operands rounded by hand, compiled for the GPU), with the GPU's helpers and then with the
interpreter's; each variant's distance from eager and from the float64 answer, the contract's verdict, and the
elements farthest from eager, so that the step which moves a rounding shows.

    PYTHONPATH=$PWD python scripts/fuzz_variants.py "Spec(...)" [--output 0] [--scale 0.125]
    TRITON_DEFAULT_FP_FUSION=0 PYTHONPATH=$PWD python scripts/fuzz_variants.py "Spec(...)"   # FMA contraction off
    PYTHONPATH=$PWD python scripts/fuzz_variants.py "Spec(...)" --resize 1 --output 1 --dump d.pt
    PYTHONPATH=$PWD python scripts/fuzz_variants.py "Spec(...)" --variants "as built,no dependent launch"

With --resize K the compared call is the campaign's K-th length of the program (fuzz_programs.resized), made after
the calls before it, so that it runs the shape-generic plan the campaign's did; --dump also writes the kernels'
sources of each variant to DUMP.kernels.txt.

Each variant's first call at the compared length, which plans and tunes (as built, before any swap), is checked
too, and which partition its search chose is printed. The spec is a line as the campaign logs it
(tests/test_fuzz.py's failures) or a file holding one.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
# before test_fuzz imports tests/conftest.py, which defaults it to the interpreter: on a GPU that ran the plan's
# kernels nowhere, and every variant was eager's answer
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import test_fuzz  # noqa: E402

import flashtensor as ft  # noqa: E402
from flashtensor import knobs  # noqa: E402
from flashtensor.api.compiled import Compiled  # noqa: E402
from flashtensor.runtime import launch, plan  # noqa: E402
from flashtensor.runtime.launch import Launch, load_kernel  # noqa: E402
from flashtensor.testing import rel_err  # noqa: E402
from fuzz_programs import TILES, Spec, build, inputs, invoke, resized  # noqa: E402

LIB = "tl.extra.cuda.libdevice"
EXP2 = [("tl.exp2(", f"{LIB}.exp2(")]
LOG = [("tl.log(", f"{LIB}.log("), ("_log1p(", f"{LIB}.log1p(")]
HELPERS = "flashtensor.codegen.triton_helpers"
INTERPRETED_HELPERS = [(f"from {HELPERS} import", "from ft_helpers_interpreted import")]
# name: (whether the plan is emitted as for the interpreter, the swaps, whether kernels launch dependent on the prior)
VARIANTS: dict[str, tuple[bool, list[tuple[str, str]], bool]] = {
    "as built": (False, [], True), "libdevice exp2": (False, EXP2, True), "libdevice log": (False, LOG, True),
    "libdevice exp2 and log": (False, EXP2 + LOG, True), "no dependent launch": (False, [], False),
    "interpreter's source": (True, [], True), "interpreter's source and helpers": (True, INTERPRETED_HELPERS, True)}


def interpreted_helpers() -> None:
    """The helpers module with its interpreter branches taken, importable as ft_helpers_interpreted."""
    src = (ROOT / "flashtensor" / "codegen" / "triton_helpers.py").read_text()
    src = src.replace("_INTERPRETED = tl.constexpr(knobs.interpret())", "_INTERPRETED = tl.constexpr(True)")
    where = knobs.cache_dir() / "helpers"
    where.mkdir(exist_ok=True)
    (where / "ft_helpers_interpreted.py").write_text(src.replace("from .. import knobs\n", ""))
    sys.path.insert(0, str(where))


def swapped(compiled: Compiled, swaps: list[tuple[str, str]]) -> None:
    """Every held program's kernels rebuilt from their source with `swaps` applied."""
    for prog in compiled.held_programs():
        launches = []
        for la in prog.launches:
            src = la.source.source
            for old, new in swaps:
                src = src.replace(old, new)
            k = dataclasses.replace(la.source, source=src)
            launches.append(Launch(k, load_kernel(k)))
        prog.launches = launches


def verdict(spec: Spec, fn: Any, args: tuple, outs: Any, refs: Any, scale: float) -> str:
    """The campaign's check of one call's outputs."""
    try:
        test_fuzz.check(spec, fn, args, outs, refs, scale)
        return "passes"
    except AssertionError as e:
        return f"fails ({str(e).splitlines()[0][:100]})"


def searched(prog: plan.Program) -> str:
    """Which partition the search chose for a program (of how many), at which sizes, with which kernels."""
    stages = prog.plan.stages
    chosen = f"candidate {stages['tune'][0]} of {len(stages['partition'])}" if "tune" in stages else "not searched"
    return f"{chosen}, bucket {prog.bucket}: {', '.join(la.source.name for la in prog.launches) or 'eager'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", help="a Spec(...) line, or a file holding one")
    ap.add_argument("--output", type=int, default=0, help="which output to compare")
    ap.add_argument("--scale", type=float, help="the call's scale (the spec's by default; its rescale, say)")
    ap.add_argument("--dump", help="save eager's, float64's and each variant's outputs (torch.save) to this file")
    ap.add_argument("--resize", type=int, default=0, help="compare the K-th resized call (1 or 2; 0: the spec's own)")
    ap.add_argument("--variants", help="only these variants, comma-separated (all by default)")
    a = ap.parse_args()
    text = Path(a.spec).read_text() if os.path.exists(a.spec) else a.spec
    first = eval(text.strip(), {"Spec": Spec, "torch": torch, "inf": float("inf"), "nan": float("nan")})
    # the campaign's calls (test_fuzz.run_spec): the spec's own shape at its scale and rescale, then each length
    later = resized(first)[:a.resize]
    before = [(first, first.scale)] + ([(first, first.rescale)] if first.rescale is not None else []) + \
        [(r, r.scale) for r in later[:-1]] if later else []
    spec = later[-1] if later else first
    warnings.simplefilter("ignore")
    fn, args = build(spec), inputs(spec)
    scale = spec.scale if a.scale is None else a.scale
    with torch.no_grad():
        refs = invoke(spec, fn, args, scale)
        ref = test_fuzz.as_tuple(refs)[a.output]
        exact = test_fuzz.as_tuple(test_fuzz.exact_outputs(spec, fn, args, scale))[a.output]
    print(f"eager: {rel_err(ref, exact):.4e} from float64")
    interpreted_helpers()
    dump: dict[str, Any] = {"eager": refs, "float64": exact}
    dependent, run_kernels = launch._dependent_launch, plan.run_kernels
    buffers: dict[str, Any] = {}

    def kept(*call: Any, **kw: Any) -> dict:
        """run_kernels, its buffers kept for the dump"""
        bufs = run_kernels(*call, **kw)
        buffers.update({str(k): b.cpu() for k, b in bufs.items() if isinstance(b, torch.Tensor)})
        return bufs

    if a.dump:
        plan.run_kernels = kept
    wanted = a.variants.split(",") if a.variants else list(VARIANTS)
    if set(wanted) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(set(wanted) - set(VARIANTS))}; there are {list(VARIANTS)}")
    for name, (interpreter_form, swaps, pdl) in VARIANTS.items():
        if name not in wanted:
            continue
        launch._dependent_launch = dependent if pdl else (lambda device: False)
        compiled = ft.compile(fn, cache=False, configs=[TILES[spec.config]], eager_if_faster=False)
        buffers.clear()
        try:
            with torch.no_grad(), knobs.override(interpret=interpreter_form or knobs.interpret()):
                for earlier, at in before:
                    invoke(earlier, compiled, inputs(earlier), at)
                first = invoke(spec, compiled, args, scale)
                progs = compiled.held_programs()
                if not any(prog.launches for prog in progs):
                    raise SystemExit("the plan fused nothing: " + "; ".join(n for pr in progs for n in pr.notes))
                print(f"{name}: first call {verdict(spec, fn, args, first, refs, scale)}; " +
                      "; ".join(searched(prog) for prog in progs))
                swapped(compiled, swaps)
                outs = invoke(spec, compiled, args, scale)
                got = test_fuzz.as_tuple(outs)[a.output]
        except Exception as e:  # noqa: BLE001 - libdevice has no interpreter form: that variant is reported, not run
            print(f"{name}: {type(e).__name__}: {str(e)[:120]}")
            continue
        dump[name] = outs
        dump[name + " buffers"] = dict(buffers)
        if a.dump:
            with open(f"{a.dump}.kernels.txt", "a") as f:
                for k, prog in enumerate(progs):
                    for la in prog.launches:
                        f.write(f"# {name}, program {k}, {la.source.name}, grid {la.source.grid}\n{la.source.source}\n")
        off = (got.double() - ref.double()).abs().flatten().cpu()
        print(f"{name}: {rel_err(got, exact):.4e} from float64, {rel_err(got, ref):.4e} from eager; "
              f"{verdict(spec, fn, args, outs, refs, scale)}")
        for i in off.argsort(descending=True)[:4].tolist():
            print(f"    [{i}] ft {got.flatten()[i].item():.6g}  eager {ref.flatten()[i].item():.6g}  "
                  f"float64 {exact.flatten()[i].item():.6g}")
    if a.dump:
        torch.save(torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, dump), a.dump)


if __name__ == "__main__":
    main()
