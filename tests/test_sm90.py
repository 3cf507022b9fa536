"""Every held program's kernels compile for the H200 (sm_90) through Triton's NVIDIA backend, on this machine
without a GPU (scripts/compile_sm90.py): the interpreter runs code the GPU compiler rejects. A folded tile's
dot operand once came out as `(0.0).to(tl.float16)`, which the interpreter took and the GPU compiler did not:
on the H200 every tile configuration of RetNet's retention failed, an internal compiler error. The script runs
in a process of its own, without the interpreter the tests run under."""
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

import flashtensor as ft
from flashtensor import driver, knobs
from flashtensor.codegen.kernel import emit_kernel
from flashtensor.options import CONFIGS, Options, TileConfig

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compile_sm90.py"


def _script() -> Any:
    """scripts/compile_sm90.py as a module: its builds of generated kernels as the GPU compiler sees them."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    import compile_sm90
    return compile_sm90


def _without_interpreter(args: list[str], timeout: int, cwd: Any = None) -> str:
    """The output of `python *args` in a process of its own, without the interpreter the tests run under (kernels
    this process ran under it leave Triton's language patched for it); the test fails where that process does."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_held_program_kernels_compile_for_sm90():
    out = _without_interpreter([str(SCRIPT), "--dtype", "fp16"], 1500)
    assert out.count(": ok") >= 24, out


def test_fuzz_find_kernels_compile_for_sm90():
    """Fuzz finds that failed to compile on the H200 only, at the first 8 configurations (the crash was at the
    7th, and at every one of two stages): a column statistic's early-exit loop over a segment that folds to
    empty (one key, a band mask) failed in Triton's sm_90 pipeline, and ptxas crashed on a two-stage loop with
    dots 16 wide; the kernels now leave such segments out, and pipeline such loops in three stages. A dot operand
    that folds to arithmetic on numbers alone (NaN from -inf * 0) is made a tile before its cast. Two built and
    could not launch: their kernels (or fixup passes) needed more shared memory than an H100 has. A scalar input's
    finite check is added as it is, not summed through tl.ravel."""
    finds = ["folded_early_exit_loops", "ptxas_two_stage_narrow_dot", "folded_constant_dot_operand",
             "rope_noise_tiles_past_shared_memory", "fixup_pass_pipelined_past_shared_memory", "scalar_input_checked"]
    out = _without_interpreter([str(SCRIPT), "--found", *finds, "--configs", "8"], 900)
    for name in finds:
        assert f"{name} (its own dtype): ok" in out, out


def test_float32_contractions_on_tensor_cores_compile_for_sm90():
    """Options.f32_dot="tf32x3" (three TF32 passes for float32 dots, which "ieee" runs on the FMA units): held
    programs in float32 compile for sm_90 with it."""
    out = _without_interpreter([str(SCRIPT), "llama_eager", "linear_elu", "--dtype", "fp32", "--f32-dot", "tf32x3"],
                               900)
    assert out.count(": ok") == 2, out


@pytest.mark.unit
@pytest.mark.parametrize("f32_dot", ["ieee", "tf32x3"])
def test_float32_dots_take_the_precision_the_options_name(f32_dot):
    """Kernels for a GPU take Options.f32_dot on their float32 dots; the interpreter's always compute exactly."""
    q, k, v = (torch.empty(1, 2, 256, 64, device="meta") for _ in range(3))

    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v

    for interpret, want in ((False, f32_dot), (True, "ieee")):
        with knobs.override(interpret=interpret):
            (_, plan), *_ = driver.candidate_plans(attention, [q, k, v], Options(f32_dot=f32_dot))
            source = emit_kernel(next(iter(plan.stages["emit"].values()))[0], CONFIGS[0]).source
        dots = [line for line in source.splitlines() if "tl.dot(" in line]
        assert dots and all(f'input_precision="{want}")' in line for line in dots), dots


@pytest.mark.unit
def test_segments_that_load_a_mask_run_one_stage_fewer():
    """A passed mask's kernel: the kept run (no mask load) keeps the config's 3 stages, the partial segments
    around it take 2, so that their mask tiles do not raise the kernel's shared memory above the kept run's."""
    q, k, v = (torch.empty(1, 2, 256, 128, device="meta") for _ in range(3))
    mask = torch.empty(1, 1, 256, 256, device="meta")

    def attention(q, k, v, mask):
        return torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1) @ v

    (_, plan), *_ = driver.candidate_plans(attention, [q, k, v, mask], Options())
    spec = next(iter(plan.stages["emit"].values()))[0]
    first = emit_kernel(spec, TileConfig(64, 64, 4, 3)).source.split("if MODE == 0")[0].split("else:")[-1]
    stages = [int(line.split("num_stages=")[1][0]) for line in first.splitlines() if "tl.range(" in line]
    assert sorted(stages) == [2] * (len(stages) - 1) + [3], stages


