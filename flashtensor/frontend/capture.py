"""Capture: a PyTorch callable plus example inputs -> graph IR.

We trace with `make_fx` (ATen-level proxy tracing) rather than torch.export:
it takes any Python callable, closures and Python constants included, without
wrapping it in an nn.Module, and the torch.compile backend reuses the same path
on the FX graph Dynamo hands it. Python control flow is specialised to the
example inputs' shapes and dtypes, which is why plans are keyed on them.
Tracing runs on fake tensors: capture never executes the program, so a function
whose eager run would not fit in memory (h2o at 32K tokens) still compiles.

What cannot be traced or represented (Python control flow on a tensor's value,
`.item()`) becomes one opaque call of the whole function (frontend/eager.py).
"""
from __future__ import annotations

import logging
import operator
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..ir.graph import Builder, Graph, Node, Returns
from ..ir.ops import ELEMENTWISE, GROUP, TENSOR, Group, scalar
from ..ir.sizes import same
from . import activations, indices, layout, norms, pooling, reductions, scan
from .checks import check_fill
from .eager import EagerOnly, raise_if_eager_rejects, torch_logs_to_debug, whole, why_untraced
from .scatter import copied, scatter
from .source import SourceRecorder
from .symbolic import Matmuls, fixed_sizes, size_oblivious, size_sources, symbolic_inputs

aten = torch.ops.aten
log = logging.getLogger("flashtensor.capture")


class CaptureError(RuntimeError):
    pass


def trace(fn: Callable, args: Sequence[torch.Tensor], dynamic: frozenset[tuple[int, int]] = frozenset()
          ) -> tuple[torch.fx.GraphModule, list[tuple[Any, str]], Returns]:
    """The function as an ATen FX graph whose output is the list of tensors it returns; the user's source line of
    every ATen call; and how to rebuild what it returns from that list. The (input, dimension) pairs in `dynamic`
    are traced as symbolic sizes (frontend/symbolic.py)."""
    rec = SourceRecorder()
    returns: list[Returns] = []

    def wrapped(*a):
        rec.calls.clear()       # a trace again (sizes it fixed made static) records its own calls
        with rec:
            out = fn(*a)
        returns.append(_returns(out, rec.calls))
        return [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]

    devices = sorted({str(a.device) for a in args})
    why = f"its tensor arguments are on several devices ({', '.join(devices)})" if len(devices) > 1 else ""
    if not why:
        with torch_logs_to_debug():
            try:
                # functionalized: an in-place write (`s[..., :5, :] = -inf`) becomes a new value that later reads
                # see, where the IR's pure nodes would otherwise keep reading the value from before the write
                functional = torch.func.functionalize(wrapped, remove="mutations")
                symbolic = _symbolic_trace(functional, args, dynamic) if dynamic else None
                # static: asked so, or the trace fixed every size it tried
                gm = symbolic if symbolic is not None else \
                    make_fx(functional, tracing_mode="fake", _allow_non_fake_inputs=True)(*args)
            except EagerOnly:
                raise
            except Exception as e:  # data-dependent control flow, an op fake tensors cannot run, a user error
                why = why_untraced(e)
    if why:
        raise_if_eager_rejects(fn, args)
        raise EagerOnly(why)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target == aten.copy_.default and n.args[0].op == "placeholder":
            # eager's write must reach the caller's tensor (a static KV cache's index_copy_): run the function
            raise EagerOnly(f"it writes into its tensor argument {placeholders.index(n.args[0]) + 1} in place")
    return gm, rec.calls, returns[-1]


def _symbolic_trace(fn: Callable, args: Sequence[torch.Tensor], dynamic: frozenset[tuple[int, int]]
                    ) -> torch.fx.GraphModule | None:
    """fn traced with the (input, dimension) pairs in `dynamic` symbolic, its ShapeEnv and size symbols in the
    graph's meta; a size the trace fixed to a constant is traced static instead (frontend.symbolic.fixed_sizes),
    and so are sizes of 1 where the trace fails (a size-oblivious trace cannot broadcast a symbolic size: a
    Hugging Face mask's head axis of 1 under dynamic=True); None where that leaves none symbolic."""
    while dynamic:
        try:
            with size_oblivious():
                mode, fakes = symbolic_inputs(args, dynamic)
                sources = size_sources(fakes)      # before the trace finds sizes equal or constant
                with mode, Matmuls():
                    gm = make_fx(fn, tracing_mode="real", _allow_non_fake_inputs=True)(*fakes)
        except EagerOnly:
            raise
        except Exception:
            ones = frozenset((i, d) for i, d in dynamic if args[i].shape[d] == 1)
            if not ones:
                raise
            log.debug("symbolic trace failed with sizes of 1 symbolic; tracing them static", exc_info=True)
            dynamic = dynamic - ones
            continue
        env = mode.shape_env
        assert env is not None
        fixed = fixed_sizes(fakes, dynamic, env)
        if not fixed:
            gm.meta["shape_env"], gm.meta["size_sources"] = env, sources
            return gm
        dynamic = dynamic - fixed
    return None


