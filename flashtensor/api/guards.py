"""What a plan depends on besides its tensor arguments, read on every call so a changed value never reuses it.

A plan bakes in every non-tensor argument, every global and closure variable the function reads, the
attributes it reads off them (`CONFIG.tau`, `self.scaling`) and the tensors it captures. `Guards.key` is
the call's key: the arguments' structure (torch.utils._pytree), each leaf's signature (runtime/cache.py) and
a fingerprint of each of those reads. Which names to read is found once per function (and again on a miss,
since a rebound helper may read others) by walking the bytecode of the function, the code nested in it and
the Python functions, methods and modules it calls from user code; library code (the standard library,
site-packages, torch, flashtensor) is taken as fixed. A tensor read is fingerprinted by identity and
`_version`, so an in-place write or a rebinding misses.
"""
from __future__ import annotations

import builtins
import dis
import functools
import inspect
import itertools
import numbers
import os
import sys
import sysconfig
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils import _pytree as pytree

from ..runtime.cache import signature
from ..runtime.launch import version

_MISSING = object()                 # an unbound name, an empty cell or an attribute that is not there
_SCALARS = frozenset({int, float, bool, complex, str, bytes, type(None)})
_ATOMS = frozenset({torch.dtype, torch.device, torch.layout, torch.memory_format})
_CONTAINERS = frozenset({list, tuple, dict, set, frozenset})
_CODE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, functools.partial)
_MAX_CODE = 64                      # functions walked per compiled callable: the walk runs on every miss
_DEPTH = 8                          # nesting of containers fingerprinted by content; deeper ones by identity
# code taken as fixed: the standard library, site-packages, torch and flashtensor itself
_LIBRARY = tuple(sorted({os.path.join(os.path.abspath(p), "") for k in ("stdlib", "platstdlib", "purelib", "platlib")
                         if (p := sysconfig.get_paths().get(k))}
                        | {os.path.join(os.path.dirname(os.path.abspath(f)), "")
                           for f in (torch.__file__ or "", os.path.dirname(__file__))}))


@dataclass
class Call:
    """One call, flattened: its tensor and non-tensor leaves, and the structure to rebuild (args, kwargs) from them
    (None: the leaves are the positional arguments)."""
    leaves: list[Any]
    spec: Optional[pytree.TreeSpec]

    @property
    def requires_grad(self) -> bool:
        for a in self.leaves:       # a loop, not any(): this runs on every call with grad enabled
            if isinstance(a, torch.Tensor) and a.requires_grad:
                return True
        return False


class _Same:
    """Equal only to itself: a key holding one keeps its object alive, so no other object can take its id."""
    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def fingerprint(v: Any, depth: int = 0) -> Any:
    """A hashable value that changes whenever a value a plan baked in may have: scalars by repr, tensors by
    identity and version, containers by content, modules by their state (_module_state), other objects by
    identity and their scalar attributes."""
    t = type(v)
    if t in _SCALARS:
        return repr(v)
    if t in _CONTAINERS and depth < _DEPTH:     # before the isinstance tests: a read's usual value (defaults)
        return _contents(v, t, depth)
    if isinstance(v, torch.Tensor):
        return _Same(v), version(v)
    if t in _ATOMS:
        return v
    if isinstance(v, (numbers.Number, str, bytes)):    # numpy's scalars, Fraction: new objects, equal values
        return repr(v)
    if isinstance(v, tuple(_CONTAINERS)) and depth < _DEPTH:      # their subclasses: a namedtuple, an OrderedDict
        return _contents(v, t, depth)
    if isinstance(v, torch.nn.Module):
        return _Same(v), tuple(_module_state(v, []))
    if isinstance(v, types.MethodType):
        return _Same(v.__self__), _Same(v.__func__)
    if isinstance(getattr(v, "__dict__", None), dict) and not isinstance(v, _CODE):
        return _Same(v), tuple(_plain_attributes(v))
    return _Same(v)


