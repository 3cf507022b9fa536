"""Shared test setup: Triton's CPU interpreter, a plan cache per session, and the docs/design.md §6 comparison."""
import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton: kernels bind it when defined
os.environ.setdefault("FLASHTENSOR_POISON", "1")  # a read of what no kernel wrote is NaN here too, as on a GPU

from flashtensor.testing import as_tuple, compare, rel_err  # noqa: E402,F401  (rel_err is re-exported for tests)


def pytest_configure(config):
    """A plan that cannot be read back is a bug, except in the tests that damage entries on purpose (pytest.warns).
    Added here rather than in pyproject.toml's filterwarnings, whose categories pytest imports before this file
    sets TRITON_INTERPRET: triton.language's own jit functions (tl.max) then do not run in the interpreter."""
    config.addinivalue_line("filterwarnings", "error::flashtensor.runtime.cache.CacheWarning")


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    """Plans and kernel sources go to a fresh folder per session: no test reuses an earlier run's plans,
    and the user's ~/.cache stays untouched. Subprocesses started by tests inherit it."""
    os.environ["FLASHTENSOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("flashtensor-cache"))


@pytest.fixture(scope="session", autouse=True)
def _programs_run_last_to_first():
    """Triton's interpreter runs a grid's programs one at a time, first to last, where a GPU runs them at once in
    any order: a kernel whose program reads what a later program of the same launch writes passes in order.
    Here they run last to first, so such a dependency fails on the CPU too."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from triton.runtime import interpreter
    builder = type(interpreter.interpreter_builder)
    in_order = builder.set_grid_idx

    def last_to_first(self, x: int, y: int, z: int) -> None:
        nx, ny, nz = self.grid_dim
        in_order(self, nx - 1 - x, ny - 1 - y, nz - 1 - z)

    builder.set_grid_idx = last_to_first
    yield
    builder.set_grid_idx = in_order


@pytest.fixture(autouse=True)
def _unit_tests_launch_no_kernels(request, monkeypatch):
    """The `unit` tier (pyproject.toml's markers) launches no generated kernel: for a test marked unit,
    Step.launch, every launch's last step, raises for a Triton kernel (a stand-in function launches). The search
    catches errors of its stages (an internal compiler error falls back to eager), so a launch is also recorded
    and fails the test at teardown, whatever caught the error."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    from flashtensor.runtime.launch import Step
    launched = []
    real = Step.launch

    def refuse(self, *args, **kwargs):
        if not type(self.fn).__module__.startswith("triton."):
            return real(self, *args, **kwargs)
        launched.append(getattr(self.fn, "__name__", repr(self.fn)))
        raise AssertionError("unit tests launch no kernels")

    monkeypatch.setattr(Step, "launch", refuse)
    yield
    if launched:
        pytest.fail(f"unit tests launch no kernels: this one launched {launched}; mark it otherwise", pytrace=False)


def assert_close(out, ref) -> None:
    """Every output matches eager: fp32 1e-4, fp16/bf16 2e-3 relative; bool/int exact; NaN/inf in the same places."""
    outs, refs = as_tuple(out), as_tuple(ref)
    assert len(outs) == len(refs), f"{len(outs)} outputs, eager gives {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        m = compare(o, r)
        assert m.ok, f"output {i}: {m.problem}"


def compiled_matches_eager(fn, args):
    """ft.compile(fn, cache=False) called on args (fallback warnings silenced) must match eager; returns the output
    and the compiled callable."""
    import warnings

    import flashtensor as ft

    compiled = ft.compile(fn, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(*args)
    assert_close(out, fn(*args))
    return out, compiled


def assert_held_fuses(name: str, dtype: str, dims: dict) -> None:
    """Held program `name` (flashtensor/bench/programs.py) at `dims` on the CPU, by the runner's own check: eager's
    answer under the contract, and fused."""
    from flashtensor.bench import held

    rec, _ = held.run_program(name, dtype, dims, "cpu")
    said = [rec["error"] or ""] + [o["problem"] for o in rec["outputs"]]
    assert rec["ok"], "; ".join(s for s in said if s)
    assert rec["status"] == "fused", rec["notes"]


def each_partition(run) -> int:
    """Calls run(k) once per candidate partition; run compiles with the option candidate=k, so the search is
    offered only the k-th, and returns the plan (runtime.plan.Plan). On a GPU the search emits and times every
    candidate, on the CPU it takes the first, so this is how the CPU suite reaches the others. Returns the
    number of candidates."""
    k, count = 0, 1
    while k < count:
        count = len(run(k).stages["partition"])
        k += 1
    return count


# linear attention with projections (tests/test_linear.py)
LINEAR = ("ea", "sima")


def prefill_in_chunks(compiled, q, k, v, chunk):
    """h2o-style (output, column sums) of `compiled` over chunks of `chunk` queries, each against the keys so far
    (q_len < kv_len): the outputs concatenated and the column sums accumulated, to compare with one call."""
    outs, cols = [], torch.zeros(q.shape[:2] + (k.shape[2],), dtype=torch.float32)
    for start in range(0, q.shape[2], chunk):
        end = start + chunk
        o, col = compiled(q[:, :, start:end].contiguous(), k[:, :, :end].contiguous(), v[:, :, :end].contiguous())
        outs.append(o)
        cols[..., :end] += col
    return torch.cat(outs, dim=2), cols
