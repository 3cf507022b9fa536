"""`ft.compile`: a drop-in callable that builds one plan per input signature and runs it."""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Sequence

import torch

from ..pipeline import Program, build


def signature(args: Sequence[Any]) -> tuple:
    """What a plan is specialised to: every tensor's shape, dtype, device and strides; every other value."""
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append(("T", tuple(a.shape), a.dtype, str(a.device), tuple(a.stride())))
        else:
            sig.append(("V", repr(a)))
    return tuple(sig)


class Compiled:
    """Wraps `fn`; the first call for each signature captures and plans, later calls reuse that plan."""

    def __init__(self, fn: Callable, **options: Any) -> None:
        self.fn = fn
        self.options = options
        self.programs: dict[tuple, Program] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def program_for(self, args: Sequence[Any]) -> Program:
        key = signature(args)
        with self._lock:
            prog = self.programs.get(key)
            if prog is None:
                prog = build(self.fn, list(args), **self.options)
                self.programs[key] = prog
        return prog

    def __call__(self, *args: Any) -> Any:
        return self.program_for(args).run(list(args))


def compile(fn: Callable, **options: Any) -> Compiled:
    """Return a callable equivalent to `fn` that runs FlashTensor's fused kernels where it can."""
    return Compiled(fn, **options)