def test_a_passed_mask_kernel_takes_the_shared_memory_of_an_inside_one():
    """Compiled for sm_90 at 64 x 64 tiles, 3 stages: causal attention under a passed fp16 mask needs no more shared
    memory than the same mask built from indices (112 KB: two programs per SM; 128 KB before its partial
    segments took one stage fewer)."""
    code = """
import sys, tempfile, torch
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import compile_sm90 as C
from flashtensor.bench import peers
from flashtensor.options import TileConfig
for form in ("inside", "passed"):
    row = peers.ROWS["causal"]
    args = peers.inputs(row, form, torch.float16, "cpu", B=1, H=2, S=256, D=128)
    print(form, C.shared_bytes(peers.program(row, form, 256, "cpu"), args, TileConfig(64, 64, 4, 3)))
"""
    out = _without_interpreter(["-c", code, str(SCRIPT.parent), str(SCRIPT.parents[1])], 600)
    got = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert got["inside"] == got["passed"], got


def test_rows_told_aligned_load_sixteen_bytes_at_a_time():
    """A generic plan over a (B, H, S, S) input (KeyFormer's Gumbel noise) at the GPU's tiles, compiled for sm_90:
    with ALIGN saying 16 divides S (codegen/artifact.header), its kernels copy the noise rows into shared memory 16
    bytes at a time (cp.async.cg); told nothing, Triton cannot see a row's start aligned and copies 4 bytes at a
    time (cp.async.ca), the load the H200 measured 2.5-4.6x slower than the exact plan's."""
    code = """
import math, re, sys, tempfile, torch
from pathlib import Path
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import torch.nn.functional as F
import compile_sm90 as C
from flashtensor import driver
from flashtensor.codegen.kernel import emit_kernel
from flashtensor.options import CONFIGS

def noise_scores(q, k, v, noise):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return F.softmax(s, dim=-1) @ v, F.softmax(s - noise.log(), dim=-1).sum(dim=-2)

args = [torch.empty(1, 2, 4096, 128, device="meta", dtype=torch.float16) for _ in range(3)]
args.append(torch.empty(1, 2, 4096, 4096, device="meta"))
generic = frozenset({(0, 2), (1, 2), (2, 2), (3, 2), (3, 3)})
(_, plan), *_ = driver.candidate_plans(noise_scores, args, dynamic=generic)
where = Path(tempfile.mkdtemp())
for spec in plan.stages["emit"][0]:
    k = emit_kernel(spec, CONFIGS[0])
    path = where / f"{k.name}.py"
    path.write_text(k.source)
    fn = getattr(C._compiled_module(path), k.name)
    for align in C.variants(fn, k.aligned):
        if align.get("SPLIT"):
            continue
        ptx = C._sm90(fn, C._signature(k.buffers, k.sizes), {"MODE": 0, **align}, k.num_warps, k.num_stages).asm["ptx"]
        print(k.name, align.get("ALIGN"), len(re.findall(r"cp[.]async[.]ca[.]", ptx)), len(re.findall(r"cp[.]async[.]cg[.]", ptx)))
"""
    out = _without_interpreter(["-c", code, str(SCRIPT.parent), str(SCRIPT.parents[1])], 900)
    got = {(name, int(align)): (int(ca), int(cg)) for name, align, ca, cg in
           (line.split() for line in out.strip().splitlines())}
    assert {name for name, _ in got} == {"ft_kernel0", "ft_kernel1"}, got      # both read the noise, both take ALIGN
    for name in ("ft_kernel0", "ft_kernel1"):
        (ca0, cg0), (ca1, cg1) = got[name, 0], got[name, 1]
        assert ca1 * 4 <= ca0 and cg1 > cg0, got


