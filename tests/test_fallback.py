"""The fallback is never slower than eager: a program with nothing fused calls the user's own function, a
partly fused one runs its remainder through torch.compile where that pays, a plan that would hand eager a
score-sized value or run one program per element of a matmul is not taken, and every note says once, in the
user's terms, what fell back and where (README, Fallback)."""
import inspect
import logging
import math
import re
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import flashtensor as ft
from conftest import assert_close
from flashtensor import FallbackWarning
from flashtensor.bench import held
from flashtensor.ir import ops

HERE = Path(__file__).name
INTERNAL = re.compile(r"\b[tv]\d+\b")      # loop-form value and variable names (t41, v714)


def line_of(fn, text: str) -> str:
    """'test_fallback.py:N' for the line of fn's source that holds `text`."""
    lines, first = inspect.getsourcelines(fn)
    return f"{HERE}:{first + next(i for i, ln in enumerate(lines) if text in ln)}"


@pytest.fixture
def evaluated(monkeypatch) -> list[str]:
    """Every op the op-by-op evaluator (or an FX step of the remainder) runs, by name; planning never does."""
    seen: list[str] = []
    for op, f in list(ops.EVAL.items()):
        def counted(n, *args, _f=f):
            seen.append(n.name)
            return _f(n, *args)
        monkeypatch.setitem(ops.EVAL, op, counted)
    return seen


def quiet(compiled, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        return compiled(*args)


def program(compiled):
    (prog,) = compiled.programs.values()
    return prog


def qkv(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).to(dtype) for _ in range(3))


# ---- nothing fused: the user's function ----------------------------------------------------------

@pytest.mark.unit
def test_nothing_fused_calls_the_users_function_with_the_calls_arguments(evaluated):
    """float64 has no fused lowering: each call runs `fn` itself on the very tensors and the Python value of
    that call (a new value is a new signature, so a new program), and no op of the decomposed graph."""
    seen = []

    def attn_scaled(q, k, v, scale):
        seen.append((q, scale))
        return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v

    q, k, v = qkv(2, 40, 16, dtype=torch.float64)
    compiled = ft.compile(attn_scaled, cache=False)
    for scale in (0.25, 0.5, 0.25):
        out = quiet(compiled, q, k, v, scale)
        ran = [s for t, s in seen if t is q]
        assert ran[-1] == scale, ran
        assert_close(out, torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v)
    assert len([s for t, s in seen if t is q]) == 3 and len(compiled.programs) == 2
    assert evaluated == []
    for prog in compiled.programs.values():
        assert prog.plan.eager and not prog.launches
        assert any(n.startswith("no fused plan: float64") for n in prog.notes), prog.notes


# ---- the remainder of a partly fused plan --------------------------------------------------------

def attention_then_running_total(q, k, v):
    o = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ v
    c = torch.logcumsumexp(o, dim=-1)             # no lowering: it and the rest run in eager
    return torch.softmax(c * 0.5, dim=-1) + F.normalize(c, dim=-1)


def test_remainder_is_evaluated_on_the_cpu(evaluated):
    """On the CPU (the interpreter) the remainder runs in the evaluator; kernels still compute the attention."""
    q, k, v = qkv(2, 48, 16)
    compiled = ft.compile(attention_then_running_total, cache=False)
    assert_close(quiet(compiled, q, k, v), attention_then_running_total(q, k, v))
    prog = program(compiled)
    assert prog.launches and prog.remainder.compiled is None
    assert "opaque" in evaluated


def attention_then_column_running_total(q, k, v):
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ v, torch.logcumsumexp(p.sum(dim=-2), dim=-1)     # one opaque call between views


def attention_then_pooled_running_total(q, k, v):
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    col = p.sum(dim=-2)
    return p @ v, F.avg_pool1d(col, kernel_size=3, padding=1, stride=1) + col.logcumsumexp(dim=-1)