def _contents(v: Any, t: type, depth: int) -> tuple:
    fps = tuple([fingerprint(x, depth + 1) for x in (v.items() if isinstance(v, dict) else v)])
    return t, frozenset(fps) if isinstance(v, (set, frozenset)) else fps


def _plain_attributes(v: Any) -> list[tuple[str, str]]:
    """An object's scalar attributes (a config's `softcap`, a module's `scaling` or `training`): a helper may read
    them off an object passed to it as an argument, where no read of ours sees them."""
    return [(k, repr(a)) for k, a in vars(v).items() if type(a) in _SCALARS]


def _module_state(m: torch.nn.Module, out: list) -> list:
    """Scalar attributes, and parameters and buffers by identity and version, of `m` and every submodule."""
    out += _plain_attributes(m)
    out += [(_Same(t), version(t)) for t in itertools.chain(m._parameters.values(), m._buffers.values())
            if t is not None]
    for sub in m._modules.values():
        if sub is not None:
            out.append(_Same(sub))
            _module_state(sub, out)
    return out


@dataclass(frozen=True, eq=False)
class Read:
    """A value the function reads from outside its arguments: a global ("global": `source` is the globals dict),
    a closure cell ("cell") or an object ("object"), then the attributes in `path` off it."""
    kind: str
    source: Any
    name: str = ""
    path: tuple[str, ...] = ()

    def attr(self, *names: str) -> Read:
        return Read(self.kind, self.source, self.name, self.path + names)

    def ident(self) -> tuple:
        return self.kind, id(self.source), self.name, self.path

    def value(self) -> Any:
        try:
            v = (self.source.get(self.name, _MISSING) if self.kind == "global"
                 else self.source.cell_contents if self.kind == "cell" else self.source)
            for a in self.path:
                v = getattr(v, a)
        except Exception:  # noqa: BLE001 - an empty cell, a missing attribute, a property that raises: all a value
            return _MISSING
        return v


class Guards:
    """The call binding and the reads of one compiled callable."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.reads: list[Read] = []
        target = fn.forward if isinstance(fn, torch.nn.Module) else fn
        try:
            self.signature: Optional[inspect.Signature] = inspect.signature(target)
        except (TypeError, ValueError):     # a builtin without one: calls are taken as written
            self.signature = None
        self.arity = _arity(self.signature)

    def bind(self, args: tuple, kwargs: dict) -> Optional[Call]:
        """The call as leaves. Keyword arguments are bound to the parameters they name, so `f(q, k, v=v)` and
        `f(q, k, v)` share a plan; None when the arguments do not fit the signature (eager raises its own error).
        Defaults are not filled in: the function reads them itself, and `__defaults__` is a read."""
        if self.signature is not None and (kwargs or not self.arity[0] <= len(args) <= self.arity[1]):
            try:
                bound = self.signature.bind(*args, **kwargs)
            except TypeError:
                return None
            args, kwargs = bound.args, bound.kwargs
        if not kwargs:
            for a in args:
                if type(a) not in _SCALARS and not isinstance(a, torch.Tensor):
                    break
            else:
                return Call(list(args), None)       # the common case, without pytree's cost
        leaves, spec = pytree.tree_flatten((args, kwargs))
        return Call(leaves, spec)

    def key(self, call: Call, shapes: bool = True) -> tuple:
        """Other leaves than tensors, and the reads, by `fingerprint`: a module passed to an attention helper by its
        state, not by its repr, which shows no attribute and costs a walk of the module tree. Without `shapes`,
        the key of the program's structure (runtime.cache.signature), which shape-generic plans share. The global
        modes a trace bakes in are part of it (`ambient`)."""
        return (call.spec, signature(call.leaves, fingerprint, shapes),
                tuple([fingerprint(r.value()) for r in self.reads]), ambient())

    def refresh(self) -> None:
        """Walk the function again (on a miss): a rebound helper or module may read names the old one did not."""
        walker = _Walker()
        for r in self.reads:
            walker.add(r)
        walker.visit(self.fn, None)
        self.reads = list(walker.reads.values())

    def flat(self, spec: Optional[pytree.TreeSpec]) -> Callable:
        """`fn` as a function of the call's leaves, which is what the driver captures."""
        if spec is None:
            return self.fn

        def of_leaves(*leaves: Any) -> Any:
            args, kwargs = pytree.tree_unflatten(list(leaves), spec)
            return self.fn(*args, **kwargs)
        of_leaves.__name__ = name_of(self.fn)
        of_leaves.leaf_names = self._leaf_names(spec)    # type: ignore[attr-defined]
        return of_leaves

    def _leaf_names(self, spec: pytree.TreeSpec) -> list[str]:
        """Each leaf by the parameter it is passed as, and where in it (`past[0]`, `mask`), for notes and errors."""
        params = [p.name for p in self.signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)] if self.signature is not None else []
        names = []
        for path, _ in pytree.tree_flatten_with_path(pytree.tree_unflatten([0] * spec.num_leaves, spec))[0]:
            top, key, *rest = path
            if getattr(top, "idx", None) == 0:       # (args, kwargs)[0]: a positional argument
                i = getattr(key, "idx", 0)
                name = params[i] if i < len(params) else f"args[{i}]"
            else:
                name = str(getattr(key, "key", key))
            names.append(name + pytree.keystr(tuple(rest)))
        return names


