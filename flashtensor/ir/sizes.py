"""Sizes that may be symbolic: a shape-generic plan traces with torch SymInts for the dimensions that vary.

A symbolic size is a `torch.SymInt` of the trace's ShapeEnv. Arithmetic on it stays symbolic; a comparison
that decides something (`extent <= 64`) records a guard in the ShapeEnv, and the plan is valid only where its
guards hold (runtime/plan.py checks them on each call), so a decision taken on the traced sizes can never
reach a call it does not fit. Heuristic choices that are correct for every size (which parallel axis is the
longest) read `hint`, the traced value, and add no guard. Generated code prints sizes with `source`, as
expressions of the kernel's size arguments; the launch evaluates grids and buffer shapes with `value`.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, Mapping, Sequence

import sympy
import torch

Size = int | torch.SymInt


def symbolic(x: Any) -> bool:
    """Whether x is a size that differs between the calls a plan serves (a sympy expression of size symbols too)."""
    if isinstance(x, sympy.Basic):
        return bool(x.free_symbols)
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) and bool(x.node.expr.free_symbols)


def hint(x: Any) -> Any:
    """x's value in the traced call, without a guard: for choices every size would be correct with. A Python
    number: torch 2.11's size_hint gives a sympy Integer, and a product of one with a SymInt is a sympy
    expression, which `source` printed as sympy does (`pid // 18*((s + 15)//16)` divided by 18 first)."""
    if not isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return x
    node = x.node
    if node.hint is not None:
        return node.hint
    env = node.shape_env
    if hasattr(env, "guarding_hint_or_throw"):      # torch 2.13 renamed size_hint
        return _number(env.guarding_hint_or_throw(node.expr))
    return _number(env.size_hint(node.expr))


def _number(v: Any) -> Any:
    """A sympy number as Python's bool, int or float; anything else as it is."""
    if not isinstance(v, sympy.Basic):
        return v
    if v.is_Boolean:
        return bool(v)
    return int(v) if v.is_integer else float(v)


def expr(x: Any) -> sympy.Expr:
    return x.node.expr if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) else sympy.sympify(x)


def names(x: Any) -> set[str]:
    """The size symbols x depends on."""
    return {str(s) for s in expr(x).free_symbols} if symbolic(x) else set()


def broadcast_free(d: Size) -> bool:
    """Whether a dimension of size d has its own loop variable (a static 1 broadcasts). A symbolic size never
    broadcasts: the trace is size-oblivious (frontend/symbolic.py), so torch guarded wherever it would."""
    return symbolic(d) or d != 1


def same(a: Any, b: Any) -> bool:
    """Whether two sizes are the same expression (no guard)."""
    return bool(sympy.expand(expr(a) - expr(b)) == 0)


def guarded_same(a: Any, b: Any) -> bool:
    """Whether a == b where the traced sizes agree, under a guard that they do (the plan then serves only calls
    where they are equal); for sizes that `same` does not find equal by their expressions: repeat_kv's
    `kv_heads * (heads // kv_heads)` is `heads` exactly where kv_heads divides heads."""
    return hint(a) == hint(b) and bool(a == b)


def simpler(a: Any, b: Any) -> bool:
    """Whether size a is a shorter expression than b, which the trace found equal to it (a query axis, s1, and the
    slice of positions it was broadcast with, Max(0, s0 - Max(0, s0 - s1))): the one to keep, since reshapes
    and tiles match sizes by their expressions."""
    return symbolic(b) and sympy.count_ops(expr(a)) < sympy.count_ops(expr(b))


def length(extent: Size) -> tuple[bool, int]:
    """A sort key of extents, longest last: a symbolic extent is longer than every static one (any length may come,
    and only a tiled axis serves them all), symbolic ones by their traced values."""
    return symbolic(extent), hint(extent)


def longer(extent: Size, bound: int) -> bool:
    """extent > bound, taking a symbolic extent as longer: the branch for long axes is correct at any length."""
    return True if symbolic(extent) else extent > bound


