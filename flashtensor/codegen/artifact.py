"""The kernel artifact: what code generation hands the runtime and the plan cache stores.

A `KernelSource` is plain data (Triton source text, launch grid and configuration, and the
buffers its arguments are, in order), so a plan read back from disk launches exactly what was
planned, with no compiler stage in between.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ..ir.sizes import ALIGN, python

FINITE = ("finite",)   # buffer key of the finite-check flag: zeroed per call, NaN once a check finds a non-finite input
HELPERS_MODULE = "flashtensor.codegen.triton_helpers"   # what every generated kernel imports its helpers from


@dataclass
class Buffer:
    name: str
    shape: tuple[Any, ...]     # ints; in a shape-generic kernel, sizes as ir.sizes.python gives them
    dtype: torch.dtype
    kind: str                  # input | output | intermediate
    # ("in", program input index), an LOutput or LNode while planning; a plain key once planned
    source: Any = None
    written: bool = False      # the kernel stores into it


@dataclass
class Prologue:
    """A companion kernel in the same module: a pre-pass launched before its kernel (codegen/ranges.py: the run-time
    tile ranges of masks read from tensors), or the combine launched after a kernel whose loop is split across
    programs (codegen/split.py)."""
    name: str
    buffers: list[Buffer]
    grid: tuple[Any]
    num_warps: int
    sizes: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)     # size expressions that must stay below 2**31 (see below)


@dataclass
class KernelSource:
    name: str
    source: str
    buffers: list[Buffer]
    grid: tuple[Any]               # programs: an int, or a size expression (ir.sizes.python)
    num_warps: int
    num_stages: int
    blocks: dict[str, int] = field(default_factory=dict)
    assumes_finite: bool = False   # it skips tiles by value facts that hold for finite inputs
    fixup: bool = False            # relaunched with MODE=1 after the plan: recomputes unless the check passed
    fixup_programs: int = 264      # programs of that fixup pass
    sizes: list[str] = field(default_factory=list)   # size arguments after the buffers (a shape-generic kernel)
    prologues: list[Prologue] = field(default_factory=list)     # launched before it, in order
    splits: Any = 1                # programs per row tile, each over a piece of the loop (a size expression)
    combine: Optional[Prologue] = None     # launched after it where the loop is split: merges the pieces
    # in a shape-generic kernel, the reach of its int32 tile offsets (codegen/tiles.Tiles.offset), as size
    # expressions a call's sizes must keep below 2**31
    limits: list[str] = field(default_factory=list)
    aligned: list[str] = field(default_factory=list)    # sizes its ALIGN bits stand for, in order (header)

    @property
    def runtime_split(self) -> bool:
        """Whether it takes SPLIT (header): a split loop whose count is a size expression."""
        return self.combine is not None and isinstance(self.splits, str)

    @property
    def reaches(self) -> list[str]:
        """The limits of the kernel and of its companions."""
        companions = self.prologues + ([self.combine] if self.combine else [])
        return list(dict.fromkeys(self.limits + [x for p in companions for x in p.limits]))

    @property
    def config(self) -> str:
        """The tuned configuration in words (the tuner's progress line, explain's report)."""
        ways = f"{self.splits} ways" if isinstance(self.splits, int) else "as the call's sizes say"
        split = f", loop split {ways}" if self.combine else ""
        return f"blocks {self.blocks}, {self.num_warps} warps, {self.num_stages} stages{split}"


INT32_REACH = 2 ** 31
"""Element offsets below it fit the int32 of a tile's indices."""


def header(name: str, buffers: Sequence[Buffer], sizes: Sequence[str], aligned: Sequence[str],
           mode: bool, split: bool = False) -> list[str]:
    """The first lines of a generated kernel: its decorator, its signature (buffers, size arguments, then the
    constexprs: MODE where it has a fixup pass, PDL, ALIGN where it takes a size of `aligned`, and SPLIT where
    its loop's split count follows from the sizes (codegen/split.py)), the wait for
    the kernel before it (PDL), and each size of `aligned` it takes, told a multiple of ALIGN where ALIGN's bit
    for it (its position in `aligned`) says so.

    Size arguments are not specialised: Triton would otherwise compile the kernel again for the lengths that 16
    divides, seconds on a call that should only launch, and fold a length of 1 into the code, where an early-exit
    loop that then never runs crashes its sm_90 pipeline. Alignment matters only for the sizes that stride rows
    (ir.sizes.strided): unspecialised, Triton cannot see a row's start aligned, nor a bounds mask constant over a
    vector, and loads those rows an element at a time. So the launch passes their alignment as ALIGN
    (runtime/launch.py), and ir.sizes.bucket keeps a bucket's calls on one value of it."""
    hinted = [(i, s) for i, s in enumerate(aligned) if s in sizes]
    consts = (["MODE: tl.constexpr"] if mode else []) + ["PDL: tl.constexpr"] + \
        (["ALIGN: tl.constexpr"] if hinted else []) + (["SPLIT: tl.constexpr"] if split else [])
    jit = f"@triton.jit(do_not_specialize={list(sizes)!r})" if sizes else "@triton.jit"
    told = [f"    {s} = _aligned({s}, (ALIGN >> {i}) & 1)" for i, s in hinted]
    return [jit, f"def {name}({', '.join([b.name for b in buffers] + list(sizes) + consts)}):",
            "    if PDL:", "        _after_prior()"] + told


def align_bits(aligned: Sequence[str], sizes: Sequence[str], values: Mapping[str, int]) -> Optional[int]:
    """ALIGN of a launch of a kernel taking `sizes` (`header`): bit i set where it takes the i-th size of `aligned`
    and ALIGN divides its value; None where it takes none of them (it has no ALIGN)."""
    if not set(aligned) & set(sizes):
        return None
    return sum(1 << i for i, s in enumerate(aligned) if s in sizes and values[s] % ALIGN == 0)


def plain_shape(b: Buffer) -> Buffer:
    """b with its symbolic sizes as Python expressions of the size arguments (the launch evaluates them)."""
    return dataclasses.replace(b, shape=tuple(python(d) for d in b.shape))


def encode_kernel(k: KernelSource) -> dict:
    """Plain data (the plan cache loads it with torch.load(weights_only=True))."""
    return dataclasses.asdict(k)


def decode_kernel(d: dict) -> KernelSource:
    def companion(p: dict) -> Prologue:
        return Prologue(**{**p, "buffers": [Buffer(**b) for b in p["buffers"]]})
    combine = d.get("combine")
    return KernelSource(**{**d, "buffers": [Buffer(**b) for b in d["buffers"]],
                           "prologues": [companion(p) for p in d.get("prologues", [])],
                           "combine": companion(combine) if combine else None})


def with_plain_keys(kernels: list[KernelSource], key: Callable[[Any], tuple]) -> list[KernelSource]:
    """The kernels with every buffer's planning-time source (an LOutput or LNode) replaced by key(source)."""
    def plain(bufs: list[Buffer]) -> list[Buffer]:
        return [dataclasses.replace(b, source=key(b.source)) for b in bufs]
    def companion(p: Prologue) -> Prologue:
        return dataclasses.replace(p, buffers=plain(p.buffers))
    return [dataclasses.replace(k, buffers=plain(k.buffers), prologues=[companion(p) for p in k.prologues],
                                combine=companion(k.combine) if k.combine else None)
            for k in kernels]
