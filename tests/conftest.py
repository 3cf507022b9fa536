"""Shared test setup: Triton's CPU interpreter, and the DESIGN section 6 comparison against eager."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton: kernels bind it when defined

from flashtensor.testing import as_tuple, compare, rel_err  # noqa: E402,F401  (rel_err is re-exported for tests)


def assert_close(out, ref) -> None:
    """Every output matches eager: fp32 1e-4, fp16/bf16 2e-3 relative; bool/int exact; NaN/inf in the same places."""
    outs, refs = as_tuple(out), as_tuple(ref)
    assert len(outs) == len(refs), f"{len(outs)} outputs, eager gives {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        m = compare(o, r)
        assert m.ok, f"output {i}: {m.problem}"