def ceildiv(a: Size, b: Size) -> Size:
    """ceil(a / b) for sizes, written so a symbolic one divides nonnegative operands only (Triton's `//`
    truncates toward zero, Python's floors: they agree there)."""
    return (a + b - 1) // b if symbolic(a) or symbolic(b) else -(-a // b)


def value(x: Any, sizes: Mapping[str, int]) -> Any:
    """x at the given values of its symbols (a call's sizes)."""
    if not symbolic(x):
        return hint(x)
    return _number(expr(x).xreplace({s: sympy.Integer(sizes[str(s)]) for s in expr(x).free_symbols}))


def at(x: Any, sizes: Mapping[str, int]) -> Any:
    """x with every symbolic size in it (inside lists, tuples and dicts too) at the given values of its symbols."""
    if symbolic(x):
        return value(x, sizes)
    if isinstance(x, (list, tuple)):
        return type(x)(at(a, sizes) for a in x)
    if isinstance(x, dict):
        return {k: at(v, sizes) for k, v in x.items()}
    return x


def has_symbolic(x: Any) -> bool:
    """Whether x holds a symbolic size (inside lists, tuples and dicts too)."""
    if isinstance(x, (list, tuple)):
        return any(has_symbolic(a) for a in x)
    if isinstance(x, dict):
        return any(has_symbolic(v) for v in x.values())
    return symbolic(x)


_FUNCS = {"FloorDiv": "({0} // {1})", "Mod": "({0} % {1})", "PythonMod": "({0} % {1})",
          "Max": "tl.maximum({0}, {1})", "Min": "tl.minimum({0}, {1})", "CeilDiv": "(({0} + {1} - 1) // {1})",
          "ToFloat": "tl.cast({0}, tl.float64)", "FloatTrueDiv": "({0} / {1})",
          "IntTrueDiv": "(tl.cast({0}, tl.float64) / tl.cast({1}, tl.float64))"}
_PY = {**_FUNCS, "Max": "max({0}, {1})", "Min": "min({0}, {1})", "ToFloat": "float({0})", "IntTrueDiv": "({0} / {1})"}


def source(x: Any) -> str:
    """x as Triton source over the kernel's size arguments (their names are the symbols'). A number derived from
    sizes (a threshold 2.0 / kv_len) is computed in float64, as Python computes it, and then taken to float32, as a
    float literal is in a static kernel."""
    if not symbolic(x):
        return repr(hint(x))
    if isinstance(x, torch.SymFloat):
        return f"({_print(expr(x), _FUNCS)}).to(tl.float32)"
    return _print(expr(x), _FUNCS)


def times(index: str, x: Any) -> str:
    """`index * x` as Triton source, multiplied factor by factor: an int64 index keeps every partial product in
    int64, where x's own product over the int32 size arguments could pass 2**31."""
    if symbolic(x) and expr(x).is_Mul:
        return " * ".join([index] + [_print(a, _FUNCS) for a in expr(x).args])
    return index if not symbolic(x) and hint(x) == 1 else f"{index} * {source(x)}"


def python(x: Any) -> int | str:
    """A static size as it is, a symbolic one as a Python expression of the size symbols (`evaluate` runs it)."""
    return _print(expr(x), _PY) if symbolic(x) else hint(x)


@functools.cache
def _compiled(src: str) -> Any:
    return compile(src, "<size>", "eval")


def evaluate(x: int | str, sizes: Mapping[str, int]) -> int:
    """A size `python` gave, at a call's sizes."""
    return x if isinstance(x, int) else eval(_compiled(x), {"max": max, "min": min}, dict(sizes))


def evaluator(xs: Sequence[int | str]) -> Callable[[Mapping[str, int]], tuple]:
    """A function of a call's sizes giving each of `xs` (sizes `python` gave) in one evaluation: a launch reads
    a dozen sizes, each eval of its own costs a microsecond of host time per call."""
    code = _compiled("(" + "".join(f"{x}, " for x in xs) + ")")
    return lambda sizes: eval(code, {"max": max, "min": min}, sizes)