def ambient() -> tuple:
    """The global modes a trace bakes in, as torch.compile guards on them: autocast's state and dtype for each
    device type kernels run for or trace on (its casts), the default dtype (of `torch.full(s, 1.0)`), and the
    float32 matmul precision (Options.f32_dot follows it)."""
    return (torch.get_default_dtype(), torch.get_float32_matmul_precision(),
            *((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")))


def _arity(sig: Optional[inspect.Signature]) -> tuple[float, float]:
    """How many positional arguments a call without keywords may pass and need no binding: (0, -1), none, when
    a keyword-only parameter has no default."""
    if sig is None:
        return 0, float("inf")
    ps = sig.parameters.values()
    if any(p.kind is p.KEYWORD_ONLY and p.default is p.empty for p in ps):
        return 0, -1
    positional = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    most = float("inf") if any(p.kind is p.VAR_POSITIONAL for p in ps) else len(positional)
    return sum(p.default is p.empty for p in positional), most


def name_of(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _user(path: Optional[str]) -> bool:
    """Code from a file outside _LIBRARY (or typed in: "<stdin>")."""
    return path is not None and not os.path.abspath(path).startswith(_LIBRARY)


def _library_module(v: Any) -> bool:
    return isinstance(v, types.ModuleType) and not _user(getattr(v, "__file__", None))


class _Walker:
    """Collects the reads of a callable and of the user functions, methods and modules it reaches."""

    def __init__(self) -> None:
        self.reads: dict[tuple, Read] = {}
        self.seen: set[tuple] = set()

    def add(self, read: Read) -> None:
        self.reads.setdefault(read.ident(), read)

    def visit(self, obj: Any, via: Optional[Read]) -> None:
        """`obj` is called; `via` is the read it comes from (None for the compiled callable itself)."""
        me = via or Read("object", obj)
        if isinstance(obj, functools.partial):
            self.add(me.attr("args"))
            self.add(me.attr("keywords"))
            self.visit(obj.func, me.attr("func"))
        elif isinstance(obj, types.MethodType):
            self.function(obj.__func__, me.attr("__self__"))
        elif isinstance(obj, types.FunctionType):
            self.function(obj, None)
        elif isinstance(obj, torch.nn.Module):
            self.add(me)            # training, parameters and buffers, wherever the code reads them
            self.add(me.attr("forward"))
            self.function(type(obj).forward, me)
        elif not isinstance(obj, type) and isinstance(call := inspect.getattr_static(type(obj), "__call__", None),
                                                           types.FunctionType):
            self.add(me.attr("__call__"))
            self.function(call, me)

    def function(self, f: Any, me: Optional[Read]) -> None:
        """Reads of function `f`; `me` is how the code reaches `self` when `f` is a method."""
        code = getattr(f, "__code__", None)
        at = (code, me.ident() if me else None)
        if code is None or not _user(code.co_filename) or at in self.seen or len(self.seen) >= _MAX_CODE:
            return
        self.seen.add(at)
        fn_read = Read("object", f)
        for a in ("__defaults__", "__kwdefaults__"):
            if getattr(f, a, None):
                self.add(fn_read.attr(a))
        cells = dict(zip(code.co_freevars, f.__closure__ or ()))
        this = code.co_varnames[0] if me is not None and code.co_argcount else None
        for kind, name, path, method, depth in _loads(code):
            if name == this and (kind == "free" or depth == 0 and kind == "local"):
                base = me
            elif kind == "global" and (name in f.__globals__ or not hasattr(builtins, name)):
                base = Read("global", f.__globals__, name)
            elif kind == "free" and name in cells and depth == 0 or kind == "outer" and name in cells:
                base = Read("cell", cells[name])
            else:
                continue
            assert base is not None
            self.reach(base, path, method)

    def reach(self, base: Read, path: tuple[str, ...], method: Optional[str]) -> None:
        """Add the read `base.path` and walk what it calls. The path is cut where a value is a tensor (`W.T` is
        a new tensor each time: W is guarded) or reads differently twice in a row (a property that builds a new
        object): its parent is guarded instead, or every call would miss."""
        v = base.value()
        if _library_module(v) or isinstance(v, types.ModuleType) and not path:
            return
        n = 0
        while n < len(path) and not isinstance(v, torch.Tensor) and _stable(base.attr(*path[:n + 1])):
            n += 1
            v = base.attr(*path[:n]).value()
        read = base.attr(*path[:n])
        if n or base.kind != "object":
            self.add(read)
        if n < len(path):
            return
        if method is not None:      # `self.helper(x)`: walk the method with `self` as the receiver
            m = getattr(v, method, None)
            if isinstance(m, types.MethodType) and m.__self__ is v:
                self.function(m.__func__, read)
                return
            read, v = read.attr(method), m      # `self.proj(x)`: the attribute is a module or a function
            if not _stable(read):
                return
            self.add(read)
        if callable(v) and not isinstance(v, type):
            self.visit(v, read)


def _stable(read: Read) -> bool:
    return fingerprint(read.value()) == fingerprint(read.value())


_ROOTS = {"LOAD_GLOBAL": "global", "LOAD_NAME": "global", "LOAD_DEREF": "free", "LOAD_CLASSDEREF": "free"}
_METHOD_FLAG = sys.version_info >= (3, 12)     # LOAD_METHOD became LOAD_ATTR with the low bit of its argument set


def _loads(code: types.CodeType, bound: frozenset[str] = frozenset(),
           depth: int = 0) -> Iterator[tuple[str, str, tuple[str, ...], Optional[str], int]]:
    """(kind, name, attribute path, method name, depth) for every load of a global ("global"), free variable
    ("free"; "outer" in nested code where no enclosing function binds the name) or local ("local") in `code`
    and the code nested in it, with the attributes read off it right after (`CONFIG.tau`: path ("tau",));
    a method called off it ends the path and is given apart."""
    ins = list(dis.get_instructions(code))
    for i, op in enumerate(ins):
        kind = _ROOTS.get(op.opname) or ("local" if op.opname.startswith("LOAD_FAST") else None)
        if kind is None or not isinstance(op.argval, str):
            continue
        if kind == "free" and depth and op.argval not in bound:
            kind = "outer"
        path: list[str] = []
        method = None
        for nxt in itertools.islice(ins, i + 1, None):
            if nxt.opname == "LOAD_METHOD" or nxt.opname == "LOAD_ATTR" and _METHOD_FLAG and (nxt.arg or 0) & 1:
                method = nxt.argval
            elif nxt.opname == "LOAD_ATTR":
                path.append(nxt.argval)
                continue
            break
        yield kind, op.argval, tuple(path), method, depth
    inner = bound | set(code.co_varnames) | set(code.co_cellvars)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _loads(c, inner, depth + 1)
