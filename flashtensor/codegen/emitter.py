"""The kernel emitter's core: names, tiles and broadcasting, buffers, and the Triton expression of every value.

Every tile is a Triton tensor over its variables in the schedule's canonical order (grid-tiled row,
loop, whole); batch variables are scalars taken from the program id. Float math runs in float32;
contraction operands stay in half precision when an operand is. The emitter prints what the earlier
stages decided; the local forms it may print instead of an op as written are a list in forms.py, the
finite check's lines are check.py's, the loop's structure loop.py's.
"""
from __future__ import annotations

import ast
from typing import Any, Optional, Sequence

import torch

from ..analysis.facts import IDENTITY, exact_sum
from ..ir.loops import ABSOLUTE, Affine, LNode, LOutput, Var, read_input
from ..ir.sizes import source, symbolic, times
from ..schedule.schedule import Factor, ScheduleError
from . import check, forms
from .body import Body
from .lower import (
    ABSOLUTE_FORMS,
    AS_EAGER,
    BINARY,
    HALF,
    NAN_REDUCE,
    TL,
    UNARY,
    contig,
    lit,
    quotient_as_eager,
    round_to,
)
from .tiles import Tiles

CHUNK = 32       # the piece of a chunked contraction's axis (Emitter.looped_sum)


class Emitter(Tiles):
    """Prints every value of a kernel as Triton; `Tiles` holds the kernel's state."""

    def value(self, n: LNode, ctx: Optional[Body]) -> tuple[str, list[Var]]:
        """Triton expression (a variable name) for node n, emitting its code where it belongs."""
        if self.chunk is not None:      # a looped contraction's operand: over its variable in its loop, else outside
            k, inner, ctx, _ = self.chunk
            if k in self.s.tile_vars(n):
                if id(n) not in inner.cache:
                    inner.cache[id(n)] = self.compute(n, inner, inner.lines)
                return inner.cache[id(n)]
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
            assert ctx is not None      # values of the loop body are asked for from a body
            lines, store = ctx.lines, ctx.cache
        const = self.s.constant_on(n, ctx.region) if (ctx is not None and ctx.region) else None
        res: tuple[str, list[Var]]
        if const is not None:
            res = (lit(const), [])
        else:
            res = self.compute(n, ctx if home != "pre" else None, lines)
        store[id(n)] = res
        return res

    def arg(self, a: Any, tv: list[Var], ctx: Optional[Body]) -> str:
        if not isinstance(a, LNode):
            return lit(float(a) if isinstance(a, float) else a)
        e, have = self.value(a, ctx)
        return self.bcast(e, have, tv)

    def compute(self, n: LNode, ctx: Optional[Body], lines: list[str]) -> tuple[str, list[Var]]:
        tv = self.tvars(n)
        out = self.fresh("x")
        op = n.op
        if n in self.s.boundary:
            return self.load_intermediate(n, out, lines, ctx), tv
        if op == "load":
            shape, dtype = self.inputs[n.attrs["input"]]
            buf = self.buffer(("in", n.attrs["input"]), shape, dtype, "input")
            strides = contig(shape)
            off = self.offset(zip(n.attrs["index"], strides), tv, ctx)
            mask = self.load_mask(n, tv, ctx)
            lines.append(f"{out}_raw = tl.load({buf} + {off}" + (f", mask={mask}, other=0)" if mask else ")"))
            self.loaded.append((tv, dtype.itemsize))
            if self.checks.get(n.attrs["input"], (None,))[0] is n:
                added = check.check_add(self, n.attrs["input"], f"{out}_raw", tv, mask)
                lines += added
                if ctx is not None and not self.check_whole:
                    ctx.checked[id(n)] = (added[0], mask)
            if dtype in HALF:
                lines.append(f"{out} = {out}_raw.to(tl.float32)")
                self.raw[id(n)] = f"{out}_raw"
            else:
                lines.append(f"{out} = {out}_raw")
            return out, tv
        if op == "iota":
            e = n.attrs["expr"]
            if not n.dtype.is_floating_point:
                lines.append(f"{out} = {self.affine(e, tv)}")
            else:       # a float arange (a log of positions): the index as float32
                index = f"{self.affine(e, tv)}.to(tl.float32)" if e.terms else repr(float(e.const))
                lines.append(f"{out} = {index}")
            return out, tv
        if op == "scalar":
            return lit(n.attrs["value"]), []
        if op == "cast":
            e = self.arg(n.args[0], tv, ctx)
            if n.dtype.is_floating_point and n.args[0].dtype.is_floating_point:
                r = self.rounded(n, e, ctx)
                if r == e:
                    return e, tv
                lines.append(f"{out} = {r}")
                return out, tv
            lines.append(f"{out} = {e}.to({TL[n.dtype if n.dtype not in HALF else torch.float32]})")
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
            check.check_by_log(self, n, out, tv, ctx, lines)
            return out, tv
        if op in UNARY:
            template = AS_EAGER.get(op, UNARY[op]) if self.rounds(n, ctx) else \
                ABSOLUTE_FORMS.get(op, UNARY[op]) if n.attrs.get(ABSOLUTE) else UNARY[op]
            lines.append(f"{out} = " + self.rounded(n, template.format(self.arg(n.args[0], tv, ctx)), ctx))
            return out, tv
        for form in forms.FORMS:       # local forms cheaper than the op as written (codegen/forms.py)
            if (alt := form(self, n, tv, ctx, lines)) is not None:
                lines.append(f"{out} = {alt}")
                return out, tv
        if op in BINARY:
            a, b = self.arg(n.args[0], tv, ctx), self.arg(n.args[1], tv, ctx)
            eager = quotient_as_eager(a, n.args[1]) if op == "div" and self.rounds(n, ctx) else None
            expr = eager or (self.times(n, a, b, ctx) if op == "mul" else BINARY[op].format(a, b))
            lines.append(f"{out} = " + (expr if exact_sum(n) else self.rounded(n, expr, ctx)))
            return out, tv
        if op == "reduce":
            return self.tile_reduce(n, ctx, lines, out)
        raise ScheduleError(f"no Triton lowering for op '{op}'", where=n.origin)

    def load_mask(self, n: LNode, tv: list[Var], ctx: Optional[Body] = None) -> Optional[str]:
        """The mask of an input's load: a cat's piece is read at the joined axis' index minus its offset."""
        return self.index_mask(tv, zip(n.attrs["index"], self.inputs[n.attrs["input"]][0]), ctx)

    def full(self, e: str, xs: Sequence[object], tv: list[Var], ctx: Body) -> str:
        """`e`, computed from the values xs, as a tile over all of tv: constants in place of values that
        vary along tv (a constant-folded body) would otherwise leave it without those axes."""
        have = {v for x in xs for v in self.varies(x, ctx.region)}
        if have >= set(tv):
            return e
        shape = ", ".join(str(self.blk[v]) for v in tv)
        return f"(tl.zeros([{shape}], tl.float32) + {e})"

    def varies(self, x: object, region: frozenset) -> set[Var]:
        """The variables x's value varies along on tiles where `region` holds (its facts' constants do not)."""
        if not isinstance(x, LNode) or x.op == "scalar" or (region and self.s.constant_on(x, region) is not None):
            return set()
        if x.op in ("load", "iota") or x in self.s.boundary or (x.op == "reduce" and x in self.s.accums):
            return set(self.tvars(x))
        return set(self.tvars(x)) & {v for a in x.args for v in self.varies(a, region)}

    def tile_reduce(self, n: LNode, ctx: Optional[Body], lines: list[str], out: str) -> tuple[str, list[Var]]:
        """A reduction over a variable held whole in the tile (no loop)."""
        v, kind = n.attrs["var"], n.attrs["kind"]
        tv = self.tvars(n)
        if n in self.s.steps:
            return self.looped_sum(n, ctx, lines, out, self.s.steps[n], True), tv
        if n in self.s.dots:
            a, b, k = self.s.dots[n]
            if self.chunks(n):
                return self.looped_sum(n, ctx, lines, out, k, False), tv
            opa, opb = self.operand(a, n, True, ctx, lines), self.operand(b, n, False, ctx, lines)
            lines.append(f"{out} = tl.dot({opa}, {opb}{self.dot_prec(a + b)})")
            return out, tv
        x = n.args[0]
        xt = self.tvars(x)
        e = self.arg(x, xt, ctx)
        if self.padded(v):
            fill = lit(IDENTITY[kind]) if kind != "any" else "0"
            e = f"tl.where({self.idx(v, xt)} < {source(v.extent)}, {e}, {fill})"
        if kind == "any":
            lines.append(f"{out} = tl.max(({e} != 0).to(tl.int32), axis={xt.index(v)}) != 0")
        elif kind == "sum":
            lines.append(f"{out} = tl.sum({e}, axis={xt.index(v)})")
        else:
            lines.append(f"{out} = {self.extreme(n, kind, e, xt.index(v))}")
        return out, tv

    def chunks(self, n: LNode) -> bool:
        """Whether contraction n runs as a loop over chunks of its axis (`looped_sum`): a float32 one over an axis
        held whole and longer than a chunk, whose operands along that axis are elementwise in loads and indices
        (no reduction, no value the finite check watches). Its operand tiles, whole, took every register: EA's
        projections of a 64 x 128 float32 tile by 128 x 32 weights, as 3xTF32, spilled 3 KB per thread."""
        a, b, k = self.s.dots[n]
        if k not in self.s.whole or symbolic(k.extent) or k.extent <= CHUNK or self.half(a + b):
            return False
        watched = set(self.checks) | set(self.ftz)

        def elementwise(x: object) -> bool:
            if not isinstance(x, LNode) or k not in x.vars or x in self.s.boundary:
                return True
            if x.op == "load":
                return x.attrs["input"] not in watched
            return x.op not in ("reduce", "at") and x not in self.s.accums and all(map(elementwise, x.args))
        return all(elementwise(f) for f, _ in a + b)

    def looped_sum(self, n: LNode, ctx: Optional[Body], lines: list[str], out: str, k: Var, stepped: bool) -> str:
        """Sum n accumulated over a loop: a contraction over CHUNK-wide pieces of its axis k, or (`stepped`) over the
        values of k, a second variable it sums over (Schedule.steps), each value's sum a dot or a tile sum. Each
        piece's values are computed inside the loop (those off k before it), so no whole tile over k stays live."""
        inner = Body(ctx.pass_ if ctx else 0, ctx.region if ctx else frozenset(), ctx.bounds if ctx else False, {},
                     ctx.at_l0 if ctx else False)
        full, raw = self.blk[k], dict(self.raw)
        self.blk[k], self.chunk = (full if stepped else CHUNK), (k, inner, ctx, stepped)
        try:
            if n in self.s.dots:
                a, b, _ = self.s.dots[n]
                opa, opb = self.operand(a, n, True, inner, inner.lines), self.operand(b, n, False, inner, inner.lines)
                step = f"tl.dot({opa}, {opb}, {out}{self.dot_prec(a + b)})"
            else:
                step = f"{out} + {self.tile_reduce(n.args[0], inner, inner.lines, self.fresh('x'))[0]}"
        finally:
            self.blk[k], self.chunk, self.raw = full, None, raw
        shape = ", ".join(str(self.blk[v]) for v in self.tvars(n))
        head = [f"for i_{k} in tl.range(0, {k.extent}):"] if stepped else \
            [f"for c_{k} in tl.range(0, {k.extent}, {CHUNK}):", f"    o_{k}c = c_{k} + tl.arange(0, {CHUNK})"]
        lines += [f"{out} = tl.zeros([{shape}], tl.float32)"] + head + ["    " + ln for ln in inner.lines] + \
            [f"    {out} = {step}"]
        return out

    def dot_prec(self, factors: Sequence[Factor]) -> str:
        """Half operands as they are; float32 ones as Options.f32_dot says (exact in the interpreter)."""
        if self.half(factors):
            return ""
        return f', input_precision="{"ieee" if self.spec.interpret else self.spec.f32_dot}"'

    def half(self, factors: Sequence[Factor]) -> Optional[torch.dtype]:
        """Operand precision of a contraction: the half type of any operand, else float32.
        Triton's CPU interpreter computes bf16 dots wrongly, so there they run in float32."""
        bf16_ok = not self.spec.interpret
        for f, _ in factors:
            dt = f.dtype if isinstance(f, LNode) else None
            if isinstance(f, LNode) and f.op == "load":
                dt = self.inputs[f.attrs["input"]][1]
            if dt == torch.float16 or (dt == torch.bfloat16 and bf16_ok):
                return dt
        return None

    def operand(self, factors: Sequence[Factor], red: LNode, is_a: bool, ctx: Optional[Body], lines: list[str],
                mask_loop: bool = False) -> str:
        """Product of factors as a 2-D dot operand: [M, K] for A, [K, N] for B."""
        a, b, k = self.s.dots[red]
        tv = self.tvars(red)          # (M, N) in canonical order
        m_or_n = tv[0] if is_a else tv[1]
        want = [m_or_n, k] if is_a else [k, m_or_n]
        canon = [v for v in self.s.order if v in want]
        prec = self.half(a + b)
        # a load in a body with bounds tests reads 0 past the loop's extent (Tiles.range_mask): a raw tile along
        # the loop needs no zeroing, and feeding it as loaded keeps the operand out of float32 registers
        if len(factors) == 1 and isinstance(factors[0][0], LNode) and factors[0][1] == 1 and prec \
                and factors[0][0].op == "load" \
                and (not mask_loop or (k is self.s.loop and k in self.tvars(factors[0][0]))):
            self.value(factors[0][0], ctx)
            raw = self.raw.get(id(factors[0][0]))
            have = self.tvars(factors[0][0])
            expr = self.bcast(raw, have, canon) if raw and len(have) == 2 else None
        else:
            expr = None
        shape = ", ".join(str(self.blk[v]) for v in canon)
        if expr is None:
            expr = self.product(factors, canon, ctx, lines)
            if _literal(expr):      # a constant the region's facts give (0 in a folded tile): a tile, which `.to` needs
                expr = f"tl.full(({shape}), {expr}, tl.float32)"
            if mask_loop or (self.padded(k) and k is not self.s.loop):
                expr = f"tl.where({self.idx(k, canon)} < {source(k.extent)}, {expr}, 0.0)"
            if prec:
                expr = f"({expr}).to({TL[prec]})"
            elif any(isinstance(f, LNode) and f.dtype == torch.bfloat16 for f, _ in a + b):
                expr = round_to(torch.bfloat16, expr)   # interpreter: bf16 operands, rounded as on the GPU
        var = self.fresh("op")
        lines.append(f"{var} = tl.broadcast_to({expr}, ({shape}))")
        return var if canon == want else f"tl.trans({var})"

    def extreme(self, n: LNode, kind: str, e: str, axis: int) -> str:
        """max/min of tile e along axis for reduction n: the GPU's fast, NaN-skipping one where
        analysis.facts.nan_absorbing_maxima allows it, else one that propagates NaN as torch does."""
        return f"tl.{kind}({e}, axis={axis})" if n in self.nan_free else f"{NAN_REDUCE[kind]}({e}, {axis})"

    def store(self, r: LNode, out: Optional[LOutput], ctx: "Body") -> None:
        """Write root r to its program output, or to an intermediate buffer for later kernels."""
        tv = self.tvars(r)
        e, have = self.value(r, ctx)
        e = self.bcast(e, have, tv)
        if out is None:
            buf, strides = self.intermediate(r, written=True)
        else:
            buf = self.buffer(out, out.shape, out.dtype, "output", written=True)
            strides = {}
            for d, st in zip(out.dims, contig(out.shape)):
                inner = st
                for v in reversed(d):
                    strides[v] = inner
                    inner *= v.extent
            if not set(r.vars) <= set(strides):
                raise ScheduleError("an output is broadcast along a variable its value does not depend on")
        dtype = self.bufs[r if out is None else out].dtype
        off = self.offset(((Affine.of(v), strides[v]) for v in r.vars), tv)
        mask = self.range_mask(tv)
        val = e if tv or e.isidentifier() else f"tl.full([], {e}, tl.float32)"
        if dtype == torch.bfloat16 and self.spec.interpret:   # the interpreter's conversion truncates
            val = round_to(dtype, val)
        val = f"{val}.to({TL[dtype]})"
        if tv:
            shape = ", ".join(str(self.blk[v]) for v in tv)
            val = f"tl.broadcast_to({val}, ({shape}))"
        # an output repeated along variables its value does not depend on (x.repeat, x.expand returned): the
        # tile is stored once per value of theirs
        indent = ""
        for v in (v for v in strides if v not in r.vars):
            ctx.lines.append(f"{indent}for r_{v} in range({source(v.extent)}):")
            indent += "    "
            off += " + " + times(f"tl.cast(r_{v}, tl.int64)", strides[v])
        ctx.lines.append(f"{indent}tl.store({buf} + {off}, {val}" + (f", mask={mask})" if mask else ")"))

    def store_roots(self, cache: dict) -> list[str]:
        """The lines storing every root of the kernel (after its loop), and the folded normalisers of those it
        reduces; `cache` holds the values computed before and after the loop."""
        s, ctx = self.s, Body(self.s.passes, frozenset(), False, cache)
        for r in s.plan.roots:
            for out in self.spec.outputs.get(r, [None]):      # one node may be several program outputs
                self.store(r, out, ctx)
            if r in self.spec.outputs and r in self.spec.loaded_later:   # a program output another kernel also reads
                self.store(r, None, ctx)
        for (m, d), f in self.spec.folded.items():
            if m in s.plan.roots and d in s.plan.roots:
                self.store(f, None, ctx)
        return ctx.lines

    def product(self, factors, tv: list[Var], ctx, lines: list[str]) -> str:
        """Product of factors over tile tv, a summand or a dot operand. The forms for a quotient apply to its
        factors as to a division: normalised_exp to an exponential over its normaliser, thin_divisor to a
        divisor over fewer variables than the tile. The factors are applied in the program's order, each quotient
        before the next factor: (x / d) * (x / d) with x near finfo.min and d infinite is 0, where x * x / d / d
        is NaN."""
        factors = list(factors)
        done: dict[int, str] = {}       # a factor's position -> its expression, folded with its divisor
        for i, (d, p) in enumerate(factors):
            for j, (e, q) in enumerate(factors):
                if p < 0 and q > 0 and forms.normalised_exp in forms.FORMS and \
                        (folded := forms.exp_over(self, e, d, tv, ctx, lines)) is not None:
                    done[j] = folded
                    factors[i] = factors[j] = (1.0, 0)
                    break
        thin = [i for i, (f, p) in enumerate(factors) if p < 0 and isinstance(f, LNode) and
                forms.thin_divisor in forms.FORMS and len(self.tvars(f)) < len(tv)]
        for i in thin:
            for j, (e, q) in enumerate(factors):
                if factors[i][1] == -1 and q == 1 and j not in done and \
                        (quot := forms.thin_quotient(self, e, factors[i][0], tv, ctx, lines)) is not None:
                    done[j], factors[i] = quot, (1.0, 0)
                    break
        steps: list[tuple[str, str]] = []       # ("*" or "/", expression) in the factors' order
        for i, (f, p) in enumerate(factors):
            if i in done:
                steps.append(("*", done[i]))
            elif p > 0:
                steps.append(("*", self.arg(f, tv, ctx)))
            elif p < 0 and i in thin:
                steps.append(("*", forms.reciprocal(self, f, tv, ctx, lines)))
            elif p < 0:
                steps.append(("/", self.arg(f, tv, ctx)))
        first = next((k for k, (how, _) in enumerate(steps) if how == "*"), None)
        e = "1.0" if first is None else steps.pop(first)[1]
        return e + "".join(f" {how} {x}" for how, x in steps)


def _literal(expr: str) -> bool:
    """Whether an emitted expression is arithmetic on numbers alone (values the facts fix: `float("-inf") * 0.5 *
    0.0 / 64` in a tile folded by a -inf mask), a Python number in Triton, not a tensor."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id == "float" and len(node.args) == 1
                    and isinstance(node.args[0], ast.Constant) and not node.keywords):
                return False
        elif isinstance(node, ast.Name):
            if node.id != "float":
                return False
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.operator,
                                   ast.unaryop, ast.Load)):
            return False
    return True