_RELATIONS = {"Equality": "==", "Unequality": "!=", "StrictLessThan": "<", "LessThan": "<=",
              "StrictGreaterThan": ">", "GreaterThan": ">="}
_GUARD = {**_PY, "Abs": "abs({0})", "Not": "(not {0})", "TruncToInt": "int({0})"}


def guards(env: Any) -> str:
    """The ShapeEnv's guards as one Python expression of the size symbols (`holds` evaluates it on a call)."""
    return " and ".join(f"({_print(g.expr, _GUARD)})" for g in env.guards) or "True"


def values(sources: Mapping[str, tuple[int, int]], tensors: Sequence[Any]) -> dict[str, int]:
    """Each size symbol's value in a call: the size of the (input, dimension) its `sources` entry names."""
    return {name: tensors[i].shape[d] for name, (i, d) in sources.items()}


def holds(src: str, sizes: Mapping[str, int]) -> bool:
    return bool(eval(_compiled(src), {"abs": abs, "float": float, "int": int, "max": max, "min": min}, dict(sizes)))


def _print(e: Any, funcs: Mapping[str, str]) -> str:
    if e.is_Integer:
        return str(int(e))
    if e.is_Rational:
        return f"({e.p} / {e.q})"
    if e.is_Float:
        return repr(float(e))
    if e in (sympy.oo, -sympy.oo, sympy.nan):     # a float constant a trace derived from sizes: -inf * (0.0 / n)
        return f'float("{float(e)}")'
    if e.is_Symbol:
        return str(e)
    if e.is_Add:
        return "(" + " + ".join(_print(a, funcs) for a in e.args) + ")"
    if e.is_Mul:
        return "(" + " * ".join(_print(a, funcs) for a in e.args) + ")"
    if e.is_Pow and e.exp.is_Integer and e.exp > 0:
        return "(" + " * ".join([_print(e.base, funcs)] * int(e.exp)) + ")"
    name = type(e).__name__
    if e is sympy.true or e is sympy.false:
        return str(bool(e))
    if name in _RELATIONS:
        return f"({_print(e.args[0], funcs)} {_RELATIONS[name]} {_print(e.args[1], funcs)})"
    if name in ("And", "Or"):
        return "(" + f" {name.lower()} ".join(_print(a, funcs) for a in e.args) + ")"
    if name in ("Max", "Min") and len(e.args) > 2:
        return _print(type(e)(e.args[0], type(e)(*e.args[1:])), funcs)
    if name in funcs:
        return funcs[name].format(*(_print(a, funcs) for a in e.args))
    raise NotImplementedError(f"no Triton source for the size expression {e}")


ALIGN = 16
"""A size that this divides keeps every row it strides aligned for vector loads (16 elements: 16 bytes or more)."""


def strided(inputs: Iterable[Any]) -> frozenset[str]:
    """The size symbols that are a tensor input's last, contiguous extent: the row stride of what comes before it.
    Whether ALIGN divides one decides whether kernels can load its rows a vector at a time (codegen/artifact.header)."""
    return frozenset(n for x in inputs if len(x.shape) for n in names(x.shape[-1]))


def bucket(sizes: Mapping[str, int], aligned: frozenset[str] = frozenset()) -> tuple[tuple[str, int, bool], ...]:
    """The length bucket of a call's sizes: each symbol's next power of two, and for the symbols in `aligned`
    (`strided`'s) whether ALIGN divides it, since the kernels are compiled for that: a call in a tuned bucket
    launches what its tuning compiled."""
    return tuple(sorted((name, pow2_bucket(v), name in aligned and v % ALIGN == 0) for name, v in sizes.items()))


def pow2_bucket(n: int) -> int:
    """The length bucket of n: the next power of two (a plan tunes once per bucket)."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))
