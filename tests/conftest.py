"""Shared test setup: Triton's CPU interpreter, a plan cache per session, and the docs/design.md §6 comparison."""
import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton: kernels bind it when defined

from flashtensor.testing import as_tuple, compare, rel_err  # noqa: E402,F401  (rel_err is re-exported for tests)


@pytest.fixture(scope="session", autouse=True)
def _session_cache_dir(tmp_path_factory):
    """Plans and kernel sources go to a fresh folder per session: no test reuses an earlier run's plans,
    and the user's ~/.cache stays untouched. Subprocesses started by tests inherit it."""
    os.environ["FLASHTENSOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("flashtensor-cache"))


def assert_close(out, ref) -> None:
    """Every output matches eager: fp32 1e-4, fp16/bf16 2e-3 relative; bool/int exact; NaN/inf in the same places."""
    outs, refs = as_tuple(out), as_tuple(ref)
    assert len(outs) == len(refs), f"{len(outs)} outputs, eager gives {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        m = compare(o, r)
        assert m.ok, f"output {i}: {m.problem}"


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
