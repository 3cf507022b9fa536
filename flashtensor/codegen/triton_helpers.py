"""Triton helpers that generated kernels import (`from flashtensor.codegen.triton_helpers import ...`).

Each is a `@triton.jit` function a kernel calls where one Triton expression would not say it: the GPU's
approximate log2, eager's fp16 rounding of a scaled product, NaN-propagating max and min, the finite
check's carrier, bf16 rounding that the interpreter gets right, and the wait of a programmatic dependent
launch. Being a real module, it is linted, type-checked and tested like the rest (tests/test_kernels.py).
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait, libdevice

from .. import knobs

_INTERPRETED = tl.constexpr(knobs.interpret())


@triton.jit
def _log2_approx(x, FTZ: tl.constexpr):
    # the GPU's lg2.approx, as accurate as the ex2.approx that tl.exp2 is. FTZ flushes subnormal x to 0 (log2
    # -inf) and costs one instruction where the subnormal path costs four; the interpreter has no inline asm
    # and flushes by hand
    if _INTERPRETED:
        return tl.log2(tl.where(tl.abs(x) < 1.1754943508222875e-38, 0.0, x) if FTZ else x)
    elif FTZ:
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.inline_asm_elementwise("lg2.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _tanh_fast(x):
    # tanh as 1 - 2 / (e^2x + 1), an exp2 and a division: within 1e-7, but it cancels near 0 (0 below 3e-8). For
    # values only added to others (lower.ABSOLUTE_FORMS), whose absolute error alone reaches a result
    return 1.0 - 2.0 / (tl.exp2(2.8853900817779268 * x) + 1.0)


@triton.jit
def _tanh(x):
    # tanh within 4e-7 of its value, relative, everywhere: below 0.4, where _tanh_fast loses its relative precision
    # (mish's x tanh(softplus(x)) then lost the tiny negative weights whose log decides an entropy), tanh's odd
    # Taylor series to x^11, a few FMAs
    x2 = x * x
    r = x2 * (-1382.0 / 155925.0) + 62.0 / 2835.0
    r = r * x2 + -17.0 / 315.0
    r = r * x2 + 2.0 / 15.0
    r = r * x2 + -1.0 / 3.0
    near = x + x * x2 * r
    return tl.where(tl.abs(x) < 0.4, near, _tanh_fast(x))


@triton.jit
def _tanh_as_eager(x):
    # torch.tanh where eager rounds it to half precision (lower.AS_EAGER): on the GPU libdevice's tanhf, the
    # function eager's CUDA kernel calls, so that the kernel rounds the same value; the interpreter has no
    # libdevice and takes _tanh
    if _INTERPRETED:
        return _tanh(x)
    else:
        return libdevice.tanh(x)


@triton.jit
def _div_as_eager(x, c: tl.constexpr, inv: tl.constexpr):
    # x / c for a number c where eager rounds the quotient to half precision (lower.quotient_as_eager): eager's CUDA
    # kernel multiplies by c's float32 reciprocal `inv`, where Triton's `/` is div.full.f32, two ulps off at
    # times (a bf16 rounding can keep either); the CPU's, which the interpreter stands beside, divides exactly
    if _INTERPRETED:
        return x / c
    else:
        return _mul_rn(x, inv)


@triton.jit
def _mul_rn(x, y):
    # x * y where eager rounds the product to half precision: PTX's mul.rn.f32, which ptxas never fuses into an
    # FMA, in inline asm, which LLVM cannot see into. With Triton's contraction, LLVM turns a rounded float32
    # product and the rounded sum it feeds into half-precision ops and fuses them into one fma.rn.bf16, which skips
    # the product's rounding; it also folds libdevice's mul_rn into a plain multiply first
    if _INTERPRETED:
        return x * y
    else:
        return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [x, y], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def _scale_f16(x, c: tl.constexpr, hi2: tl.constexpr, lo2: tl.constexpr):
    # fp16(fp16(x) * c) for a float32 constant c, as eager rounds it. On the GPU, two elements at a time:
    # one conversion to an fp16 pair h, then h * hi + fp16(h * lo) with c = hi + lo in fp16 (hi2, lo2: each
    # half's bits twice), then back to float32. The remainder is clamped to +-65504: it is finite for a
    # finite h, and for h = +-inf (a score that overflowed) inf * 0 or inf - inf would make the sum NaN
    if _INTERPRETED:
        return (x.to(tl.float16).to(tl.float32) * c).to(tl.float16).to(tl.float32)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 h, p, m; .reg .f16 a, b; cvt.rn.f16x2.f32 h, $3, $2; mul.rn.f16x2 p, h, $6; "
            "mov.b32 m, 0x7BFF7BFF; min.f16x2 p, p, m; mov.b32 m, 0xFBFFFBFF; max.f16x2 p, p, m; "
            "fma.rn.f16x2 h, h, $4, p; mov.b32 {a, b}, h; cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; }",
            "=r,=r,r,r,r,r,r,r", [x, tl.full(x.shape, hi2, tl.int32), tl.full(x.shape, lo2, tl.int32)],
            dtype=tl.float32, is_pure=True, pack=2)


@triton.jit
def _aligned(n, ALIGNED: tl.constexpr):
    # n, a size argument, as a value Triton knows 16 divides where the launch says it does (codegen/artifact.header):
    # the rows it strides then load a vector at a time. n // 16 * 16 is n there.
    if ALIGNED:
        n = n // 16 * 16
    return n


@triton.jit
def _after_prior():
    # programmatic dependent launch (runtime/launch.py): wait until the plan's kernel before this one has
    # finished and its writes are visible, then let the next kernel launch: its programs take the SMs that
    # this grid's last ones leave, and wait here in turn
    gdc_wait()
    gdc_launch_dependents()


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _nan_where_any(r, x, axis: tl.constexpr):
    # r, x reduced over `axis` by tl.max or tl.min (which drop NaNs), made NaN where x holds one: a sum that is
    # 0 or NaN. The interpreter's form of _max_over and _min_over: it runs a reduction with a combine function
    # element by element in Python
    if x.dtype.is_floating():
        xf = x.to(tl.float32)       # the interpreter's bf16 NaN compares equal to itself
        nan = tl.sum(tl.where(xf == xf, 0.0, xf), axis)
        r = tl.where(nan == nan, r.to(tl.float32), nan)
    return r.to(x.dtype)


@triton.jit
def _max_over(x, axis: tl.constexpr):
    # torch's amax over `axis`: NaN where any element is
    if _INTERPRETED:
        return _nan_where_any(tl.max(x, axis), x, axis)
    return tl.reduce(x, axis, _max_nan)


@triton.jit
def _min_over(x, axis: tl.constexpr):
    # torch's amin over `axis`: NaN where any element is
    if _INTERPRETED:
        return _nan_where_any(tl.min(x, axis), x, axis)
    return tl.reduce(x, axis, _min_nan)


@triton.jit
def _with_check(x, t, FIRST: tl.constexpr):
    # x + t in the first pass, where t is a check's x * 0 (NaN where the checked value is not finite), so
    # the sum that x feeds also carries the check; x alone in the fixup pass
    if FIRST:
        return x + t
    else:
        return x


@triton.jit
def _round_bf16(x):
    # float32 x rounded to the nearest bf16 value, kept in float32. The interpreter's conversion truncates
    # (the GPU's and eager's round to nearest even), so there the rounding is done on the bits
    if _INTERPRETED:
        b = x.to(tl.int32, bitcast=True)
        r = ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
        return tl.where(x != x, x, r)
    else:
        return x.to(tl.bfloat16).to(tl.float32)


@triton.jit
def _expm1(x):
    # exp(x) - 1 without its cancellation near 0 (Kahan): (u - 1) * x / log(u) for the computed u = exp(x),
    # whose error cancels in the ratio; x where u rounds to 1, u - 1 where it is -1 or inf
    u = tl.exp(x)
    um1 = u - 1.0
    return tl.where(u == 1.0, x, tl.where((um1 == -1.0) | (u == float("inf")), um1, um1 * (x / tl.log(u))))


@triton.jit
def _log1p(x):
    # log(1 + x) without its cancellation near 0 (Goldberg): log(u) * x / (u - 1) for the computed u = 1 + x;
    # x where u rounds to 1, log(u) where u is 0 or inf
    u = 1.0 + x
    return tl.where(u == 1.0, x, tl.where((u == 0.0) | (u == float("inf")), tl.log(u), tl.log(u) * (x / (u - 1.0))))


@triton.jit
def _pow(b, e):
    # torch.pow with a float result: |b| ** e as exp2(e * log2 |b|), negated where b's sign bit is set (-0.0
    # too) and e is an odd integer, NaN where b is negative and finite and e is no integer, and 1 where e is
    # 0, b is 1, or b is -1 and e infinite, as C's pow
    b = tl.cast(b, tl.float32)
    e = tl.cast(e, tl.float32)
    b, e = tl.broadcast(b, e)     # a per-head base (a scalar in the program) with a tile of exponents
    mag = tl.exp2(e * tl.log2(tl.abs(b)))
    whole = tl.floor(e) == e
    odd = whole & (tl.floor(e * 0.5) != e * 0.5)
    r = tl.where((b.to(tl.int32, bitcast=True) < 0) & odd, -mag, mag)
    r = tl.where((b < 0) & (b > float("-inf")) & (tl.floor(e) != e), float("nan"), r)
    return tl.where((e == 0) | (b == 1) | ((b == -1) & (tl.abs(e) == float("inf"))), 1.0, r)
