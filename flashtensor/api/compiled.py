"""`ft.compile`: a drop-in callable that builds one plan per input signature and runs it."""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Sequence

from ..driver import build
from ..options import Options
from ..runtime.cache import signature
from ..runtime.plan import Program


class Compiled:
    """Wraps `fn`; the first call for each signature captures and plans (or loads the plan from the
    on-disk cache), later calls reuse that plan."""

    def __init__(self, fn: Callable, options: Options) -> None:
        self.fn = fn
        self.options = options
        self.programs: dict[tuple, Program] = {}
        self.warned: set[str] = set()      # notes warned about: one FallbackWarning each per callable
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def program_for(self, args: Sequence[Any]) -> Program:
        key = signature(args)
        with self._lock:
            prog = self.programs.get(key)
            if prog is None:
                prog = build(self.fn, list(args), self.options, self.warned)
                self.programs[key] = prog
        return prog

    def __call__(self, *args: Any) -> Any:
        return self.program_for(args).run(list(args))


def compile(fn: Callable, **options: Any) -> Compiled:
    """Return a callable equivalent to `fn` that runs FlashTensor's fused kernels where it can. Keyword
    arguments are fields of `flashtensor.options.Options` (for example `cache=False`, which keeps this
    callable off the on-disk plan cache)."""
    return Compiled(fn, Options.make(**options))