def test_generic_kernels_take_every_length_unspecialised(tmp_path):
    """A generic plan's kernels take their lengths as plain integers on the GPU: Triton folds an int argument of 1
    into the code unless told not to, and in an early-exit loop that then never runs (a length of 1) its sm_90
    pipeline crashed (TritonGPUCoalesce, fuzz seed 213 on the H200); specialising on 16 compiled again for the
    lengths it divides. The kernels are imported as the GPU compiler sees them, their size parameters bound as a
    launch binds them."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import native_specialize_impl

    def h2o(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2) / 4.0, dim=-1)
        return p @ v, p.sum(dim=-2)

    compiled = ft.compile(h2o, dynamic=True, cache=False)
    for n in (1, 33):
        compiled(*(torch.randn(1, 2, n, 16) for _ in range(3)))
    kernels = [k for p in compiled.generic_programs() for k in p.kernels]
    assert kernels and all(k.sizes for k in kernels)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    for k in kernels:
        path = tmp_path / f"{k.name}.py"
        path.write_text(k.source)
        fn = getattr(_script()._compiled_module(path), k.name)
        params = [p for p in fn.params if p.name in k.sizes]
        assert len(params) == len(k.sizes), k.source[:500]
        for p, n in ((p, n) for p in params for n in (1, 16, 4096, 2 ** 33)):
            bound = native_specialize_impl(backend, n, p.is_const, not p.do_not_specialize,
                                           not p.do_not_specialize_on_alignment)
            assert bound == ("i32" if n < 2 ** 31 else "i64", None), (k.name, p.name, n, bound)


@pytest.mark.unit
def test_ops_rounded_to_half_precision_compute_as_eagers_cuda_kernels():
    """A plan that rounds tanh(s / 30) to bf16 as eager does (the bf16 soft-cap find in test_fuzz.FOUND) calls
    libdevice's tanhf, the function eager calls, through `_tanh_as_eager`, and divides by 30 as eager's CUDA kernel
    does, by multiplying by 30's float32 reciprocal; gemma2's kernels, whose soft cap stays in float32 and is only
    added to, keep the fast forms."""
    capped = [k.source for k in _gpu_kernels(*_capped_find())]
    assert any("_tanh_as_eager(" in s for s in capped) and not any("_tanh_fast(" in s for s in capped)
    inverse = (torch.tensor(1.0) / 30).item()
    assert any("_div_as_eager(" in s and f", 30.0, {inverse!r})" in s for s in capped)
    gemma = [k.source for k in _gpu_kernels(*_gemma2())]
    assert not any(f in s for f in ("_tanh(", "_tanh_as_eager(", "_div_as_eager(") for s in gemma)
    assert any("_tanh_fast(" in s for s in gemma)


@pytest.mark.unit
def test_kernels_that_round_as_eager_fuse_no_multiply_with_an_add():
    """The bf16 soft-cap find rounds t * 30, then t * 30 plus an ALiBi term, to bf16 as eager does. With Triton's FMA
    contraction, LLVM turns a rounded float32 product and sum into a bf16 multiply and add and fuses them into one
    `fma.rn.bf16`, which skips the product's rounding: on the H100 a row's largest score came out a bf16 step above
    eager's, and o 1.79e-2 from float64 where eager is 1.37e-2 (TRITON_DEFAULT_FP_FUSION=0 gave 1.33e-2, the
    interpreter's answer). A product eager rounds is computed by `_mul_rn` (libdevice's mul.rn.f32, which nothing
    fuses), and the kernels keep contraction elsewhere: as built the find's kernels have no half FMA, with
    `_mul_rn` a plain multiply they have; gemma2's, whose soft cap stays in float32, have no `_mul_rn`. Compiled in
    a process of its own: kernels this process ran under the interpreter leave Triton's language patched for it."""
    code = "import test_sm90; print(test_sm90._half_fmas())"
    out = _without_interpreter(["-c", code], 600, cwd=Path(__file__).parent)
    rounding, as_built, plain, gemma_plain = eval(out.strip().splitlines()[-1])
    assert rounding and as_built == 0 and plain > 0 and gemma_plain


