"""The user's source line of an ATen call or a failure, for the notes and errors that point at it."""
from __future__ import annotations

import inspect
import os
import traceback
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_SKIP = tuple(os.path.dirname(inspect.getfile(m)) + os.sep for m in (torch,)) + (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,)


class SourceRecorder(TorchDispatchMode):
    """Remembers the user's source line for every ATen call, so errors and warnings can point at it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, user_frame()))
        return func(*args, **(kwargs or {}))


def user_frame(frames: Optional[list[traceback.FrameSummary]] = None) -> str:
    """The innermost of `frames` (by default the caller's stack) outside torch and the flashtensor package
    itself (workloads.py and bench/programs.py count as user code), as `file:line: code`."""
    for fr in reversed(traceback.extract_stack()[:-2] if frames is None else frames):
        f = os.path.abspath(fr.filename)
        if (f.startswith(_SKIP) and not f.endswith(("workloads.py", "programs.py"))) or fr.filename.startswith("<"):
            continue
        return f"{f}:{fr.lineno}: {(fr.line or '').strip()}"
    return ""
