"""Where FlashTensor's warnings point: the user's line that called into FlashTensor (or the model code that did,
through torch.compile or an attention interface), found by walking out of the package and torch, since the depth
of that frame depends on the path a call takes (a plan from the cache, a new plan, the torch.compile backend)."""
from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Optional

import torch

_INSIDE = tuple(os.path.dirname(os.path.abspath(f)) + os.sep for f in (__file__, torch.__file__))


def user_stacklevel() -> int:
    """`warnings.warn`'s stacklevel, called in the function that warns, for the first frame outside FlashTensor
    and torch (1, the warning function itself, where every frame is inside: FlashTensor's own command line)."""
    frame: Optional[FrameType] = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1
