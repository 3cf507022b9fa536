"""`ft.compile`: a drop-in callable that builds one plan per call key and runs it."""
from __future__ import annotations

import functools
import logging
import threading
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from ..caller import user_stacklevel
from ..driver import FallbackWarning, build, retune, warn_notes
from ..options import Options
from ..runtime.autotune import timed
from ..runtime.launch import MEMO
from ..runtime.plan import Program
from .guards import Call, Guards, name_of, version

log = logging.getLogger("flashtensor.compiled")
_CHANGED = 2        # traces in a row that change what the function reads, before it runs eagerly


class Compiled:
    """Wraps `fn`; the first call for each key (api/guards.py: the arguments' structure and signature, the values
    of the globals, closure variables and attributes the function reads) captures and plans (or loads the plan
    from the on-disk cache), later calls reuse that plan."""

    def __init__(self, fn: Callable, options: Options) -> None:
        self.fn = fn
        self.options = options
        self.programs: dict[tuple, Program] = {}
        # shape-generic programs by the program's structure (guards.Guards.key without shapes), each serving
        # the sizes its guards admit; and per structure, the tensor shapes of its first call and the dimensions
        # in which a later call differed from them
        self.generic: dict[tuple, list[Program]] = {}
        self._first: dict[tuple, tuple[list[tuple[int, ...]], set[tuple[int, int]]]] = {}
        # (structure, dimensions) whose shape-generic plan fused nothing: its notes
        self.refused: dict[tuple, list[str]] = {}
        self._served: dict[tuple, Program] = {}     # generic programs by the exact keys of calls they served
        # per program: the tensors the plan baked in, with their versions then, and whether any requires grad
        self._baked: dict[int, tuple[list[tuple[torch.Tensor, int]], bool]] = {}
        self._counts = {"searches": 0, "tunes": 0, "hits": 0, "misses": 0}
        self.dims: Optional[frozenset[tuple[int, int]]] = None    # the dimensions to be generic in, where known
        # what runs where nothing fuses, on devices that compile the remainder (driver.build): fn, or the torch.compile
        # backend's Inductor-compiled graph
        self.unfused: Optional[Callable] = None
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

    def generic_programs(self) -> list[Program]:
        """The shape-generic programs held, of every structure."""
        return [p for ps in self.generic.values() for p in ps]

    def held_programs(self) -> list[Program]:
        """Every program held: those of exact shapes, then the shape-generic ones."""
        return list(self.programs.values()) + self.generic_programs()

    def cache_info(self) -> dict[str, int]:
        """How this callable's calls went, as functools.lru_cache reports: plan searches and tunes run in this
        process (a plan read from the on-disk cache needs neither), calls that found a plan held (`hits`) and
        those that built one (`misses`), and the plans held, shape-generic ones among them."""
        generic = len(self.generic_programs())
        return {**self._counts, "plans": len(self.programs) + generic, "generic": generic}

    def _held(self, call: Call, tune: bool = False) -> Optional[Program]:
        """The program held for this call: the one for its exact key, or a generic one whose guards admit it, tuned
        for its length bucket where the device times kernels (remembered by the exact key, in `_served`). With
        `tune`, a generic program tuned for another bucket is tuned again for this one (driver.retune: its search
        reused)."""
        key = self._guards.key(call)
        prog = self.programs.get(key) or self._served.get(key)
        if prog is not None and self._fresh(prog):
            return prog
        held = self.generic.get(self._guards.key(call, shapes=False), [])
        fitting = [p for p in held if p.fits(call.leaves) and self._fresh(p)]
        if not fitting:
            return None
        prog = fitting[0]
        if timed(prog.device):
            at = prog.at([call.leaves[i] for i in prog.tensor_positions])
            same = [p for p in fitting if at is not None and p.bucket == at[1]]
            if same:
                prog = same[0]
            elif not tune:
                return None
            else:
                try:
                    tuned = retune(prog, call.leaves, self.options, functools.partial(self._held, call))
                except Exception:  # noqa: BLE001 - a bug in tuning for a new bucket costs a plan, not the answer
                    log.debug("tuning the generic plan for a new length bucket failed; planning anew", exc_info=True)
                    tuned = None
                if tuned is None:
                    return None
                self._counts["tunes"] += 1
                self._baked[id(tuned)] = self._baked[id(prog)]
                held.append(tuned)
                prog = tuned
        if len(self._served) >= MEMO:
            self._served.clear()
        self._served[key] = prog
        return prog

    def _plan(self, call: Call) -> tuple[Program, bool]:
        """The program for `call` and whether a tensor it baked in requires grad. A miss walks the function again
        (guards.Guards.refresh) before it builds; a plan whose baked-in tensors were written since is rebuilt."""
        prog = self._held(call)
        if prog is not None:
            self._counts["hits"] += 1
            return prog, self._baked[id(prog)][1]
        with self._lock:
            self._guards.refresh()
            key = self._guards.key(call)
            prog = self._held(call, tune=True)
            if prog is None:
                self._counts["misses"] += 1
                prog = self._build(call, key)
                self._count_changes(self._guards.key(call) != key)
        return prog, self._baked[id(prog)][1]

    def _build(self, call: Call, key: tuple) -> Program:
        """A shape-generic program where `_dynamic` names sizes to be generic in and the plan holds for this call;
        otherwise one for this call's shapes, held under `key` (the call's key before the trace ran): the trial
        itself where its trace fixed every size it tried. Where a structure's generic plan in these dimensions
        fused nothing (its notes in `refused`: a size the kernels cannot take as an argument, or a compiler bug),
        later calls that would be generic in the same dimensions plan for their exact shapes rather than search
        twice per shape; the trial's notes are not warned, since the static plan is what runs."""
        structure = self._guards.key(call, shapes=False)
        per_call = functools.partial(self._held, call)      # what a later call does first, priced with the plan
        dims = self._dynamic(call)
        if (structure, dims) in self.refused:
            dims = frozenset()
        fn = self._guards.flat(call.spec)
        prog = None
        if dims:
            try:
                prog = build(fn, call.leaves, self.options, None, dims, self.unfused, per_call)
                self._count(prog)
            except Exception as e:  # noqa: BLE001 - a bug in the generic path costs a plan per shape, not the answer
                log.debug("shape-generic planning failed; planning for this call's shapes", exc_info=True)
                self.refused[structure, dims] = [f"internal compiler error ({type(e).__name__}: {e}) in the "
                                                 "shape-generic plan; the program plans for each call's shapes"]
        if prog is not None and prog.generic and prog.fits(call.leaves):
            warn_notes(prog.notes, self.warned)
            self.generic.setdefault(structure, []).append(prog)
        elif prog is not None and prog.launches and not prog.generic:   # its trace fixed every size: an exact plan
            warn_notes(prog.notes, self.warned)
            self.programs[key] = prog
        else:
            if prog is not None and not prog.generic and prog.plan.captured.shape_env is not None:
                self.refused[structure, dims] = prog.notes
            prog = build(fn, call.leaves, self.options, self.warned, unfused=self.unfused, per_call=per_call)
            self._count(prog)
            self.programs[key] = prog
        baked = {id(v): v for n in prog.plan.captured.nodes for v in n.attrs.values() if isinstance(v, torch.Tensor)}
        self._baked[id(prog)] = ([(t, version(t)) for t in baked.values()],
                                 any(t.requires_grad for t in baked.values()))
        return prog

    def _count(self, prog: Program) -> None:
        stages = prog.plan.stages
        self._counts["searches"] += "partition" in stages
        self._counts["tunes"] += "tune" in stages

    def _dynamic(self, call: Call) -> frozenset[tuple[int, int]]:
        """The (leaf, dimension) pairs a new plan for `call` is generic in: with `dynamic=True`, every dimension
        but a tensor's last where no other dimension of the inputs has its size (a head or feature dimension,
        which kernels hold whole in a tile; a last dimension as long as another, KeyFormer's S x S noise, is
        taken to be that axis); by default those in which this call's or an earlier call's shapes differed from
        the first call of the same structure (as torch.compile's automatic dynamic shapes), which is also what
        `dynamic=True` falls back to where a plan generic in every dimension fused nothing (a symbolic head axis
        split by a constant); none with `dynamic=False`."""
        tensors = [(i, tuple(a.shape)) for i, a in enumerate(call.leaves) if isinstance(a, torch.Tensor)]
        if self.options.dynamic is False:
            return frozenset()
        if self.dims is not None:       # Dynamo's symbolic dimensions (api/backend.py)
            return self.dims
        structure = self._guards.key(call, shapes=False)
        first, changed = self._first.setdefault(structure, ([s for _, s in tensors], set()))
        changed.update((i, d) for (i, shape), old in zip(tensors, first) for d in range(len(shape))
                       if shape[d] != old[d])
        if self.options.dynamic:
            inner = {n for _, shape in tensors for n in shape[:-1]}
            every = frozenset((i, d) for i, shape in tensors for d in range(len(shape))
                              if d < len(shape) - 1 or shape[d] in inner)
            if (structure, every) not in self.refused:
                return every
        return frozenset(changed)

    def _count_changes(self, changed: bool) -> None:
        """A function whose own run changes what it reads (a call log it appends to) misses on every call, and
        would plan every time: after _CHANGED such traces in a row (the first may only fill a cache it keeps), it
        runs in eager PyTorch, which is what replays its side effects anyway."""
        self._changed = self._changed + 1 if changed else 0
        if self._changed == _CHANGED:
            warnings.warn(f"FlashTensor: {name_of(self.fn)} changes values it reads each time it runs, so no plan "
                          "could be reused; it runs in eager PyTorch", FallbackWarning, stacklevel=user_stacklevel())

    def _fresh(self, prog: Program) -> bool:
        return all(version(t) == v for t, v in self._baked[id(prog)][0])

    def _eager(self, args: tuple, kwargs: dict) -> Any:
        """Run `fn` itself, which autograd records; said once per compiled callable."""
        if not self._warned_grad:
            self._warned_grad = True
            warnings.warn(f"FlashTensor: inputs require grad: running {name_of(self.fn)} in eager PyTorch for "
                          "autograd; FlashTensor's kernels are forward-only", FallbackWarning,
                          stacklevel=user_stacklevel())
        return self.fn(*args, **kwargs)


def compile(fn: Callable, **options: Any) -> Compiled:
    """Return a callable equivalent to `fn` that runs FlashTensor's fused kernels where it can. Keyword
    arguments are fields of `flashtensor.options.Options` (for example `cache=False`, which keeps this
    callable off the on-disk plan cache)."""
    return Compiled(fn, Options.make(**options))
