"""The nested-sums rewrite (transform/sums.py) on its own: the loop form before and after it computes the
same values in the reference evaluator, and the sum over the long variable ends up inside; a contraction over
three variables that merge becomes one over the merged variable."""
import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err
from flashtensor.frontend.capture import capture
from flashtensor.ir.loops import evaluate_loops
from flashtensor.partition.fusable import fusable_part
from flashtensor.transform.decompose import decompose
from flashtensor.transform.loopform import to_loops
from flashtensor.transform.sums import commute_sums, merge_contractions

pytestmark = pytest.mark.unit


def _loops(fn, args):
    loops, consts = to_loops(fusable_part(decompose(capture(fn, list(args)))))
    return loops, list(args) + consts


@pytest.mark.parametrize("fn", [
    lambda p: p.view(2, 2, 3, 40, 40).mean(dim=2).sum(dim=2),        # GQA: mean over a group, then over queries
    lambda p: p.mean(dim=1).sum(dim=1),                              # mean over all heads (two atoms), then queries
    lambda p: (p.sum(dim=1) * 0.5).sum(dim=1),
], ids=["group_mean", "all_heads", "scaled"])
def test_nested_sums_put_the_long_variable_inside(fn):
    p = torch.rand(2, 6, 40, 40, generator=torch.Generator().manual_seed(1))
    loops, ins = _loops(fn, (p,))
    swapped = commute_sums(loops, through_half=True)
    assert rel_err(evaluate_loops(swapped, ins)[0], evaluate_loops(loops, ins)[0]) < 1e-6
    assert rel_err(evaluate_loops(swapped, ins)[0], fn(p)) < 1e-6
    sums = [n for n in swapped.nodes if n.op == "reduce"]
    inner = [n for n in sums if n.args[0].op != "reduce"]
    assert all(n.attrs["var"].extent == 40 for n in inner), [(n.name, n.attrs["var"].extent) for n in inner]


def test_a_sum_over_the_long_variable_already_inside_is_left_alone():
    fn = lambda p: p.sum(dim=2).sum(dim=1)                           # queries first, then heads
    p = torch.rand(2, 6, 40, 40, generator=torch.Generator().manual_seed(2))
    loops, _ = _loops(fn, (p,))
    assert commute_sums(loops, through_half=True) is loops


def _gqa_projection(order):
    def fn(q, k, v, w):
        B, H, S, D = q.shape
        kv = k.shape[1]
        k, v = (x[:, :, None].expand(B, kv, H // kv, S, D).reshape(B, H, S, D) for x in (k, v))
        o = (q @ k.transpose(2, 3) / D ** 0.5).softmax(-1) @ v
        o = o.view(B, kv, H // kv, S, D).permute(0, 3, *order, 4).reshape(B, S, H * D)
        return F.linear(o, w)
    return fn


@pytest.mark.parametrize("order", [(1, 2), (2, 1)], ids=["kv_head_first", "group_first"])
def test_a_contraction_over_three_variables_sums_one_merged_variable(order):
    """GQA's output projection sums over kv head, group and head dimension: one variable, the attention output
    read back over it from its stored buffer."""
    fn = _gqa_projection(order)
    g = torch.Generator().manual_seed(3)
    args = (torch.randn(2, 6, 20, 8, generator=g), torch.randn(2, 2, 20, 8, generator=g),
            torch.randn(2, 2, 20, 8, generator=g), torch.randn(48, 48, generator=g))
    loops, ins = _loops(fn, args)
    merged = merge_contractions(loops, through_half=True)
    assert rel_err(evaluate_loops(merged, ins)[0], fn(*args)) < 1e-5
    out = merged.outputs[0].node
    assert out.op == "reduce" and out.attrs["var"].extent == 48
    assert [n.attrs["merged"][1] for n in merged.nodes if "merged" in n.attrs] == [out.attrs["var"]]