_PLAIN = "\n\n@triton.jit\ndef _mul_plain(x, y):\n    return x * y\n"


def _half_fmas() -> tuple[int, int, int, bool]:
    """For the bf16 soft-cap find's kernels that round a product (through `_mul_rn`): how many there are, their
    half-precision FMAs as built and with `_mul_rn` a plain multiply; and whether gemma2's kernels have none."""
    script = _script()
    where = Path(tempfile.mkdtemp(prefix="sm90-"))

    def fmas(k: Any) -> int:     # less the finite check's products by 0 (chk += v * 0: inf * 0 is NaN still)
        ptx = script.built(k, where).asm["ptx"]
        zero = set(re.findall(r"mov\.b16\s+(%rs\d+), 0x0000;", ptx))
        fused = re.findall(r"\bfma\.rn\.(?:bf16|f16)\s+%rs\d+, (%rs\d+), (%rs\d+), %rs\d+;", ptx)
        return sum(a not in zero and b not in zero for a, b in fused)

    rounding = [k for k in _gpu_kernels(*_capped_find()) if "_mul_rn(" in k.source]
    plain = [dataclasses.replace(k, source=k.source.replace("_mul_rn(", "_mul_plain(") + _PLAIN) for k in rounding]
    return (len(rounding), sum(map(fmas, rounding)), sum(map(fmas, plain)),
            not any("_mul_rn(" in k.source for k in _gpu_kernels(*_gemma2())))


@pytest.mark.unit
def test_every_kernel_of_a_plan_computes_an_exponent_alike():
    """ptxas fuses a multiply into a following add (FFMA) where it sees fit, and float32 rounds x * log2 e by up to
    2^-24 of it: 0.004 at fp16's -65504. A plan whose row statistics' kernel fused `x * log2 e - m` and whose column
    kernel did not summed each fully padded fp16 row to 1.0015 on the H100 (test_fuzz's
    fp16_padded_rows_sum_to_one_across_kernels). Its exponents of huge values are now exp2((x - m) * log2 e), an
    FMUL after the subtraction in every kernel; h2o's, of moderate scores, are one FFMA with log2 e in its row and
    its column kernel alike. Read off the sm_90 SASS (the instruction that writes each MUFU.EX2's operand), in a
    process of its own, as above."""
    code = "import test_sm90; print(test_sm90._exponent_producers())"
    out = _without_interpreter(["-c", code], 600, cwd=Path(__file__).parent)
    padded, h2o = eval(out.strip().splitlines()[-1])
    assert len(padded) == 3 and all(set(k) == {"FMUL log2e"} for k in padded), padded
    assert len(h2o) == 2 and all(max(k, key=k.get) == "FFMA log2e" for k in h2o), h2o


_SASS = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)\s*([^;]*);", re.M)


