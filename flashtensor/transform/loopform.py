"""Layout normalisation: graph IR -> loop form (docs/design.md §3.1).

Every tensor axis gets a loop variable; elementwise ops and matmuls unify the
variables of matching axes, the way einsum unifies indices. Layout ops only
regroup variables: a reshape that merges axes keeps their variables
(row-major), one that splits an axis splits its variable, permute reorders,
expand adds a variable the value does not depend on. select and slice
substitute an affine expression for a variable and re-derive the producer
under it, so layout ops never survive into the core graph: inputs are read
through affine index maps. A `stored` value (pooled statistics) is not
re-derived: it is read through an `at` node, at an index map the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..ir.graph import Graph, Node
from ..ir.loops import (
    Affine,
    LNode,
    LoopGraph,
    LOutput,
    NodeTable,
    Var,
    loop_topo,
    node_vars,
    reindexed,
    stamp,
    var_union,
)
from ..ir.ops import BINARY, UNARY, WIDE, Op
from ..ir.reasons import NoPlanError, place
from ..ir.sizes import broadcast_free, guarded_same, same, simpler, symbolic


class LoweringError(NoPlanError):
    """The program (or one op in it) has no loop-form lowering; the caller falls back."""

    def __init__(self, node: Node | None, why: str) -> None:
        where = place(node) if node is not None else ""
        super().__init__(why + (f" ({where})" if where else ""), why, where)
        self.node = node


class _Solver:
    """Union-find over variables, where a root may be split into row-major parts."""

    def __init__(self) -> None:
        self.parent: dict[Var, Var] = {}
        self.parts: dict[Var, list[Var]] = {}

    def find(self, v: Var) -> Var:
        while v in self.parent:
            v = self.parent[v]
        return v

    def atoms(self, v: Var) -> list[Var]:
        r = self.find(v)
        if r in self.parts:
            return [a for p in self.parts[r] for a in self.atoms(p)]
        return [r]

    def axis_atoms(self, axis: Sequence[Var]) -> list[Var]:
        return [a for v in axis for a in self.atoms(v)]

    def split(self, v: Var, first: int) -> tuple[Var, Var]:
        """Split atom v (extent first*rest) into (hi, lo) with hi of extent `first`."""
        r = self.find(v)
        hi, lo = Var(first), Var(r.extent // first)
        self.parts[r] = [hi, lo]
        return hi, lo

    def unify(self, a: Sequence[Var], b: Sequence[Var], node: Node) -> None:
        xs, ys = self.axis_atoms(a), self.axis_atoms(b)
        i = j = 0
        while i < len(xs) and j < len(ys):
            x, y = self.find(xs[i]), self.find(ys[j])
            if x is y:
                i, j = i + 1, j + 1
            elif x.extent == y.extent:
                if simpler(x.extent, y.extent):
                    self.parent[y] = x
                else:
                    self.parent[x] = y
                i, j = i + 1, j + 1
            elif x.extent > y.extent and x.extent % y.extent == 0:
                hi, lo = self.split(x, y.extent)
                self.parent[hi] = y
                xs[i] = lo
                j += 1
            elif y.extent > x.extent and y.extent % x.extent == 0:
                hi, lo = self.split(y, x.extent)
                self.parent[hi] = x
                ys[j] = lo
                i += 1
            else:
                raise LoweringError(node, f"axes of extents {x.extent} and {y.extent} cannot be aligned")
        if i < len(xs) or j < len(ys):
            raise LoweringError(node, "axes do not line up")


@dataclass
class _LV:
    node: LNode
    axes: list[list[Var]]


def _position(at: Var | Affine) -> LNode:
    """An index (a variable's, or an affine one of several) as an int64 value: a cat's joined axis, a running
    total's two positions."""
    expr = at if isinstance(at, Affine) else Affine.of(at)
    return LNode(Op.IOTA, (), torch.int64, tuple(expr.vars), {"expr": expr})


def _mk(op: Op | str, args: tuple, dtype: torch.dtype, **attrs: object) -> LNode:
    return LNode(Op(op), args, dtype, var_union(*(a.vars for a in args if isinstance(a, LNode))), attrs)


class _Lowerer:
    def __init__(self, g: Graph) -> None:
        self.g = g
        self.s = _Solver()
        self.vals: dict[Node, _LV] = {}
        self.consts: list[torch.Tensor] = []

    # --- variables -----------------------------------------------------------------
    def fresh_axes(self, shape: Sequence[int]) -> list[list[Var]]:
        return [[Var(d)] if broadcast_free(d) else [] for d in shape]

    def load(self, source, shape: Sequence[int], dtype: torch.dtype) -> _LV:
        axes = self.fresh_axes(shape)
        index = tuple(Affine.of(a[0]) if a else Affine() for a in axes)
        node = LNode(Op.LOAD, (), dtype, var_union(*axes), {"input": source, "index": index})
        return _LV(node, axes)

    # --- ops -------------------------------------------------------------------------
    def lower(self, n: Node) -> _LV:
        rule = _LOWER.get(n.op)
        if rule is None:
            raise LoweringError(n, f"op '{n.op}' has no loop-form lowering")
        lv = rule(self, n, [self.vals[x] if isinstance(x, Node) else x for x in n.args])
        if n.source:            # an input's loads take the origin of the first op that reads them
            stamp(lv.node, place(n))
        return lv

    def input(self, n: Node, a: list) -> _LV:
        return self.load(n.attrs["index"], n.shape, n.dtype)

    def const(self, n: Node, a: list) -> _LV:
        self.consts.append(n.attrs["value"])
        return self.load(len(self.g.inputs) + len(self.consts) - 1, n.shape, n.dtype)

    def full(self, n: Node, a: list) -> _LV:
        return _LV(_mk("scalar", (), n.dtype, value=n.attrs["value"]), self.fresh_axes(n.shape))

    def iota(self, n: Node, a: list) -> _LV:
        axes = self.fresh_axes(n.shape)
        v = axes[n.attrs["dim"]]
        expr = Affine.of(v[0]) if v else Affine()
        return _LV(LNode(Op.IOTA, (), n.dtype, tuple(v), {"expr": expr}), axes)

    def unary(self, n: Node, a: list) -> _LV:
        return _LV(_mk(n.op, (a[0].node,), n.dtype), a[0].axes)

    def permute(self, n: Node, a: list) -> _LV:
        return _LV(a[0].node, [a[0].axes[d] for d in n.attrs["dims"]])

    def expand(self, n: Node, a: list) -> _LV:
        x = a[0]
        off = len(n.shape) - len(x.axes)
        axes = [[] for _ in range(off)] + [list(ax) for ax in x.axes]
        for d, size in enumerate(n.shape):
            if broadcast_free(size) and not axes[d]:
                axes[d] = [Var(size)]
        return _LV(x.node, axes)

    def rename_apart(self, ops: list, roles: list[list[object]]) -> list:
        """Give an operand fresh copies of variables that another operand uses in a different role.

        `roles[k][d]` names the role of operand k's axis d (an output dim, or "K" for a contracted
        axis). One tensor reaching an op twice (x.T @ x, or q, k, v selected from one projection)
        would otherwise tie two different axes to one variable and compute only the diagonal.
        """
        seen: dict[Var, object] = {}
        at_role: dict[object, list[tuple[int, set[Var]]]] = {}
        for k, (x, role) in enumerate(zip(ops, roles)):
            if isinstance(x, _LV):
                for ax, r in zip(x.axes, role):
                    at_role.setdefault(r, []).append((k, set(self.s.axis_atoms(ax))))
        out = []
        for k, (x, role) in enumerate(zip(ops, roles)):
            if not isinstance(x, _LV):
                out.append(x)
                continue
            # a variable summed over inside this operand that the op would tie to one of this operand's
            # axes (another operand's axis in the same role): it would be captured and the sum would become
            # a diagonal ((q @ k.T).sum(-2) * q.sum(-1) reaches q's row variable twice)
            own = {v for ax in x.axes for v in self.s.axis_atoms(ax)}
            tied = {v for ax, r in zip(x.axes, role) if ax for j, vs in at_role[r] if j != k for v in vs}
            clash: dict[Var, Var] = {v: Var(v.extent) for v in (self.bound(x.node) - own) & tied}
            for ax, r in zip(x.axes, role):
                for v in self.s.axis_atoms(ax):
                    if seen.setdefault(v, r) != r:
                        clash[v] = Var(v.extent)
            if clash:
                sub = {v: Affine.of(w) for v, w in clash.items()}
                node = Rebuilder(self.s, rename_bound=True).rebuild(x.node, sub)
                x = _LV(node, [[clash.get(v, v) for v in self.s.axis_atoms(ax)] for ax in x.axes])
            out.append(x)
        return out

    def bound(self, node: LNode) -> set[Var]:
        """Variable atoms that reductions inside `node` sum over."""
        out: set[Var] = set()
        for m in loop_topo([node]):
            if m.op == "reduce_axes":
                out.update(self.s.axis_atoms(m.attrs["axes"]))
            elif m.op == "reduce":
                out.update(self.s.axis_atoms([m.attrs["var"]]))
        return out

    def elementwise(self, n: Node, a: list) -> _LV:
        r = len(n.shape)
        a = self.rename_apart(a, [[d + r - len(x.axes) for d in range(len(x.axes))] if isinstance(x, _LV) else []
                                  for x in a])
        axes: list[list[Var]] = []
        for d in range(r):
            cands = []
            for x in a:
                if isinstance(x, _LV):
                    k = d - (r - len(x.axes))
                    if k >= 0 and x.axes[k] and broadcast_free(n.shape[d]):
                        cands.append(x.axes[k])
            for c in cands[1:]:
                self.s.unify(cands[0], c, n)
            axes.append(list(cands[0]) if cands else [])
        args = tuple(x.node if isinstance(x, _LV) else x for x in a)
        return _LV(_mk(n.op, args, n.dtype), axes)

    def reduce(self, n: Node, a: list) -> _LV:
        x = a[0]
        dims = n.attrs["dims"]
        node = x.node
        if node.dtype != n.dtype and n.attrs["kind"] == "sum":
            node = _mk("cast", (node,), n.dtype)
        node = _mk("reduce_axes", (node,), n.dtype, kind=n.attrs["kind"], axes=[v for d in dims for v in x.axes[d]])
        axes = [ax if d not in dims else [] for d, ax in enumerate(x.axes)]
        if not n.attrs["keepdim"]:
            axes = [ax for d, ax in enumerate(axes) if d not in dims]
        return _LV(node, axes)

    def matmul(self, n: Node, a: list) -> _LV:
        x, y = a[0], a[1]
        if len(x.axes) < 2 or len(y.axes) < 2:
            raise LoweringError(n, "matmul with a vector operand")
        batch = len(n.shape) - 2
        x, y = self.rename_apart([x, y], [
            [d + batch - (len(x.axes) - 2) for d in range(len(x.axes) - 2)] + ["M", "K"],
            [d + batch - (len(y.axes) - 2) for d in range(len(y.axes) - 2)] + ["K", "N"]])
        self.s.unify(x.axes[-1], y.axes[-2], n)
        axes: list[list[Var]] = []
        for d in range(batch):
            cands = []
            for z in (x, y):
                k = d - (batch - (len(z.axes) - 2))
                if k >= 0 and z.axes[k] and broadcast_free(n.shape[d]):
                    cands.append(z.axes[k])
            for c in cands[1:]:
                self.s.unify(cands[0], c, n)
            axes.append(list(cands[0]) if cands else [])
        axes += [x.axes[-2], y.axes[-1]]
        cd = WIDE.get(n.dtype, n.dtype)
        prod = _mk("mul", (x.node, y.node), cd)
        s = _mk("reduce_axes", (prod,), cd, kind="sum", axes=list(x.axes[-1]))
        return _LV(s if cd == n.dtype else _mk("cast", (s,), n.dtype), axes)

    def reshape(self, n: Node, a: list) -> _LV:
        x = a[0]
        flat = self.s.axis_atoms([v for ax in x.axes for v in ax])
        axes: list[list[Var]] = []
        for size in n.shape:
            ax: list[Var] = []
            have = 1
            if symbolic(size) or (flat and symbolic(self.s.find(flat[0]).extent)):
                axes.append(self._symbolic_group(n, size, flat))
                continue
            while have < size:      # a static size from static axes: whole ones, or a split of one
                if not flat:
                    raise LoweringError(n, "reshape does not line up with its input")
                v = self.s.find(flat.pop(0))
                if symbolic(v.extent):
                    raise LoweringError(n, "reshape of symbolic sizes that line up only at some sizes")
                if have * v.extent <= size:
                    ax.append(v)
                    have *= v.extent
                elif size % have == 0 and v.extent % (size // have) == 0:
                    hi, lo = self.s.split(v, size // have)
                    ax.append(hi)
                    flat.insert(0, lo)
                    have = size
                else:
                    raise LoweringError(n, "reshape splits an axis unevenly")
            if have != size:
                raise LoweringError(n, "reshape does not line up with its input")
            axes.append(ax)
        return _LV(x.node, axes)

    def _symbolic_group(self, n: Node, size: Any, flat: list[Var]) -> list[Var]:
        """The leading input axes whose extents multiply to `size`, where sizes are symbolic: whole axes only (a split
        of a symbolic axis does not lower), equal to `size` by their expressions, else under a guard that they are
        (sizes.guarded_same): kv_heads x (H // kv_heads) heads are H only where kv_heads divides H."""
        products: list[Any] = [1]
        for v in flat:
            products.append(products[-1] * self.s.find(v).extent)
        j = next((j for j, have in enumerate(products) if same(have, size)), None)
        if j is None:
            j = next((j for j, have in enumerate(products) if guarded_same(have, size)), None)
        if j is None:
            raise LoweringError(n, "reshape of symbolic sizes that line up only at some sizes")
        ax = [self.s.find(v) for v in flat[:j]]
        del flat[:j]
        return ax

    def index(self, n: Node, a: list) -> _LV:
        x = a[0]
        """select / slice: substitute the indexed variable(s) and re-derive the producer."""
        d = n.attrs["dim"]
        atoms = self.s.axis_atoms(x.axes[d])
        sub: dict[Var, Affine] = {}
        if n.op == "select":
            idx = n.attrs["index"]
            for v in reversed(atoms):
                sub[v] = Affine((), idx % v.extent)
                idx //= v.extent
            new_axis: list[Var] = []
        else:
            start, size, step = n.attrs["start"], n.shape[d], n.attrs.get("step", 1)
            inner = 1
            for v in atoms[1:]:
                inner *= v.extent
            if step != 1 and inner != 1 and atoms and step % inner == 0:
                # x[..., 1::2] of an axis split (D/2, 2) (GPT-J's interleaved halves): the lead variable steps,
                # the inner ones are fixed by start, as a select fixes them
                lead = Var(size) if size != 1 else None
                rest = start % inner
                for v in reversed(atoms[1:]):
                    sub[v] = Affine((), rest % v.extent)
                    rest //= v.extent
                sub[atoms[0]] = (Affine.of(lead).scale(step // inner) if lead else Affine()) + \
                    Affine((), start // inner)
                new_axis = [lead] if lead else []
            elif not atoms or start % inner or size % inner or (step != 1 and inner != 1):
                raise LoweringError(n, "slice that does not align with the axis' variables")
            else:
                lead = Var(size // inner) if size // inner != 1 else None
                sub[atoms[0]] = (Affine.of(lead).scale(step) if lead else Affine()) + Affine((), start // inner)
                new_axis = ([lead] if lead else []) + atoms[1:]
        node = Rebuilder(self.s).rebuild(x.node, sub)
        axes = [list(ax) for ax in x.axes]
        if n.op == "select":
            del axes[d]
        else:
            axes[d] = new_axis
        return _LV(node, axes)

    def cumsum(self, n: Node, a: list) -> _LV:
        """cumsum along axis d (variable i): the sum over a fresh variable t of x re-derived at t, where t <= i
        (0 elsewhere), in float32 for half values; the value facts then skip the tiles past the diagonal."""
        x = a[0]
        atoms = self.s.axis_atoms(x.axes[n.attrs["dim"]])
        if len(atoms) > 1:
            raise LoweringError(n, "a cumsum along an axis that merges several variables")
        cd = WIDE.get(n.dtype, n.dtype)
        node = x.node if x.node.dtype == cd else _mk("cast", (x.node,), cd)
        if atoms:
            i, t = atoms[0], Var(atoms[0].extent)
            at_t = Rebuilder(self.s).rebuild(node, {i: Affine.of(t)})
            up_to = _mk("le", (_position(t), _position(i)), torch.bool)
            zero = 0.0 if cd.is_floating_point else 0
            node = _mk("reduce_axes", (_mk("where", (up_to, at_t, zero), cd),), cd, kind="sum", axes=[t])
        return _LV(node if cd == n.dtype else _mk("cast", (node,), n.dtype), [list(ax) for ax in x.axes])

    def stored(self, n: Node, a: list) -> _LV:
        """stored: a value that reads a reduction, read through an `at` node whose index map the slices and cats
        around it fill in (Rebuilder), so it is computed once, not re-derived at each offset; any other value as
        it is (re-deriving a value computed per element costs nothing)."""
        x = a[0]
        reads = loop_topo([x.node], {m for m in loop_topo([x.node]) if m.op == "at"})
        if not any(m.op in ("reduce", "reduce_axes") for m in reads):
            return x
        return _LV(LNode(Op.AT, (x.node,), n.dtype, x.node.vars, {"map": ()}), x.axes)

    def cat(self, n: Node, a: list) -> _LV:
        """cat: a fresh variable w over the joined axis (or two, hi and lo, see `_inner`); each piece is re-derived
        at w minus its offset (its reads past its own range load 0) and picked by where over w's index."""
        d = n.attrs["dim"]
        a = self.rename_apart(a, [list(range(len(n.shape)))] * len(a))
        axes: list[list[Var]] = []
        for k in range(len(n.shape)):
            cands = [x.axes[k] for x in a if x.axes[k]] if k != d else []
            # the oldest variable stays (unify keeps its second operand's): padding's constant blocks take the
            # padded value's variables, whose order lays out the buffers of the values over them
            oldest: list[Var] = min(cands, key=lambda c: min(v.id for v in self.s.axis_atoms(c)), default=[])
            for c in cands:
                if c is not oldest:
                    self.s.unify(c, oldest, n)
            axes.append(list(oldest))
        pieces = [self.s.axis_atoms(x.axes[d]) for x in a]
        inner = _inner(pieces, [p.shape[d] for p in n.args])
        if inner is None:
            raise LoweringError(n, "cat along an axis that merges several variables")
        # the joined axis as (hi, lo) where a piece is split (DeepSeek's interleaved RoPE half beside the rest of
        # the head dimension): each piece then reads hi shifted by its offset and lo as it is
        hi = Var(n.shape[d] // inner)
        axes[d] = [hi] + ([Var(inner)] if inner > 1 else [])
        flat = Affine.of(hi).scale(inner) + Affine.of(axes[d][-1]) if inner > 1 else Affine.of(hi)
        picks, start = [], 0
        for x, atoms, piece in zip(a, pieces, n.args):
            if len(atoms) == 2:
                sub = {atoms[0]: Affine.of(hi) + Affine((), -start // inner), atoms[1]: Affine.of(axes[d][-1])}
            else:
                sub = {atoms[0]: flat + Affine((), -start)} if atoms else {}
            start += piece.shape[d]
            picks.append((Rebuilder(self.s).rebuild(x.node, sub), start))
        index = _position(flat)
        out = picks[-1][0]
        for node, end in reversed(picks[:-1]):
            out = _mk("where", (_mk("lt", (index, end), torch.bool), node, out), n.dtype)
        return _LV(out, axes)


def _inner(pieces: list[list[Var]], sizes: list[int]) -> int | None:
    """The extent of the inner variable a cat's joined axis splits into: 1 where every piece's axis is one variable;
    the inner extent of the pieces split in two, where they agree and every piece starts and ends on a multiple of
    it; None otherwise."""
    split = {atoms[1].extent for atoms in pieces if len(atoms) == 2}
    if any(len(atoms) > 2 for atoms in pieces) or len(split) > 1:
        return None
    inner = split.pop() if split else 1
    return inner if all(n % inner == 0 for n in sizes) else None


# how each op of the decomposed graph becomes loop form; what is not here has no fused lowering
_LOWER: dict[Op, Callable[[_Lowerer, Node, list], _LV]] = {
    Op.INPUT: _Lowerer.input, Op.CONST: _Lowerer.const, Op.FULL: _Lowerer.full, Op.IOTA: _Lowerer.iota,
    **{op: _Lowerer.unary for op in UNARY}, Op.CAST: _Lowerer.unary,
    **{op: _Lowerer.elementwise for op in BINARY}, Op.WHERE: _Lowerer.elementwise,
    Op.REDUCE: _Lowerer.reduce, Op.CUMSUM: _Lowerer.cumsum, Op.MATMUL: _Lowerer.matmul,
    Op.PERMUTE: _Lowerer.permute, Op.RESHAPE: _Lowerer.reshape, Op.EXPAND: _Lowerer.expand,
    Op.SELECT: _Lowerer.index, Op.SLICE: _Lowerer.index, Op.CAT: _Lowerer.cat, Op.STORED: _Lowerer.stored,
}


class Rebuilder:
    """Re-derives a subgraph with variables resolved to atoms and an affine substitution applied.

    Also hash-conses: structurally equal nodes become one node.
    """

    def __init__(self, s: _Solver, rename_bound: bool = False) -> None:
        self.s = s
        self.rename_bound = rename_bound      # also rename variables that reductions sum over (alpha-renaming)
        self.memo: dict[tuple, LNode] = {}
        self.table = NodeTable()

    def affine(self, e: Affine, sub: dict[Var, Affine]) -> Affine:
        out = Affine((), e.const)
        for v, c in e.terms:
            atoms = self.s.atoms(v)
            stride = 1
            val = Affine()
            for a in reversed(atoms):
                val = val + (sub[a] if a in sub else Affine.of(a)).scale(stride)
                stride *= a.extent
            out = out + val.scale(c)
        return out

    def rebuild(self, n: LNode, sub: dict[Var, Affine]) -> LNode:
        key = (id(n), tuple(sorted((v.id, e) for v, e in sub.items())))
        if key in self.memo:
            return self.memo[key]
        if n.op in ("load", "iota"):
            attrs = dict(n.attrs)
            if n.op == "load":
                attrs["index"] = tuple(self.affine(e, sub) for e in n.attrs["index"])
                vs = [v for e in attrs["index"] for v in e.vars]
            else:
                attrs["expr"] = self.affine(n.attrs["expr"], sub)
                vs = attrs["expr"].vars
            out = self.table.get(n.op, (), n.dtype, var_union(vs), attrs)
        elif n.op == "at":
            out = self.at(n, sub)
        elif n.op in ("reduce_axes", "reduce"):
            bound = [a for ax in n.attrs.get("axes", [n.attrs.get("var")]) for a in self.s.atoms(ax)]
            renamed = {v: sub[v].vars[0] for v in bound if self.rename_bound and v in sub}
            out = self.rebuild(n.args[0], {v: e for v, e in sub.items() if v not in bound or v in renamed})
            for v in bound:
                out = self.reduce(n.attrs["kind"], out, renamed.get(v, v), n.dtype)
        else:
            args = tuple(self.rebuild(a, sub) if isinstance(a, LNode) else a for a in n.args)
            vars_ = var_union(*(a.vars for a in args if isinstance(a, LNode)))
            out = self.table.get(n.op, args, n.dtype, vars_, dict(n.attrs))
        stamp(out, n.origin)
        self.memo[key] = out
        return out

    def at(self, n: LNode, sub: dict[Var, Affine]) -> LNode:
        """A stored value read at an index map: its own value is rebuilt as it stands (a kernel computes it once),
        the substitution goes into the map, over the variables the read takes from its reader."""
        base = self.rebuild(n.args[0], {})
        keys = [self.s.atoms(v) for v, _ in n.attrs["map"]]    # a variable unified since stands for its root
        if any(len(k) != 1 for k in keys):
            raise LoweringError(None, "a value read at shifted offsets along an axis that a reshape splits")
        index_map = [(k[0], e) for k, (_, e) in zip(keys, n.attrs["map"])]
        attrs = {"map": reindexed(index_map, base, sub, lambda e: self.affine(e, sub))}
        return self.table.get("at", (base,), n.dtype, node_vars("at", (base,), attrs), attrs)

    def reduce(self, kind: str, x: LNode, v: Var, dtype: torch.dtype) -> LNode:
        if v not in x.vars:
            if kind != "sum":
                return x
            count = float(v.extent) if dtype.is_floating_point else v.extent
            return self.table.get("mul", (x, count), dtype, x.vars, {})
        return self.table.get("reduce", (x,), dtype, tuple(w for w in x.vars if w is not v), {"kind": kind, "var": v})


def to_loops(g: Graph) -> tuple[LoopGraph, list[torch.Tensor]]:
    """Lower a decomposed graph to loop form. Returns the loop graph and the tensor constants it reads
    (passed after the program inputs). Raises LoweringError naming the op when it cannot."""
    low = _Lowerer(g)
    for n in g.nodes:
        low.vals[n] = low.lower(n)
    rb = Rebuilder(low.s)
    outs = []
    for o in g.outputs:
        lv = low.vals[o]
        node = rb.rebuild(lv.node, {})
        if node.op == "at" and not node.attrs["map"]:      # a stored value returned as it is: its kernel stores it
            node = node.args[0]
        dims = [low.s.axis_atoms(ax) for ax in lv.axes]
        outs.append(LOutput(node, dims, tuple(o.shape), o.dtype))
    nodes = loop_topo([o.node for o in outs])
    for k, ln in enumerate(nodes):
        ln.name = f"t{k}"
    ins = [(tuple(i.shape), i.dtype) for i in g.inputs] + [(tuple(c.shape), c.dtype) for c in low.consts]
    return LoopGraph(ins, nodes, outs), low.consts
