"""Triton source for one scheduled kernel.

Every tile is a Triton tensor over its variables in the schedule's canonical order
(grid-tiled row, loop, whole); batch variables are scalars taken from the program id.
Float math runs in float32; contraction operands stay in half precision when an operand is.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Optional

import torch

from ..analysis.facts import IDENTITY
from ..ir.loops import Affine, LNode, LOutput, Var, exact_cast, read_input, rounds_input
from .schedule import Accum, Schedule, ScheduleError

_TL = {torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.float32: "tl.float32",
       torch.float64: "tl.float64", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.bool: "tl.int1"}
_HALF = (torch.float16, torch.bfloat16)
_LOG2E = 1.0 / math.log(2.0)
_BIN = {"add": "({} + {})", "sub": "({} - {})", "mul": "({} * {})", "div": "({} / {})",
        "eq": "({} == {})", "ne": "({} != {})", "lt": "({} < {})", "le": "({} <= {})", "gt": "({} > {})",
        "ge": "({} >= {})", "logical_and": "({} & {})", "logical_or": "({} | {})",
        "maximum": "tl.maximum({}, {}, propagate_nan=tl.PropagateNan.ALL)",
        "minimum": "tl.minimum({}, {}, propagate_nan=tl.PropagateNan.ALL)"}
# tl.max/tl.min drop NaNs (maxnum); torch's amax/amin/maximum propagate them, so kernels reduce with these
_NAN_REDUCE = {"max": "_max_nan", "min": "_min_nan"}
_HELPERS = """
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


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
def _scale_f16(x, c: tl.constexpr, hi2: tl.constexpr, lo2: tl.constexpr):
    # fp16(fp16(x) * c) for a float32 constant c, as eager rounds it. On the GPU, two elements at a time:
    # one conversion to an fp16 pair h, then h * hi + fp16(h * lo) with c = hi + lo in fp16 (hi2, lo2: each
    # half's bits twice), then back to float32
    if _INTERPRETED:
        return (x.to(tl.float16).to(tl.float32) * c).to(tl.float16).to(tl.float32)
    else:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 h, p; .reg .f16 a, b; cvt.rn.f16x2.f32 h, $3, $2; mul.rn.f16x2 p, h, $6; "
            "fma.rn.f16x2 h, h, $4, p; mov.b32 {a, b}, h; cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; }",
            "=r,=r,r,r,r,r,r,r", [x, tl.full(x.shape, hi2, tl.int32), tl.full(x.shape, lo2, tl.int32)],
            dtype=tl.float32, is_pure=True, pack=2)


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
"""
_UN = {"exp": "tl.exp({})", "log": "tl.log({})", "abs": "tl.abs({})", "sqrt": "tl.sqrt({})", "rsqrt": "tl.rsqrt({})",
       "exp2": "tl.exp2({})", "log2": "tl.log2({})", "log2_approx": "_log2_approx({}, False)", "neg": "(-{})",
       "reciprocal": "(1.0 / {})",
       "sigmoid": f"(1.0 / (1.0 + tl.exp2({-_LOG2E!r} * {{}})))", "tanh": f"(1.0 - 2.0 / (tl.exp2({2 * _LOG2E!r} * {{}}) + 1.0))",
       "logical_not": "({} == 0)"}


def _lit(v) -> str:
    if isinstance(v, bool):     # Triton's bool, so `x | False` stays int1 (with 0 it became int32)
        return "True" if v else "False"
    if isinstance(v, float):
        if math.isinf(v):
            return 'float("inf")' if v > 0 else 'float("-inf")'
        if math.isnan(v):
            return 'float("nan")'
        return repr(v)
    return repr(v)


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << (max(n, 1) - 1).bit_length())


@dataclass
class Buffer:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str                  # input | output | intermediate
    source: object = None      # ("in", program input index), LOutput, or LNode (intermediate)
    written: bool = False      # the kernel stores into it


FINITE = ("finite",)   # buffer key of the finite-check flag: zeroed per call, NaN once a check finds a non-finite input
CHECK_BLOCK = 8192      # most elements per step of the finite check
CHECK_MARK = "     # check"   # ends the lines of the finite check inside a tile (the fixup pass drops them)
FIXUP_PROGRAMS = 264    # programs of the fixup pass (two per SM of an H100 or H200)
GROUP_PROGRAMS = 512    # programs per launch-order group (see _placement): a couple of waves on a large GPU


@dataclass
class KernelSource:
    name: str
    source: str
    buffers: list[Buffer]
    grid: tuple[int, int]
    num_warps: int
    num_stages: int
    blocks: dict[str, int] = field(default_factory=dict)
    assumes_finite: bool = False   # it skips tiles by value facts that hold for finite inputs
    fixup: bool = False            # relaunched with MODE=1 after the plan: recomputes unless the check passed

    @property
    def config(self) -> str:
        """The tuned configuration in words (the tuner's progress line, explain's report)."""
        return f"blocks {self.blocks}, {self.num_warps} warps, {self.num_stages} stages"


class _Emitter:
    def __init__(self, s: Schedule, inputs: list, block_row: int, block_loop: int, faithful: bool,
                 nan_free: frozenset) -> None:
        self.s = s
        self.nan_free = nan_free        # max/min reductions that may use the fast, NaN-skipping max
        self.inputs = inputs            # program input (shape, dtype) list
        self.blk: dict[Var, int] = {}
        if s.row is not None:
            self.blk[s.row] = min(block_row, _pow2(s.row.extent))
        if s.loop is not None:
            self.blk[s.loop] = min(block_loop, _pow2(s.loop.extent))
        for v in s.whole:
            self.blk[v] = _pow2(v.extent)
        self.bufs: dict[object, Buffer] = {}    # by source, in kernel-argument order
        self.pre: list[str] = []
        self.cache_pre: dict[int, tuple[str, list[Var]]] = {}
        self.raw: dict[int, str] = {}
        self.faithful = faithful
        self.finals: dict[LNode, str] = {}      # loop reduction -> its value after its pass
        self.deps: dict[int, bool] = {}
        self.tmp = 0
        self.checks: dict[int, tuple[LNode, Optional[str]]] = {}   # input -> (its tile load, domain): see _check
        self.check_whole = False    # check_add keeps whole tiles (the loop over skipped tiles, see _check)
        self.folded: dict[tuple[LNode, LNode], LNode] = {}  # (m, d) -> m + log2 d, stored by an earlier kernel
        self.ftz: frozenset[int] = frozenset()   # inputs whose logs flush subnormals in the first pass (see emit_kernel)
        self.narrowed: dict[int, torch.dtype] = {}   # inputs the check tests as cast (see emit_kernel)
        self.carriers: dict[str, list[Var]] = {}   # sum accumulators that took in a check (see _loop_body)

    # ---- naming and broadcasting --------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.tmp += 1
        return f"{base}_{self.tmp}"

    def tvars(self, n: LNode) -> list[Var]:
        return self.s.tile_vars(n)

    def idx(self, v: Var, tv: list[Var]) -> str:
        if v in self.s.batch:
            return f"i_{v}"
        if len(tv) <= 1:
            return f"o_{v}"
        return f"o_{v}[:, None]" if tv.index(v) == 0 else f"o_{v}[None, :]"

    def bcast(self, expr: str, have: list[Var], want: list[Var]) -> str:
        if have == want or not have:
            return expr
        if len(have) == 1 and len(want) == 2:
            return f"{expr}[:, None]" if want.index(have[0]) == 0 else f"{expr}[None, :]"
        raise ScheduleError(f"cannot broadcast a tile over {have} to {want}")

    def affine(self, e: Affine, tv: list[Var]) -> str:
        parts = [(f"{c} * " if c != 1 else "") + self.idx(v, tv) for v, c in e.terms]
        if e.const or not parts:
            parts.append(str(e.const))
        return "(" + " + ".join(parts) + ")"

    def partial(self, v: Var) -> bool:
        """Whether some tile of v reaches past its extent."""
        return v.extent % self.blk[v] != 0 if v in (self.s.row, self.s.loop) else self.blk[v] != v.extent

    def range_mask(self, tv: list[Var]) -> Optional[str]:
        """Bounds test for a tile that can reach past an extent. Loop ranges start at multiples of the
        loop block, so a loop variable whose extent the block divides never needs one."""
        conds = [f"({self.idx(v, tv)} < {v.extent})" for v in tv if self.partial(v)]
        return " & ".join(conds) if conds else None

    def buffer(self, key, shape, dtype, kind, written: bool = False) -> str:
        if key not in self.bufs:
            self.bufs[key] = Buffer(f"{kind[:3]}{len(self.bufs)}", tuple(shape), dtype, kind, key)
        self.bufs[key].written |= written
        return self.bufs[key].name

    def check_add(self, i: int, raw: str, tv: list[Var], mask: Optional[str]) -> list[str]:
        """The finite check of a tile of input i this program loaded: x * 0 (NaN where x is outside the
        input's domain; masked-off elements count as inside), summed over the loop's axis into a small
        accumulator (`check_acc`), or whole where the tile has no loop axis (it is loaded once). In the loop
        over skipped tiles it adds whole tiles into `chkt{i}`, keeps the domain's bound as a running
        minimum in `chkm{i}` (two instructions per element where the test and select took four) and leaves
        the sums to after the loop (see _check)."""
        x, dom = self.as_checked(i, raw), self.checks[i][1]
        if self.check_whole:
            lines = [f"chkt{i} += {x} * 0{CHECK_MARK}"]
            if dom:
                m = _measure(x, dom)
                m = f"tl.where({mask}, {m}, float(\"inf\"))" if mask else m
                lines.append(f"chkm{i} = _min_nan(chkm{i}, {m}){CHECK_MARK}")
            return lines
        return [self.check_sum(i, _check_term(x, dom, mask), tv)]

    def check_sum(self, i: int, term: str, tv: list[Var]) -> str:
        """Line adding a check term over a tile of input i to its accumulator."""
        red = f"tl.sum({term}, {tv.index(self.s.loop)})" if self.s.loop in tv else f"tl.sum(tl.ravel({term}), 0)"
        return f"chk{i} += {red}.to(tl.float32){CHECK_MARK}"

    def check_by_log(self, log: LNode, out: str, tv: list[Var], ctx: Optional["_Body"], lines: list[str]) -> None:
        """The flushing log `out` of a checked tile of an input, over the same tile, is finite exactly where
        the input is positive normal and finite, the domain its check tests: the check becomes out * 0, held
        in `ctx.witness` until a sum over the loop of the same tile takes it in (see _loop_body). KeyFormer's
        row kernel: 956 -> 773 sm_90 instructions per step of its loop."""
        x = log.args[0]
        while isinstance(x, LNode) and x.op == "cast" and exact_cast(x):
            x = x.args[0]
        if ctx is None or self.s.loop not in tv or id(x) not in ctx.checked or self.tvars(x) != tv:
            return
        i = x.attrs["input"]
        line, mask = ctx.checked.pop(id(x))
        if i in self.narrowed or self.checks[i][1] != "positive" or line not in lines:
            return
        lines.remove(line)
        ctx.witness[i] = (f"tl.where({mask}, {out} * 0, 0.0)" if mask else f"{out} * 0", tv)

    def as_checked(self, i: int, x: str) -> str:
        """Input i's value x as the check tests it: through the narrowest cast the program applies to it."""
        return _round_to(self.narrowed[i], x) if i in self.narrowed else x

    def check_acc(self, i: int) -> tuple[str, str]:
        """Input i's tile-check accumulator: its initialisation and its sum."""
        tv = self.tvars(self.checks[i][0])
        shape = [str(self.blk[v]) for v in tv if v is not self.s.loop] if self.s.loop in tv else []
        return (f"chk{i} = tl.zeros([{', '.join(shape)}], tl.float32){CHECK_MARK}",
                f"tl.sum(tl.ravel(chk{i}), 0)" if shape else f"chk{i}")

    def load_intermediate(self, n: LNode, out: str, lines: list[str]) -> str:
        """Load an earlier kernel's value of n over this tile."""
        tv = self.tvars(n)
        buf, strides = self.intermediate(n, written=False)
        off = " + ".join(f"{self.idx(v, tv)} * {st}" for v, st in strides.items()) or "0"
        mask = self.range_mask(tv)
        lines.append(f"{out} = tl.load({buf} + {off}" + (f", mask={mask}, other=0)" if mask else ")"))
        return out

    def intermediate(self, n: LNode, written: bool) -> tuple[str, dict[Var, int]]:
        """Buffer passing n between kernels: contiguous over n's variables, float math kept in float32."""
        shape = [v.extent for v in n.vars]
        dtype = torch.float32 if n.dtype.is_floating_point else n.dtype
        return self.buffer(n, shape, dtype, "intermediate", written), dict(zip(n.vars, _contig(shape)))

    # ---- values ------------------------------------------------------------------------------
    def value(self, n: LNode, ctx: "_Body") -> tuple[str, list[Var]]:
        """Triton expression (a variable name) for node n, emitting its code where it belongs."""
        hit = ctx.lookup(n) if ctx else None
        if hit is None:
            hit = self.cache_pre.get(id(n))
        if hit is not None:
            return hit
        if n.op == "reduce" and n in self.s.accums:
            if ctx is not None and ctx.pass_ == self.s.accums[n].pass_:
                return ctx.running[n], self.tvars(n)
            return self.finals[n], self.tvars(n)
        home = self.home(n)
        if home == "pre":
            lines, store = self.pre, self.cache_pre
        else:
            lines, store = ctx.lines, ctx.cache
        const = self.s.constant_on(n, ctx.region) if (ctx is not None and ctx.region) else None
        if const is not None:
            res = (_lit(const), [])
        else:
            res = self.compute(n, ctx if home != "pre" else None, lines)
        store[id(n)] = res
        return res

    def home(self, n: LNode) -> str:
        if self.s.loop not in n.vars and (n in self.s.boundary or not self.deps_acc(n)):
            return "pre"
        return "body"

    def deps_acc(self, n: LNode) -> bool:
        """Whether n reads a loop reduction of this kernel."""
        if id(n) not in self.deps:
            self.deps[id(n)] = n not in self.s.boundary and (
                n in self.s.accums or any(self.deps_acc(a) for a in n.inputs))
        return self.deps[id(n)]

    def arg(self, a, tv: list[Var], ctx) -> str:
        if not isinstance(a, LNode):
            return _lit(float(a) if isinstance(a, float) else a)
        e, have = self.value(a, ctx)
        return self.bcast(e, have, tv)

    def compute(self, n: LNode, ctx, lines: list[str]) -> tuple[str, list[Var]]:
        tv = self.tvars(n)
        out = self.fresh("x")
        op = n.op
        if n in self.s.boundary:
            return self.load_intermediate(n, out, lines), tv
        if op == "load":
            shape, dtype = self.inputs[n.attrs["input"]]
            buf = self.buffer(("in", n.attrs["input"]), shape, dtype, "input")
            strides = _contig(shape)
            off = " + ".join(f"{self.affine(e, tv)} * {st}" for e, st in zip(n.attrs["index"], strides)) or "0"
            mask = self.range_mask(tv)
            lines.append(f"{out}_raw = tl.load({buf} + {off}" + (f", mask={mask}, other=0)" if mask else ")"))
            if self.checks.get(n.attrs["input"], (None,))[0] is n:
                check = self.check_add(n.attrs["input"], f"{out}_raw", tv, mask)
                lines += check
                if ctx is not None and not self.check_whole:
                    ctx.checked[id(n)] = (check[0], mask)
            if dtype in _HALF:
                lines.append(f"{out} = {out}_raw.to(tl.float32)")
                self.raw[id(n)] = f"{out}_raw"
            else:
                lines.append(f"{out} = {out}_raw")
            return out, tv
        if op == "iota":
            lines.append(f"{out} = {self.affine(n.attrs['expr'], tv)}")
            return out, tv
        if op == "scalar":
            return _lit(n.attrs["value"]), []
        if op == "cast":
            e = self.arg(n.args[0], tv, ctx)
            if n.dtype.is_floating_point and n.args[0].dtype.is_floating_point:
                r = self.rounded(n, e)
                if r == e:
                    return e, tv
                lines.append(f"{out} = {r}")
                return out, tv
            lines.append(f"{out} = {e}.to({_TL[n.dtype if n.dtype not in _HALF else torch.float32]})")
            return out, tv
        if op == "where":
            known = self.s.constant_on(n.args[0], ctx.region) if ctx is not None and ctx.region and \
                isinstance(n.args[0], LNode) else None
            if isinstance(known, bool):     # the condition is constant on these tiles: the branch it picks
                lines.append(f"{out} = {self.arg(n.args[1 if known else 2], tv, ctx)}")
                return out, tv
            c, a, b = (self.arg(x, tv, ctx) for x in n.args)
            lines.append(f"{out} = tl.where({c}, {a}, {b})")
            return out, tv
        if op == "log2_approx" and read_input(n.args[0]) in self.ftz:
            # the first pass runs only on inputs the check finds positive normal: flushing subnormals is exact
            lines.append(f"{out} = _log2_approx({self.arg(n.args[0], tv, ctx)}, MODE == 0)")
            self.check_by_log(n, out, tv, ctx, lines)
            return out, tv
        if op in _UN:
            lines.append(f"{out} = " + self.rounded(n, _UN[op].format(self.arg(n.args[0], tv, ctx))))
            return out, tv
        if op == "div" and (folded := self.exp_over(n.args[0], n.args[1], tv, ctx, lines)) is not None:
            lines.append(f"{out} = " + self.rounded(n, folded))
            return out, tv
        if op == "div" and isinstance(n.args[1], LNode) and len(self.tvars(n.args[1])) < len(tv):
            rcp = self.reciprocal(n.args[1], tv, ctx, lines)
            lines.append(f"{out} = " + self.rounded(n, f"({self.arg(n.args[0], tv, ctx)} * {rcp})"))
            return out, tv
        if op == "mul" and (scaled := self.half_scale(n, tv, ctx)) is not None:
            lines.append(f"{out} = {scaled}")
            return out, tv
        if op in _BIN:
            a, b = self.arg(n.args[0], tv, ctx), self.arg(n.args[1], tv, ctx)
            kept = _identity_operand(op, a, b)
            if kept is not None:    # x + 0, x - 0, x * 1, x / 1: no instruction, and exact
                src = n.args[kept]
                exact = isinstance(src, LNode) and src.dtype == n.dtype
                lines.append(f"{out} = " + ((a, b)[kept] if exact else self.rounded(n, (a, b)[kept])))
                return out, tv
            expr = _BIN[op].format(a, b)
            lines.append(f"{out} = " + (expr if _exact_sum(n) else self.rounded(n, expr)))
            return out, tv
        if op == "pow" and not isinstance(n.args[1], LNode) and float(n.args[1]) == 2.0:
            x = self.arg(n.args[0], tv, ctx)
            lines.append(f"{out} = {x} * {x}")
            return out, tv
        if op == "reduce":
            return self.tile_reduce(n, ctx, lines, out)
        raise ScheduleError(f"no Triton lowering for op '{op}'")

    def scaled(self, x, ctx: "_Body") -> tuple:
        """(y, c) with x equal to y * c on this body's tiles for a positive constant c, else (x, 1.0).
        A running max of x is then c times the max of y (exact: rounding is monotone), and x's multiply
        is left with one use, the exponent's subtraction, which the compiler fuses with it."""
        y = x
        while isinstance(y, LNode):
            if y.op == "cast" and y.dtype.is_floating_point and y.args[0].dtype.is_floating_point \
                    and not self.rounds(y):
                y = y.args[0]          # emitted as no instruction
                continue
            zero = [i for i, a in enumerate(y.args) if y.op in ("add", "sub")
                    and (i == 1 or y.op == "add") and self.constant(a, ctx.region) == 0]
            other = y.args[1 - zero[0]] if zero else None
            if not (isinstance(other, LNode) and other.dtype == y.dtype):
                break
            y = other                  # x + 0 on these tiles: a copy
        if not isinstance(y, LNode) or y.op != "mul" or self.rounds(y):
            return x, 1.0
        for i in (0, 1):
            c, other = self.constant(y.args[i], ctx.region), y.args[1 - i]
            if isinstance(c, float) and 0 < c < math.inf and isinstance(other, LNode):
                return other, c
        return x, 1.0

    def constant(self, a, region: frozenset):
        """The value of a literal, a scalar node, or a node constant on tiles where `region` holds."""
        if not isinstance(a, LNode):
            return float(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else None
        if a.op == "scalar":
            return self.constant(a.attrs["value"], region)
        v = self.s.constant_on(a, region) if region else None
        return self.constant(v, region) if v is not None else None

    def full(self, e: str, xs, tv: list[Var], ctx: "_Body") -> str:
        """`e`, computed from the values xs, as a tile over all of tv: constants in place of values that
        vary along tv (a constant-folded body) would otherwise leave it without those axes."""
        have = {v for x in xs for v in self.varies(x, ctx.region)}
        if have >= set(tv):
            return e
        shape = ", ".join(str(self.blk[v]) for v in tv)
        return f"(tl.zeros([{shape}], tl.float32) + {e})"

    def varies(self, x, region: frozenset) -> set:
        """The variables x's value varies along on tiles where `region` holds (its facts' constants do not)."""
        if not isinstance(x, LNode) or x.op == "scalar" or (region and self.s.constant_on(x, region) is not None):
            return set()
        if x.op in ("load", "iota") or x in self.s.boundary or (x.op == "reduce" and x in self.s.accums):
            return set(self.tvars(x))
        return set(self.tvars(x)) & {v for a in x.args for v in self.varies(a, region)}

    def exp_over(self, e, d, tv: list[Var], ctx, lines: list[str]) -> Optional[str]:
        """exp2(x - m) / d, with m and d over fewer variables than the tile and d >= 0, as
        exp2(x - (m + log2 d)): per element one subtraction the compiler fuses with x's scaling, in
        place of a multiply after the exponential. d = 0 or +inf give what the division gives.
        log2 d is lg2.approx: its absolute error (2^-22 near 1, relative 2^-22 elsewhere) is a relative
        one of the same size in the quotient, as ex2.approx's own, and libdevice's log2 costs some twenty
        instructions for each of the thread's d values, in every step of a loop over the tile's other axis."""
        if (parts := _exp_over_parts(e, d)) is None or ctx is None:
            return None
        if self.faithful and (e.dtype in _HALF or e.args[0].dtype in _HALF):
            return None
        if ctx.region and self.s.constant_on(e, ctx.region) is not None:
            return None
        x, m = parts
        mv, dv = (self.tvars(m) if isinstance(m, LNode) else []), self.tvars(d)
        if len(dv) >= len(tv) or len(mv) >= len(tv) or (mv and dv != mv) or self.deps_acc(d) or \
                (isinstance(m, LNode) and self.deps_acc(m)):
            return None
        key = (id(e), id(d), tuple(tv))
        if key in ctx.quotients:     # a second use in this body (p and p * p): no second load and exponential
            return ctx.quotients[key]
        lse, p = self.fresh("lse"), self.fresh("p")
        if (m, d) in self.folded:       # stored by the kernel that reduced m and d: one load, no log per step
            self.load_intermediate(self.folded[m, d], lse, lines)
        else:
            lines.append(f"{lse} = {self.arg(m, dv, ctx)} + _log2_approx({self.arg(d, dv, ctx)}, False)")
        lines.append(f"{p} = tl.exp2({self.arg(x, tv, ctx)} - {self.bcast(lse, dv, tv)})")
        ctx.quotients[key] = p
        return p

    def rounded(self, n: LNode, expr: str) -> str:
        """Round like eager where the node is half precision, in programs with float32 outputs computed
        from half inputs: their 1e-4 contract is tighter than the rounding eager applies on the way. A cast
        of an input that rounds is rounded in every plan, so that dots and elementwise products, in
        whichever kernel, read the same values."""
        return _round_to(n.dtype, expr) if self.rounds(n) else expr

    def rounds(self, n: LNode) -> bool:
        """Whether `rounded` rounds n (else n's float32 value stands for it, no instruction)."""
        return (self.faithful and n.dtype in _HALF) or rounds_input(n)

    def half_scale(self, n: LNode, tv: list[Var], ctx) -> Optional[str]:
        """A faithful fp16 product of fp16 values and a constant (the scores' scale) on the packed fp16 unit:
        per element half an fma, half a multiply and one conversion instead of two conversions and a
        multiply. The result is within one fp16 step of eager's float32 multiply and rounding, and equal to
        it for at least 96% of fp16 values (tests/test_kernels.py checks every one)."""
        if not (self.faithful and n.dtype == torch.float16) or math.prod(self.blk[v] for v in tv) < 512:
            return None      # the asm takes elements in pairs: at 8 warps a tile of 512 gives each thread two
        for i in (0, 1):
            c, x = self.constant(n.args[i], ctx.region if ctx else frozenset()), n.args[1 - i]
            if isinstance(c, float) and isinstance(x, LNode) and x.dtype == torch.float16 and \
                    (split := split_f16(c)) is not None:
                if x.op == "cast" and isinstance(x.args[0], LNode) and x.args[0].dtype == torch.float32:
                    x = x.args[0]      # _scale_f16 rounds to fp16 first: one conversion, not three
                return f"_scale_f16({self.arg(x, tv, ctx)}, {split[0]!r}, {_pair(split[1])}, {_pair(split[2])})"
        return None

    def tile_reduce(self, n: LNode, ctx, lines, out) -> tuple[str, list[Var]]:
        """A reduction over a variable held whole in the tile (no loop)."""
        v, kind = n.attrs["var"], n.attrs["kind"]
        tv = self.tvars(n)
        if n in self.s.dots:
            a, b, k = self.s.dots[n]
            lines.append(f"{out} = tl.dot({self.operand(a, n, True, ctx, lines)}, {self.operand(b, n, False, ctx, lines)}{self.dot_prec(a + b)})")
            return out, tv
        x = n.args[0]
        xt = self.tvars(x)
        e = self.arg(x, xt, ctx)
        if self.blk[v] != v.extent:
            e = f"tl.where({self.idx(v, xt)} < {v.extent}, {e}, {_lit(IDENTITY[kind]) if kind != 'any' else '0'})"
        if kind == "any":
            lines.append(f"{out} = tl.max(({e} != 0).to(tl.int32), axis={xt.index(v)}) != 0")
        elif kind == "sum":
            lines.append(f"{out} = tl.sum({e}, axis={xt.index(v)})")
        else:
            lines.append(f"{out} = {self.extreme(n, kind, e, xt.index(v))}")
        return out, tv

    def dot_prec(self, factors) -> str:
        return "" if self.half(factors) else ', input_precision="ieee"'

    def half(self, factors) -> Optional[torch.dtype]:
        """Operand precision of a contraction: the half type of any operand, else float32.
        Triton's CPU interpreter computes bf16 dots wrongly, so there they run in float32."""
        bf16_ok = os.environ.get("TRITON_INTERPRET", "0") != "1"
        for f, _ in factors:
            dt = f.dtype if isinstance(f, LNode) else None
            if isinstance(f, LNode) and f.op == "load":
                dt = self.inputs[f.attrs["input"]][1]
            if dt == torch.float16 or (dt == torch.bfloat16 and bf16_ok):
                return dt
        return None

    def operand(self, factors, red: LNode, is_a: bool, ctx, lines, mask_loop: bool = False) -> str:
        """Product of factors as a 2-D dot operand: [M, K] for A, [K, N] for B."""
        a, b, k = self.s.dots[red]
        tv = self.tvars(red)          # (M, N) in canonical order
        m_or_n = tv[0] if is_a else tv[1]
        want = [m_or_n, k] if is_a else [k, m_or_n]
        canon = [v for v in self.s.order if v in want]
        prec = self.half(a + b)
        if len(factors) == 1 and isinstance(factors[0][0], LNode) and factors[0][1] == 1 and prec \
                and factors[0][0].op == "load" and not mask_loop:
            self.value(factors[0][0], ctx)
            raw = self.raw.get(id(factors[0][0]))
            have = self.tvars(factors[0][0])
            expr = self.bcast(raw, have, canon) if raw and len(have) == 2 else None
        else:
            expr = None
        if expr is None:
            expr = self.product(factors, canon, ctx, lines)
            if mask_loop or (self.blk[k] != k.extent and k is not self.s.loop):
                expr = f"tl.where({self.idx(k, canon)} < {k.extent}, {expr}, 0.0)"
            if prec:
                expr = f"({expr}).to({_TL[prec]})"
            elif any(isinstance(f, LNode) and f.dtype == torch.bfloat16 for f, _ in a + b):
                expr = _round_to(torch.bfloat16, expr)   # interpreter: bf16 operands, rounded as on the GPU
        var = self.fresh("op")
        shape = ", ".join(str(self.blk[v]) for v in canon)
        lines.append(f"{var} = tl.broadcast_to({expr}, ({shape}))")
        return var if canon == want else f"tl.trans({var})"

    def reciprocal(self, d, tv: list[Var], ctx, lines: list[str]) -> str:
        """1 / d for a divisor over fewer variables than the tile: one division per element of d's own
        tile, broadcast to tv and multiplied in (a division per tile element costs far more)."""
        have = self.tvars(d) if isinstance(d, LNode) else []
        rcp = self.fresh("rcp")
        lines.append(f"{rcp} = 1.0 / {self.arg(d, have, ctx)}")
        return self.bcast(rcp, have, tv)

    def extreme(self, n: LNode, kind: str, e: str, axis: int) -> str:
        """max/min of tile e along axis for reduction n: the GPU's fast, NaN-skipping one where
        analysis.facts.nan_absorbing_maxima allows it, else one that propagates NaN as torch does."""
        return f"tl.{kind}({e}, axis={axis})" if n in self.nan_free else f"tl.reduce({e}, {axis}, {_NAN_REDUCE[kind]})"

    def store(self, r: LNode, out: Optional[LOutput], ctx: "_Body") -> None:
        """Write root r to its program output, or to an intermediate buffer for later kernels."""
        tv = self.tvars(r)
        e, have = self.value(r, ctx)
        e = self.bcast(e, have, tv)
        if out is None:
            buf, strides = self.intermediate(r, written=True)
        else:
            buf = self.buffer(out, out.shape, out.dtype, "output", written=True)
            strides = {}
            for d, st in zip(out.dims, _contig(out.shape)):
                inner = st
                for v in reversed(d):
                    strides[v] = inner
                    inner *= v.extent
            if set(strides) != set(r.vars):
                raise ScheduleError("an output is broadcast along a variable its value does not depend on")
        dtype = self.bufs[r if out is None else out].dtype
        off = " + ".join(f"{self.idx(v, tv)} * {strides[v]}" for v in r.vars) or "0"
        mask = self.range_mask(tv)
        val = e if tv or e.isidentifier() else f"tl.full([], {e}, tl.float32)"
        val = f"{val}.to({_TL[dtype]})"
        if tv:
            shape = ", ".join(str(self.blk[v]) for v in tv)
            val = f"tl.broadcast_to({val}, ({shape}))"
        ctx.lines.append(f"tl.store({buf} + {off}, {val}" + (f", mask={mask})" if mask else ")"))

    def product(self, factors, tv: list[Var], ctx, lines: list[str]) -> str:
        """Product of factors over tile tv. A divisor over fewer variables than the tile is inverted once
        per element of its own tile and multiplied in: a division per tile element costs far more."""
        factors = list(factors)
        num = []
        for i, (d, p) in enumerate(factors):
            for j, (e, q) in enumerate(factors):
                if p < 0 and q > 0 and (folded := self.exp_over(e, d, tv, ctx, lines)) is not None:
                    num.append(folded)
                    factors[i] = factors[j] = (1.0, 0)
                    break
        num += [self.arg(f, tv, ctx) for f, p in factors if p > 0]
        den = []
        for f, p in factors:
            if p >= 0:
                continue
            if len(self.tvars(f) if isinstance(f, LNode) else []) < len(tv):
                num.append(self.reciprocal(f, tv, ctx, lines))
            else:
                den.append(self.arg(f, tv, ctx))
        e = " * ".join(num) if num else "1.0"
        return e + "".join(f" / {d}" for d in den)


def _round_to(dtype: torch.dtype, expr: str) -> str:
    """expr, a float32 value, rounded to the half type and kept in float32."""
    return f"_round_bf16({expr})" if dtype == torch.bfloat16 else f"({expr}).to({_TL[dtype]}).to(tl.float32)"


def _identity_operand(op: str, a: str, b: str) -> Optional[int]:
    """Which operand is the result when the other is the operation's identity literal."""
    if op in ("add", "sub", "mul", "div") and b == ("0.0" if op in ("add", "sub") else "1.0"):
        return 0
    if op in ("add", "mul") and a == ("0.0" if op == "add" else "1.0"):
        return 1
    return None


def split_f16(c: float) -> Optional[tuple[float, float, float]]:
    """c as eager's float32 opmath holds it, and that value as fp16 hi + lo (lo the rounded remainder);
    None where hi leaves fp16's normal range or hi + lo misses c32 by more than 2^-21 of it (a remainder
    deep in fp16's subnormals)."""
    c32 = float(torch.tensor(c, dtype=torch.float32))
    hi = float(torch.tensor(c32, dtype=torch.float16))
    lo = float(torch.tensor(c32 - hi, dtype=torch.float16))
    if not 2.0 ** -14 <= abs(hi) <= 65504.0 or abs(c32 - hi - lo) > 2.0 ** -21 * abs(c32):
        return None
    return c32, hi, lo


def _pair(v: float) -> int:
    """An fp16 value's bits in both halves of an int32 (an f16x2 operand)."""
    b = int(torch.tensor(v, dtype=torch.float16).view(torch.int16)) & 0xFFFF
    return (b << 16 | b) - (1 << 32 if b & 0x8000 else 0)


def _exp_over_parts(e, d) -> Optional[tuple]:
    """(x, m) where e / d is exp2(x - m) / d with d >= 0: the form `_Emitter.exp_over` folds."""
    if isinstance(e, LNode) and e.op == "exp2" and isinstance(e.args[0], LNode) and e.args[0].op == "sub" \
            and isinstance(d, LNode) and _nonnegative(d):
        return e.args[0].args[0], e.args[0].args[1]
    return None


def _nonnegative(x) -> bool:
    """x >= 0 (or NaN) wherever it is defined: exponentials, and sums, products, casts and selects of such."""
    if not isinstance(x, LNode):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0
    if x.op in ("exp", "exp2"):
        return True
    if x.op == "scalar":
        return _nonnegative(x.attrs["value"])
    if x.op == "reduce":
        return x.attrs["kind"] in ("sum", "max", "min") and _nonnegative(x.args[0])
    if x.op in ("mul", "add", "cast", "div"):
        return all(_nonnegative(a) for a in x.args)
    return x.op == "where" and all(_nonnegative(a) for a in x.args[1:])


def _zero_or_inf(x) -> bool:
    """x is 0 or +-inf wherever it is defined (a literal, or a select between such literals)."""
    if isinstance(x, LNode):
        if x.op == "scalar":
            return _zero_or_inf(x.attrs["value"])
        return x.op == "where" and all(_zero_or_inf(y) for y in x.args[1:])
    return isinstance(x, (int, float)) and (x == 0 or math.isinf(x))


def _exact_sum(n: LNode) -> bool:
    """A half-precision add/sub of a half value and 0 or +-inf (an additive mask) is exact: no rounding."""
    if n.op not in ("add", "sub"):
        return False
    a, b = n.args
    return any(_zero_or_inf(m) and isinstance(x, LNode) and x.dtype == n.dtype for x, m in ((a, b), (b, a)))


def _contig(shape) -> list[int]:
    out, acc = [], 1
    for s in reversed(list(shape)):
        out.append(acc if s != 1 else 0)
        acc *= s
    return out[::-1]


class _Body:
    """Code and value cache of one loop body (or one post-pass block). `region`: half-planes that hold on
    all of its tiles (their facts' constants replace values); `bounds`: its tiles may pass the loop's extent."""

    def __init__(self, pass_: int, region: frozenset, bounds: bool, parent_cache: dict) -> None:
        self.pass_, self.region, self.bounds = pass_, region, bounds
        self.running: dict[LNode, str] = {}     # this pass's running maxima, as this body sees them
        self.lines: list[str] = []
        self.cache: dict[int, tuple[str, list[Var]]] = {}
        self.quotients: dict[tuple, str] = {}     # exp_over's results by (id(e), id(d), tile variables)
        self.checked: dict[int, tuple[str, Optional[str]]] = {}   # checked load -> (its check line, mask)
        self.witness: dict[int, tuple[str, list[Var]]] = {}      # input -> (check term, tile), see check_by_log
        self.parent = parent_cache

    def lookup(self, n: LNode):
        return self.cache.get(id(n)) or self.parent.get(id(n))


def emit_kernel(s: Schedule, name: str, inputs: list, outputs: dict, block_row: int = 128, block_loop: int = 64,
                num_warps: int = 4, num_stages: int = 2, faithful: bool = False,
                nan_free: frozenset = frozenset(), loaded_later: frozenset = frozenset(),
                slots: int = 0, check: Optional[dict] = None, part: int = 0,
                tiled: Optional[dict] = None, folded: Optional[dict] = None,
                ftz: frozenset = frozenset(), narrowed: Optional[dict] = None) -> KernelSource:
    """Triton source for schedule `s`. `outputs` maps a root to its program outputs (others are intermediates).
    `faithful` rounds half-precision values as eager does (see `_Emitter.rounded`); reductions in `nan_free`
    use the fast max that skips NaN (analysis.facts.nan_absorbing_maxima says where that is exact); roots in
    `loaded_later` are also stored as intermediates, in the layout later kernels read.

    Skipping and constant folding assume finite inputs. In a plan with `slots` > 0 the kernel runs twice:
    with MODE=0 it assumes them, and each program, once its tile is stored, checks an equal piece of the
    `part`-th of `slots` equal parts of the inputs `check` names: it sums x * 0 over its piece (NaN where
    x lies outside the domain `check` gives it, see analysis.facts.input_domains) and sets the zeroed flag
    to NaN when that is not 0. The inputs `tiled` maps to (their load, domain) (see tile_checks) it checks
    whole instead, on the tiles its programs load anyway, and reads only the loop tiles they skip. With
    MODE=1, after the whole plan, it returns at once when the flag is 0 and otherwise recomputes every
    tile as eager does. The check's loads overlap other programs' arithmetic and nothing waits for it: no
    host sync, no pass over the inputs before the kernels, no programs of its own in the tail.
    `folded` (see folded_normalisers): the kernel stores those whose statistics it reduces and loads
    those whose statistics it reads. Inputs in `ftz` are checked for the domain "positive" in this plan, which
    also rejects subnormals (see _DOMAIN_MIN): with MODE=0 the logs of them flush subnormals, one instruction
    in place of four. The check tests an input in `narrowed` (analysis.facts.narrowed_inputs) as its cast to
    the type given there, so a value that cast makes 0 or inf goes to the fixup pass too."""
    em = _Emitter(s, inputs, block_row, block_loop, faithful, nan_free)
    em.checks = dict(tiled or {})
    em.ftz = ftz
    em.narrowed = narrowed or {}
    folded = folded or {}
    em.folded = {md: f for md, f in folded.items() if set(md) <= s.boundary}
    body: list[str] = []
    final_cache: dict[int, tuple[str, list[Var]]] = {}
    segments = _segments(em) if s.loop is not None else []
    for p in range(s.passes if s.loop is not None else 0):
        accs = [a for a in s.accums.values() if a.pass_ == p]
        running = {a.node: f"acc_{a.node.name}" for a in accs}
        for a in accs:
            shape = ", ".join(str(em.blk[v]) for v in em.tvars(a.node))
            init = _lit(IDENTITY[a.kind]) if a.kind != "any" else "0"
            dt = "tl.int32" if a.kind == "any" else "tl.float32"
            body.append(f"acc_{a.node.name} = tl.full([{shape}], {init}, {dt})" if shape else f"acc_{a.node.name} = {init}")
        early = s.stops_early(p)
        if early:   # tiles that can set an `any` first, the constant-folded ones (mostly false) last
            segments = sorted(segments, key=lambda seg: bool(seg[2] & set(s.special)))
            body.append(f"more = {_unsettled(em, accs)}")
        for lo, hi, region, bounds in segments:
            ctx = _Body(p, region, bounds, {**em.cache_pre, **final_cache})
            _loop_body(em, ctx, accs, running)
            for n, _ in em.checks.values():     # a checked load these tiles do not otherwise need
                if s.loop in n.vars and ctx.lookup(n) is None:
                    ctx.cache[id(n)] = em.compute(n, ctx, ctx.lines)
            if early:
                ctx.lines += [f"more = {_unsettled(em, accs)}", f"l0 += {em.blk[s.loop]}"]
                body += [f"l0 = {lo} + tl.zeros([], tl.int32)", f"while (l0 < {hi}) & more:"]
            else:
                # tl.range with explicit stages: Triton then also pipelines the loop's loads that feed no dot.
                # A loop that runs starts at a multiple of the block (see _segments); said so, Triton loads a
                # tile contiguous along the loop variable (KeyFormer's noise) in 16-byte pieces, not 4
                body.append(f"for l0 in tl.range(tl.multiple_of({lo}, {em.blk[s.loop]}), {hi}, {em.blk[s.loop]}, "
                            f"num_stages={num_stages}):")
            body.append(f"    o_{s.loop} = l0 + tl.arange(0, {em.blk[s.loop]})")
            body += ["    " + ln for ln in ctx.lines]
        post = _Body(p + 1, frozenset(), False, {**em.cache_pre, **final_cache})
        for a in accs:
            e = f"acc_{a.node.name}"
            if a.kind == "any":
                e = f"({e} != 0)"
            tv = em.tvars(a.node)
            for f, pw in a.pulled:
                fe = em.arg(f, tv, post)
                e = f"{e} * {fe}" if pw > 0 else f"{e} / {fe}"
            em.finals[a.node] = f"red_{a.node.name}"
            post.lines.append(f"red_{a.node.name} = {e}")
        body += post.lines
        final_cache.update(post.cache)
    if s.loop is None and s.accums:
        raise ScheduleError("reductions without a loop variable")
    store_ctx = _Body(s.passes, frozenset(), False, {**em.cache_pre, **final_cache})
    for r in s.plan.roots:
        for out in outputs.get(r, [None]):      # one node may be several program outputs
            em.store(r, out, store_ctx)
        if r in outputs and r in loaded_later:   # a program output another kernel also reads
            em.store(r, None, store_ctx)
    for (m, d), f in folded.items():
        if m in s.plan.roots and d in s.plan.roots:
            em.store(f, None, store_ctx)
    body += store_ctx.lines
    grid1 = math.prod(v.extent for v in s.batch)
    ntiles = -(-s.row.extent // em.blk[s.row]) if s.row is not None else 1
    tiles = ntiles * grid1
    for n, _ in em.checks.values():
        if s.loop not in n.vars and id(n) not in em.cache_pre:
            em.value(n, None)
    tile = _placement(em, ntiles, grid1) + [f"o_{v} = tl.arange(0, {em.blk[v]})" for v in s.whole] + \
        [em.check_acc(i)[0] for i in em.checks] + em.pre + body
    checked = tile + (_check(em, slots, check or {}, part, tiles, num_stages)
                      if slots and (check or em.checks) else [])
    prog = _modes(em, slots, tiles, tile, checked)
    buffers = list(em.bufs.values())
    head = [f"def {name}({', '.join(b.name for b in buffers)}, MODE: tl.constexpr, PDL: tl.constexpr):",
            "    if PDL:", "        _after_prior()"]
    lines = head + ["    " + ln for ln in prog]
    src = "import os\n\nimport triton\nimport triton.language as tl\n" + \
        "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait\n\n" + _HELPERS + \
        "\n\n@triton.jit\n" + "\n".join(lines) + "\n"
    blocks = {str(v): em.blk[v] for v in em.blk}
    return KernelSource(name, src, buffers, (tiles,), num_warps, num_stages, blocks, bool(s.skip or s.special),
                        slots > 0)


def folded_normalisers(schedules: list[Schedule]) -> dict[tuple[LNode, LNode], LNode]:
    """Row statistics m and d that a later kernel reads to form exp2(x - (m + log2 d)) (see
    `_Emitter.exp_over`), both reduced by one earlier kernel: (m, d) -> a node m + log2 d, which that kernel
    stores once per row and the later one loads in place of m and d, with no log in its loop. The earlier
    kernel still stores m and d (two thin vectors) for any other reader."""
    out: dict[tuple[LNode, LNode], LNode] = {}
    for k, s in enumerate(schedules):
        for n in s.nodes:
            if n.op != "div" or (parts := _exp_over_parts(*n.args)) is None:
                continue
            e, d, m = n.args[0], n.args[1], parts[1]
            if not (isinstance(m, LNode) and {m, d} <= s.plan.loads and m.vars == d.vars
                    and e.dtype == e.args[0].dtype == torch.float32) or (m, d) in out:
                continue
            if any(m in t.plan.roots and d in t.plan.roots for t in schedules[:k]):
                lg = LNode("log2_approx", (d,), torch.float32, d.vars, name=f"log2_{d.name}")
                out[m, d] = LNode("add", (m, lg), torch.float32, m.vars, name=f"lse_{m.name}")
    return out


def _segments(em: _Emitter) -> list[tuple[str, str, frozenset, bool]]:
    """Loop ranges in order, each with the half-planes that hold on all its tiles and whether it needs
    bounds tests: a predicated head, the bulk (wholly outside every skipped and special half-plane), a
    predicated tail, and the tiles wholly inside the special half-plane before the head or after the
    tail. Skipped tiles are left out. Every range that is not empty starts at a multiple of the loop block
    (an empty one may start at hi)."""
    s, L = em.s, em.s.loop
    bl = em.blk[L]
    lo, hi = ["0"], [str(L.extent)]
    ulo, uhi = ["0"], [str((L.extent // bl) * bl)]
    for h in s.skip + s.special:
        cl, kmin, kmax = _span(em, h)
        if cl > 0:
            if h in s.skip:
                hi.append(f"(tl.maximum(-{kmin}, 0) + {cl - 1}) // {cl}")
            uhi.append(f"((tl.maximum(-{kmax}, 0) + {cl - 1}) // {cl}) // {bl} * {bl}")
        else:
            d = -cl
            if h in s.skip:
                lo.append(f"(tl.maximum({kmin} + {d}, 0) // {d}) // {bl} * {bl}")
            ulo.append(f"((tl.maximum({kmax} + {d}, 0) // {d}) + {bl - 1}) // {bl} * {bl}")
    if s.skip or s.special:
        # skipping and constant folding rely on finite inputs (x + -inf = -inf): `fin` is 0 in the fixup
        # pass, where every tile is computed, predicated, as eager computes it (see emit_kernel)
        em.pre.append(f"lo = {_fold('tl.maximum', lo)} * fin")
        em.pre.append(f"hi = {L.extent} - ({L.extent} - {_fold('tl.minimum', hi)}) * fin")
    else:
        em.pre.append("lo = 0")
        em.pre.append(f"hi = {L.extent}")
    em.pre.append(f"ua = tl.minimum(tl.maximum({_fold('tl.maximum', ulo)}, lo), hi)")
    em.pre.append(f"ub = tl.maximum(ua, {_fold('tl.minimum', uhi)})")
    none, bulk = frozenset(), s.live
    segs = [("lo", "ua", none, True), ("ua", "ub", bulk, False), ("ub", "hi", none, True)]
    for h in s.special:
        cl, kmin, _ = _span(em, h)
        if cl > 0:      # from the first tile wholly inside h to the end
            first = f"(((tl.maximum(-{kmin}, 0) + {cl - 1}) // {cl}) + {bl - 1}) // {bl} * {bl}"
            em.pre.append(f"sp = hi - (hi - tl.minimum(tl.maximum({first}, ub), hi)) * fin")
            segs = segs[:2] + [("ub", "sp", none, True), ("sp", "hi", frozenset([h]), True)]
        else:           # from the start to the last tile wholly inside h
            d = -cl
            end = f"(tl.maximum({kmin} + {d}, 0) // {d}) // {bl} * {bl}"
            em.pre.append(f"sp = lo + (tl.minimum(tl.maximum({end}, lo), ua) - lo) * fin")
            segs = [("lo", "sp", frozenset([h]), True), ("sp", "ua", none, True)] + segs[1:]
    return segs


def _unsettled(em: _Emitter, accs: list[Accum]) -> str:
    """Scalar that is true while some `any` accumulator of the tile is still false (Schedule.stops_early)."""
    terms = []
    for a in accs:
        acc = f"acc_{a.node.name}"
        terms.append(f"(tl.min(tl.ravel({acc}), 0) == 0)" if em.tvars(a.node) else f"({acc} == 0)")
    return " | ".join(terms)


def _placement(em: _Emitter, ntiles: int, grid1: int) -> list[str]:
    """Row tile and batch index of this program. Tiles whose loop covers the most are launched first
    (the direction follows the skipped and constant-folded half-planes), across the batch in groups of
    about GROUP_PROGRAMS programs: the longest tiles of a group start together and its shortest end it,
    so the last wave is short, while a group's batch entries are few enough to share the cache."""
    s = em.s
    out = []
    group = max(1, min(grid1, GROUP_PROGRAMS // ntiles))
    if group >= grid1:
        out += [f"t = pid // {grid1}", f"b = pid % {grid1}"]
    else:
        out += [f"g = pid // {group * ntiles}", f"gn = tl.minimum({group}, {grid1} - g * {group})",
                f"t = (pid - g * {group * ntiles}) // gn", f"b = g * {group} + (pid - g * {group * ntiles}) % gn"]
    if s.row is not None:
        grows = sum(h.coeff(s.row) for h in s.skip + s.special) < 0   # loop work grows with the row index
        out.append(f"r0 = ({ntiles - 1} - t) * {em.blk[s.row]}" if grows else f"r0 = t * {em.blk[s.row]}")
        out.append(f"o_{s.row} = r0 + tl.arange(0, {em.blk[s.row]})")
    rest = "b"
    for v in reversed(s.batch):
        out.append(f"i_{v} = {rest} % {v.extent}")
        rest = f"({rest} // {v.extent})"
    return out


# each domain as a lower bound on a measure of x: the check of a value tests it, and that of a whole tile
# keeps a running minimum of the measure and tests that once. "positive" asks for a normal number:
# subnormals go to the fixup pass too, so the first pass's logs may flush them (see emit_kernel)
_DOMAIN_MIN = {"positive": ("{}", "1.1754943508222875e-38"), "nonneg": ("{}", "0.0"),
               "nonzero": ("tl.abs({})", "1.401298464324817e-45")}


def _measure(x: str, dom: str) -> str:
    return _DOMAIN_MIN[dom][0].format(x)


def _meets(m: str, dom: str) -> str:
    """Whether m, a value of the domain's measure, reaches its bound (False for NaN)."""
    return f"({m} >= {_DOMAIN_MIN[dom][1]})"


def _check_term(x: str, dom: Optional[str], mask: Optional[str] = None) -> str:
    """x * 0: 0 where x is finite, NaN where it is not, or where it lies outside `dom` (elements `mask`
    leaves out count as inside)."""
    if not dom:
        return f"{x} * 0"
    cond = _meets(_measure(x, dom), dom) + (f" | ~({mask})" if mask else "")
    return f"tl.where({cond}, {x} * 0, float(\"nan\"))"


def _in_domain(least: str, dom: str) -> str:
    """0 where `least`, a running minimum of the domain's measure, meets its bound, else NaN."""
    return f"tl.where({_meets(least, dom)}, 0.0, float(\"nan\"))"


def tile_checks(s: Schedule, inputs: list) -> dict[int, LNode]:
    """Inputs this kernel's tiles read whole, each with the load that does: every grid variable indexes
    it and the load's variables map one to one onto its elements, so the programs' tiles cover it without
    overlap. A load over the loop variable counts where the loop visits its tiles in order (no early
    stop); the check reads the tiles the loop skips (see _check)."""
    grid = set(s.batch) | ({s.row} if s.row is not None else set())
    free = grid | set(s.whole) | ({s.loop} if s.loop is not None else set())
    early = s.loop is not None and any(s.stops_early(p) for p in range(s.passes))
    out: dict[int, LNode] = {}
    for n in s.nodes:
        if n.op != "load" or n in s.boundary or n.attrs["input"] in out:
            continue
        vs = []
        for e, size in zip(n.attrs["index"], inputs[n.attrs["input"]][0]):
            if e.terms == () and e.const == 0 and size == 1:
                continue
            if len(e.terms) != 1 or e.terms[0][1] != 1 or e.const != 0 or e.terms[0][0].extent != size:
                break
            vs.append(e.terms[0][0])
        else:
            if vs and len(set(vs)) == len(vs) and grid <= set(vs) <= free and not (s.loop in vs and early):
                out[n.attrs["input"]] = n
    return out


def _check(em: _Emitter, slots: int, check: dict, part: int, tiles: int, stages: int) -> list[str]:
    """The finite check's lines at the end of a MODE=0 program (see emit_kernel): this program's piece of
    the kernel's part of each checked input, summed as x * 0 in the input's own precision (two half
    values per instruction); inputs of one size share a loop, so their loads are in flight together.
    Inputs checked on the program's tiles (`em.checks`) add the loop tiles it skipped, then their sums.
    That loop adds whole tiles and sums them once after it (a row sum per step costs shuffles). It has no
    dot, and Triton software-pipelines its loads only when told the stages: they then go through shared
    memory `stages` deep, as the main loop's operands do."""
    flag = em.buffer(FINITE, (1,), torch.float32, "intermediate", written=True)
    skipped = []
    looped = [n for n, _ in em.checks.values() if em.s.loop in n.vars]
    if looped:
        L, bl = em.s.loop, em.blk[em.s.loop]
        ctx = _Body(0, frozenset(), True, {})
        em.check_whole = True
        for n in looped:
            em.compute(n, ctx, ctx.lines)
        em.check_whole = False
        for n in looped:
            i, shape = n.attrs["input"], ", ".join(str(em.blk[v]) for v in em.tvars(n))
            skipped.append(f"    chkt{i} = tl.zeros([{shape}], tl.float32)")
            if em.checks[i][1]:
                skipped.append(f"    chkm{i} = tl.full([{shape}], float(\"inf\"), tl.float32)")
        for lo, hi in (("0", "lo"), (f"(hi + {bl - 1}) // {bl} * {bl}", str(L.extent))):
            skipped += [f"    for l0 in tl.range({lo}, {hi}, {bl}, num_stages={stages}):     # loop tiles it skipped",
                        f"        o_{L} = l0 + tl.arange(0, {bl})"] + ["        " + ln for ln in ctx.lines]
        for n in looped:
            i, ax = n.attrs["input"], em.tvars(n).index(L)
            low = f" + tl.sum({_in_domain(f'chkm{i}', em.checks[i][1])}, {ax})" if em.checks[i][1] else ""
            skipped.append(f"    chk{i} += tl.sum(chkt{i}, {ax}){low}")
    sizes: dict[int, list[int]] = {}
    for i in check:
        sizes.setdefault(math.prod(em.inputs[i][0]), []).append(i)
    inits, out = [], []
    for n, group in sizes.items():
        span = -(-n // slots)
        start, stop = part * span, min(n, (part + 1) * span)
        per = -(-(stop - start) // tiles)
        blk = min(CHECK_BLOCK, _pow2(per))
        out += [f"    end = tl.minimum({start} + (pid64 + 1) * {per}, {stop})",
                f"    for off in range({start} + pid64 * {per}, end, {blk}):",
                f"        o = off + tl.arange(0, {blk})"]
        for i in group:
            shape, dtype = em.inputs[i]
            inits.append(f"    chk{i} = tl.zeros([{blk}], {_TL[dtype]})")
            out += [f"        v{i} = tl.load({em.buffer(('in', i), shape, dtype, 'input')} + o, mask=o < end, other=0)",
                    f"        chk{i} += {_check_term(em.as_checked(i, f'v{i}'), check[i], 'o < end')}"]
    total = " + ".join([f"tl.sum(chk{i}.to(tl.float32), 0)" for i in check] +
                       [em.check_acc(i)[1] for i in em.checks] +
                       [f"tl.sum(tl.ravel({acc} * 0), 0)" if tv else f"{acc} * 0" for acc, tv in em.carriers.items()])
    head = ["if MODE == 0:     # this program's piece of the finite check", "    pid64 = pid.to(tl.int64)"]
    return head + inits + out + skipped + [f"    if {total} != 0:     # NaN: some value here is NaN or inf",
                                           f"        tl.store({flag}, float(\"nan\"))"]


def _modes(em: _Emitter, slots: int, tiles: int, tile: list[str], checked: list[str]) -> list[str]:
    """The kernel body: one tile per program, then its piece of the check (MODE=0); in a plan with a check,
    also the fixup pass (MODE=1), whose FIXUP_PROGRAMS programs return at once when the flag is 0 and
    otherwise loop over the tiles (see emit_kernel). Few programs keep the usual, finite case cheap."""
    if not slots:
        return ["fin = 1", "pid = tl.program_id(0)"] + tile
    flag = em.buffer(FINITE, (1,), torch.float32, "intermediate")
    return ["if MODE == 1:     # the fixup pass",
            f"    if tl.load({flag}) == 0:     # every input finite: the first pass was exact",
            "        return",
            "    fin = 0",
            f"    for pid in range(tl.program_id(0), {tiles}, tl.num_programs(0)):"] + \
        ["        " + ln for ln in tile if not ln.endswith(CHECK_MARK)] + \
        ["else:", "    fin = 1", "    pid = tl.program_id(0)"] + ["    " + ln for ln in checked]


def _span(em: _Emitter, h: Affine) -> tuple[int, str, str]:
    """h's loop coefficient and the least and greatest of its other terms over this program's row tile."""
    cr = h.coeff(em.s.row) if em.s.row is not None else 0
    if not cr:
        return h.coeff(em.s.loop), str(h.const), str(h.const)
    a, b = f"{cr} * r0", f"{cr} * (r0 + {em.blk[em.s.row] - 1})"
    return h.coeff(em.s.loop), f"(tl.minimum({a}, {b}) + {h.const})", f"(tl.maximum({a}, {b}) + {h.const})"


def _fold(fn: str, xs: list[str]) -> str:
    return xs[0] if len(xs) == 1 else f"{fn}({xs[0]}, {_fold(fn, xs[1:])})"


def _loop_body(em: _Emitter, ctx: _Body, accs: list[Accum], running: dict) -> None:
    """One tile step: running maxima first, then every accumulator of the pass."""
    s = em.s
    L = s.loop
    pred = ctx.bounds and em.partial(L)    # bounds tests on the loop variable
    news = {}
    for a in accs:
        if a.kind in ("max", "min"):
            x = a.node.args[0]
            xt = em.tvars(x)
            base, scale = em.scaled(x, ctx)
            e = em.full(em.arg(base, xt, ctx), [base], xt, ctx)
            if pred:
                e = f"tl.where({em.idx(L, xt)} < {L.extent}, {e}, {_lit(IDENTITY[a.kind])})"
            fn = "max" if a.kind == "max" else "min"
            new = f"new_{a.node.name}"
            red = em.extreme(a.node, a.kind, e, xt.index(L))
            if scale != 1.0:
                red = f"{red} * {_lit(scale)}"
            if a.node in em.nan_free:
                ctx.lines.append(f"{new} = tl.{fn}imum({running[a.node]}, {red})")
            else:
                ctx.lines.append(f"{new} = tl.{fn}imum({running[a.node]}, {red}, propagate_nan=tl.PropagateNan.ALL)")
            safe = f"safe_{a.node.name}"
            ctx.lines.append(f"{safe} = tl.where({new} == {_lit(IDENTITY[a.kind])}, 0.0, {new})")
            ctx.running[a.node] = safe
            news[a.node] = new
            for base in sorted({b for acc in accs for d, b in acc.rescale if d is a.node}):
                ctx.lines.append(f"alpha_{base}_{a.node.name} = tl.{base}({running[a.node]} - {safe})")
    for a in accs:
        acc = running[a.node]
        tv = em.tvars(a.node)
        alpha = "".join(f" * {em.bcast(f'alpha_{b}_{d.name}', em.tvars(d), tv)}" for d, b in a.rescale)
        if a.kind in ("max", "min"):
            continue
        if a.kind == "any":
            x = a.node.args[0]
            xt = em.tvars(x)
            e = f"({em.full(em.arg(x, xt, ctx), [x], xt, ctx)} != 0)"
            if pred:
                e = f"({e} & ({em.idx(L, xt)} < {L.extent}))"
            ctx.lines.append(f"{acc} = tl.maximum({acc}, tl.max({e}.to(tl.int32), axis={xt.index(L)}))")
            continue
        if a.node in s.dots:
            fa, fb, k = s.dots[a.node]
            # past the loop's extent both operands are zeroed: a padded lane of either may be inf (the log of
            # a noise load's padding 0), and inf times the other's 0 is NaN
            opa = em.operand(fa, a.node, True, ctx, ctx.lines, mask_loop=pred)
            opb = em.operand(fb, a.node, False, ctx, ctx.lines, mask_loop=pred)
            ctx.lines.append(f"{acc} = tl.dot({opa}, {opb}, {acc}{alpha}{em.dot_prec(fa + fb)})")
            continue
        xt = [v for v in s.order if any(isinstance(f, LNode) and v in f.vars for f, _ in a.kept)]
        if L not in xt:
            raise ScheduleError(f"{a.node.name}: summand does not vary along the loop")
        e = em.full(em.product(a.kept, xt, ctx, ctx.lines), [f for f, _ in a.kept], xt, ctx)
        for i in [i for i, (_, wt) in ctx.witness.items() if wt == xt]:   # one sum carries both
            e = f"_with_check({e}, {ctx.witness.pop(i)[0]}, MODE == 0)"
            em.carriers[acc] = tv
        if pred:
            e = f"tl.where({em.idx(L, xt)} < {L.extent}, {e}, 0.0)"
        ctx.lines.append(f"{acc} = {acc}{alpha} + tl.sum({e}, axis={xt.index(L)})")
    for d, new in news.items():
        ctx.lines.append(f"{running[d]} = {new}")
    for i, (term, wt) in ctx.witness.items():     # no sum of that tile took it in
        ctx.lines.append(em.check_sum(i, term, wt))
    ctx.witness.clear()
