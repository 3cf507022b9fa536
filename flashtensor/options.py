"""Compile options: one frozen object per compiled callable, hashed into the plan cache's key.

`ft.compile(fn, **fields)` builds it; tests pick a tile configuration or a partition candidate through
it instead of patching module globals.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch


@dataclass(frozen=True)
class TileConfig:
    """Block of the grid's row variable and of the loop variable, warps and pipeline stages of one kernel."""
    block_row: int
    block_loop: int
    num_warps: int
    num_stages: int


# the tuner's candidates; the first is the one used where nothing is timed (the CPU, the interpreter)
CONFIGS: tuple[TileConfig, ...] = tuple(TileConfig(*c) for c in (
    (128, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 4, 3),
    (64, 64, 4, 2), (128, 128, 4, 2), (64, 32, 4, 2), (128, 32, 8, 3)))


@dataclass(frozen=True)
class Options:
    configs: tuple[TileConfig, ...] = CONFIGS   # tile configurations the tuner tries
    candidate: Optional[int] = None    # offer the search only this partition candidate (None: every one)
    group_programs: int = 512          # programs per launch-order group (codegen/loop.py placement)
    fixup_programs: int = 264          # programs of the fixup pass (two per SM of an H100 or H200)
    # a kernel whose loop feeds only row statistics and sums, with fewer programs than this, splits its loop across
    # programs to reach it (four per SM of an H200; codegen/split.py)
    split_programs: int = 528
    splits: Optional[int] = None       # force that many loop splits wherever a kernel can split (tests; None: sizes)
    cache: bool = True                 # read and write the on-disk plan cache (also FLASHTENSOR_CACHE=0)
    kernels: bool = True               # False: stop after decomposition, run everything in eager
    # torch.compile what a partly fused plan runs in eager (None: on CUDA devices only; runtime/remainder.py)
    compile_remainder: Optional[bool] = None
    # on a GPU, time the plan against the function itself and run whichever is faster (False: the kernels, as
    # tests of the kernels want)
    eager_if_faster: bool = True
    # shape-generic plans (kernels that take sizes as arguments): None, after a second shape of the same
    # program, in the dimensions that changed; True, from the first call, in every dimension but an input's last
    # where no other dimension has its size (api/compiled.py); False, never
    dynamic: Optional[bool] = None
    # float32 contractions on the GPU: "ieee" (exact products, on the FMA units) or "tf32x3" (three TF32 passes
    # on the tensor cores, near float32's accuracy); None follows torch.get_float32_matmul_precision() as eager's
    # matmuls do: "ieee" at "highest" (torch's default), "tf32x3" where eager may use TF32 ("high", "medium"), still
    # nearer float64 than eager's one pass. Triton's interpreter computes both exactly
    f32_dot: Optional[str] = None

    @classmethod
    def make(cls, **fields: Any) -> "Options":
        """Options from keyword arguments, naming any unknown one."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(fields) - names
        if unknown:
            raise TypeError(f"unknown compile option(s): {', '.join(sorted(unknown))}; "
                            f"known: {', '.join(sorted(names))}")
        if fields.get("f32_dot") not in (None, "ieee", "tf32x3"):
            raise ValueError(f"f32_dot must be 'ieee', 'tf32x3' or None, not {fields['f32_dot']!r}")
        if "configs" in fields:
            fields["configs"] = tuple(c if isinstance(c, TileConfig) else TileConfig(*c) for c in fields["configs"])
        return cls(**fields)

    def key(self) -> str:
        """What of these options changes a plan (the cache's part of the key)."""
        return repr(dataclasses.replace(self, cache=True, compile_remainder=None, dynamic=None,
                                        f32_dot=self.float32_dot()))

    def float32_dot(self) -> str:
        """f32_dot, or where it is None what torch's float32 matmul precision asks of eager's matmuls now."""
        if self.f32_dot is not None:
            return self.f32_dot
        return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32x3"
