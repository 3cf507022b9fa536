"""Compile generated kernels for an sm_90 GPU (the H200) on a machine without one, to find the kernels Triton
cannot build there before a GPU run does: Triton's interpreter, which runs them on the CPU, accepts code the GPU
compiler rejects.

    .venv/bin/python scripts/compile_sm90.py [HELD_PROGRAMS...] [--dtype fp16] [--configs N] [--splits N] \
        [--f32-dot tf32x3]
    .venv/bin/python scripts/compile_sm90.py --found ID...     # fuzz finds (tests/test_fuzz.py's FOUND_IDS)

For each held program (flashtensor/bench/programs.py) at the GPU shapes, or each fuzz find at its own shapes,
on meta tensors, every kernel of every
candidate partition is emitted at the first N tile configurations and compiled through Triton's NVIDIA backend
to a cubin (ptxas ships with Triton), in both modes (MODE 0 and the fixup pass), with the pre-passes launched
before it (codegen/ranges.py) and the combine after a split loop (codegen/split.py; --splits forces them), its
pointers aligned as on the GPU. Exits 1 if any fails.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from flashtensor import driver  # noqa: E402
from flashtensor.bench import programs  # noqa: E402
from flashtensor.codegen.kernel import emit_kernel  # noqa: E402
from flashtensor.options import CONFIGS, Options  # noqa: E402

_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64",
          torch.int32: "i32", torch.int64: "i64", torch.bool: "i1", torch.int8: "i8", torch.uint8: "u8"}


def _meta(a: Any) -> Any:
    return torch.empty_like(a, device="meta") if isinstance(a, torch.Tensor) else a


def _where(e: Exception) -> str:
    """The failing source line and the error, from Triton's CompilationError text."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    at = next((ln.strip() for ln in reversed(lines) if not ln.strip().startswith("^")), "")
    return f"{lines[-1][:200]} (at: {at[:200]})" if lines else ""


