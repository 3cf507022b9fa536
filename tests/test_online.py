"""The online rules (schedule/online.py), each on its own: with a rule left out, the same program still
matches eager and the loop-form evaluator, its schedule takes the passes the remaining rules allow, and
what the rule carries (a rescale, a factor moved out of the sum) is gone from the schedule."""

import pytest
import torch

import flashtensor as ft
from conftest import assert_close, compiled_matches_eager
from flashtensor import workloads as W
from flashtensor.ir.loops import evaluate_loops
from flashtensor.schedule import online

ALL = online.ONLINE_RULES
WITHOUT = {rule.__name__: [r for r in ALL if r is not rule] for rule in ALL}


def _compile(rules, monkeypatch):
    monkeypatch.setattr(online, "ONLINE_RULES", rules)
    fn, args = W.make("attn", device="cpu", dtype=torch.float32, S=70, H=2, D=16, seed=4)
    out, compiled = compiled_matches_eager(fn, args)
    loops = compiled.program_for(args).plan.stages["rewrites"]
    assert_close(out, evaluate_loops(loops, list(args))[0].to(out.dtype).reshape(out.shape))
    return ft.explain(compiled, *args).properties[0].loop


@pytest.mark.parametrize("rules,passes,rescaled,pulled", [
    (ALL, 1, True, True),                               # flash attention: one pass, online softmax
    (WITHOUT["independent"], 1, True, True),            # plain factors fall through every rule and stay put
    (WITHOUT["running_max"], 2, False, True),           # the row max first, then the normaliser and output
    (WITHOUT["loop_invariant"], 2, True, False),        # 1 / l cannot move out: the output waits for l
    ([online.independent], 3, False, False),            # max, then normaliser, then output
])
def test_each_rule_carries_its_factor_or_costs_a_pass(rules, passes, rescaled, pulled, monkeypatch):
    loop = _compile(rules, monkeypatch)
    assert f"in {passes} pass(es)" in loop, loop
    assert ("rescaled by running max" in loop) is rescaled, loop
    assert ("moved out of the sum" in loop) is pulled, loop


def stabilised_twice(q, k, v):
    """Scores less their row max, then a softmax, which subtracts its own (GPT-OSS's eager attention does this)."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    s = s - s.max(dim=-1, keepdim=True).values
    return torch.softmax(s, dim=-1) @ v


def test_an_exponential_of_a_value_that_reads_an_earlier_max_is_carried_online():
    """exp(s - m1 - m2), m2 the softmax's max of s - m1: m1 finishes in the first pass, and in the second the
    normaliser and the output are rescaled by m2's running max beside it. Two passes; three when the rule
    required y to read no reduction at all. Eager's answer at a length no tile holds whole."""
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    q, k, v = (torch.randn(1, 2, 300, 16, generator=g) for _ in range(3))
    out, compiled = compiled_matches_eager(stabilised_twice, (q, k, v))
    loop = ft.explain(compiled, q, k, v).properties[0].loop
    assert "in 2 pass(es)" in loop and "rescaled by running max" in loop, loop
