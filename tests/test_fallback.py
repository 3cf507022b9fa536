"""Fallback notes a user can act on: the op and source line once, one clause per cause, one warning per
note per compiled callable (README, Fallback)."""
import inspect
import logging
import re
import warnings
from pathlib import Path

import pytest
import torch

import flashtensor as ft
from conftest import LINEAR, NOT_YET
from flashtensor import FallbackWarning, workloads

HERE = Path(__file__).name
INTERNAL = re.compile(r"\b[tv]\d+\b")      # loop-form value and variable names (t41, v714)


def line_of(fn, text: str) -> str:
    """'test_fallback.py:N' for the line of fn's source that holds `text`."""
    lines, first = inspect.getsourcelines(fn)
    return f"{HERE}:{first + next(i for i, ln in enumerate(lines) if text in ln)}"


def program(compiled):
    (prog,) = compiled.programs.values()
    return prog


# ---- notes a user can act on ---------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("name", LINEAR)
def test_no_fused_plan_note_is_one_clause_per_cause_without_internal_names(name, caplog):
    fn, args = workloads.make(name, device="cpu", dtype=torch.float32, **workloads.SMALL)
    with caplog.at_level(logging.DEBUG, logger="flashtensor"):
        with pytest.warns(FallbackWarning) as caught:
            compiled = ft.compile(fn, cache=False)
            compiled(*args)
    (note,) = program(compiled).notes
    assert [str(w.message) for w in caught] == [f"FlashTensor: {note}"]
    assert note.startswith(f"no fused plan: {NOT_YET} (") and note.count(NOT_YET) == 1, note
    assert not INTERNAL.search(note), note
    source = Path(workloads.__file__).read_text().splitlines()
    feature = next(i for i, ln in enumerate(source, 1) if ln.lstrip().startswith(f"def {name}(")) + 3
    linear = next(i for i, ln in enumerate(source, 1) if "qkv = F.linear(" in ln)
    assert f"workloads.py:{feature}:" in note and f"(matmul at {workloads.__file__}:{linear}:" in note, note
    assert re.search(r"no fused plan: loop over v\d+: t\d+: a sum over a three-variable product", caplog.text)


def sorted_scaled(x):
    values, order = torch.sort(x, dim=-1)      # two outputs of one op with no lowering
    return values * 2.0, order


@pytest.mark.unit
def test_one_warning_per_distinct_note_per_compiled_callable():
    """sort's two outputs are two opaque nodes of one op and line, and a new shape plans again: one warning."""
    compiled = ft.compile(sorted_scaled, cache=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for shape in ((5, 12), (7, 12), (5, 12)):
            x = torch.randn(*shape)
            out = compiled(x)
            assert all(torch.equal(o, r) for o, r in zip(out, sorted_scaled(x)))
    messages = [str(w.message) for w in caught if w.category is FallbackWarning]
    where = line_of(sorted_scaled, "torch.sort(")
    assert len(messages) == 1 and "aten.sort" in messages[0] and where in messages[0], messages
    assert len(compiled.programs) == 2
    assert all(len(p.notes) == 1 for p in compiled.programs.values())
    with pytest.warns(FallbackWarning, match="aten.sort"):      # another callable warns for itself
        ft.compile(sorted_scaled, cache=False)(torch.randn(5, 12))