def _producers(k: Any, where: Path) -> dict[str, int]:
    """How a kernel computes the operands of its MUFU.EX2s: the opcode of the instruction before each that writes
    its register, marked where it multiplies by log2 e."""
    import triton
    cubin = where / f"{k.name}.cubin"
    cubin.write_bytes(_script().built(k, where).asm["cubin"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    sass = subprocess.run([str(tool), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    ins = [(m.group(1), [a.strip() for a in m.group(2).split(",")]) for m in _SASS.finditer(sass)]
    out: dict[str, int] = {}
    for i, (op, args) in enumerate(ins):
        if op.startswith("MUFU.EX2"):
            reg = args[1].lstrip("-|").split(".")[0]
            op2, args2 = next((o, a) for o, a in reversed(ins[:i]) if a and a[0].split(".")[0] == reg)
            kind = op2.split(".")[0] + (" log2e" if any("1.44269" in a for a in args2) else "")
            out[kind] = out.get(kind, 0) + 1
    return out


def _exponent_producers() -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """_producers of each kernel of the padded-rows find's plan and of h2o's (fp16, the small shapes)."""
    import test_fuzz

    import fuzz_programs
    from flashtensor import workloads
    where = Path(tempfile.mkdtemp(prefix="sm90-"))
    spec = test_fuzz.FOUND[test_fuzz.FOUND_IDS.index("fp16_padded_rows_sum_to_one_across_kernels")]
    fn, args = workloads.make("h2o", device="cpu", dtype=torch.float16, **workloads.SMALL)
    return ([_producers(k, where) for k in _gpu_kernels(fuzz_programs.flat(spec), fuzz_programs.inputs(spec))],
            [_producers(k, where) for k in _gpu_kernels(fn, [_script()._meta(a) for a in args])])


def _gpu_kernels(fn: Any, args: Any) -> list:
    """The kernels of fn's first candidate plan, emitted for the GPU at the first tile configuration."""
    with knobs.override(interpret=False):
        (_, plan), *_ = driver.candidate_plans(fn, list(args), Options())
        return [emit_kernel(spec, CONFIGS[0]) for spec in next(iter(plan.stages["emit"].values()))]


def _capped_find() -> tuple[Any, Any]:
    """The bf16 soft-cap find of test_fuzz.FOUND, as a function and its inputs."""
    import test_fuzz

    import fuzz_programs
    spec = test_fuzz.FOUND[test_fuzz.FOUND_IDS.index("bf16_capped_product_fused")]
    return fuzz_programs.flat(spec), fuzz_programs.inputs(spec)


def _gemma2() -> tuple[Any, Any]:
    """gemma2's soft-capped attention in bf16 at the small shapes, on meta tensors."""
    from flashtensor.bench import programs
    fn, args = programs.make("gemma2_softcap", device="cpu", dtype=torch.bfloat16, **programs.SMALL)
    return fn, [_script()._meta(a) for a in args]


def test_unsplit_generic_attention_keeps_its_wgmma_pipelined():
    """Gemma 2's shape-generic attention kernel at the GPU's tiles (64 x 64, 4 warps, 3 stages, as the H100 tuned
    it), compiled for sm_90 with SPLIT 0 (codegen/split.py: a call whose sizes give one piece): its loop's tensor
    core instructions issue back to back, one wait per step. With the split's code compiled in, ptxas ran out of
    registers for the wgmma pipeline and waited after each of the 12 (one wait each): the generic kernel took
    0.50 ms against the exact kernel's 0.43 on an H100."""
    got = eval(_without_interpreter(["-c", "import test_sm90; print(test_sm90._bulk_loop_waits())"], 900,
                                    cwd=Path(__file__).parent).strip().splitlines()[-1])
    mma, waits = got.get(0, got.get(-1, (0, 0)))     # SPLIT 0, or no SPLIT taken
    assert mma >= 8 and waits <= 2, got


def _generic_sass(workload: str, kernel: int, cfg: TileConfig) -> dict[int, str]:
    """By SPLIT (-1 where it takes none): the sm_90 SASS of a workload's shape-generic kernel at S=4096, H=32, D=128,
    its (B, S, H, D) inputs' batch, lengths and heads all sizes, emitted at tile configuration `cfg`."""
    import triton

    from flashtensor import workloads
    fn, small = workloads.make(workload, device="cpu", S=64, H=2, D=128)
    args = [torch.empty([{64: 4096, 2: 32}.get(n, n) for n in a.shape], dtype=a.dtype, device="meta") for a in small]
    generic = frozenset((i, d) for i, a in enumerate(args) for d in range(a.dim() - 1))
    with knobs.override(interpret=False):
        (_, plan), *_ = driver.candidate_plans(fn, args, dynamic=generic)
        k = emit_kernel(plan.stages["emit"][0][kernel], cfg)
    where = Path(tempfile.mkdtemp(prefix="sm90-"))
    path = where / f"{k.name}.py"
    path.write_text(k.source)
    C = _script()
    fn = getattr(C._compiled_module(path), k.name)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    out = {}
    for more in C.variants(fn, k.aligned):
        cubin = where / f"{k.name}.cubin"
        built = C._sm90(fn, C._signature(k.buffers, k.sizes), {"MODE": 0, **more}, k.num_warps, k.num_stages)
        cubin.write_bytes(built.asm["cubin"])
        out[more.get("SPLIT", -1)] = subprocess.run([str(tool), "-c", str(cubin)], capture_output=True, text=True,
                                                    check=True).stdout
    return out


def _bulk_loop_waits() -> dict[int, tuple[int, int]]:
    """By the SPLIT gemma2's generic kernel is built with (-1 where it takes none): the tensor core instructions of
    its bulk key loop, the shortest basic block of its sm_90 SASS that has any, and the waits on them there."""
    out = {}
    for split, sass in _generic_sass("gemma2", 0, TileConfig(64, 64, 4, 3)).items():   # soft-capped causal
        bulk = min((b for b in _blocks(sass) if any(op.startswith("HGMMA") for op in b)), key=len)
        out[split] = (sum(op.startswith("HGMMA") for op in bulk), sum(op.startswith("WARPGROUP.DEPBAR") for op in bulk))
    return out


def _blocks(sass: str) -> list[list[str]]:
    """The opcodes of each basic block of a SASS listing: a label starts one, a branch ends one."""
    blocks: list[list[str]] = [[]]
    for line in sass.splitlines():
        m = _SASS.match(line)
        if line.startswith(".L_x_"):
            blocks.append([])
        elif m is not None:
            blocks[-1].append(m.group(1))
            if m.group(1).startswith("BRA"):
                blocks.append([])
    return blocks


def test_generic_column_kernel_loads_a_vector_at_a_time():
    """h2o's shape-generic column kernel at the tiles the H100 tuned for the exact one (128 x 64, 8 warps, 3
    stages), compiled for sm_90: each program's piece of the finite check starts at a multiple of 64 elements, so
    the check reads 16 bytes per load (it read 2, an element at a time: 64 loads per thread where 8 do), and the
    bulk of the key loop reads the row statistics the first kernel stored 8 bytes at a time (their rows padded to
    a multiple of 16, not 4 bytes from a length's stride)."""
    got = eval(_without_interpreter(["-c", "import test_sm90; print(test_sm90._column_loads())"], 900,
                                    cwd=Path(__file__).parent).strip().splitlines()[-1])
    for split, (loads, bulk) in got.items():
        assert loads and all(op == "LDG.E.128" for op in loads), (split, loads)
        assert bulk and all(op.startswith(("LDGSTS.E.64", "LDGSTS.E.BYPASS.128")) for op in bulk), (split, bulk)


def _column_loads() -> dict[int, tuple[list[str], list[str]]]:
    """By SPLIT: h2o's generic column kernel's global loads to registers (the check's), and its bulk loop's
    asynchronous copies."""
    out = {}
    for split, sass in _generic_sass("h2o", 1, TileConfig(128, 64, 8, 3)).items():
        blocks = _blocks(sass)
        ops = [op for b in blocks for op in b]
        bulk = min((b for b in blocks if any(op.startswith("HGMMA") for op in b)), key=len)
        out[split] = ([op for op in ops if op.startswith("LDG.")], [op for op in bulk if op.startswith("LDGSTS")])
    return out
