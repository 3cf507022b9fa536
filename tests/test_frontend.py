"""The foundation against eager PyTorch: capture, decomposition, the compiled callable, fallback, recompilation."""
import importlib.util
import inspect
import math
import os
import warnings
from pathlib import Path

import pytest
import torch

import flashtensor as ft
from conftest import LINEAR, assert_close, compare, rel_err
from flashtensor import FallbackWarning, workloads
from flashtensor.ir.evaluate import evaluate
from flashtensor.ir.ops import COMPOSITE
from flashtensor.testing import compare_with_exact

SEED = 20240611


def small(name: str, seed: int = SEED, dtype: torch.dtype = torch.float32):
    return workloads.make(name, device="cpu", dtype=dtype, seed=seed, **workloads.SMALL)


def qkv(*shape, seed: int = SEED) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def eager(fn, *args):
    with torch.no_grad():
        return fn(*args)


def tensors(args) -> list:
    return [a for a in args if isinstance(a, torch.Tensor)]


def line_in(fn, text: str) -> int:
    """Line number of the line of `fn`'s source that contains `text` (so tests need not hard-code it)."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# ---- the comparison itself (docs/design.md §6) ---------------------------------------------------

@pytest.mark.unit
def test_metric_follows_the_contract():
    ref = torch.randn(64, 64)
    assert rel_err(ref * (1 + 5e-5), ref) == pytest.approx(5e-5, rel=1e-2)
    assert compare(ref * (1 + 5e-5), ref).ok
    assert not compare(ref * (1 + 5e-4), ref).ok
    half = ref.half()
    assert compare((half.float() * (1 + 1e-3)).half(), half).ok
    assert not compare((half.float() * (1 + 1e-2)).half(), half).ok
    mask = ref > 0
    assert compare(mask.clone(), mask).ok
    flipped = mask.clone()
    flipped[3, 5] = ~flipped[3, 5]
    assert not compare(flipped, mask).ok
    assert not compare(ref.double(), ref).ok and not compare(ref[:-1], ref).ok


@pytest.mark.unit
def test_metric_requires_matching_nan_and_inf():
    ref = torch.randn(8, 8)
    ref[0, 0], ref[1, 1], ref[2, 2] = math.nan, math.inf, -math.inf
    assert compare(ref.clone(), ref).ok
    for i, j, v in ((0, 0, 0.0), (1, 1, -math.inf), (3, 3, math.nan), (4, 4, math.inf)):
        bad = ref.clone()
        bad[i, j] = v
        assert not compare(bad, ref).ok, (i, j, v)


@pytest.mark.unit
def test_a_float32_output_may_be_finite_where_eager_overflowed_an_intermediate():
    """Eager's float32 sinh(89) on some CPUs is exp(89) / 2, inf; float64's 2.24e38 fits float32. An output with
    that value passes; one that keeps eager's inf passes too; one that is finite but far from it, or inf where
    eager and float64 are finite, does not."""
    x = torch.tensor([89.0, -89.2, 3.0], dtype=torch.float64)
    exact = torch.sinh(x)
    eager = exact.float()
    eager[:2] = torch.tensor([math.inf, -math.inf])
    assert compare_with_exact(exact.float(), eager, exact).ok
    assert compare_with_exact(eager.clone(), eager, exact).ok
    assert not compare_with_exact(exact.float() * 1.01, eager, exact).ok
    wrong = exact.float()
    wrong[2] = math.inf
    assert not compare_with_exact(wrong, eager, exact).ok


# ---- the reference workloads --------------------------------------------------------------------

@pytest.mark.parametrize("name", workloads.NAMES)
def test_compiled_workload_matches_eager(name):
    fn, args = small(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)  # snapkv's avg_pool runs eagerly on purpose
        compiled = ft.compile(fn)
        out = compiled(*args)
    assert_close(out, eager(fn, *args))


@pytest.mark.parametrize("name", LINEAR)
def test_linear_attention_fuses(name):
    """EA and SimA run in at most three kernels, with no note (tests/test_linear.py says what they pass)."""
    fn, args = small(name)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        compiled = ft.compile(fn)
        out = compiled(*args)
    assert_close(out, eager(fn, *args))
    (program,) = compiled.programs.values()
    assert 1 <= len(program.launches) <= 3 and not program.notes, program.notes


@pytest.mark.parametrize("name", workloads.NAMES)
def test_captured_and_decomposed_graphs_match_eager(name):
    fn, args = small(name, seed=SEED + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        program = ft.explain(fn, *args).plan
    ref = eager(fn, *args)
    assert_close(tuple(evaluate(program.captured, tensors(args))), ref)
    assert_close(tuple(evaluate(program.decomposed, tensors(args))), ref)


@pytest.mark.parametrize("name", workloads.NAMES)
def test_decomposed_graph_has_no_composites(name):
    fn, args = small(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        program = ft.explain(fn, *args).plan
    assert any(n.op in COMPOSITE for n in program.captured.nodes)  # there was something to decompose
    assert [n.op for n in program.decomposed.nodes if n.op in COMPOSITE] == []


def test_ragged_batched_cross_attention_matches_eager():
    """q_len != kv_len, batch 2, lengths that are not multiples of any tile."""
    g = torch.Generator().manual_seed(SEED)
    q = torch.randn(2, 48, 3, 16, generator=g)
    k, v = torch.randn(2, 80, 3, 16, generator=g), torch.randn(2, 80, 3, 16, generator=g)
    assert_close(ft.compile(workloads.h2o)(q, k, v), eager(workloads.h2o, q, k, v))


def test_half_precision_workload_matches_eager():
    fn, args = small("roco", dtype=torch.float16)
    assert_close(ft.compile(fn)(*args), eager(fn, *args))


def test_fully_masked_rows_give_nan_where_eager_does():
    def masked(q, k, v, keep):
        s = (q @ k.transpose(-1, -2)).masked_fill(~keep, -math.inf)
        return torch.softmax(s, dim=-1) @ v

    q, k, v = qkv(2, 64, 16)
    keep = torch.rand(64, 64) > 0.3
    keep[5] = False  # softmax of an all -inf row is NaN in eager
    ref = masked(q, k, v, keep)
    assert ref[:, 5].isnan().all() and not ref[:, 4].isnan().any()
    assert_close(ft.compile(masked)(q, k, v, keep), ref)


@pytest.mark.parametrize("fn", [lambda x: torch.exp(x - 0.5) * 2.0, lambda x: torch.softmax(x, dim=-1)],
                         ids=["elementwise", "row_softmax"])
def test_program_without_a_reduction_loop_matches_eager(fn):
    x = torch.randn(64, 300)
    assert_close(ft.compile(fn)(x), fn(x))


@pytest.mark.parametrize("fn, fused", [(lambda x: (x > -3.0).all(dim=-1), True),
                                       (lambda x: (x < 2.5).all(dim=0, keepdim=True), True),
                                       (lambda x: (x.abs() < 3.0).all(), False),
                                       (lambda x: (x > -3.0).all(dim=(0, 1)), True)],
                         ids=["last", "first_keepdim", "every", "two_dims"])
def test_all_is_not_any_of_not_and_matches_eager(fn, fused):
    """`all` lowers to not any(not x); thresholds near the tails give both outcomes. A reduction over two of a
    3-d tensor's dimensions fuses (the short one held whole, the kept one in the grid); one over every
    dimension finds no fused plan and says so."""
    x = torch.randn(6, 40, 300)
    ref = fn(x)
    assert ref.dtype == torch.bool and (ref.numel() == 1 or (ref.any() and not ref.all()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        report = ft.explain(fn, x)
        out = ft.compile(fn)(x)
    graph = report.plan.decomposed
    assert not [n for n in graph.nodes if n.op == "opaque"] and any(n.op == "logical_not" for n in graph.nodes)
    assert bool(report.kernels) == fused, report.plan.notes
    assert_close(out, ref)


# ---- fallback ------------------------------------------------------------------------------------

def running_total(x, w):
    y = torch.logcumsumexp(x, dim=-1)  # no IR op, and only elementwise ops after it: all in eager
    return y * w + 1.0


def sorted_scaled(x):
    values, order = torch.sort(x, dim=-1)  # multi-output op with no IR op
    return values * 2.0, order


def fallback_messages(fn, *args) -> list[str]:
    """Compile and run `fn`, check it against eager, and return the FallbackWarning messages."""
    with pytest.warns(FallbackWarning) as caught:
        out = ft.compile(fn)(*args)
    assert_close(out, eager(fn, *args))
    return [str(w.message) for w in caught if w.category is FallbackWarning]


@pytest.mark.unit
@pytest.mark.parametrize("fn, op", [(running_total, "logcumsumexp"), (sorted_scaled, "sort")])
def test_unknown_op_falls_back_to_eager_with_a_warning(fn, op):
    args = (torch.randn(5, 12), torch.randn(12))[: fn.__code__.co_argcount]
    messages = fallback_messages(fn, *args)
    where = f"{Path(__file__).name}:{line_in(fn, f'torch.{op}(')}"
    assert any(op in m and where in m for m in messages), messages


@pytest.mark.unit
def test_fallback_names_user_code_in_a_folder_called_flashtensor(tmp_path):
    folder = tmp_path / "flashtensor"
    folder.mkdir()
    (folder / "user_code.py").write_text("import torch\n\ndef f(x):\n    return torch.logcumsumexp(x, 0) * 2\n")
    spec = importlib.util.spec_from_file_location("user_code", folder / "user_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    messages = fallback_messages(module.f, torch.randn(9))
    assert any("logcumsumexp" in m and "user_code.py:4" in m for m in messages), messages


# ---- specialisation: one plan per signature ------------------------------------------------------

def test_new_shape_recompiles_and_same_signature_reuses():
    compiled = ft.compile(workloads.attn)
    steps = (((1, 128, 2, 32), 1), ((1, 72, 2, 32), 2), ((1, 128, 2, 32), 2), ((1, 72, 2, 32), 2))
    for i, (shape, plans) in enumerate(steps):
        args = qkv(*shape, seed=SEED + i)  # fresh values each call; only the shape decides the plan
        assert_close(compiled(*args), eager(workloads.attn, *args))
        assert compiled.cache_info()["plans"] == plans, shape     # the second length: one generic plan


def test_new_dtype_recompiles():
    compiled = ft.compile(workloads.attn)
    args = qkv(1, 72, 2, 32)
    assert_close(compiled(*args), eager(workloads.attn, *args))
    wide = tuple(a.double() for a in args)
    out = compiled(*wide)
    assert len(compiled.programs) == 2
    assert out.dtype == torch.float64
    assert_close(out, eager(workloads.attn, *wide))


def test_closure_tensor_and_python_constants_match_eager():
    bias = torch.randn(64, 64)
    scale = 0.37

    def biased(q, k, v):
        s = q @ k.transpose(-1, -2) * scale + bias
        return torch.softmax(s, dim=-1) @ v * 3.0 - 1.0

    q, k, v = qkv(2, 64, 16)
    assert_close(ft.compile(biased)(q, k, v), biased(q, k, v))


@pytest.mark.parametrize("name, values", [("keyformer", (1.5, 0.7, 1.5)), ("gemma2", (50.0, 30.0, 50.0))])
def test_non_tensor_arguments_are_baked_in_and_recompile(name, values):
    """keyformer's tau and gemma2's soft cap are Python floats: each new value is a new plan."""
    fn, args = small(name)
    compiled = ft.compile(fn)
    for value in values:
        assert_close(compiled(*args, value), eager(fn, *args, value))
    assert len(compiled.programs) == 2


def test_summed_variable_is_not_captured_by_a_later_op():
    """`(q @ k.T).exp().sum(-2)` sums over q's rows; multiplying it with `q.sum(-1)` lines its key axis up with
    q's row axis. Tying the two variables would compute only the diagonal; the loop form renames the summed
    one apart (the evaluator of the loop form is checked, and the compiled result)."""
    from flashtensor.frontend.capture import capture
    from flashtensor.ir.loops import evaluate_loops
    from flashtensor.transform.decompose import decompose
    from flashtensor.transform.loopform import to_loops

    def fn(q, k):
        return (q @ k.transpose(-1, -2)).exp().sum(-2)[..., None] * q.sum(-1, keepdim=True)

    q, k = qkv(2, 64, 16)[:2]
    loops, _ = to_loops(decompose(capture(fn, [q, k])))
    assert rel_err(evaluate_loops(loops, [q, k])[0], fn(q, k)) < 1e-5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        assert_close(ft.compile(fn)(q, k), fn(q, k))


@pytest.mark.unit
def test_internal_compiler_error_falls_back_to_eager_with_its_reason(monkeypatch):
    """A bug in a stage must not cost the user the answer: eager runs, and the note says what broke."""
    from flashtensor.transform import rewrite

    def broken(*args, **kwargs):
        raise KeyError("simulated bug")

    monkeypatch.setattr(rewrite, "REWRITES", [("broken", broken)])
    q, k, v = qkv(1, 40, 16)
    fn = workloads.attn
    with pytest.warns(FallbackWarning, match="internal compiler error"):
        out = ft.compile(fn, cache=False)(q[:, :, None], k[:, :, None], v[:, :, None])
    assert_close(out, eager(fn, q[:, :, None], k[:, :, None], v[:, :, None]))


def test_an_internal_compiler_error_prints_one_line_and_no_traceback(tmp_path):
    """In a user's process (no logging configured) the bug's traceback goes to the debug log only: Python's
    last-resort handler printed `log.exception`'s ERROR record, traceback and all, to stderr beside the warning."""
    import subprocess
    import sys
    script = tmp_path / "user.py"
    script.write_text(
        "import torch\n"
        "import flashtensor as ft\n"
        "from flashtensor import workloads\n"
        "from flashtensor.transform import rewrite\n"
        "def broken(*args, **kwargs):\n"
        "    raise KeyError('simulated bug')\n"
        "rewrite.REWRITES = [('broken', broken)]\n"
        "q, k, v = (torch.randn(1, 40, 1, 16) for _ in range(3))\n"
        "out = ft.compile(workloads.attn, cache=False)(q, k, v)\n"
        "assert torch.allclose(out, workloads.attn(q, k, v), atol=1e-5)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHTENSOR_DEBUG")}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "internal compiler error" in run.stderr and "simulated bug" in run.stderr, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]


def test_an_internal_compiler_error_is_not_cached(monkeypatch, tmp_path):
    """A stage's bug gives eager's answer for this call, but no plan on disk: the next process plans again."""
    from flashtensor.transform import rewrite

    def broken(*args, **kwargs):
        raise KeyError("simulated bug")

    monkeypatch.setenv("FLASHTENSOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(rewrite, "REWRITES", [("broken", broken)])
    q, k, v = qkv(1, 40, 16)
    with pytest.warns(FallbackWarning, match="internal compiler error"):
        ft.compile(workloads.attn)(q[:, :, None], k[:, :, None], v[:, :, None])
    assert not list((tmp_path / "plans").glob("*.plan"))