_CONSTANT = (int, float, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def _returns(out: Any, calls: Sequence[tuple[Any, str]]) -> Returns:
    """The structure of a return value: its tensors become the graph's outputs, the rest are constants."""
    leaves, spec = pytree.tree_flatten(out)
    slots = tuple(k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor))
    for x in leaves:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            at = next((src for f, src in calls if f == aten._local_scalar_dense.default), "") or "unknown source"
            raise EagerOnly(f"it returns a Python number read from a tensor's value (as .item() gives) at {at}")
        if not isinstance(x, (torch.Tensor, *_CONSTANT)):
            raise EagerOnly(f"it returns a {type(x).__name__} (FlashTensor rebuilds tensors, numbers and strings "
                             "in tuples, lists, dicts and other pytree containers)")
    return Returns(spec, tuple(None if k in slots else x for k, x in enumerate(leaves)), slots)


def capture(fn: Callable, args: Sequence[torch.Tensor], dynamic: frozenset[tuple[int, int]] = frozenset()) -> Graph:
    """Trace `fn(*args)` to ATen and lower it into the graph IR; what capture cannot represent is one opaque call
    of the whole function. A program eager rejects raises eager's exception (a user error). With `dynamic`, the
    graph's sizes there are symbolic (a shape-generic plan)."""
    try:
        gm, calls, returns = trace(fn, args, dynamic)
    except EagerOnly as e:
        return whole(fn, args, str(e))
    try:
        g = from_fx(gm, calls, returns)
        if "shape_env" in gm.meta:
            g.shape_env, g.size_sources = gm.meta["shape_env"], gm.meta["size_sources"]
        return g
    except EagerOnly as e:
        return whole(fn, args, str(e))
    except Exception as e:  # a user error fake tensors let through (softmax's dim), or a bug in capture
        log.debug("capture failed", exc_info=True)
        why = f"internal compiler error in capture ({type(e).__name__}: {e}), please report it"
    raise_if_eager_rejects(fn, args)
    return whole(fn, args, why)      # a bug costs the user speed, not the answer


BEFORE_KERNELS = "it runs in eager PyTorch before the kernels, which read its value"


def fallback_notes(g: Graph, before: frozenset[str] = frozenset()) -> list[str]:
    """What runs in eager PyTorch, once per op and source line (the outputs of one call are one note); the calls
    named in `before` (partition.fusable.prologue's, by op and source line) run before the kernels, which read
    their values."""
    def note(n: Node) -> str:
        at = f"no lowering for {n.attrs['fn']} at {n.source or 'unknown source'}"
        if f"{n.attrs['fn']} at {n.source}" in before:
            return f"{at}; {BEFORE_KERNELS}"
        return n.attrs.get("note") or f"{at}; it and what depends on it run in eager PyTorch"
    return list(dict.fromkeys(note(n) for n in g.nodes if n.op == "opaque"))


def from_fx(gm: torch.fx.GraphModule, calls: Sequence[tuple[Any, str]], returns: Returns) -> Graph:
    """The graph IR of a traced function (`trace`)."""
    b = Builder()
    env: dict[torch.fx.Node, Any] = {}
    inputs: list[Node] = []
    pending = list(calls)
    live = _live(gm.graph)

    def source_of(target) -> str:
        for k, (f, src) in enumerate(pending):
            if f == target:
                del pending[: k + 1]
                return src
        return ""

    for fx in gm.graph.nodes:
        if fx.op == "placeholder":
            val = fx.meta["val"]
            n = b.add("input", (), val.shape, val.dtype, index=len(inputs), device=val.device)
            inputs.append(n)
            env[fx] = n
        elif fx.op == "get_attr":
            t = getattr(gm, fx.target)
            env[fx] = b.add("const", (), t.shape, t.dtype, value=t)
        elif fx.op == "call_function":
            env[fx] = _lower_call(b, fx, env, source_of(fx.target), live)
        elif fx.op == "output":
            return Graph(inputs, [env[o] for o in fx.args[0]], b.nodes, returns)
    raise CaptureError("traced graph has no output")


