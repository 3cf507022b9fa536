"""A softmax over the keys and one more column (GPT-OSS's learned sink logit, joined to the scores by cat) whose
probabilities then meet the values over the keys alone: the loop form has two key variables, one position
apart, and neither fits a tile whole at a real length, so the program ran eagerly. peel_reductions
(transform/bound.py) reduces over the keys and combines the extra column's value per row."""
import pytest
import torch

import flashtensor as ft
from conftest import assert_close, assert_held_fuses
from flashtensor.bench import programs
from flashtensor.frontend.capture import capture
from flashtensor.ir.loops import evaluate_loops
from flashtensor.partition.fusable import fusable_part
from flashtensor.transform.bound import peel_reductions
from flashtensor.transform.decompose import decompose
from flashtensor.transform.loopform import to_loops


@pytest.mark.unit
def test_peeled_loop_form_reduces_over_the_keys_and_computes_the_same_values():
    """Every reduction over the 41-long variable becomes one over the 40 keys combined with the sink's column, and
    the reference evaluator gives the same outputs at fresh inputs."""
    fn, args = programs.make("gpt_oss_sinks", device="cpu", dtype=torch.float32,
                             **{**programs.SMALL, "S": 40, "seed": int(torch.randint(1 << 30, ()))})
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    loops, consts = to_loops(fusable_part(decompose(capture(lambda *t: fn(*t, args[-1]), tensors))))
    peeled = peel_reductions(loops, False)

    def extents(g):
        return sorted({n.attrs["var"].extent for n in g.nodes if n.op == "reduce"})
    assert 41 in extents(loops) and 41 not in extents(peeled), (extents(loops), extents(peeled))
    for a, b in zip(evaluate_loops(loops, tensors + consts), evaluate_loops(peeled, tensors + consts)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_sink_column_attention_fuses_at_a_length_no_tile_holds(dtype):
    """transformers' GptOss eager attention at 300 positions: fused, eager's answer under the contract."""
    assert_held_fuses("gpt_oss_sinks", dtype, dict(B=1, H=2, S=300, D=16, KV=1))


def test_one_shape_generic_plan_serves_other_lengths():
    """Between symbolic lengths the peeled gap is still a number (S + 1 less S): after a second length the plan is
    shape-generic, fused, and serves a third without a search."""
    compiled = None
    for S in (300, 333, 280):
        fn, args = programs.make("gpt_oss_sinks", device="cpu", dtype=torch.float32,
                                 **{**programs.SMALL, "S": S, "seed": S})
        compiled = compiled or ft.compile(fn, cache=False)
        assert_close(compiled(*args), fn(*args))
    info = compiled.cache_info()
    assert (info["searches"], info["generic"], info["hits"]) == (2, 1, 1), info
    assert all(p.launches and not p.notes for p in compiled.programs.values())
