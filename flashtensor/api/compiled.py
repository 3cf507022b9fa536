"""`ft.compile`: a drop-in callable that builds one plan per call key and runs it."""
from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from ..driver import FallbackWarning, build
from ..options import Options
from ..runtime.plan import Program
from .guards import Call, Guards, name_of, version

_CHANGED = 2        # traces in a row that change what the function reads, before it runs eagerly


class Compiled:
    """Wraps `fn`; the first call for each key (api/guards.py: the arguments' structure and signature, the values
    of the globals, closure variables and attributes the function reads) captures and plans (or loads the plan
    from the on-disk cache), later calls reuse that plan."""

    def __init__(self, fn: Callable, options: Options) -> None:
        self.fn = fn
        self.options = options
        self.programs: dict[tuple, Program] = {}
        # per key: the tensors the plan baked in, with their versions then, and whether any requires grad
        self._baked: dict[tuple, tuple[list[tuple[torch.Tensor, int]], bool]] = {}
        self._guards = Guards(fn)
        self.warned: set[str] = set()      # notes warned about: one FallbackWarning each per callable
        self._lock = threading.Lock()
        self._warned_grad = False
        self._changed = 0           # builds in a row whose trace changed what the function reads
        # not `__dict__`: an object's own attributes (an `fn` among them) must not replace this one's
        functools.update_wrapper(self, fn, updated=())

    def program_for(self, args: Sequence[Any], kwargs: Optional[dict] = None) -> Program:
        """The program for this call (planned now if none fits), whether or not a call would run it."""
        call = self._guards.bind(tuple(args), kwargs or {})
        if call is None:
            self.fn(*args, **(kwargs or {}))     # raises eager's own TypeError
            raise TypeError(f"the arguments do not fit the signature of {name_of(self.fn)}")
        return self._plan(call)[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self._guards.bind(args, kwargs)
        if call is None or self._changed >= _CHANGED:
            return self.fn(*args, **kwargs)      # arguments that do not fit: eager raises its own error
        grad = torch.is_grad_enabled()
        if grad and call.requires_grad:
            return self._eager(args, kwargs)
        prog, baked_grad = self._plan(call)
        if grad and baked_grad:
            return self._eager(args, kwargs)
        return prog.run(call.leaves)

    def _plan(self, call: Call) -> tuple[Program, bool]:
        """The program for `call` and whether a tensor it baked in requires grad. A miss walks the function again
        (guards.Guards.refresh) before it builds; a plan whose baked-in tensors were written since is rebuilt."""
        key = self._guards.key(call)
        prog = self.programs.get(key)
        if prog is not None and self._fresh(key):
            return prog, self._baked[key][1]
        with self._lock:
            self._guards.refresh()
            key = self._guards.key(call)
            prog = self.programs.get(key)
            if prog is None or not self._fresh(key):
                prog = build(self._guards.flat(call.spec), call.leaves, self.options, self.warned)
                baked = {id(v): v for n in prog.plan.captured.nodes for v in n.attrs.values()
                         if isinstance(v, torch.Tensor)}
                self._baked[key] = ([(t, version(t)) for t in baked.values()],
                                    any(t.requires_grad for t in baked.values()))
                self.programs[key] = prog
                self._count_changes(self._guards.key(call) != key)
        return prog, self._baked[key][1]

    def _count_changes(self, changed: bool) -> None:
        """A function whose own run changes what it reads (a call log it appends to) misses on every call, and
        would plan every time: after _CHANGED such traces in a row (the first may only fill a cache it keeps), it
        runs in eager PyTorch, which is what replays its side effects anyway."""
        self._changed = self._changed + 1 if changed else 0
        if self._changed == _CHANGED:
            warnings.warn(f"FlashTensor: {name_of(self.fn)} changes values it reads each time it runs, so no plan "
                          "could be reused; it runs in eager PyTorch", FallbackWarning, stacklevel=4)

    def _fresh(self, key: tuple) -> bool:
        return all(version(t) == v for t, v in self._baked[key][0])

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        """Run `fn` itself, which autograd records; said once per compiled callable."""
        if not self._warned_grad:
            self._warned_grad = True
            warnings.warn(f"FlashTensor: inputs require grad: running {name_of(self.fn)} in eager PyTorch for "
                          "autograd; FlashTensor's kernels are forward-only", FallbackWarning, stacklevel=3)
        return self.fn(*args, **kwargs)


def compile(fn: Callable, **options: Any) -> Compiled:
    """Return a callable equivalent to `fn` that runs FlashTensor's fused kernels where it can. Keyword
    arguments are fields of `flashtensor.options.Options` (for example `cache=False`, which keeps this
    callable off the on-disk plan cache)."""
    return Compiled(fn, Options.make(**options))
