"""Loads generated Triton source as a module and launches its kernels in plan order."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from .. import knobs
from ..codegen.artifact import FINITE, Buffer, KernelSource, align_bits
from ..ir.sizes import evaluator

SIZES = ("sizes",)     # buffer key of the size symbols' values
AT = ("sizes", "at")   # buffer key of those values as one hashable key, made once per call (launches memoise by it)
LAUNCH = ("sizes", "launch")   # buffer key of the call's device, stream and launch hooks (found once a call)
FLAGS = ("finite", "pool")      # buffer key of the finite-check flags kept buffers' calls take in turn (_Flags)


def load_kernel(k: KernelSource, name: Optional[str] = None) -> Any:
    """Import the kernel (or another function of its module, a prologue's) from a file named by its source hash
    (Triton's jit reads source from files)."""
    digest = hashlib.sha256(k.source.encode()).hexdigest()[:20]
    mod_name = f"ft_{k.name}_{digest}"
    if mod_name in sys.modules:
        return getattr(sys.modules[mod_name], name or k.name)
    path = knobs.cache_dir() / "kernels" / f"{mod_name}.py"
    if not path.exists() or path.read_text() != k.source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(k.source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(mod_name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, name or k.name)


MEMO = 256            # sizes whose launches a kernel keeps worked out (a decode loop brings a new one per token)


@dataclass
class Step:
    """One launch of a call: a kernel or a companion at its grid, its tensor arguments by buffer key (`inputs`: the
    positions among them of the program's inputs), its size arguments' values and its launch options. On a GPU
    (`direct`) it launches the compiled kernel itself, found in `kernels` (the Launch's, shared by the steps of
    every call's sizes) by what Triton specialised it on: the function and its options, the sizes' (`spec`) and
    the alignment of the inputs' pointers (a view into a larger tensor may not be aligned); dtypes are fixed for
    a plan."""
    fn: Any
    grid: tuple[int]
    buffers: list[Any]
    sizes: list[int]
    options: dict[str, Any]
    inputs: list[int]
    kernels: dict[tuple, Any]
    spec: tuple
    direct: bool

    def args(self, buffers: dict) -> list[Any]:
        return [buffers[b] for b in self.buffers] + self.sizes

    def launch(self, buffers: dict) -> None:
        if not self.direct:
            self.fn[self.grid](*self.args(buffers), **self.options)
            return
        args = [buffers[b] for b in self.buffers]
        device, stream, enter, leave = _context(buffers)
        key = (self.spec, device, *[args[i].data_ptr() % 16 == 0 for i in self.inputs])
        kernel = self.kernels.get(key)
        if kernel is None:      # Triton's own path the first time, which compiles or finds the kernel
            kernel = self.fn[self.grid](*args, *self.sizes, **self.options)
            self.kernels[key] = kernel.result() if hasattr(kernel, "result") else kernel
            return
        args += self.tail
        # Triton's launch metadata is None without an enter hook (a profiler's); skipping the call saves its cost
        kernel.run(self.grid[0], 1, 1, stream, kernel.function, kernel.packed_metadata,
                   None if enter is None else kernel.launch_metadata(self.grid, stream, *args), enter, leave, *args)

    @functools.cached_property
    def tail(self) -> list[Any]:
        """The size arguments, then the values of the kernel's constexpr parameters, which a direct launch passes
        after the tensors."""
        return self.sizes + [self.options[name] for name in self.fn.arg_names[len(self.buffers) + len(self.sizes):]]


def _size_spec(n: int) -> bool:
    """What Triton specialises a size argument on (codegen/artifact.jit): the width it needs."""
    return -2 ** 31 <= n < 2 ** 31


@dataclass
class Launch:
    source: KernelSource
    fn: Any
    ms: float = 0.0          # the tuner's median time on the device (0 where nothing was timed)
    _memo: dict[tuple, Any] = field(default_factory=dict, repr=False, compare=False)      # steps and allocations
    _kernels: dict[tuple, Any] = field(default_factory=dict, repr=False, compare=False)   # Step.kernels

    def __call__(self, buffers: dict, fixup: bool = False, after_prior: bool = False,
                 prepasses: bool = True) -> None:
        """MODE=0: the kernel, each program also checking its piece of the inputs; MODE=1: the fixup pass
        (codegen/check.py says what both do). `after_prior`: a programmatic dependent launch where
        the device has them, which may start while the plan's kernel before it on the stream finishes (its
        programs first wait for that kernel's writes): the launch gap between a plan's kernels goes. Only
        the plan's own kernels after its first are launched so; any kernel's wait is a no-op otherwise.
        Without `prepasses`, the pre-passes are left out: their buffers hold what they found for the same
        masks (run_kernels)."""
        for step in self.steps(buffers, fixup, after_prior, prepasses):
            step.launch(buffers)

    def compile(self, buffers: dict, fixup: bool = False, after_prior: bool = False) -> None:
        """Compile what the same call would launch, launching nothing (Triton's warmup): the tuner compiles its
        candidates side by side before it times them one by one."""
        for step in self.steps(buffers, fixup, after_prior):
            step.fn.warmup(*step.args(buffers), grid=step.grid, **step.options)

    def steps(self, buffers: dict, fixup: bool, after_prior: bool, prepasses: bool = True) -> list[Step]:
        """The launches of one call, in order (`_steps`), worked out once per sizes, device and mode."""
        sizes = buffers.get(SIZES, {})
        device = buffers[self.source.buffers[0].source].device
        run = prepasses and not fixup
        return memoised(self._memo, (buffers.get(AT, ()), device, fixup, after_prior, run),
                         lambda: self._steps(sizes, device, fixup, after_prior, run))

    def _steps(self, sizes: Mapping[str, int], device: torch.device, fixup: bool, after_prior: bool,
               prepasses: bool) -> list[Step]:
        """The pre-passes where `prepasses` says (never in the fixup pass, which computes every tile and reads no
        run-time range), the kernel, and the combine of a split loop (in the fixup pass too, after it recomputed
        the pieces; none where the count comes to 1)."""
        src = self.source
        tiles, splits, merged, *before = self._grids(sizes)
        pdl = _dependent_launch(device)     # the code waits, and lets the next kernel launch early
        direct = _direct(device)

        def step(fn: Any, grid: int, buffers: list[Buffer], names: list[str], **options: Any) -> Step:
            keys = [b.source for b in buffers]
            values = [sizes[n] for n in names]
            align = align_bits(src.aligned, names, sizes)
            if align is not None:
                options["ALIGN"] = align
            spec = (id(fn), tuple(sorted(options.items())), tuple(map(_size_spec, values)))
            return Step(fn, (grid,), keys, values, options, [i for i, k in enumerate(keys) if _is_input(k)],
                        self._kernels, spec, direct)

        out = []
        for p, fn, n in zip(src.prologues if prepasses else [], self.prologues, before):
            out.append(step(fn, n, p.buffers, p.sizes, PDL=pdl, launch_pdl=pdl and after_prior,
                            num_warps=p.num_warps))
            after_prior = True
        split = {"SPLIT": int(splits != 1)} if src.runtime_split else {}
        out.append(step(self.fn, min(tiles, src.fixup_programs) if fixup else tiles, src.buffers, src.sizes,
                        MODE=int(fixup), PDL=pdl, launch_pdl=pdl and after_prior, num_warps=src.num_warps,
                        num_stages=src.num_stages, **split))
        c = src.combine
        if c is not None and splits != 1:
            out.append(step(self.combine, merged, c.buffers, c.sizes, MODE=int(fixup), PDL=pdl, launch_pdl=pdl,
                            num_warps=c.num_warps))
        return out

    def allocate(self, buffers: dict, device: torch.device) -> None:
        """Create the outputs, intermediates and the (zeroed) finite-check flag this kernel and its companions
        use that `buffers` does not hold yet. Where a split loop's count comes to 1 at these sizes, the kernel
        writes no pieces (codegen/split.epilogue): their buffers are one shared element, not allocated."""
        sizes = buffers.get(SIZES, {})
        for source, shape, dtype, split, make in memoised(self._memo, ("allocate", buffers.get(AT, ())),
                                                          lambda: self._allocations(sizes)):
            have = buffers.get(source)
            # the tuner's candidates share buffers by key, and one may split where another does not: a placeholder
            # is replaced where this one writes pieces
            if have is not None and not (split and have is _untouched(device, dtype)):
                continue
            buffers[source] = _untouched(device, dtype) if shape is None else make(shape, dtype=dtype, device=device)

    def _allocations(self, sizes: Mapping[str, int]) -> list[tuple[Any, Optional[tuple], torch.dtype, bool, Any]]:
        """(buffer key, shape, dtype, whether it holds a split loop's pieces, torch.zeros or torch.empty) of each
        buffer that is not a program input, once each; shape None for the pieces where the loop runs in one."""
        out: dict[Any, tuple[Any, Optional[tuple], torch.dtype, bool, Any]] = {}
        one = self._grids(sizes)[1] == 1
        for b, shape in zip(self._buffers, self._shapes(sizes)):
            if not _is_input(b.source):
                split = _is_split(b.source)
                out.setdefault(b.source, (b.source, None if one and split else shape, b.dtype, split and not one,
                                          torch.zeros if b.source == FINITE else _empty()))
        return list(out.values())

    @functools.cached_property
    def _buffers(self) -> list[Buffer]:
        companions = self.source.prologues + ([self.source.combine] if self.source.combine else [])
        return self.source.buffers + [b for p in companions for b in p.buffers]

    @functools.cached_property
    def _shapes(self) -> Callable[[Mapping[str, int]], tuple]:
        """Every buffer's shape at a call's sizes, in one evaluation."""
        return evaluator([f"({''.join(f'{d}, ' for d in b.shape)})" for b in self._buffers])

    @functools.cached_property
    def _grids(self) -> Callable[[Mapping[str, int]], tuple]:
        """The kernel's programs, its split count, the combine's programs and each prologue's, in one evaluation."""
        src = self.source
        return evaluator([src.grid[0], src.splits, src.combine.grid[0] if src.combine else 1] +
                         [p.grid[0] for p in src.prologues])

    @functools.cached_property
    def prepass_inputs(self) -> Optional[list[Any]]:
        """The program inputs (buffer keys) the pre-passes read: the masks. None where they also read a buffer they
        do not write themselves that is no program input (a value an earlier kernel computes)."""
        own = {b.source for p in self.source.prologues for b in p.buffers if b.written}
        read = list(dict.fromkeys(b.source for p in self.source.prologues for b in p.buffers if b.source not in own))
        return read if all(_is_input(k) for k in read) else None

    @functools.cached_property
    def prologues(self) -> list[Any]:
        return [load_kernel(self.source, p.name) for p in self.source.prologues]

    @functools.cached_property
    def combine(self) -> Any:
        assert self.source.combine is not None     # launched only for a kernel with a split loop
        return load_kernel(self.source, self.source.combine.name)


def _empty() -> Callable[..., torch.Tensor]:
    """torch.empty, or with knobs.poison() one whose memory holds NaN or the most negative int32."""
    if not knobs.poison():
        return torch.empty

    def poisoned(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=device)
        return t.fill_(float("nan") if t.is_floating_point() else -2 ** 31 if dtype.itemsize >= 4 else 0)
    return poisoned


def _is_input(key: Any) -> bool:
    return isinstance(key, tuple) and key[0] == "in"


def _is_split(key: Any) -> bool:
    return isinstance(key, tuple) and key[0] == "split"


@functools.cache
def _untouched(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A buffer no kernel reads or writes, passed where one is declared but unused at these sizes."""
    return torch.empty(1, dtype=dtype, device=device)


def memoised(memo: dict, key: Any, make: Callable[[], Any]) -> Any:
    """memo[key], made where it is missing (None is a value too); a memo past MEMO entries starts again."""
    got = memo.get(key, memo)
    if got is memo:
        if len(memo) >= MEMO:
            memo.clear()
        got = memo[key] = make()
    return got


@functools.cache
def _direct(device: torch.device) -> bool:
    """Whether steps launch their compiled kernels themselves: on a real GPU, where Triton's own launch path (argument
    binding, cache key, checks) costs tens of microseconds of host time per launch."""
    return device.type == "cuda" and not knobs.interpret()


@functools.cache
def _triton() -> tuple[Any, Any]:
    """Triton's active driver and its runtime knobs (the launch hooks a profiler sets)."""
    import triton
    from triton.runtime import driver
    return driver.active, triton.knobs.runtime


def _context(buffers: dict) -> tuple[int, int, Any, Any]:
    """The call's device index, stream and Triton's launch hooks, found by its first direct launch and kept in
    `buffers` for the others (each lookup is a driver call)."""
    ctx = buffers.get(LAUNCH)
    if ctx is None:
        device = _current_device()
        hooks = _triton()[1]
        ctx = buffers[LAUNCH] = (device, _current_stream(device), _hook(hooks.launch_enter_hook),
                                 _hook(hooks.launch_exit_hook))
    return ctx


def _hook(hook: Any) -> Any:
    """A launch hook, or None where none is set: Triton keeps its hooks in a chain that is never None itself, and
    calling an empty one still costs each launch its metadata and two Python calls."""
    return None if hook is None or getattr(hook, "calls", None) == [] else hook


def _current_device() -> int:
    return _triton()[0].get_current_device()


def _current_stream(device: int) -> int:
    return _triton()[0].get_current_stream(device)


@functools.cache
def _dependent_launch(device: torch.device) -> bool:
    """Programmatic dependent launch needs sm_90 or later (and a real device)."""
    return device.type == "cuda" and not knobs.interpret() and torch.cuda.get_device_capability(device)[0] >= 9


def input_buffers(inputs: Sequence[torch.Tensor], sizes: Optional[dict[str, int]] = None) -> dict:
    """Program inputs keyed as kernels name them (generated code assumes contiguous layouts), and the values of
    the size symbols a shape-generic plan's kernels take (under SIZES)."""
    bufs: dict[Any, Any] = {("in", i): t.contiguous() for i, t in enumerate(inputs)}
    bufs[SIZES] = sizes or {}
    bufs[AT] = tuple(bufs[SIZES].items())
    return bufs


def run_kernels(launches: Sequence[Launch], inputs: Sequence[torch.Tensor], device: torch.device,
                sizes: Optional[dict[str, int]] = None, kept: Optional[dict] = None,
                memo: Optional[dict] = None) -> dict:
    """Allocate intermediates and outputs, launch every kernel, then the fixup pass where the plan has one
    (it returns at once unless an input was not finite); returns all buffers by key. With `kept` (the program's
    own dict), the intermediates of the last call from this thread on this stream at the same sizes are reused:
    that call's kernels ran before these on the stream, and no intermediate leaves the call; outputs are new. A
    kernel's pre-passes are left out where that call read the same mask tensors, unwritten since (`_masks_read`):
    the tile ranges they found are still in its buffers, as the layers of a model share one attention mask. `memo`
    (the program's own dict) keeps each sizes' list of launches (`call_steps`)."""
    buffers = input_buffers(inputs, sizes)
    reused, found = False, {}
    if kept is not None:
        where = (threading.get_ident(), _context(buffers)[1] if _direct(device) else None)
        at, held, then = kept.get(where, (None, {}, {}))
        reused = at == buffers[AT]
        if reused:
            found = then
            buffers.update(held)
            if FLAGS in held:
                buffers[FINITE] = held[FLAGS].take(device)
            kept[where] = (at, held, {})    # until this call's pre-passes are done, none is known
    if reused and memo is not None:     # the intermediates are that call's: only the outputs are new
        for key, shape, dtype, make in memoised(memo, ("outputs", buffers[AT]), lambda: _outputs(launches, sizes)):
            buffers[key] = make(shape, dtype=dtype, device=device)
    else:
        for la in launches:
            la.allocate(buffers, device)
    masks: list[Optional[list[tuple[torch.Tensor, int]]]] = []
    prepasses = (True,) * len(launches)
    if any(la.source.prologues for la in launches):
        # a CUDA graph being captured records the launches, not their effect: it keeps its pre-passes (a replay
        # reads the mask then), and what it would leave in the buffers is no range found
        capturing = _capturing(device)
        masks = [None if capturing else _masks_read(la, buffers) for la in launches]
        prepasses = tuple(not _unchanged(found.get(k), masks[k]) for k in range(len(launches)))
    make = functools.partial(call_steps, launches, buffers, prepasses)
    for step in make() if memo is None else memoised(memo, (buffers[AT], device, prepasses), make):
        step.launch(buffers)
    if kept is not None:
        if not reused:
            if len(kept) >= MEMO:
                kept.clear()
            held = {k: b for k, b in buffers.items() if _is_intermediate(k) and k != FINITE}
            if FINITE in buffers:
                held[FLAGS] = _Flags(device)
        kept[where] = (buffers[AT], held, {k: [(weakref.ref(t), v) for t, v in m] for k, m in enumerate(masks) if m})
    return buffers


class _Flags:
    """The finite-check flags of the calls that reuse one kept set of buffers: each call takes the next flag of a
    pool, and the pool is zeroed whole as it comes round (stream order puts that after every call that used one of
    its flags), so a call launches no fill of its own. A call captured in a CUDA graph zeroes its flag itself, since
    each replay runs with that one flag again."""

    SIZE = 64

    def __init__(self, device: torch.device) -> None:
        self.pool = torch.zeros(self.SIZE, dtype=torch.float32, device=device)
        self.flags = list(self.pool.split(1))
        self.at = 0     # the flag of the call that kept the buffers is its own: the pool starts unused

    def take(self, device: torch.device) -> torch.Tensor:
        self.at = (self.at + 1) % self.SIZE
        if self.at == 0:
            self.pool.zero_()
        flag = self.flags[self.at]
        if _capturing(device):
            flag.zero_()
        return flag


def _outputs(launches: Sequence[Launch], sizes: Optional[Mapping[str, int]]) -> list[tuple[Any, Any, Any, Any]]:
    """(buffer key, shape, dtype, torch.empty) of each of the launches' program outputs at `sizes`, once each."""
    out = {key: (key, shape, dtype, make) for la in launches
           for key, shape, dtype, _, make in la._allocations(sizes or {}) if key[0] == "out"}
    return list(out.values())


def call_steps(launches: Sequence[Launch], buffers: dict, prepasses: tuple[bool, ...]) -> list[Step]:
    """Every launch of a call, in order: each kernel with its companions (its pre-passes where `prepasses` says),
    each a dependent launch after the first, then each kernel's fixup pass."""
    out = [s for k, la in enumerate(launches) for s in la.steps(buffers, False, k > 0, prepasses[k])]
    return out + [s for la in launches if la.source.fixup for s in la.steps(buffers, True, True)]


def _capturing(device: torch.device) -> bool:
    return _direct(device) and torch.cuda.is_current_stream_capturing()


def version(t: torch.Tensor) -> int:
    """`t._version`, which every in-place write moves; -1 for an inference tensor, which keeps none."""
    try:
        return t._version
    except RuntimeError:
        return -1


def _masks_read(la: Launch, buffers: dict) -> Optional[list[tuple[torch.Tensor, int]]]:
    """The tensors a kernel's pre-passes read, each with its `version`; None where it has none, where they read a
    value an earlier kernel computes, or a tensor keeps no version (one made under inference_mode): their
    pre-passes then run on every call."""
    keys = la.prepass_inputs
    if not keys:
        return None
    out = [(buffers[key], version(buffers[key])) for key in keys]
    return None if any(v < 0 for _, v in out) else out


def _unchanged(before: Optional[list[tuple[Any, int]]], now: Optional[list[tuple[torch.Tensor, int]]]) -> bool:
    """Whether a kernel's pre-passes read the same tensor objects (alive since, so no other took their place) at
    the same versions as the call that `before` (weak references and versions) records."""
    return before is not None and now is not None and len(before) == len(now) and \
        all(ref() is t and v == w for (ref, v), (t, w) in zip(before, now))


def _is_intermediate(key: Any) -> bool:
    """A buffer the kernels write and read that is neither a program input nor output (nor the call's sizes)."""
    return isinstance(key, tuple) and key[0] not in ("in", "out", "sizes")
