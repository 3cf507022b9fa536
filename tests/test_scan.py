"""Running totals (torch.cumsum), as models write them: Hugging Face's position ids from a padding mask, the
Forgetting Transformer's decay bias (the gates' running log-sum read at the query and at the key), a running
total of column statistics. The loop form sums over a fresh variable up to each position (tiles past the
diagonal skipped), and a kernel of its own stores the totals that the attention reads back."""
import math

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import flashtensor as ft
from conftest import assert_close, compiled_matches_eager
from flashtensor.bench import held
from flashtensor.frontend.capture import capture
from flashtensor.ir.loops import evaluate_loops
from flashtensor.transform.decompose import decompose
from flashtensor.transform.loopform import to_loops

B, H, S, D = 2, 2, 70, 16


def position_ids(mask):
    """transformers' position ids for a left-padded batch."""
    return mask.long().cumsum(-1) - 1


def forgetting_attention(q, k, v, fgate):
    """Forgetting Transformer: log f = logsigmoid(gate logits); the score of key j at query i gains
    sum over j < l <= i of log f_l, the difference of the running totals."""
    c = torch.cumsum(F.logsigmoid(fgate.float()), dim=-1)
    s = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1]) + (c[..., :, None] - c[..., None, :])
    causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(causal, float("-inf")), dim=-1).to(v.dtype) @ v


def column_running_total(q, k, v, fgate):
    """A running total of the column sums along the keys, beside the attention output."""
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
    return p @ v, p.sum(dim=-2).cumsum(dim=-1)


def inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(3))
    return q, k, v, 2 * torch.randn(B, H, S, generator=g)


def padding_mask():
    mask = torch.ones(B, S, dtype=torch.long)
    mask[0, :9] = 0
    return mask


CASES = [(position_ids, lambda dtype: (padding_mask(),)), (forgetting_attention, inputs),
         (column_running_total, inputs)]


@pytest.mark.unit
@pytest.mark.parametrize("fn,make", CASES)
def test_running_totals_loop_form_matches_eager(fn, make):
    args = make(torch.float32)
    loops, consts = to_loops(decompose(capture(fn, list(args))))
    for got, ref in zip(evaluate_loops(loops, list(args) + consts), pytree.tree_leaves(fn(*args))):
        assert_close(got, ref)


@pytest.mark.parametrize("fn,make", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_running_totals_fuse(fn, make, dtype):
    """Fused with no note, eager's answer under the contract (half totals sum in float32 and round once, as eager's
    do; a bf16 output that misses eager by more than 2e-3 is held to the float64 answer), only thin values between
    kernels, and the running totals' kernel leaves out the tiles past the diagonal."""
    args = make(dtype)
    compiled = ft.compile(fn, cache=False)
    out = compiled(*args)
    matches = held.check_outputs(fn, args, out, fn(*args))
    assert all(m.ok for m in matches), matches
    prog = compiled.program_for(args)
    assert prog.launches and not prog.notes, prog.notes
    for kern in prog.kernels:
        assert all(math.prod(b.shape) < S * S for b in kern.buffers if b.kind == "intermediate"), kern.name
    assert any(p["skipped"] for p in prog.plan.summary["properties"]), prog.plan.summary["properties"]


def test_forget_gate_totals_are_stored_once():
    """The attention reads the totals at the query and at the key from one stored buffer: two kernels, and the
    running totals are summed once (the loop form has one sum over the gates)."""
    args = inputs()
    prog = compiled_matches_eager(forgetting_attention, args)[1].program_for(args)
    assert len(prog.kernels) == 2
    loops = to_loops(decompose(capture(forgetting_attention, list(args))))[0]
    assert sum(n.op == "at" for n in loops.nodes) == 2