def _unheld(fx: torch.fx.Node, val: Any, src: str) -> str:
    """Why a call's value has no place in the graph IR."""
    op = fx.args[0].target if fx.target is operator.getitem and isinstance(fx.args[0], torch.fx.Node) else fx.target
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        what = f"{op} reads a tensor's value into Python (as .item() does)"
    elif isinstance(val, torch.Tensor):
        what = f"the shape of {op}'s result depends on a tensor's values"
    else:
        what = f"{op} gives a {type(val).__name__}, which the graph IR does not hold"
    return f"{what} at {src or 'unknown source'}"


def _live(g: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes the output depends on (or that have effects): an unused value, such as the indices of
    `max_pool1d`, must not become an opaque node, which would cost a fallback note and kernel outputs."""
    live: set[torch.fx.Node] = set()
    for n in reversed(g.nodes):
        if n.op in ("output", "placeholder") or n.is_impure() or any(u in live for u in n.users):
            live.add(n)
    return live


def _meta(fx: torch.fx.Node) -> tuple[tuple[int, ...], torch.dtype]:
    v = fx.meta["val"]
    return tuple(v.shape), v.dtype


def _lower_call(b: Builder, fx: torch.fx.Node, env: dict, src: str, live: set[torch.fx.Node]) -> Any:
    def arg(a):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    t = _out_of_place(fx) or fx.target
    if fx not in live and any(env[a] is None for a in fx.all_input_nodes):
        return None                      # reads an unused output that got no node
    val = fx.meta.get("val")
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not free_unbacked_symbols(val):
        return val                       # a size, or arithmetic on sizes: symbolic where the trace is dynamic
    if not (isinstance(val, (tuple, list)) or (isinstance(val, torch.Tensor) and
                                               not free_unbacked_symbols(val.shape))):
        if fx not in live:
            return None
        raise EagerOnly(_unheld(fx, val, src))
    args = [arg(a) for a in fx.args]
    kw = {k: arg(v) for k, v in fx.kwargs.items()}
    if t is operator.getitem:
        base, idx = args
        if isinstance(base, (list, tuple)):
            return base[idx]
        raise CaptureError(f"unexpected getitem on {base}")
    if t in _MULTI:
        return _MULTI[t](b, fx, args, kw, src, live)
    if isinstance(val, (tuple, list)):
        return _multi_opaque(b, fx, args, kw, src, live)
    shape, dtype = _meta(fx)
    check_fill(t, args, kw, dtype)
    rule = _RULES.get(t)
    if rule is not None:
        out = rule(b, args, kw, shape, dtype, src)
        if out is not None:
            return out
    return _opaque(b, t, args, kw, shape, dtype, src, None) if fx in live else None


def _out_of_place(fx: torch.fx.Node) -> Any:
    """The out-of-place overload of an in-place op that functionalisation left in the graph (F.rms_norm's `add_` of
    eps to its mean), where the tensor it writes is an intermediate nothing else reads; else None."""
    t, a0 = fx.target, (fx.args[0] if fx.args else None)
    name = getattr(getattr(t, "overloadpacket", None), "__name__", "")
    if not name.endswith("_") or name.startswith("_") or not isinstance(a0, torch.fx.Node) or \
            a0.op != "call_function" or len(a0.users) != 1:
        return None
    return getattr(getattr(aten, name[:-1], None), getattr(t, "_overloadname", ""), None)


def _opaque(b, t, args, kw, shape, dtype, src, index):
    """A call the IR does not model, run eagerly: its tensors, also those in lists (cat, stack, index_put),
    are the node's inputs in order, and `arg_spec` and `kwargs` are the call with TENSOR in their places."""
    tensors: list[Node] = []
    spec = _marked(list(args), tensors)
    kwargs = {k: _marked(v, tensors) for k, v in kw.items()}
    return b.add("opaque", tuple(tensors), shape, dtype, src, fn=t, arg_spec=spec, kwargs=kwargs, index=index)


def _marked(a: Any, tensors: list[Node]) -> Any:
    """`a` with TENSOR in its tensors' places, as plain lists and tuples: FX's immutable_list (an argument such as
    avg_pool's kernel_size) is one Dynamo cannot pass to the op, so it would break a compiled remainder's graph."""
    if isinstance(a, Node):
        tensors.append(a)
        return TENSOR
    if isinstance(a, (list, tuple)):
        return (list if isinstance(a, list) else tuple)(_marked(x, tensors) for x in a)
    return a


def _used(fx: torch.fx.Node, live: set[torch.fx.Node]) -> set[int]:
    """Which outputs of a call that returns several the program reads."""
    users = [u for u in fx.users if u in live]
    if all(u.target is operator.getitem for u in users):
        return {k for u in users if isinstance(k := u.args[1], int)}
    return set(range(len(fx.meta["val"])))


def _multi_opaque(b, fx, args, kw, src, live):
    """Any other call that returns several tensors (std_mean, aminmax, sdpa, logsigmoid, max_pool): one opaque
    node per output the program reads, each running the call and taking its output."""
    vals, used = fx.meta["val"], _used(fx, live)
    return [_opaque(b, fx.target, args, kw, tuple(v.shape), v.dtype, src, k) if k in used else None
            for k, v in enumerate(vals)]


def _max_dim(b, fx, args, kw, src, live):
    """max.dim / min.dim: values lower to a reduction; indices, where read, stay opaque (the IR has no argmax)."""
    x, dim = args[0], args[1]
    keep = bool(args[2]) if len(args) > 2 else False
    vals = fx.meta["val"]
    kind = "max" if fx.target == aten.max.dim else "min"
    v = b.add("reduce", (x,), tuple(vals[0].shape), vals[0].dtype, src, kind=kind, dims=[dim % len(x.shape)],
              keepdim=keep)
    i = _opaque(b, fx.target, args, kw, tuple(vals[1].shape), vals[1].dtype, src, 1) if 1 in _used(fx, live) else None
    return [v, i]


def _aminmax(b, fx, args, kw, src, live):
    """torch.aminmax: the min and the max over `dim` (every element where none), each a reduction."""
    x, dim = args[0], kw.get("dim", args[1] if len(args) > 1 else None)
    keep = bool(kw.get("keepdim", args[2] if len(args) > 2 else False))
    dims = list(range(len(x.shape))) if dim is None else [dim % max(len(x.shape), 1)]
    return [b.add("reduce", (x,), tuple(v.shape), v.dtype, src, kind=kind, dims=dims, keepdim=keep)
            for kind, v in zip(("min", "max"), fx.meta["val"])]


def _split(b, fx, args, kw, src, live):
    """split / split_with_sizes: a slice per piece."""
    x, size = args[0], args[1]
    dim = (args[2] if len(args) > 2 else kw.get("dim", 0)) % len(x.shape)
    sizes = size if isinstance(size, (list, tuple)) else [size] * -(-x.shape[dim] // size)
    outs, start = [], 0
    for v, s in zip(fx.meta["val"], sizes):
        s = min(s, x.shape[dim] - start)
        outs.append(b.add("slice", (x,), tuple(v.shape), v.dtype, src, dim=dim, start=start))
        start += s
    return outs


def _unbind(b, fx, args, kw, src, live):
    """unbind (`q, k, v = qkv.unbind(0)`): a select per piece."""
    x = args[0]
    dim = (args[1] if len(args) > 1 else kw.get("dim", 0)) % len(x.shape)
    return [b.add("select", (x,), tuple(v.shape), v.dtype, src, dim=dim, index=k) for k, v in enumerate(fx.meta["val"])]


def _layer_norm(b, fx, args, kw, src, live):
    x, shape, weight, bias, eps = args
    return norms.layer_norm(b, x, len(shape), weight, bias, eps, [v.dtype for v in fx.meta["val"]], src)


def _var_mean(b, fx, args, kw, src, live):
    """torch.var_mean: eager's correction is 1 unless given."""
    x, correction = args[0], kw.get("correction")
    dims = norms.dims_of(args[1] if len(args) > 1 else kw.get("dim"), len(x.shape))
    mean, _, var = norms.moments(b, x, dims, 1 if correction is None else correction, src)
    return [_cast(b, [_reshape(b, [n], {}, tuple(v.shape), n.dtype, src)], {}, tuple(v.shape), v.dtype, src)
            for n, v in zip((var, mean), fx.meta["val"])]


def _first_lowered(lower: Callable) -> Callable:
    """A call whose first output has a lowering (`lower`, a rule of _RULES' form) and whose others, the indices
    of max_pool or log_sigmoid's buffer for the backward, stay opaque where read."""
    def rule(b, fx, args, kw, src, live):
        vals, used = fx.meta["val"], _used(fx, live)
        first = lower(b, args, kw, tuple(vals[0].shape), vals[0].dtype, src)
        if first is None:
            return _multi_opaque(b, fx, args, kw, src, live)
        return [first] + [_opaque(b, fx.target, args, kw, tuple(v.shape), v.dtype, src, k) if k in used else None
                          for k, v in enumerate(vals) if k > 0]
    return rule


def _with_params(op: str, **defaults: Any) -> Callable:
    """A rule for a float composite whose attributes are the call's arguments after the tensor, by position or
    name; of an integer tensor (nan_to_num) the call changes nothing."""
    def rule(b, a, kw, s, d, src):
        given = {**dict(zip(defaults, a[1:])), **{k: v for k, v in kw.items() if k in defaults}}
        if not d.is_floating_point:
            return a[0]
        return b.add(op, (a[0],), s, d, src, **{k: given.get(k, v) for k, v in defaults.items()})
    return rule


def _unary(op):
    return lambda b, a, kw, shape, dtype, src: b.add(op, (a[0],), shape, dtype, src)


def _binary(op):
    def rule(b, a, kw, shape, dtype, src):
        x, y = a[0], a[1]
        alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
        if alpha != 1:
            y = b.add("mul", (y, alpha), y.shape if isinstance(y, Node) else (), dtype, src)
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            x, y = _compared(x, y), _compared(y, x)
        return b.add(op, (x, y), shape, dtype, src)
    return rule


def _compared(v: Any, other: Any) -> Any:
    """A number compared with a half tensor is rounded to its dtype, as eager's CPU and CUDA kernels read it: an
    fp16 p of fp16(1 / 21) (a uniform row) is `>= 1 / 21`."""
    half = isinstance(other, Node) and other.dtype in (torch.float16, torch.bfloat16)
    return torch.tensor(v, dtype=torch.float64).to(other.dtype).item() if half and type(v) in (int, float) else v


def _identity(b, a, kw, shape, dtype, src):
    return a[0]


def _cast(b, a, kw, shape, dtype, src):
    return a[0] if a[0].dtype == dtype else b.add("cast", (a[0],), shape, dtype, src)


def _added_product(b, a, kw, shape, dtype, src):
    """`beta * input + alpha * (batch1 @ batch2)`: addmm and baddbmm (GPT-NeoX's and Bloom's scores, with ALiBi as
    the input); a beta of 0 ignores the input, NaN included, as eager does."""
    beta, alpha = kw.get("beta", 1), kw.get("alpha", 1)
    product = b.add("matmul", (a[1], a[2]), shape, dtype, src)
    if alpha != 1:
        product = b.add("mul", (product, alpha), shape, dtype, src)
    if beta == 0:
        return product
    added = a[0] if beta == 1 else b.add("mul", (a[0], beta), a[0].shape, dtype, src)
    return b.add("add", (added, product), shape, dtype, src)


def _reshape(b, a, kw, shape, dtype, src):
    return a[0] if len(a[0].shape) == len(shape) and all(map(same, a[0].shape, shape)) else \
        b.add("reshape", (a[0],), shape, dtype, src)


def _full(value_of):
    def rule(b, a, kw, shape, dtype, src):
        return b.add("full", (), shape, dtype, src, value=scalar(value_of(a), dtype),
                     device=kw.get("device") or torch.device("cpu"))
    return rule


def _like(value_of):
    def rule(b, a, kw, shape, dtype, src):
        return b.add("full", (), shape, dtype, src, value=scalar(value_of(a), dtype), device=a[0].device)
    return rule


def _arange(b, a, kw, shape, dtype, src):
    nums = list(a) + [kw[k] for k in ("start", "end", "step") if k in kw]
    start, step = (0, 1) if len(nums) == 1 else (nums[0], nums[2] if len(nums) > 2 else 1)
    dev = kw.get("device") or torch.device("cpu")
    # eager computes start + step * i in float32 for half types and rounds once: fp16's arange(2200, 0, -1) ends
    # at 1, where rounding the index first (2199 is 2200 in fp16) would end at 0
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    r = b.add("iota", (), shape, wide, src, dim=0, device=dev)
    if step != 1:
        r = b.add("mul", (r, step), shape, wide, src)
    if start != 0:
        r = b.add("add", (r, start), shape, wide, src)
    return r if wide == dtype else b.add("cast", (r,), shape, dtype, src)


def _fill(b, a, kw, s, d, src):
    """`x.fill_(v)`, `x[...] = v`: v (a number or a 0-d tensor) broadcast to x's shape."""
    v = a[1]
    if not isinstance(v, Node):
        return b.add("full", (), s, d, src, value=scalar(v, d), device=a[0].device)
    if v.shape:
        return None
    v = v if v.dtype == d else b.add("cast", (v,), (), d, src)
    return b.add("expand", (v,), s, d, src) if s else v


def _overload(name: str) -> Any:
    """`"add.Tensor"` -> aten.add.Tensor."""
    packet, overload = name.split(".")
    return getattr(getattr(aten, packet), overload)


# calls that return several tensors and have a lowering; any other such call is _multi_opaque
_MULTI = {aten.max.dim: _max_dim, aten.min.dim: _max_dim, aten.aminmax.default: _aminmax, aten.split.Tensor: _split,
          aten.split_with_sizes.default: _split, aten.unbind.int: _unbind,
          aten.native_layer_norm.default: _layer_norm, aten.var_mean.correction: _var_mean,
          aten.log_sigmoid_forward.default: _first_lowered(_unary("log_sigmoid")),
          aten.max_pool2d_with_indices.default: _first_lowered(pooling.max_pool)}

_RULES: dict[Any, Callable] = {
    # elementwise ops: the ATen overloads ir.ops.ELEMENTWISE names for each
    **{_overload(name): (_unary if GROUP[op] is Group.UNARY else _binary)(op)
       for op, e in ELEMENTWISE.items() for name in e.aten},
    aten.rsub.Scalar: lambda b, a, kw, s, d, src: b.add("sub", (a[1], a[0]), s, d, src),
    aten.relu.default: lambda b, a, kw, s, d, src: b.add("maximum", (a[0], 0.0), s, d, src),
    aten.where.self: lambda b, a, kw, s, d, src: b.add("where", tuple(a[:3]), s, d, src),
    aten._to_copy.default: _cast, aten.clone.default: _identity, aten.alias.default: _identity,
    aten.detach.default: _identity, aten.lift_fresh_copy.default: _identity, aten.contiguous.default: _identity,
    aten.mean.dim: lambda b, a, kw, s, d, src: b.add(
        "mean", (a[0],), s, d, src, dims=norms.dims_of(a[1], len(a[0].shape)),
        keepdim=bool(a[2] if len(a) > 2 else kw.get("keepdim", False))),
    aten.logsumexp.default: lambda b, a, kw, s, d, src: b.add(
        "logsumexp", (a[0],), s, d, src, dims=norms.dims_of(a[1], len(a[0].shape)),
        keepdim=bool(a[2] if len(a) > 2 else kw.get("keepdim", False))),
    aten.mean.default: lambda b, a, kw, s, d, src: b.add(
        "mean", (a[0],), s, d, src, dims=list(range(len(a[0].shape))), keepdim=False),
    aten.bmm.default: lambda b, a, kw, s, d, src: b.add("matmul", (a[0], a[1]), s, d, src),
    aten.mm.default: lambda b, a, kw, s, d, src: b.add("matmul", (a[0], a[1]), s, d, src),
    aten.addmm.default: lambda b, a, kw, s, d, src: b.add(
        "addmm", (a[0], a[1], a[2]), s, d, src) if kw.get("beta", 1) == kw.get("alpha", 1) == 1 else
    _added_product(b, a, kw, s, d, src),
    aten.baddbmm.default: _added_product,
    aten.linear.default: lambda b, a, kw, s, d, src: b.add(
        "linear", tuple(x for x in a[:3] if x is not None), s, d, src),
    aten._softmax.default: lambda b, a, kw, s, d, src: b.add("softmax", (a[0],), s, d, src, dim=_dim(a[1], len(s))),
    aten._log_softmax.default: lambda b, a, kw, s, d, src: b.add(
        "log_softmax", (a[0],), s, d, src, dim=_dim(a[1], len(s))),
    aten.linalg_vector_norm.default: lambda b, a, kw, s, d, src: b.add(
        "norm", (a[0],), s, d, src, ord=float(a[1] if len(a) > 1 else 2),
        dims=norms.dims_of(a[2] if len(a) > 2 else None, len(a[0].shape)), keepdim=bool(a[3] if len(a) > 3 else False)),
    aten.clamp_min.default: lambda b, a, kw, s, d, src: b.add("clamp", (a[0],), s, d, src, min=a[1], max=None),
    aten.clamp_max.default: lambda b, a, kw, s, d, src: b.add("clamp", (a[0],), s, d, src, min=None, max=a[1]),
    aten.clamp.default: lambda b, a, kw, s, d, src: b.add(
        "clamp", (a[0],), s, d, src, min=a[1] if len(a) > 1 else kw.get("min"),
        max=a[2] if len(a) > 2 else kw.get("max")),
    aten.masked_fill.Scalar: lambda b, a, kw, s, d, src: b.add("masked_fill", (a[0], a[1], a[2]), s, d, src),
    aten.masked_fill.Tensor: lambda b, a, kw, s, d, src: b.add(
        "masked_fill", (a[0], a[1], a[2]), s, d, src) if not a[2].shape else None,
    aten.triu.default: lambda b, a, kw, s, d, src: b.add(
        "triu", (a[0],), s, d, src, diagonal=a[1] if len(a) > 1 else 0),
    aten.tril.default: lambda b, a, kw, s, d, src: b.add(
        "tril", (a[0],), s, d, src, diagonal=a[1] if len(a) > 1 else 0),
    aten.full.default: _full(lambda a: a[1]),
    aten.zeros.default: _full(lambda a: 0), aten.ones.default: _full(lambda a: 1),
    aten.scalar_tensor.default: _full(lambda a: a[0]),
    aten.full_like.default: _like(lambda a: a[1]), aten.zeros_like.default: _like(lambda a: 0),
    aten.ones_like.default: _like(lambda a: 1),
    aten.arange.default: _arange, aten.arange.start: _arange, aten.arange.start_step: _arange,
    aten.transpose.int: lambda b, a, kw, s, d, src: b.add(
        "permute", (a[0],), s, d, src, dims=_swap(len(s), a[1], a[2])),
    aten.t.default: lambda b, a, kw, s, d, src: b.add("permute", (a[0],), s, d, src, dims=list(range(len(s)))[::-1]),
    aten.permute.default: lambda b, a, kw, s, d, src: b.add(
        "permute", (a[0],), s, d, src, dims=[x % len(s) for x in a[1]]),
    aten.view.default: _reshape, aten._unsafe_view.default: _reshape, aten.reshape.default: _reshape,
    aten.unsqueeze.default: _reshape, aten.squeeze.dim: _reshape, aten.squeeze.dims: _reshape,
    aten.squeeze.default: _reshape,
    aten.expand.default: lambda b, a, kw, s, d, src: a[0] if tuple(a[0].shape) == s else b.add(
        "expand", (a[0],), s, d, src),
    aten.select.int: lambda b, a, kw, s, d, src: b.add(
        "select", (a[0],), s, d, src, dim=a[1] % len(a[0].shape), index=a[2] % a[0].shape[a[1]]),
    aten.fill.Scalar: _fill, aten.fill.Tensor: _fill,
    **layout.RULES, **pooling.RULES, **scan.RULES, **activations.RULES, **reductions.RULES, **indices.RULES,
    aten.elu.default: _with_params("elu", alpha=1.0, scale=1.0, input_scale=1.0),
    aten.nan_to_num.default: _with_params("nan_to_num", nan=None, posinf=None, neginf=None),
    aten.slice_scatter.default: scatter(False), aten.select_scatter.default: scatter(True), aten.copy.default: copied,
}


def _dim(d: int, rank: int) -> int:
    """A dimension counted from 0; out of range is eager's IndexError (softmax's meta function lets dim=rank by)."""
    if not -max(rank, 1) <= d < max(rank, 1):
        raise IndexError(f"dim {d} is out of range for a tensor of rank {rank}")
    return d % max(rank, 1)


def _swap(rank, i, j):
    dims = list(range(rank))
    i, j = i % rank, j % rank
    dims[i], dims[j] = dims[j], dims[i]
    return dims

