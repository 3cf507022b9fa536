"""Shared test setup: Triton's CPU interpreter, a plan cache per session, and the DESIGN section 6 comparison."""
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


def each_partition(monkeypatch, run) -> int:
    """Calls run(k) once per candidate partition, with the search offered only the k-th: on a GPU the search
    emits and times every candidate, on the CPU it takes the first, so this is how the CPU suite reaches the
    others. The plan cache is off: its key does not name the candidate. Returns the number of candidates."""
    import flashtensor.pipeline as pipeline

    monkeypatch.setenv("FLASHTENSOR_CACHE", "0")
    whole, seen = pipeline.partitions, []

    def only(k):
        def pick(*args):
            cands = whole(*args)
            seen.append(len(cands))
            return cands[k:k + 1]
        return pick

    k = 0
    while k == 0 or k < seen[0]:
        monkeypatch.setattr(pipeline, "partitions", only(k))
        run(k)
        k += 1
    return seen[0]