def _module(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_HELPERS = "flashtensor.codegen.triton_helpers"
SHARED_BYTES = 232448       # an H100's or H200's shared memory a block may take


@functools.cache
def _compiled_helpers() -> Any:
    """One copy of the helpers module whose `@triton.jit` functions are compiled ones (made once: Triton's code
    generator fails on a kernel whose helpers come from a second copy)."""
    return _module(ROOT / "flashtensor" / "codegen" / "triton_helpers.py", _HELPERS)


def _compiled_module(path: Path) -> Any:
    """Import a kernel file as the GPU compiler sees it, also in a process running Triton's interpreter (the
    tests): its `@triton.jit` functions, and the helpers it imports, are then compiled ones, not interpreted."""
    saved, interpret = sys.modules.get(_HELPERS), os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        sys.modules[_HELPERS] = _compiled_helpers()
        return _module(path, path.stem)
    finally:
        if saved is not None:
            sys.modules[_HELPERS] = saved
        if interpret is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = interpret


def _compile(src: Any, where: Path) -> list[str]:
    """Compile one KernelSource for sm_90 in both modes; the errors (empty when both build)."""
    path = where / f"{src.name}_{abs(hash(src.source))}.py"
    path.write_text(src.source)
    module = _compiled_module(path)
    # the kernel in both modes, each pre-pass launched before it (run-time tile ranges, codegen/ranges.py), and the
    # combine launched after a split loop (codegen/split.py), in both modes too
    modes = (0, 1) if src.fixup else (0,)
    builds = [(src.name, _signature(src.buffers, src.sizes), {"MODE": mode}, src.num_warps, src.num_stages)
              for mode in modes]
    builds += [(p.name, _signature(p.buffers, p.sizes), {}, p.num_warps, src.num_stages) for p in src.prologues]
    c = src.combine
    builds += [(c.name, _signature(c.buffers, c.sizes), {"MODE": mode}, c.num_warps, src.num_stages)
               for mode in (modes if c else ())]
    # a kernel told which lengths 16 divides (codegen/artifact.header) builds with none and with all of them, one
    # whose split count follows from the sizes with its loop split and whole
    builds = [(name, types, {**consts, **more}, warps, stages) for name, types, consts, warps, stages in builds
              for more in variants(getattr(module, name), src.aligned)]
    errors = []
    for name, types, modes, warps, stages in builds:
        try:
            shared = _sm90(getattr(module, name), types, modes, warps, stages).metadata.shared
        except Exception as e:  # noqa: BLE001 - every failure is a finding
            errors.append(f"{name} {modes}: {type(e).__name__}: {_where(e)} (source: {path})")
            continue
        if shared > SHARED_BYTES:       # it compiles, and the launch raises OutOfResources
            errors.append(f"{name} {modes}: needs {shared} bytes of shared memory, sm_90 has {SHARED_BYTES} "
                          f"(source: {path})")
    return errors


def variants(fn: Any, aligned: list[str]) -> list[dict[str, int]]:
    """The constexprs beyond MODE to build a kernel with: ALIGN with no length aligned and with all, where it takes
    ALIGN; SPLIT 0 and 1, where its loop's split count follows from the sizes (codegen/artifact.header)."""
    params = [p.name for p in fn.params]
    align = [{"ALIGN": 0}, {"ALIGN": (1 << len(aligned)) - 1}] if "ALIGN" in params else [{}]
    split = [{"SPLIT": 0}, {"SPLIT": 1}] if "SPLIT" in params else [{}]
    return [{**a, **b} for a in align for b in split]


def _signature(buffers: list, sizes: list[str]) -> dict[str, str]:
    """A kernel's argument types as Triton's compiler takes them: its buffers' pointers, then its sizes."""
    return {**{b.name: "*" + _TYPES[b.dtype] for b in buffers}, **{n: "i32" for n in sizes}}


def _sm90(fn: Any, types: dict[str, str], modes: dict[str, int], warps: int, stages: int) -> Any:
    """fn compiled for sm_90 with every pointer 16-byte aligned, as a launch on the GPU specialises torch's
    allocations (and no size: codegen/artifact.header): the code it then vectorises is what fails (a bool mask's
    cp.async of 1 byte once, which unaligned compiles passed)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(types.values()) if t.startswith("*")}
    after = ("ALIGN", "SPLIT")      # the constexprs after PDL (codegen/artifact.header)
    signature = {**types, **{m: "constexpr" for m in modes if m not in after}, "PDL": "constexpr",
                 **{m: "constexpr" for m in after if m in modes}}      # in the order of the parameters
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs={**modes, "PDL": True}, attrs=aligned),
                          target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "num_stages": stages})


def shared_bytes(fn: Any, args: tuple, cfg: Any) -> list[int]:
    """The shared memory of each kernel of fn's first candidate plan at tile config cfg, compiled for sm_90
    (MODE 0)."""
    where = Path(tempfile.mkdtemp(prefix="sm90-"))
    (_, plan), *_ = driver.candidate_plans(fn, list(args), Options())
    return [built(emit_kernel(spec, cfg), where).metadata.shared for spec in next(iter(plan.stages["emit"].values()))]


def built(src: Any, where: Path) -> Any:
    """The KernelSource's kernel (MODE 0) compiled for sm_90 from a file it writes in `where`."""
    path = where / f"{src.name}_{abs(hash(src.source))}.py"
    path.write_text(src.source)
    fn = getattr(_compiled_module(path), src.name)
    return _sm90(fn, _signature(src.buffers, src.sizes), {"MODE": 0, **variants(fn, src.aligned)[0]},
                 src.num_warps, src.num_stages)


def found(name: str) -> tuple[Any, tuple]:
    """The fuzz find `name` (tests/test_fuzz.py) as a function and its inputs. The tests' conftest turns Triton's
    interpreter on where nothing set it, and the kernels are emitted for it then: it is set off first."""
    os.environ.setdefault("TRITON_INTERPRET", "0")
    sys.path[:0] = [str(ROOT / "tests")]
    import test_fuzz

    import fuzz_programs
    spec = test_fuzz.FOUND[test_fuzz.FOUND_IDS.index(name)]
    return fuzz_programs.flat(spec), fuzz_programs.inputs(spec)


def check(name: str, dtype: torch.dtype, configs: int, where: Path, splits: int | None = None,
          fuzzed: bool = False, f32_dot: str = "ieee") -> list[str]:
    """The failures of held program `name`'s kernels at the GPU shapes (or, `fuzzed`, of the fuzz find's at its
    own), every candidate, the first `configs`; with `splits`, every loop that can split split so (Options.splits);
    float32 contractions as `f32_dot` says (Options.f32_dot)."""
    fn, args = found(name) if fuzzed else programs.make(name, device="cpu", dtype=dtype, **programs.GPU)
    failures = []
    # a find's inputs are small, and stay on the CPU: a program may capture a tensor of its own there (a mask buffer)
    inputs = list(args) if fuzzed else [_meta(a) for a in args]
    for k, plan in driver.candidate_plans(fn, inputs, Options(splits=splits, f32_dot=f32_dot)):
        for specs in plan.stages["emit"].values():
            for spec in specs:
                for cfg in CONFIGS[:configs]:
                    try:
                        errors = _compile(emit_kernel(spec, cfg), where)
                    except Exception:  # noqa: BLE001
                        errors = ["emit: " + traceback.format_exc().strip().splitlines()[-1]]
                    failures += [f"{name} cand{k} {spec.name} {cfg}: {e}" for e in errors]
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", default=programs.NAMES)
    ap.add_argument("--dtype", default="fp16", choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--configs", type=int, default=1)
    ap.add_argument("--splits", type=int, default=None, help="split every loop that can split so (codegen/split.py)")
    ap.add_argument("--found", action="store_true", help="the names are fuzz finds (tests/test_fuzz.py's FOUND_IDS)")
    ap.add_argument("--f32-dot", default="ieee", choices=["ieee", "tf32x3"], help="float32 contractions (Options)")
    a = ap.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[a.dtype]
    failures = []
    d = Path(tempfile.mkdtemp(prefix="sm90-"))      # kept: a failure names its kernel's file here
    for name in a.programs:
        failed = check(name, dtype, a.configs, d, a.splits, a.found, a.f32_dot)
        said = "ok" if not failed else f"{len(failed)} failed"
        print(f"{name} {'(its own dtype)' if a.found else a.dtype}: {said}", flush=True)
        failures += failed
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
