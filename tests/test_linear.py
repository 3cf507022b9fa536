"""Linear attention with its projections (EA, SimA; workloads.py): the qkv projection, a feature map, normalisers
over tokens, the per-head context k^T v, then q (k^T v) and the output projection. The contractions nest, and
the general machinery fuses them: the context and the statistics over tokens in a kernel that loops over the
tokens (the projection recomputed per tile, a dot over the channels), the output in a kernel over token tiles
whose loop steps through the heads (schedule.py's stepped loop), each step a dot per contraction. Only the
per-head d x d context and per-head normalisers over tokens cross the kernel boundary."""
import re

import pytest
import torch
import torch.nn.functional as F

import flashtensor as ft
from conftest import LINEAR, assert_close, compiled_matches_eager, each_partition, rel_err
from flashtensor import workloads
from flashtensor.frontend.capture import capture
from flashtensor.ir.loops import evaluate_loops
from flashtensor.partition.fusable import fusable_part
from flashtensor.transform.bound import share_reductions
from flashtensor.transform.decompose import decompose
from flashtensor.transform.loopform import to_loops
from flashtensor.transform.sums import commute_sums

H = 4          # heads of the reference workloads
D = 128 // H   # their head dimension


def intermediates(program) -> list[tuple[int, ...]]:
    """Extents of the buffers one kernel stores and a later one reads, each sorted (a buffer is laid out in
    the order of its loop variables, which depends on how the program is written)."""
    return sorted({tuple(sorted(b.shape)) for la in program.launches for b in la.source.buffers
                   if b.kind == "intermediate"})


def fused(fn, args, kernels: int):
    out, compiled = compiled_matches_eager(fn, args)
    (program,) = compiled.programs.values()
    assert not program.notes and len(program.launches) == kernels, program.notes
    return program


@pytest.mark.parametrize("N", [workloads.SMALL["N"], 100])
@pytest.mark.parametrize("name", LINEAR)
def test_linear_attention_fuses_passing_only_thin_values(name, N):
    """Two kernels within 1e-4 of eager, at the CPU shape and at a token count no tile divides. Between them
    only the context (B, h, d, d) and, for SimA, the L1 norm of q over tokens (B, h, d): never q, k, v or y,
    each as large as x. The output kernel steps through the heads: q's projection, q (k^T v) and the output
    projection are three tl.dot per step."""
    fn, args = workloads.make(name, "cpu", **{**workloads.SMALL, "N": N, "seed": N})
    program = fused(fn, args, kernels=2)
    B = workloads.SMALL["BL"]
    thin = [(B, H, D, D)] + ([(B, H, D)] if name == "sima" else [])
    assert intermediates(program) == sorted(tuple(sorted(t)) for t in thin)
    last = program.launches[-1].source.source
    assert len(re.findall(r"for l0 in tl.range\(tl.multiple_of\(lo, 1\), hi, 1,", last)) == 1, last
    assert f"    hi = {H}\n" in last and last.count("tl.dot(") == 3, last


