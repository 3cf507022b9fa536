"""The partition (partition/plan.py) on its own: every candidate covers the outputs with kernels in an order where
each kernel loads only values that earlier kernels store."""
import pytest
import torch
import torch.nn.functional as F

from flashtensor import driver, workloads
from flashtensor.ir.loops import stored

pytestmark = pytest.mark.unit   # no test here launches a kernel (the tier: pyproject.toml)


def gated(q, k, v, gate):
    """A forget gate (cumulative log-sigmoid over the keys) on the scores, and a prefix of the column sums."""
    sq, sk = q.shape[-2], k.shape[-2]
    c = torch.cumsum(F.logsigmoid(gate), dim=-1)
    s = q @ k.transpose(-1, -2) * 0.2 + (c[..., sk - sq:, None] - c[..., None, :])
    p = torch.softmax(s, dim=-1)
    return p @ v, p.sum(-2).cumsum(-1)


def _assert_ordered(plan) -> None:
    for candidate in plan.stages["partition"]:
        done: set = set()
        for kernel in candidate:
            assert {stored(a) for a in kernel.loads} <= done, "a kernel loads a value no earlier kernel stores"
            done.update(kernel.roots)
        assert {o.node for o in plan.stages["rewrites"].outputs} <= done


@pytest.mark.parametrize("q_len", [43, 77])
def test_a_gate_prefix_beside_a_prefix_of_column_sums_has_an_order(q_len):
    """The gate's prefix sums and the column sums' prefix share their variables; merging them before the column
    sums were placed closed a cycle through the row statistics (no plan at all where q_len < kv_len)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, q_len, 32, generator=g)
    k, v = (torch.randn(1, 2, 77, 32, generator=g) for _ in range(2))
    plans = list(driver.candidate_plans(gated, [q, k, v, torch.randn(1, 2, 77, generator=g)]))
    assert plans
    for _, plan in plans:
        _assert_ordered(plan)


@pytest.mark.parametrize("name", ["attn", "h2o", "keyformer", "corm", "ea"])
def test_every_candidate_of_a_workload_has_an_order(name):
    fn, args = workloads.make(name, device="cpu", dtype=torch.float32, seed=3, **workloads.SMALL)
    plans = list(driver.candidate_plans(fn, list(args)))
    assert plans
    for _, plan in plans:
        _assert_ordered(plan)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_causal(q, k, v, cos, sin):
    """Llama's RoPE (rotate_half by cat) applied inside, then causal attention with a finfo.min fill."""
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
    return torch.softmax(s.masked_fill(j > i, torch.finfo(s.dtype).min).float(), dim=-1).to(q.dtype) @ v


def rope_inputs(dtype=torch.float32, S=40, D=16):
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, S, D, generator=g).to(dtype) for _ in range(3))
    angle = torch.arange(S)[:, None] * 10000.0 ** (-torch.arange(0, D, 2) / D)
    angle = torch.cat((angle, angle), dim=-1)
    return q, k, v, angle.cos().to(dtype), angle.sin().to(dtype)


def operand_candidate(plan):
    """The index of the candidate whose first kernels store the rotated queries and keys: kernels of no reduction
    that the attention kernel loads."""
    for k, (*first, last) in enumerate(plan.stages["partition"]):
        if len(first) == 2 and all(r.op != "reduce" for p in first for r in p.roots) and \
                {stored(a) for a in last.loads} == {r for p in first for r in p.roots}:
            return k
    return None


def test_rotated_operands_are_stored_once_by_a_candidate():
    """A contraction's operand computed from several loads (RoPE's rotation by cat) is recomputed by the greedy plan
    for every key tile (DeepSeek's MLA spilled 6.8 KB a thread and ran at half eager's speed); another candidate
    stores each rotated side once, and never the probabilities (computed from statistics)."""
    plans = list(driver.candidate_plans(rope_causal, list(rope_inputs())))
    for _, plan in plans:
        _assert_ordered(plan)
    assert operand_candidate(plans[0][1]) is not None