@pytest.mark.parametrize("fn", [attention_then_running_total, attention_then_pooled_running_total])
def test_remainder_runs_through_torch_compile_once_per_plan(fn, monkeypatch):
    """compile_remainder=True (the default on CUDA devices): the remainder is one torch.compile'd FX graph,
    compiled on the plan's first call and reused by later calls, never the evaluator; the answer is eager's.
    An opaque call's keyword arguments once reached Dynamo through a generator it cannot rebuild at a graph
    break (SnapKV's avg_pool1d on the H200), and the evaluator ran instead; later its kernel_size as FX's
    immutable_list, which Dynamo cannot pass to the op: the graph broke there (the whole remainder is compiled
    in one graph now, or not at all)."""
    from torch._dynamo.utils import counters

    from flashtensor.runtime import remainder
    monkeypatch.setattr(remainder, "evaluate", lambda *a: pytest.fail("the evaluator ran"))
    compiled = ft.compile(fn, cache=False, compile_remainder=True)
    counters.clear()
    for seed in range(3):
        q, k, v = qkv(2, 48, 16, seed=seed)
        assert_close(quiet(compiled, q, k, v), fn(q, k, v))
    prog = program(compiled)
    assert prog.launches and prog.remainder.compiled is not None
    assert any(n.op == "opaque" for n in prog.remainder.order), "no opaque call left: pick another op"
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_a_remainder_of_one_computing_op_is_not_compiled(evaluated, monkeypatch):
    """A running total of the column sums is one opaque call between views: nothing for Inductor to fuse, so
    even with compile_remainder=True the evaluator runs it (torch.compile is never called) and the answer is
    eager's."""
    monkeypatch.setattr(torch, "compile", lambda *a, **k: pytest.fail("torch.compile was called"))
    compiled = ft.compile(attention_then_column_running_total, cache=False, compile_remainder=True)
    q, k, v = qkv(2, 48, 16)
    assert_close(quiet(compiled, q, k, v), attention_then_column_running_total(q, k, v))
    prog = program(compiled)
    assert prog.launches and prog.remainder.compiled is None
    assert "opaque" in evaluated


