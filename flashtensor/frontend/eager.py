"""The whole function in eager PyTorch: what capture does with a program it cannot trace or represent.

Python control flow on a tensor's value, `.item()`, arguments on several devices: make_fx on fake
tensors cannot follow these, so the function becomes one opaque call of itself (a graph break in spirit),
with a note that names the reason and the user's line. A failed trace may also be the user's error; then
eager rejects the program too, and its own exception is raised, so the function runs once in eager
PyTorch to tell the two apart (only when tracing fails).
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import traceback
from typing import Callable, Iterator, Sequence

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from ..ir.graph import Builder, Graph, Returns
from ..ir.ops import TENSOR
from .source import user_frame

log = logging.getLogger("flashtensor.capture")


class EagerOnly(Exception):
    """Eager runs the program but capture cannot represent it (the message says why)."""


def whole(fn: Callable, args: Sequence[torch.Tensor], why: str) -> Graph:
    """The function as one opaque call of it, whose value is what the function returns (the node's shape and
    dtype are placeholders)."""
    b = Builder()
    inputs = [b.add("input", (), a.shape, a.dtype, index=i, device=a.device) for i, a in enumerate(args)]
    call = b.add("opaque", tuple(inputs), (), torch.float32, fn=fn, arg_spec=[TENSOR] * len(inputs), kwargs={},
                 index=None, note=f"could not capture {name(fn)}: {why}; the whole function runs in eager PyTorch")
    return Graph(inputs, [call], b.nodes, Returns(pytree.tree_structure(0), (None,), (0,)))


def why_untraced(e: Exception) -> str:
    """Why tracing failed, for the note: what the program did, and the user's line where it did it."""
    if isinstance(e, GuardOnDataDependentSymNode):
        what = "Python control flow on a tensor's value"
    elif isinstance(e, (DataDependentOutputException, DynamicOutputShapeException)):
        what = f"{e.func}, whose result depends on a tensor's values"
    else:
        what = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
    at = user_frame(traceback.extract_tb(e.__traceback__))
    return f"{what} at {at}" if at else what


def raise_if_eager_rejects(fn: Callable, args: Sequence[torch.Tensor]) -> None:
    """Run `fn` once in eager PyTorch on copies of the arguments (a function that writes into one must not write
    twice), the random state restored after, so the call that follows draws the same numbers. If eager rejects
    the program too, it is the user's error: raise eager's own exception, noted with the call."""
    with torch.random.fork_rng(devices=sorted({a.device.index or 0 for a in args if a.device.type == "cuda"})):
        try:
            fn(*(a.clone() for a in args))
        except Exception as e:
            e.add_note(f"FlashTensor: raised by {described(fn, args)} in eager PyTorch")
            raise


class _ToDebugLog(logging.Filter):
    """Sends what torch logs while tracing (fake tensors log the traceback of an op that fails) to the debug log:
    such a failure is the user's, which eager raises again, or a capture limitation, which the note names."""

    def filter(self, record: logging.LogRecord) -> bool:
        log.debug("%s: %s", record.name, record.getMessage(), exc_info=record.exc_info)
        return False


@contextlib.contextmanager
def torch_logs_to_debug() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes")]
    to_debug = _ToDebugLog()
    for lg in loggers:
        lg.addFilter(to_debug)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(to_debug)


def name(fn: Callable) -> str:
    return getattr(fn, "__name__", None) or repr(fn)


def parameters(fn: Callable) -> list[str]:
    """The names of fn's parameters, in order; none where it has no signature (a builtin)."""
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def described(fn: Callable, args: Sequence[torch.Tensor]) -> str:
    """`attn(q: float32[1, 40, 2, 16] on cpu, ...)`, with the parameters' names where they are known (`arg_names`,
    which the driver's function of the tensors carries, else the signature's where it lists the tensors)."""
    names = getattr(fn, "arg_names", None)
    if names is None:
        names = parameters(fn)
    if len(names) != len(args):
        names = [""] * len(args)
    shown = [f"{n + ': ' if n else ''}{str(a.dtype).removeprefix('torch.')}{list(a.shape)} on {a.device}"
             for n, a in zip(names, args)]
    return f"{name(fn)}({', '.join(shown)})"