def ea_einsum(x, w_qkv, b_qkv, w_o, b_o):
    """EA written with chunk, (B, N, h, d) tensors and einsum: nothing depends on the workload's spelling."""
    B, N, C = x.shape
    q, k, v = (t.reshape(B, N, H, C // H) for t in (x @ w_qkv.T + b_qkv).chunk(3, dim=-1))
    q, k = q.softmax(dim=-1), k.softmax(dim=1)
    ctx = torch.einsum("bnhd,bnhe->bhde", k, v)
    return torch.einsum("bnhd,bhde->bnhe", q, ctx).reshape(B, N, C) @ w_o.T + b_o


def sima_by_hand(x, w_q, w_k, w_v, w_o):
    """SimA with separate projections, no biases, the L1 normalisation written out and k^T v as a transpose."""
    B, N, C = x.shape
    q, k, v = (F.linear(x, w).view(B, N, H, C // H) for w in (w_q, w_k, w_v))
    q = q / q.abs().sum(dim=1, keepdim=True).clamp_min(1e-12)
    k = k / k.abs().sum(dim=1, keepdim=True).clamp_min(1e-12)
    ctx = k.transpose(1, 2).transpose(-2, -1) @ v.transpose(1, 2)           # (B, h, d, d)
    y = (q.transpose(1, 2) @ ctx).transpose(1, 2).reshape(B, N, C)
    return F.linear(y, w_o)


def test_linear_attention_written_differently_fuses_the_same_way():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 100, 128, generator=g)
    w = [torch.randn(384, 128, generator=g) * 0.05, torch.randn(384, generator=g) * 0.05,
         torch.randn(128, 128, generator=g) * 0.05, torch.randn(128, generator=g) * 0.05]
    assert intermediates(fused(ea_einsum, (x, *w), kernels=2)) == [(2, H, D, D)]     # sorted extents
    ws = [torch.randn(128, 128, generator=g) * 0.05 for _ in range(4)]
    assert intermediates(fused(sima_by_hand, (x, *ws), kernels=2)) == [(2, H, D), (2, H, D, D)]


def _loops(fn, args):
    loops, consts = to_loops(fusable_part(decompose(capture(fn, list(args)))))
    return loops, list(args) + consts


@pytest.mark.unit
def test_a_normaliser_over_a_copy_of_the_tokens_reads_the_projection_computed_once():
    """F.normalize's sum over tokens reads q through a copy of the token variable, so the lowering projects q
    twice; renamed onto the tokens, the sum reads the one projection (one product x * w per projection), and
    the loop form computes the same values."""
    fn, args = workloads.make("sima", "cpu", **workloads.SMALL)
    loops, ins = _loops(fn, args)
    shared = share_reductions(loops, False)

    def products(g):
        return sum(1 for n in g.nodes if n.op == "mul" and any(a.op == "load" and a.attrs["input"] == 0
                                                                for a in n.inputs))
    assert (products(loops), products(shared)) == (5, 3)
    for a, b in zip(evaluate_loops(loops, ins), evaluate_loops(shared, ins)):
        assert rel_err(b, a) <= 1e-6


@pytest.mark.unit
def test_a_contraction_over_two_variables_sums_the_longer_inside():
    """An output projection over (heads, head dimension) is a chain of two sums of one product; the head
    dimension (the longer) goes inside, where it is the dot's K, and the heads outside, the loop."""
    fn, args = workloads.make("ea", "cpu", **workloads.SMALL)
    loops, ins = _loops(fn, args)
    out = commute_sums(loops, False)
    top = out.outputs[0].node.args[0]          # bias added to sum over heads of sum over head dimension
    assert [top.attrs["var"].extent, top.args[0].attrs["var"].extent] == [H, D]
    assert top.args[0].args[0].op == "mul"
    for a, b in zip(evaluate_loops(loops, ins), evaluate_loops(out, ins)):
        assert rel_err(b, a) <= 1e-6


def elu_linear_attention(queries, keys, values):
    """fast-transformers' LinearAttention (the held program linear_elu): the elu + 1 feature map, the context
    and the normaliser by einsum over (N, L, H, D) inputs."""
    Q, K = F.elu(queries) + 1, F.elu(keys) + 1
    KV = torch.einsum("nshd,nshm->nhmd", K, values)
    Z = 1 / (torch.einsum("nlhd,nhd->nlh", Q, K.sum(dim=1)) + 1e-6)
    return torch.einsum("nlhd,nhmd,nlh->nlhm", Q, KV, Z)


def test_a_context_that_no_query_varies_gets_a_kernel_of_its_own():
    """The greedy partition computes the d x d context k^T v and k's token sum inside the output kernel, which
    the grid splits over query tiles: every tile sums all L tokens again (0.19x eager on the H200 at L=4096).
    The fifth candidate cuts long reductions that do not vary along the kernel's longest parallel variable:
    a kernel of the (N, H, D, M) context and (N, H, D) sums, then the output reading them. Each candidate
    matches eager; the GPU's tuner picks between them."""
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    args = tuple(torch.randn(1, 300, 2, 16, generator=g) for _ in range(3))
    seen = []

    def run(k):
        c = ft.compile(elu_linear_attention, cache=False, candidate=k)
        assert_close(c(*args), elu_linear_attention(*args))
        (program,) = c.programs.values()
        assert not program.notes, program.notes
        seen.append(intermediates(program))
        return program.plan

    assert each_partition(run) >= 2
    assert [(2, 16, 16), (2, 16)] in [sorted(s, key=len, reverse=True) for s in seen], seen


def projected_attention(x, w_q, w_k):
    """Attention over projections of float32 features, q's through SiLU: the projections are contractions over the
    80 features, which a kernel over query tiles and a loop over key tiles holds whole."""
    q, k = F.silu(x) @ w_q, x @ w_k
    return torch.softmax(q @ k.transpose(-1, -2) * k.shape[-1] ** -0.5, dim=-1) @ k


def test_float32_contractions_over_a_whole_axis_run_a_chunk_at_a_time():
    """A float32 contraction over an axis the tile holds whole (here 80 features, a block of 128) runs as a loop
    over 32-wide chunks of it, each chunk's operands computed in the loop (SiLU included) and the 80-feature edge
    masked: whole operand tiles took every register on the GPU (EA's projections spilled 3 KB per thread as 3xTF32,
    none chunked). Checked against eager at fresh inputs."""
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    x = torch.randn(2, 300, 80, generator=g)
    w_q, w_k = (torch.randn(80, 16, generator=g) * 0.1 for _ in range(2))
    (launch,) = fused(projected_attention, (x, w_q, w_k), kernels=1).launches
    src = launch.source.source
    assert "tl.range(0, 80, 32)" in src and re.search(r"o_v\d+c\[[^]]*\] < 80", src), src
    x_loads = re.findall(r"tl\.load\(inp0 [^\n]*", src)      # x is the first input
    assert x_loads and all(re.search(r"o_v\d+c\[", ld) for ld in x_loads), x_loads