def test_remainder_falls_back_to_the_evaluator_where_torch_compile_fails(evaluated, caplog):
    q, k, v = qkv(2, 48, 16)
    compiled = ft.compile(attention_then_running_total, cache=False, compile_remainder=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        prog = compiled.program_for((q, k, v))

    def broken(*args):
        raise RuntimeError("simulated Inductor failure")
    prog.remainder.compiled = broken
    with caplog.at_level(logging.DEBUG, logger="flashtensor.runtime.remainder"):
        assert_close(compiled(q, k, v), attention_then_running_total(q, k, v))
    assert prog.remainder.compiled is None and "torch.compile of the eager remainder failed" in caplog.text
    assert "opaque" in evaluated


# ---- ops without a lowering before the kernels ---------------------------------------------------

def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


def llama_rope_by_position_ids(q, k, v, cos, sin, position_ids):
    """transformers' apply_rotary_pos_emb before 4.38: the tables indexed by position ids inside the attention."""
    cos, sin = cos[position_ids].unsqueeze(1), sin[position_ids].unsqueeze(1)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    s = q @ k.transpose(2, 3) / math.sqrt(q.shape[-1])
    s = s + torch.full((s.shape[-1], s.shape[-1]), torch.finfo(s.dtype).min, dtype=s.dtype).triu(1)
    return torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def t5_bucketed_bias(q, k, v, table):
    """T5's relative position buckets computed inside, then its bias table looked up by F.embedding."""
    pos = torch.arange(q.shape[-2], dtype=torch.long)
    rel = pos[None, :] - pos[:, None]
    buckets = (rel > 0).to(torch.long) * 8 + torch.clamp(rel.abs(), max=7)
    bias = F.embedding(buckets, table).permute([2, 0, 1]).unsqueeze(0)
    return torch.softmax((q @ k.transpose(3, 2) + bias).float(), dim=-1).type_as(q) @ v


def attention_over_gathered_keys(q, k, v, idx):
    """Attention over a selected subset of the keys (gathered by index), with the column sums of its weights."""
    pick = idx[..., None].expand(-1, -1, -1, k.shape[-1])
    ks, vs = torch.gather(k, 2, pick), torch.gather(v, 2, pick)
    p = torch.softmax(q @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ vs, p.sum(dim=-2)


def _before_kernels_inputs(fn, dtype, S=40):
    q, k, v = qkv(1, 2, S, 16, dtype=dtype)
    if fn is llama_rope_by_position_ids:
        angles = torch.arange(64.0)[:, None] / 10000 ** (torch.arange(0, 16, 2.0) / 16)
        emb = torch.cat((angles, angles), dim=-1)
        return q, k, v, emb.cos().to(dtype), emb.sin().to(dtype), torch.arange(S)[None] + 3
    if fn is t5_bucketed_bias:
        return q, k, v, torch.randn(16, 2).to(dtype)
    return q, k, v, torch.randint(0, S, (1, 2, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [llama_rope_by_position_ids, t5_bucketed_bias, attention_over_gathered_keys],
                         ids=lambda f: f.__name__)
def test_an_op_without_a_lowering_on_the_inputs_runs_before_the_kernels(fn, dtype):
    """An index, an embedding lookup or a gather of the inputs runs in eager before the kernels, which read its
    value: the attention after it fuses (it all ran in eager before), with one note saying so; the same callable
    serves another length through a generic plan."""
    args = _before_kernels_inputs(fn, dtype)
    compiled = ft.compile(fn, cache=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(*args)
    assert all(m.ok for m in held.check_outputs(fn, args, out, fn(*args)))    # the float64 rule for bf16
    notes = [str(w.message) for w in caught if w.category is FallbackWarning]
    assert len(notes) == 1 and "before the kernels, which read its value" in notes[0], notes
    prog = program(compiled)
    assert prog.launches and len(prog.before) >= 1
    longer = _before_kernels_inputs(fn, dtype, S=56)
    assert all(m.ok for m in held.check_outputs(fn, longer, quiet(compiled, *longer), fn(*longer)))
    assert all(p.launches for p in compiled.programs.values())


# ---- a score-sized value handed to eager: the whole program as written ---------------------------

def scores_through_logcumsumexp(q, k, v):
    s = torch.logcumsumexp(q @ k.transpose(-1, -2), dim=-1)     # no lowering, reads the S x S scores
    return torch.softmax(s, dim=-1) @ v


@pytest.mark.unit
def test_handing_eager_a_score_sized_value_runs_the_whole_program(evaluated):
    seen = []

    def fn(q, k, v):
        seen.append(q)
        return scores_through_logcumsumexp(q, k, v)

    q, k, v = qkv(2, 64, 16)
    compiled = ft.compile(fn, cache=False)
    assert_close(quiet(compiled, q, k, v), scores_through_logcumsumexp(q, k, v))
    prog = program(compiled)
    assert any(t is q for t in seen) and evaluated == [] and prog.plan.eager and not prog.launches
    where = line_of(scores_through_logcumsumexp, "torch.logcumsumexp(")
    (opaque,) = [n for n in prog.plan.captured.nodes if n.op == "opaque"]
    (matmul,) = [n for n in prog.plan.decomposed.nodes if n.op == "matmul" and n.shape == (2, 64, 64)]
    assert prog.notes == [
        f"no lowering for aten.logcumsumexp.default at {opaque.source}; it and what depends on it run in eager "
        "PyTorch",
        f"no fused plan: the kernels would hand eager PyTorch a [2, 64, 64] intermediate (matmul at "
        f"{matmul.source}), larger than every input and output; the whole program runs in eager PyTorch"], prog.notes
    assert where in opaque.source and where in matmul.source


def test_a_thin_value_handed_to_eager_still_fuses():
    """Column sums (H x S) handed to logcumsumexp are no larger than the inputs: the attention stays fused."""
    def fn(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return p @ v, torch.logcumsumexp(p.sum(dim=-2), dim=-1)

    q, k, v = qkv(2, 64, 16)
    compiled = ft.compile(fn, cache=False)
    assert_close(quiet(compiled, q, k, v), fn(q, k, v))
    assert program(compiled).launches and not program(compiled).plan.eager


# ---- pathological plans are not taken ------------------------------------------------------------

def scores(q, k):
    return q @ k.transpose(-1, -2)


@pytest.mark.unit
def test_schedule_rejects_a_matmul_split_one_element_per_program():
    """A schedule whose grid splits both free variables of a contraction computes each element of the product
    from one row of each operand, with no tile to reuse them in and no tl.dot: never better than eager, so it
    is rejected with a cause the note names. (Cosine similarity's norms once put every variable in the grid
    that way; schedule.contraction now keeps such sums out of the batch, so the grid is forced here.)"""
    from flashtensor.analysis.roles import kernel_nodes, roles
    from flashtensor.frontend.capture import capture
    from flashtensor.partition.plan import KernelPlan
    from flashtensor.schedule.schedule import ScheduleError, _finish
    from flashtensor.transform.decompose import decompose
    from flashtensor.transform.loopform import to_loops

    q, k = torch.randn(1, 2, 32, 16), torch.randn(1, 2, 32, 16)
    loops, _ = to_loops(decompose(capture(scores, [q, k])))
    plan = KernelPlan([loops.outputs[0].node])
    boundary = frozenset(plan.loads)
    nodes = kernel_nodes(plan.roots, boundary)
    compute = [n for n in nodes if n not in boundary]
    (dot,) = [n for n in compute if n.op == "reduce"]
    free = sorted(set(dot.vars), key=lambda v: v.id)
    with pytest.raises(ScheduleError, match="both free variables in the grid") as e:
        _finish(plan, nodes, compute, boundary, free, None, dot.attrs["var"], [], roles(plan.roots, nodes, boundary))
    assert {what for what, _ in e.value.causes} == {
        "a matmul that would run one program per element of its result, without tl.dot"}


# ---- notes a user can act on ---------------------------------------------------------------------

def two_long_rows(x, y):
    a = x.amax(dim=-1)
    b = y.sum(dim=-1)
    return a + b


@pytest.mark.unit
def test_no_fused_plan_note_is_one_clause_per_cause_without_internal_names(caplog):
    """Two row reductions over different axes longer than a tile holds: one kernel loops over one and must
    hold the other whole. One clause per cause, each once, and no loop-form names; those go to the debug log."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 300, generator=g), torch.randn(40, 520, generator=g)
    with caplog.at_level(logging.DEBUG, logger="flashtensor"):
        with pytest.warns(FallbackWarning) as caught:
            compiled = ft.compile(two_long_rows, cache=False)
            out = compiled(x, y)
    assert torch.equal(out, two_long_rows(x, y))
    (note,) = program(compiled).notes
    assert [str(w.message) for w in caught] == [f"FlashTensor: {note}"]
    causes = [f"an axis of extent {n} would have to be held whole in a tile (at most 256)" for n in (300, 520)]
    assert note == f"no fused plan: {'; '.join(causes)}; the program runs in eager PyTorch", note
    assert not INTERNAL.search(note), note
    assert re.search(r"loop over v\d+: variable v\d+ of extent 520 would have to be held whole in a tile",
                     caplog.text)


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


@pytest.mark.unit
def test_warnings_point_at_the_line_that_called_the_compiled_function(tmp_path, monkeypatch):
    """Each warning names the user's own line, whichever path the call takes inside: a new plan, a plan read
    from the on-disk cache by another callable, inputs requiring grad; through the torch.compile backend, the
    function Dynamo is compiling (its frame is the first outside torch)."""
    monkeypatch.setenv("FLASHTENSOR_CACHE_DIR", str(tmp_path))
    x = torch.randn(5, 12)
    calls = (lambda: ft.compile(sorted_scaled)(x), lambda: ft.compile(sorted_scaled)(x),
             lambda: ft.compile(sorted_scaled)(x.clone().requires_grad_()),
             lambda: torch.compile(sorted_scaled, backend="flashtensor")(x + 1))
    for k, call in enumerate(calls):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        where = {(w.filename, w.lineno) for w in caught if issubclass(w.category, FallbackWarning)}
        line = (call if k < 3 else sorted_scaled).__code__.co_firstlineno
        assert where == {(__file__, line)}, (k, where)


# ---- pricing a plan against the function itself (GPU) ---------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("fused_ms,eager_ms,runs_eager", [
    ((2.0, 2.0, 2.0), (1.0, 1.0, 1.0), True), ((1.0, 1.0, 1.0), (2.0, 2.0, 2.0), False),
    ((1.0, 1.0, 1.0), (1.0, 1.0, 1.0), False),
    # a host-bound call timed slower than eager once (held tova, fp16, on the H200: 0.181 against 0.152 ms, then
    # 0.122 against 0.187 side by side): each is priced by its best round
    ((0.181, 0.122, 0.125), (0.152, 0.187, 0.190), False)])
def test_a_plan_slower_than_the_function_itself_runs_eager(fused_ms, eager_ms, runs_eager):
    """On a GPU the searched plan is timed against the user's function on the call's inputs, alternately in three
    rounds, and the faster by its best round runs (the held linear_elu program's one kernel recomputed the d x d
    context for every query tile, 0.19x eager on the H200). Here with stand-in timings: which entry wins, and the
    note that says why."""
    from flashtensor import driver
    from flashtensor.runtime.plan import Plan

    ran = []

    class Stub:
        remainder = None

        def fits(self, args):
            ran.append("fits")
            return True

        def run(self, args):
            ran.append("kernels")

    def fn(*args):
        ran.append("eager")

    times = iter([t for pair in zip(fused_ms, eager_ms) for t in pair])

    def measure(f):
        f()
        return next(times)

    entry = {"eager": False, "kernels": [], "notes": []}
    out = driver._priced(Plan(), entry, Stub, fn, [1, 2], measure, lambda: ran.append("guards"))
    assert ran == ["guards", "fits", "kernels", "eager"] * 3     # the plan timed with the work a call does
    assert out["eager"] is runs_eager
    if runs_eager:
        assert out["notes"] == [f"the fused kernels took {min(fused_ms):.3f} ms and eager PyTorch "
                                f"{min(eager_ms):.3f} ms on this device; the program runs in eager PyTorch"]
    else:
        assert out is entry


@pytest.mark.unit
def test_the_compiled_callable_prices_a_plan_with_its_own_guards(monkeypatch):
    """A call of the compiled callable computes its guard key and looks its program up before the program runs
    (15-20 us): the work pricing times with the plan (`driver.build`'s per_call), on every path that builds one;
    priced without it, a host-bound held program (snapkv_window on an H100) ran at 0.90x eager."""
    from flashtensor.api import compiled as api
    from flashtensor.api.guards import Guards

    made, keyed = [], []

    def build(fn, leaves, options, warned=None, dynamic=frozenset(), unfused=None, per_call=lambda: None):
        made.append(per_call)
        return real(fn, leaves, options, warned, dynamic, unfused)

    def key(self, call, shapes=True):
        keyed.append(shapes)
        return real_key(self, call, shapes)

    real, real_key = api.build, Guards.key
    monkeypatch.setattr(api, "build", build)
    monkeypatch.setattr(Guards, "key", key)
    f = ft.compile(lambda x, y: x * 2 + y, kernels=False)     # the callable alone: no kernel launches
    f(torch.ones(3), torch.ones(3))
    assert made
    for per_call in made:
        keyed.clear()
        per_call()
        assert True in keyed       # the exact key a later call looks its program up by


@pytest.mark.unit
def test_a_plan_stands_where_the_function_itself_runs_out_of_memory():
    """Pricing at a length where eager's S x S probabilities do not fit (h2o at 32K tokens on the H200: 128 GiB of
    float32 softmax) keeps the searched plan instead of failing the call."""
    from flashtensor import driver
    from flashtensor.runtime.plan import Plan

    class Stub:
        remainder = None

        def fits(self, args):
            return True

        def run(self, args):
            pass

    def fn(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 128.00 GiB.")

    entry = {"eager": False, "kernels": [], "notes": []}
    assert driver._priced(Plan(), entry, Stub, fn, [1, 2], lambda f: f() or 1.0, lambda: None) is entry


@pytest.mark.unit
@pytest.mark.parametrize("compiled_ms,evaluated_ms,evaluates", [(0.36, 0.2, True), (0.2, 0.36, False)])
def test_a_compiled_remainder_is_priced_against_the_evaluator(compiled_ms, evaluated_ms, evaluates):
    """A partial plan's torch.compile'd remainder is timed in the evaluator too, and the faster stays: the entry
    says so, and its program builds the remainder for the evaluator (SnapKV's pooled window scores on the H200:
    0.36 ms a call with the compiled remainder, the kernels' part 0.11 ms)."""
    from flashtensor import driver
    from flashtensor.runtime.plan import Plan

    class Remainder:
        compiled = "compiled graph"

    class Stub:
        remainder = Remainder()

        def fits(self, args):
            return True

        def run(self, args):
            return self.remainder.compiled

    def measure(f):
        return {"compiled graph": compiled_ms, None: evaluated_ms, "eager": 1.0}[f()]

    entry = {"eager": False, "kernels": [], "notes": []}
    out = driver._priced(Plan(), entry, lambda: Stub(), lambda *a: "eager", [1, 2], measure, lambda: None)
    assert not out["eager"] and out.get("evaluate_remainder", False) is evaluates
    assert Stub.remainder.compiled == "compiled graph"      # restored after timing


@pytest.mark.unit
@pytest.mark.parametrize("device_ms,sleep_ms,lo,hi,n", [(5.0, 0.0, 5.0, 5.0, 2), (0.1, 2.0, 2.0, 10.0, 5)])
def test_a_call_is_priced_at_its_device_or_its_host_time(device_ms, sleep_ms, lo, hi, n):
    """autotune.call_ms: a call the device bounds costs the device's median (and is run back to back for about
    10 ms only); one the host bounds (2 ms of host work per call against 0.1 ms on the device, as a small decode
    call's launches) costs its wall time per call."""
    import time

    from flashtensor.runtime.autotune import call_ms

    calls = []

    def f():
        calls.append(1)
        time.sleep(sleep_ms / 1e3)

    ms = call_ms(f, device_ms=lambda g: device_ms, sync=lambda: None, calls=5)
    assert lo <= ms <= hi and len(calls) == n, (ms, len(calls))
