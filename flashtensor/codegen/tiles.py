"""A kernel's tiles while it is emitted: their shapes, names, index expressions and buffers.

`Tiles` holds what every part of the emitter reads (the schedule, the block sizes, the buffers, the
values computed before the loop) and the small helpers that print indices and broadcasts. The
expression of a value is the emitter's (emitter.py); `arg`, `value` and `compute` are declared here so
the local forms (forms.py) and the finite check (check.py) can ask for operands without importing it.
"""
from __future__ import annotations

import abc
from typing import Any, Iterable, Optional, Sequence

import torch

from ..analysis import precision
from ..ir.loops import Affine, LNode, Var, outside, stored
from ..ir.sizes import ALIGN, Size, ceildiv, hint, pow2_bucket, python, source, symbolic, times, value
from ..options import TileConfig
from ..schedule.schedule import Schedule, ScheduleError, contraction, factorize
from .artifact import INT32_REACH, Buffer
from .body import Body
from .lower import HALF, contig, lit, pow2, round_to
from .spec import KernelSpec


class Tiles(abc.ABC):
    def __init__(self, spec: KernelSpec, cfg: TileConfig) -> None:
        s = spec.schedule
        self.spec = spec
        self.s = s
        self.nan_free = spec.nan_free   # max/min reductions that may use the fast, NaN-skipping max
        self.inputs = spec.inputs       # program input (shape, dtype) list
        self.faithful = spec.faithful
        self.undotted = _undotted_operands(s)
        # values rounded only for the masks added to them, with those masks, where this kernel alone computes them
        again = {id(n) for n in spec.recomputed}
        self.under_masks = {} if spec.faithful else {
            k: ms for k, ms in precision.deciding_masks(s.nodes).items() if k not in again}
        self.blk: dict[Var, int] = {}
        if s.row is not None:
            self.blk[s.row] = min(cfg.block_row, pow2(self.bucket(s.row.extent)))
        if s.loop is not None:
            self.blk[s.loop] = 1 if s.stepped else min(cfg.block_loop, pow2(self.bucket(s.loop.extent)))
        for v in s.whole:
            self.blk[v] = pow2(v.extent)
        self.bufs: dict[object, Buffer] = {}    # by source, in kernel-argument order
        self.pre: list[str] = []
        self.cache_pre: dict[int, tuple[str, list[Var]]] = {}
        self.raw: dict[int, str] = {}
        self.finals: dict[LNode, str] = {}      # loop reduction -> its value after its pass
        self.deps: dict[int, bool] = {}
        self.tmp = 0
        # input -> (its tile load, domain)
        self.checks: dict[int, tuple[LNode, Optional[str]]] = dict(spec.check.tiled)
        self.check_whole = False    # check_add keeps whole tiles (the loop over skipped tiles, see check.py)
        # (m, d) -> m + log2 d, stored by an earlier kernel (codegen/normalisers.py)
        self.folded: dict[tuple[LNode, LNode], LNode] = {md: f for md, f in spec.folded.items()
                                                          if set(md) <= s.boundary}
        self.ftz: frozenset[int] = spec.check.ftz   # inputs whose logs flush subnormals in the first pass
        self.narrowed: dict[int, torch.dtype] = dict(spec.check.narrowed)   # inputs the check tests as cast
        self.carriers: dict[str, list[Var]] = {}   # sum accumulators that took in a check (see loop.py)
        self.splits: Size = 1       # programs per row tile, each over a piece of the loop (split.py)
        self.limits: list[str] = []     # the tile offsets' reach in a shape-generic kernel (see `offset`)
        self.loaded: list[tuple[list[Var], int]] = []     # each tile load emitted: its variables, bytes an element
        # while a contraction's operands are emitted a piece of a variable at a time (emitter.looped_sum): that
        # variable, the body of its loop, the body the contraction itself is in, and whether the pieces are single
        # values (a scalar index) rather than chunks of its axis
        self.chunk: Optional[tuple[Var, Body, Optional[Body], bool]] = None

    @property
    def split(self) -> bool:
        """Whether the loop is split across programs (without a guard on a symbolic count)."""
        return symbolic(self.splits) or self.splits != 1

    @property
    def runtime_split(self) -> bool:
        """Whether the split count follows from the call's sizes: the kernel takes SPLIT, whether it comes to more
        than 1 (artifact.header), so that where it does not the pieces' code is not compiled at all."""
        return symbolic(self.splits)

    def bucket(self, extent: Any) -> int:
        """A static extent, or the top of the length bucket the kernel is emitted for (spec.sizes)."""
        return pow2_bucket(value(extent, self.spec.sizes)) if symbolic(extent) else extent

    def padded(self, v: Var) -> bool:
        """Whether v's tile may hold positions past its extent (always, where the extent is symbolic)."""
        return symbolic(v.extent) or (v.extent % self.blk[v] != 0 if self.chunked(v) else self.blk[v] != v.extent)

    def chunked(self, v: Var) -> bool:
        """Whether v is the axis a contraction's operands are now emitted a chunk at a time over."""
        return self.chunk is not None and v is self.chunk[0] and not self.chunk[3]

    def stepping(self, v: Var) -> bool:
        """Whether v is the variable a contraction's operands are now emitted one value at a time over."""
        return self.chunk is not None and v is self.chunk[0] and self.chunk[3]

    def fresh(self, base: str) -> str:
        self.tmp += 1
        return f"{base}_{self.tmp}"

    def tvars(self, n: LNode) -> list[Var]:
        return [v for v in self.s.tile_vars(n) if not self.stepping(v)]

    def scalar(self, v: Var) -> bool:
        """Whether v's index is one number per program (a batch entry, a stepped loop's position) or per step of a
        contraction's loop over its values."""
        return v in self.s.batch or (self.s.stepped and v is self.s.loop) or self.stepping(v)

    def idx(self, v: Var, tv: list[Var], name: Optional[str] = None) -> str:
        """v's index over the tile tv, broadcast to its position there (`name`: another vector of v's tile)."""
        if self.scalar(v):
            return f"i_{v}"
        name = name or (f"o_{v}c" if self.chunked(v) else f"o_{v}")
        if len(tv) <= 1:
            return name
        return f"{name}[:, None]" if tv.index(v) == 0 else f"{name}[None, :]"

    def bcast(self, expr: str, have: list[Var], want: list[Var]) -> str:
        if have == want or not have:
            return expr
        if len(have) == 1 and len(want) == 2:
            return f"{expr}[:, None]" if want.index(have[0]) == 0 else f"{expr}[None, :]"
        raise ScheduleError(f"cannot broadcast a tile over {have} to {want}",
                            "a value that cannot be broadcast to its kernel's tile")

    def affine(self, e: Affine, tv: list[Var]) -> str:
        parts = [("" if isinstance(c, int) and c == 1 else f"{source(c)} * ") + self.idx(v, tv) for v, c in e.terms]
        if symbolic(e.const) or e.const or not parts:
            parts.append(source(e.const))
        return "(" + " + ".join(parts) + ")"

    def offset(self, parts: Iterable[tuple[Affine, Size]], tv: list[Var], ctx: Optional[Body] = None) -> str:
        """The element offset, the sum of index * stride over `parts`, of a load or store over this tile. The
        program's own (scalar) indices are taken to int64 before they scale, so a tensor past 2**31 elements is
        addressed right at no cost per element, and come first: `buf + scalars` is one pointer that the tile's
        int32 vectors, summed apart, then offset once. Those vectors widen too where their reach within that
        slice passes int32; in a shape-generic kernel the reach is a size expression, kept in `limits` for the
        plan to check per call. In a body of the loop (`ctx.at_l0`), the loop variable's term with a stride
        that is a size, (l0 + r) * stride, is written l0 * stride among the scalars plus r * stride in the tile:
        the tile's part does not change from one step to the next, so Triton computes it once, before the loop,
        where (l0 + r) * stride took a multiply per element and step."""
        coef: dict[Var, Any] = {}
        const: Any = 0
        for e, st in parts:
            for v, c in e.terms:
                coef[v] = coef.get(v, 0) + c * st
            const = const + e.const * st
        vector = [v for v in coef if not self.scalar(v)]
        reach = sum((c * (v.extent - 1) for v, c in coef.items()
                     if v in vector and (symbolic(c) or c > 0)), const)
        if symbolic(reach):
            self.limits.append(str(python(reach)))
        wide = not symbolic(reach) and hint(reach) >= INT32_REACH
        L = self.s.loop
        base = L if ctx is not None and ctx.at_l0 and L is not None and L in vector and symbolic(coef[L]) and \
            not self.chunked(L) else None
        scalars = [times(f"tl.cast({self.idx(v, tv)}, tl.int64)", coef[v]) for v in coef if self.scalar(v)]
        scalars += [times("tl.cast(l0, tl.int64)", coef[base])] if base is not None else []

        def index(v: Var) -> str:
            at = self.idx(v, tv, f"tl.arange(0, {self.blk[v]})" if v is base else None)
            return f"{at}.to(tl.int64)" if wide else at
        tile = [times(index(v), coef[v]) for v in vector]
        if symbolic(const) or const:
            tile.append(source(const))
        # the tile's terms summed apart, in their own width, then added to the pointer once
        return " + ".join(scalars + ([f"({' + '.join(tile)})"] if len(tile) > 1 else tile)) or "0"

    def partial(self, v: Var) -> bool:
        """Whether some tile of v reaches past its extent."""
        if symbolic(v.extent):
            return True
        return v.extent % self.blk[v] != 0 if v in (self.s.row, self.s.loop) else self.padded(v)

    def range_mask(self, tv: list[Var], ctx: Optional[Body] = None) -> Optional[str]:
        """Bounds test for a tile that can reach past an extent. Loop ranges start at multiples of the
        loop block, so a loop variable whose extent the block divides never needs one, nor does it in a loop
        body (`ctx`) whose tiles all lie inside its extent: one without bounds tests, the bulk of the loop."""
        inside = ctx is not None and not ctx.bounds
        conds = [f"({self.idx(v, tv)} < {source(v.extent)})" for v in tv
                 if self.partial(v) and not (inside and v is self.s.loop)]
        return " & ".join(conds) if conds else None

    def index_mask(self, tv: list[Var], index: Iterable[tuple[Affine, Size]],
                   ctx: Optional[Body] = None) -> Optional[str]:
        """The tile's bounds test, and where an index of a load can leave its range [0, size), the test that it
        does not: those elements load 0."""
        conds = [self.range_mask(tv, ctx)]
        for e, size in index:
            below, past = outside(e, size)
            conds += [f"({self.affine(e, tv)} >= 0)" if below else None,
                      f"({self.affine(e, tv)} < {source(size)})" if past else None]
        return " & ".join(c for c in conds if c) or None

    def buffer(self, key: Any, shape: Sequence[Size], dtype: torch.dtype, kind: str, written: bool = False) -> str:
        if key not in self.bufs:
            self.bufs[key] = Buffer(f"{kind[:3]}{len(self.bufs)}", tuple(shape), dtype, kind, key)
        self.bufs[key].written |= written
        return self.bufs[key].name

    def load_intermediate(self, n: LNode, out: str, lines: list[str], ctx: Optional[Body] = None) -> str:
        """Load an earlier kernel's value of n over this tile; an `at` node's stored value at its index map,
        0 where the index leaves the stored range, and its merged variables as one: they are adjacent in the
        buffer, so the merged variable steps by the innermost one's stride."""
        tv = self.tvars(n)
        index = dict(n.attrs["map"]) if n.op == "at" else {}
        buf, strides = self.intermediate(stored(n), written=False)
        if "merged" in n.attrs:
            group, var = n.attrs["merged"]
            strides = {var if v is group[-1] else v: st for v, st in strides.items() if v not in group[:-1]}
        at = [(index.get(v, Affine.of(v)), st) for v, st in strides.items()]
        off = self.offset(at, tv, ctx)
        mask = self.index_mask(tv, ((e, v.extent) for v, e in index.items()), ctx)
        lines.append(f"{out} = tl.load({buf} + {off}" + (f", mask={mask}, other=0)" if mask else ")"))
        self.loaded.append((tv, self.bufs[stored(n)].dtype.itemsize))
        return out

    def intermediate(self, n: LNode, written: bool) -> tuple[str, dict[Var, int]]:
        """Buffer passing n between kernels: contiguous over n's variables, float math kept in float32. A last
        extent that is a run-time size is padded to a multiple of ALIGN, so that its rows start aligned where the
        kernels load them (a vector at a time, where an unknown stride loads an element at a time)."""
        shape = [v.extent for v in n.vars]
        if shape and symbolic(shape[-1]):
            shape[-1] = ceildiv(shape[-1], ALIGN) * ALIGN
        dtype = torch.float32 if n.dtype.is_floating_point else n.dtype
        return self.buffer(n, shape, dtype, "intermediate", written), dict(zip(n.vars, contig(shape)))

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

    def constant(self, a: Any, region: frozenset) -> Optional[float]:
        """The value of a literal, a scalar node, or a node constant on tiles where `region` holds."""
        if not isinstance(a, LNode):
            return float(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else None
        if a.op == "scalar":
            return self.constant(a.attrs["value"], region)
        v = self.s.constant_on(a, region) if region else None
        return self.constant(v, region) if v is not None else None

    def rounded(self, n: LNode, expr: str, ctx: Optional[Body] = None) -> str:
        """expr, n's value in float32, rounded to n's half type where the precision policy says eager's
        rounding must be reproduced (analysis/precision.py `rounds`: in a faithful plan, and wherever it decides
        a result); a cast of an input that rounds is rounded in every plan, so that dots and elementwise
        products, in whichever kernel, read the same values. A sum rounded only for its mask is rounded where the
        mask makes it coarse (precision.saturates); a value rounded only for masks added to it, not on the
        tiles of body `ctx` where they are 0."""
        if not self.rounds(n, ctx):
            return expr
        coarse = 0.0 if id(n) in self.undotted else precision.saturates(n, self.faithful)
        if coarse:
            return f"tl.where(tl.abs({expr}) >= {lit(coarse)}, {round_to(n.dtype, expr)}, {expr})"
        return round_to(n.dtype, expr)

    def times(self, n: LNode, a: str, b: str, ctx: Optional[Body]) -> str:
        """a * b for node n (a product, or a quotient as one): through `_mul_rn`, which no FMA absorbs, where n is
        rounded to a half type as eager rounds it (triton_helpers._mul_rn says why)."""
        return f"_mul_rn({a}, {b})" if self.rounds(n, ctx) else f"({a} * {b})"

    def rounds(self, n: LNode, ctx: Optional[Body] = None) -> bool:
        """Whether `rounded` rounds n (else n's float32 value stands for it, no instruction). A value rounded for
        the masks added to it alone (precision.deciding_masks) is not where the body's region makes them all 0
        (the tiles a passed mask keeps whole): s + 0 is s there. Only in a kernel that alone computes it: one that
        recomputes the scores of another (column statistics) must see the same values on every tile."""
        if id(n) in self.undotted:
            return True
        masks = self.under_masks.get(id(n))
        if masks and ctx is not None and ctx.region and all(self.constant(m, ctx.region) == 0 for m in masks):
            return False
        return precision.rounds(n, self.faithful)

    @abc.abstractmethod
    def arg(self, a: Any, tv: list[Var], ctx: Optional[Body]) -> str:
        """The expression of operand a (a node or a literal) as a tile over tv."""

    @abc.abstractmethod
    def value(self, n: LNode, ctx: Optional[Body]) -> tuple[str, list[Var]]:
        """The name of node n's value and its tile variables, emitting its code where it belongs."""

    @abc.abstractmethod
    def compute(self, n: LNode, ctx: Optional[Body], lines: list[str]) -> tuple[str, list[Var]]:
        """Emit node n's code into `lines`."""


def _undotted_operands(s: Schedule) -> set[int]:
    """The half operands of this kernel's contractions that are not tl.dot (a single query row's scores summed
    in the tile): rounded as a dot's operands are, so that every kernel of a plan sees the same scores. RoPE's
    rotated q and k, rounded in the column kernel's dot and not in the row kernel's sums, gave a row max that
    missed the column kernel's scores, and GQA column sums 2.5e-3 off eager."""
    return {id(f) for n in s.nodes if n.op == "reduce" and n.attrs["kind"] == "sum" and n not in s.dots
            and contraction(n, s.boundary)
            for f, _ in factorize(n.args[0], atoms=s.boundary)
            if isinstance(f, LNode) and f.dtype in HALF and f.op != "load"}
