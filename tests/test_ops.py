"""The op vocabulary: every op is covered by each stage that meets it, or declared as not needing it, and
every op name the compiler compares against is a real op (a misspelling would silently never match)."""
import ast
from pathlib import Path

import pytest
import torch

import flashtensor
from flashtensor.codegen import forms, lower
from flashtensor.frontend import capture
from flashtensor.ir import loops
from flashtensor.ir.graph import Builder
from flashtensor.ir.ops import COMPOSITE, ELEMENTWISE, EVAL, GROUP, Group, Op, scalar
from flashtensor.transform import decompose, loopform

pytestmark = pytest.mark.unit   # no test here launches a kernel (the tier: pyproject.toml)

PACKAGE = Path(flashtensor.__file__).parent
FX_KINDS = {"placeholder", "call_function", "call_method", "call_module", "get_attr", "output"}   # torch.fx's .op
# ops no ATen call captures to one for one: the stages produce them (capture itself: input, const, and the integer
# rounding that floor division and remainder are built from; exp2 folding: log2_approx; loop form: load, scalar,
# reduce_axes)
PRODUCED = {Op.INPUT, Op.CONST, Op.TRUNC_DIV, Op.FMOD, Op.LOG2_APPROX, Op.LOAD, Op.SCALAR, Op.REDUCE_AXES}


def test_every_op_has_a_group():
    assert set(Op) == set(GROUP)


def test_every_graph_op_has_an_evaluator_entry():
    """(the evaluator takes inputs from its arguments)"""
    assert {op for op in Op if GROUP[op] is not Group.LOOP} - {Op.INPUT} <= set(EVAL)


def test_every_elementwise_op_is_captured_evaluated_and_printed():
    rules = set(capture._RULES)
    for op, e in ELEMENTWISE.items():
        assert e.aten or op in PRODUCED, f"{op}: no ATen overload captures to it"
        assert all(capture._overload(name) in rules for name in e.aten), op
        assert op in EVAL and (op in loops.UNARY or op in loops.BINARY), op
        assert op in lower.UNARY or op in lower.BINARY, f"{op}: no Triton template"
    assert any(f is forms.square for f in forms.FORMS)     # x ** 2 as x * x, before pow's template


def test_every_composite_has_a_decomposition():
    assert COMPOSITE <= set(decompose._RULES)


def test_every_op_that_reaches_the_loop_form_has_a_lowering():
    reach = {op for op, g in GROUP.items() if g not in (Group.COMPOSITE, Group.LOOP, Group.EAGER)}
    assert reach == set(loopform._LOWER), reach ^ set(loopform._LOWER)


def test_a_misspelt_op_fails_where_it_is_made():
    with pytest.raises(ValueError):
        Builder().add("exxp", (), (1,), torch.float32)


def _compared_names(tree: ast.AST):
    """String constants compared with `.op` / `op` (==, !=, in) in a module."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        if not ((isinstance(left, ast.Attribute) and left.attr == "op") or (isinstance(left, ast.Name) and left.id == "op")):
            continue
        for comp in node.comparators:
            items = comp.elts if isinstance(comp, (ast.Tuple, ast.List, ast.Set)) else [comp]
            for it in items:
                if isinstance(it, ast.Constant) and isinstance(it.value, str):
                    yield node.lineno, it.value


def test_every_op_name_the_compiler_compares_is_an_op():
    names = {op.value for op in Op}
    bad = [f"{f.relative_to(PACKAGE)}:{line}: {name!r}" for f in sorted(PACKAGE.rglob("*.py"))
           for line, name in _compared_names(ast.parse(f.read_text())) if name not in names | FX_KINDS]
    assert not bad, bad
    assert any(True for f in PACKAGE.rglob("*.py") for _ in _compared_names(ast.parse(f.read_text())))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("value", [-1e9, 0.1, 1, 3, -65504.0, float("-inf")])
def test_a_constant_is_the_value_its_dtype_holds(dtype, value):
    """A fill's or a select's number is stored in the tensor's dtype in eager (bf16's -1e9 is -998244352, fp16's
    is -inf): the IR's constant is that value, so that every tile computing it agrees with the ones folded by the
    facts, which round it so."""
    got = scalar(value, dtype)
    if dtype == torch.bool:
        assert got is bool(value)
    elif dtype.is_floating_point:
        assert got == torch.full((), value, dtype=torch.float64).to(dtype).item()
    else:
        assert got == value and type(got) is type(value)
