"""Capture never crashes where eager runs (docs/design.md §6): calls with several outputs, lists of tensors,
index assignment, any structure of outputs, bool masks. The programs are written the way models write them;
each compiled result is checked against eager, and each fallback note names the op and the user's line once."""
import inspect
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import flashtensor as ft
from conftest import assert_close
from flashtensor import FallbackWarning
from flashtensor.frontend.capture import capture
from flashtensor.ir.evaluate import evaluate
from flashtensor.ir.loops import evaluate_loops
from flashtensor.transform.decompose import decompose
from flashtensor.transform.loopform import to_loops

SEED = 97


def qkv(b=1, h=2, s=24, d=16, seed=SEED) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, s, d, generator=g) for _ in range(3))


def run(fn, *args):
    """`ft.compile(fn)(*args)`, its program, and the FallbackWarning messages of its first call."""
    compiled = ft.compile(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(*args)
    (program,) = compiled.programs.values()
    return out, program, [str(w.message) for w in caught if w.category is FallbackWarning]


def assert_same(out, ref) -> None:
    """The structure eager returns (containers, their types, non-tensor leaves) and every tensor in it."""
    leaves, spec = pytree.tree_flatten(out)
    ref_leaves, ref_spec = pytree.tree_flatten(ref)
    assert spec == ref_spec, f"returns {spec}, eager returns {ref_spec}"
    for o, r in zip(leaves, ref_leaves):
        if isinstance(r, torch.Tensor):
            assert_close(o, r)
        else:
            assert type(o) is type(r) and o == r, (o, r)


def where(fn, text: str) -> str:
    """`file:line` of the line of `fn`'s source that contains `text`."""
    lines, first = inspect.getsourcelines(fn)
    return f"{Path(inspect.getsourcefile(fn)).name}:{first + next(i for i, x in enumerate(lines) if text in x)}"


def assert_noted_once(notes: list[str], op: str, at: str) -> None:
    hits = [n for n in notes if op in n and at in n]
    assert len(hits) == 1, notes


# ---- calls that return several tensors -----------------------------------------------------------

def qk_norm_attention(q, k, v):
    """QK-norm (OLMo 2, ViT-22B): layer norm on q and k; native_layer_norm also returns mean and rstd."""
    q = F.layer_norm(q, (q.shape[-1],))
    k = F.layer_norm(k, (k.shape[-1],))
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v


def standardized_scores(q, k, v):
    scores = q @ k.transpose(-2, -1)
    var, mean = torch.var_mean(scores, dim=-1, keepdim=True, correction=0)
    return torch.softmax((scores - mean) * torch.rsqrt(var + 1e-5), dim=-1) @ v


def column_spread(q, k, v):
    """torch.var_mean with its default correction over two dims, neither kept."""
    return torch.var_mean(q @ k.transpose(-2, -1), dim=(0, 2))


LN = torch.nn.LayerNorm(16)
with torch.no_grad():
    LN.weight.copy_(torch.linspace(0.5, 1.5, 16))
    LN.bias.copy_(torch.linspace(-0.2, 0.2, 16))


def layer_norm_module(q, k, v):
    """nn.LayerNorm with its weight and bias (closure constants) on q and k."""
    return torch.softmax(LN(q) @ LN(k).transpose(-2, -1), dim=-1) @ v


def min_max_scaled(q, k, v):
    """Scores scaled to [0, 1] per row by torch.aminmax before the softmax."""
    s = q @ k.transpose(-2, -1)
    lo, hi = torch.aminmax(s, dim=-1, keepdim=True)
    return torch.softmax((s - lo) / (hi - lo), dim=-1) @ v


@pytest.mark.parametrize("fn, dtype", [(qk_norm_attention, torch.float32), (qk_norm_attention, torch.float16),
                                       (layer_norm_module, torch.float32), (standardized_scores, torch.float32),
                                       (column_spread, torch.float32), (min_max_scaled, torch.float32)],
                         ids=["qk_norm", "qk_norm_fp16", "layer_norm_module", "var_mean_scores", "var_mean_dims",
                              "aminmax"])
def test_layer_norm_and_var_mean_lower_and_fuse(fn, dtype):
    """native_layer_norm and var_mean lower to means and elementwise ops (float32 inside for half inputs, as
    eager computes them), aminmax to a min and a max, so the attention after them fuses."""
    args = tuple(a.to(dtype) for a in qkv(s=40))
    with torch.no_grad():      # inference: nn.LayerNorm's parameters require grad, which runs eager for autograd
        out, program, notes = run(fn, *args)
        assert_same(out, fn(*args))
    assert program.launches and not notes, notes
    assert not [n for n in program.plan.captured.nodes if n.op == "opaque"]


@pytest.mark.unit
def test_var_mean_of_an_infinity_gives_welfords_nan():
    """Eager's var_mean, var and layer_norm take one Welford pass, whose mean of values holding an infinity is NaN
    (inf - inf at the next element); the two-pass moments give that NaN too, and a single element stays itself."""
    x = torch.randn(4, 6)
    x[1, 2], x[2, 0], x[3, :] = math.inf, -math.inf, math.inf

    def fn(x):
        var, mean = torch.var_mean(x, dim=-1)
        return var, mean, torch.var_mean(x[:, :1], dim=-1)[1], F.layer_norm(x, (6,))

    outs, refs = evaluate(capture(fn, [x]), [x]), fn(x)
    for o, r in zip(outs, refs):
        assert torch.equal(o.isnan(), r.isnan()) and torch.equal(o.isinf(), r.isinf()), (o, r)


def std_and_mean(x):
    std, mean = torch.std_mean(x, dim=-1, keepdim=True)
    return (x - mean) / std


def running_max(x):
    return x - torch.cummax(x, dim=-1).values


def sdpa_merge_heads(q, k, v):
    b, h, s, d = q.shape
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return out.transpose(1, 2).reshape(b, s, h * d)


def pooled_with_positions(q, k, v):
    """PyramidKV-style max pooling of the votes, with the positions of the maxima, which the IR cannot hold."""
    window = q[..., -8:, :]
    probs = torch.softmax(window @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return F.max_pool1d(probs.sum(dim=-2), kernel_size=5, padding=2, stride=1, return_indices=True)


def best_key(q, k, v):
    values, index = torch.max(q @ k.transpose(-2, -1), dim=-1)
    return values, index


def case(fn, op, text, unit=False):
    """A parametrize case named for its program; `unit` where the call reads inputs only, so nothing fuses."""
    return pytest.param(fn, op, text, id=fn.__name__, marks=[pytest.mark.unit] if unit else [])


MULTI = [case(std_and_mean, "aten.std_mean", "torch.std_mean(", unit=True),
         case(running_max, "aten.cummax", "torch.cummax(", unit=True),
         case(sdpa_merge_heads, "aten._scaled_dot_product", "F.scaled_dot_product_attention(", unit=True),
         case(pooled_with_positions, "aten.max_pool2d_with_indices", "F.max_pool1d("),
         case(best_key, "aten.max.dim", "torch.max(")]


@pytest.mark.parametrize("fn, op, text", MULTI)
def test_calls_with_several_outputs_run_in_eager_with_one_note(fn, op, text):
    args = qkv()[: len(inspect.signature(fn).parameters)]
    out, program, notes = run(fn, *args)
    assert_same(out, fn(*args))
    assert_noted_once(notes, op, where(fn, text))


@pytest.mark.unit
def test_unused_outputs_get_no_node():
    """cummax's values, unused, make no opaque node (which would cost a note and kernel outputs)."""
    g = capture(lambda x: torch.cummax(x, dim=-1).indices * 2, [qkv()[0][0]])
    assert [(n.attrs["fn"].name(), n.attrs["index"]) for n in g.nodes if n.op == "opaque"] == \
        [("aten::cummax", 1)]


def window_votes(q, k, v):
    """kvpress's SnapKV votes: the last window's attention averaged over its queries."""
    window = q[..., -8:, :]
    return torch.softmax(window @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1).mean(dim=-2)


def snapkv_smoothed(q, k, v):
    """kvpress's SnapKV: the votes smoothed by avg_pool1d."""
    return F.avg_pool1d(window_votes(q, k, v), kernel_size=5, padding=2, stride=1)


def pyramid_votes(q, k, v):
    """PyramidKV's votes, summed in float32 and returned as a half tensor."""
    window = q[..., -8:, :]
    probs = torch.softmax((window @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1]), dim=-1)
    return probs.sum(dim=-2).to(q.dtype)


def pyramid_pooled(q, k, v):
    """PyramidKV: the votes max-pooled (the positions unused)."""
    return F.max_pool1d(pyramid_votes(q, k, v), kernel_size=7, padding=3, stride=1)


def pooled_keys(q, k, v):
    """Keys and values compressed four tokens to one by padded pooling (mean for keys, max for values, shifted by
    F.pad), then attention."""
    kp = F.avg_pool2d(k, kernel_size=(4, 1), stride=(4, 1), padding=(2, 0), count_include_pad=False)
    vp = F.max_pool1d(v[0].transpose(-1, -2), kernel_size=4, stride=4, padding=2).transpose(-1, -2)[None]
    vp = F.pad(vp, (0, 0, 1, -1), value=0.5)
    return torch.softmax(q @ kp.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1) @ vp


@pytest.mark.parametrize("fn", [pooled_keys])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_padding_and_pooling_lower_and_fuse(fn, dtype):
    """constant padding and 1-d/2-d pooling of per-element values lower to cats and shifted slices: nothing
    opaque, no note, and eager's values (half inputs accumulate in float32 and round once, as eager's do)."""
    args = tuple(a.to(dtype) for a in qkv(s=40))
    out, program, notes = run(fn, *args)
    assert_same(out, fn(*args))
    assert program.launches and not notes, notes
    assert not [n for n in program.plan.captured.nodes if n.op == "opaque"]


def _reductions(fn, args) -> int:
    """How many reductions the loop form of fn(*args) computes."""
    g = decompose(capture(fn, list(args)))
    return sum(n.op == "reduce" for n in to_loops(g)[0].nodes)


def column_votes(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1).sum(dim=-2)


def strided_votes(q, k, v):
    """Column sums pooled two at a time without the padding in the count, and max-pooled with a dilation."""
    col = column_votes(q, k, v)
    return (F.avg_pool1d(col, kernel_size=4, stride=2, padding=1, count_include_pad=False),
            F.max_pool1d(col, kernel_size=3, stride=1, padding=1, dilation=2))


@pytest.mark.parametrize("fn,votes,kernel", [(snapkv_smoothed, window_votes, 5), (pyramid_pooled, pyramid_votes, 7),
                                             (strided_votes, column_votes, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_pooling_of_statistics_reads_them_stored(fn, votes, kernel, dtype):
    """Pooled column statistics fuse: a kernel stores the statistics once and the pooling reads them back at each
    offset (`at` nodes, 0 past the ends), so pooling adds no reduction to the program's own (shifted slices would
    compute the statistics again at every offset). No note, and eager's answer."""
    args = tuple(a.to(dtype) for a in qkv(s=40))
    out, program, notes = run(fn, *args)
    assert_same(out, fn(*args))
    assert program.launches and not notes, notes
    assert not [n for n in program.plan.captured.nodes if n.op == "opaque"]
    assert sum(n.op == "at" for n in to_loops(decompose(capture(fn, list(args))))[0].nodes) == kernel
    assert _reductions(fn, args) == _reductions(votes, args)


@pytest.mark.unit
@pytest.mark.parametrize("fn", [snapkv_smoothed, pyramid_pooled, strided_votes])
@pytest.mark.parametrize("s", [3, 7, 40])
def test_pooled_statistics_loop_form_matches_eager(fn, s):
    """The loop form's evaluator reads a stored value at an `at` node's index map, 0 past its ends (where the
    padding's where picks the pad instead), at lengths shorter than the pooling window too."""
    args = qkv(s=s)
    loops, consts = to_loops(decompose(capture(fn, list(args))))
    assert any(n.op == "at" for n in loops.nodes)
    for got, ref in zip(evaluate_loops(loops, list(args) + consts), pytree.tree_leaves(fn(*args))):
        assert_close(got, ref)


def test_unbind_of_packed_qkv_lowers_and_fuses():
    def packed(qkv):
        q, k, v = qkv.unbind(0)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
    x = torch.stack(qkv())
    out, program, notes = run(packed, x)
    assert_close(out, packed(x))
    assert program.launches and not notes, notes


# ---- scores by baddbmm (GPT-NeoX, Bloom) -----------------------------------------------------------

def neox_scores(q, k, v):
    """GPT-NeoX's _attn: the scores by baddbmm into a zeros tensor, alpha the 1/sqrt(d) norm factor."""
    b, h, s, d = q.shape
    q, k = q.reshape(b * h, s, d), k.reshape(b * h, s, d)
    zeros = torch.zeros(b * h, s, s, dtype=q.dtype, device=q.device)
    scores = torch.baddbmm(zeros, q, k.transpose(1, 2), beta=1.0, alpha=1 / math.sqrt(d)).view(b, h, s, s)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    scores = torch.where(causal, scores, torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype))
    return torch.softmax(scores, dim=-1) @ v


def bloom_scores(q, k, v, alibi):
    """BloomAttention: ALiBi (batch x heads, 1, kv_len) as baddbmm's input, beta 1; and once more with the input
    scaled (beta 0.5) and ignored (beta 0, where eager drops even a NaN in it)."""
    b, h, s, d = q.shape
    q, kt = q.reshape(b * h, s, d), k.reshape(b * h, s, d).transpose(1, 2)
    scores = alibi.baddbmm(batch1=q, batch2=kt, beta=1.0, alpha=d ** -0.5).view(b, h, s, s)
    halved = torch.baddbmm(alibi, q, kt, beta=0.5, alpha=d ** -0.5).view(b, h, s, s)
    ignored = torch.baddbmm(torch.full_like(alibi, float("nan")), q, kt, beta=0.0).view(b, h, s, s)
    return [torch.softmax(x, dim=-1) @ v for x in (scores, halved, ignored)]


@pytest.mark.parametrize("fn", [neox_scores, bloom_scores], ids=lambda f: f.__name__)
def test_baddbmm_scores_fuse(fn):
    q, k, v = qkv(b=2)
    extra = (torch.randn(4, 1, 24),) if fn is bloom_scores else ()
    out, program, notes = run(fn, q, k, v, *extra)
    assert_same(out, fn(q, k, v, *extra))
    assert not notes and program.launches, notes


# ---- calls that take a list of tensors -----------------------------------------------------------

def rotate_half(x):
    """Rotates half the hidden dims of the input (Hugging Face's Llama)."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def rope_attention(q, k, v, cos, sin):
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v


def sink_attention(q, k, v, sinks):
    """gpt-oss: a learned sink logit per head joins the scores as one more column, then is dropped."""
    b, h, s, _ = q.shape
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    combined = torch.cat([scores, sinks.reshape(1, -1, 1, 1).expand(b, h, s, 1)], dim=-1)
    probs = torch.softmax(combined, dim=-1)[..., :-1]
    return probs @ v


def rotate_every_two(x):
    """GPT-J's interleaved rotary embedding."""
    x1 = x[:, :, :, ::2]
    x2 = x[:, :, :, 1::2]
    x = torch.stack((-x2, x1), dim=-1)
    return x.flatten(-2)


def test_rope_rotate_half_fuses_into_the_kernel_that_loads_q_and_k():
    """rotate_half's cat selects by the head dimension's index, its pieces read q and k shifted by half of
    it: the rotation runs where q and k are loaded, and q k^T stays a tl.dot."""
    q, k, v = qkv()
    angles = torch.arange(24.0)[:, None] / 10000 ** (torch.arange(0, 16, 2.0) / 16)
    emb = torch.cat((angles, angles), dim=-1)
    out, program, notes = run(rope_attention, q, k, v, emb.cos(), emb.sin())
    assert_close(out, rope_attention(q, k, v, emb.cos(), emb.sin()))
    assert not notes and len(program.launches) == 1, notes
    assert "tl.dot(" in program.launches[0].source.source


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rotated_queries_and_keys_stored_once_match_eager(dtype):
    """The candidate that stores RoPE's rotated q and k in kernels of their own (partition/plan._computed_operand;
    the GPU's search times it beside the greedy plan, which rotates them again for every tile) gives eager's
    answer, and its attention kernel's tiles read neither cos nor sin."""
    import test_partition

    from flashtensor import driver
    from flashtensor.bench.held import check_outputs
    fn, args = test_partition.rope_causal, test_partition.rope_inputs(dtype)
    k = test_partition.operand_candidate(next(iter(driver.candidate_plans(fn, list(args))))[1])
    compiled = ft.compile(fn, cache=False, candidate=k)
    out = compiled(*args)
    assert all(m.ok for m in check_outputs(fn, args, out, fn(*args)))
    launches = compiled.program_for(args).launches
    assert len(launches) == 3
    attention = launches[-1].source
    tiles = attention.source.split("this program's piece of the finite check")[0]    # the check reads every input
    assert not [b.name for b in attention.buffers if b.source in (("in", 3), ("in", 4)) and f"tl.load({b.name} " in tiles]


def test_sink_column_joins_the_scores():
    q, k, v = qkv()
    sinks = torch.tensor([0.5, -1.0])
    out, program, notes = run(sink_attention, q, k, v, sinks)
    assert_close(out, sink_attention(q, k, v, sinks))
    assert not notes and program.launches, notes


def test_stack_of_interleaved_halves_fuses():
    """GPT-J's step-2 slices read every other element; the stack interleaves them back."""
    q = qkv()[0]
    out, program, notes = run(rotate_every_two, q)
    assert_close(out, rotate_every_two(q))
    assert not notes and program.launches, notes


def test_index_assignment_with_a_tensor_index():
    """H2O-style eviction: the evicted keys' columns are masked out; `mask[evicted] = True` is index_put."""
    def evict(q, k, v, evicted):
        mask = torch.zeros(k.shape[-2], dtype=torch.bool)
        mask[evicted] = True
        scores = (q @ k.transpose(-2, -1)).masked_fill(mask, -math.inf)
        return torch.softmax(scores, dim=-1) @ v
    q, k, v = qkv()
    evicted = torch.tensor([1, 5, 6, 20])
    out, program, notes = run(evict, q, k, v, evicted)
    assert_close(out, evict(q, k, v, evicted))
    assert_noted_once(notes, "aten.index_put", where(evict, "mask[evicted] = True"))


# ---- bool and integer masks ----------------------------------------------------------------------

def causal_bool_mask(q, k, v):
    s = q.shape[-2]
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(mask, -math.inf)
    return torch.softmax(scores, dim=-1) @ v


def banded_int_mask(x):
    keep = torch.ones(x.shape[-2:], dtype=torch.int32).tril(2).triu(-2)
    return x * keep, (x > 0).tril(-1), torch.ones_like(x, dtype=torch.bool).masked_fill(x > 1, False)


@pytest.mark.unit
@pytest.mark.parametrize("fn, args", [(causal_bool_mask, qkv()), (banded_int_mask, (torch.randn(2, 8, 8),))],
                         ids=["bool_triu", "int_tril_triu"])
def test_masks_of_bool_and_int_tensors_evaluate_in_their_dtype(fn, args):
    """The eager fallback evaluates the decomposed graph: triu/tril and masked_fill of a bool must stay bool
    (where(keep, x, 0) promoted it to int64, which where and masked_fill then reject)."""
    ref = fn(*args)
    assert_same(tuple(evaluate(decompose(capture(fn, list(args))), list(args))), ref if isinstance(ref, tuple) else (ref,))


def test_bool_triu_mask_fuses():
    """The kernel's mask is a bool (a fill of True, not the int 1, which Triton took for an int32 condition)."""
    q, k, v = qkv()
    out, program, notes = run(causal_bool_mask, q, k, v)
    assert_close(out, causal_bool_mask(q, k, v))
    assert program.launches and not notes, notes
    fills = [n.attrs["value"] for n in program.plan.captured.nodes if n.op == "full"]
    assert fills == [True] and type(fills[0]) is bool


# ---- what the function returns -------------------------------------------------------------------

def attention_outputs(q, k, v):
    probs = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return probs @ v, probs


def as_dict(q, k, v):
    out, probs = attention_outputs(q, k, v)
    return {"attn_output": out, "attn_weights": probs}


def with_cache(q, k, v):
    """Hugging Face's (output, weights, past_key_value) with the cache as a tuple of k and v."""
    out, probs = attention_outputs(q, k, v)
    return out, None, (k, v)


def with_length(q, k, v):
    return attention_outputs(q, k, v)[0], k.shape[-2]


def row_max(q, k, v):
    return (q @ k.transpose(-2, -1)).max(dim=-1)


@pytest.mark.parametrize("fn", [as_dict, with_cache, with_length, row_max], ids=lambda f: f.__name__)
def test_the_compiled_function_returns_what_eager_returns(fn):
    q, k, v = qkv()
    out, program, notes = run(fn, q, k, v)
    assert_same(out, fn(q, k, v))
    assert type(out) is type(fn(q, k, v))


@pytest.mark.unit
def test_returns_rebuild_tuples_without_deprecated_pytree_calls():
    """A flat tuple of outputs is rebuilt without walking the pytree on each call, and without pytree calls that
    torch 2.13 deprecates (its FutureWarning would reach every user's call); nested ones keep their structure."""
    from flashtensor.ir.graph import Returns
    a, b = torch.ones(2), torch.zeros(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat = Returns(pytree.tree_structure((0, 0)), (None, None), (0, 1))
        assert flat._plain == "tuple" and flat.build([a, b]) == (a, b)
        nested = Returns(pytree.tree_structure((0, (0,))), (None, None), (0, 1))
        assert nested._plain == "" and nested.build([a, b]) == (a, (b,))
        assert Returns(pytree.tree_structure(0), (None,), (0,)).build([a]) is a


# ---- what capture cannot trace runs in eager as a whole ------------------------------------------

def skip_all_ones_mask(q, k, mask):
    """Hugging Face's habit: drop an attention mask that masks nothing (a branch on the mask's values)."""
    if (mask == 1).all():
        mask = None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -math.inf)
    return torch.softmax(scores, dim=-1)


def absmax_scaled(q, k, mask):
    """Per-tensor scaling by a Python number read from the data."""
    scale = k.abs().amax().item()
    return torch.softmax(q @ (k / scale).transpose(-2, -1), dim=-1)


def kept_scores(q, k, mask):
    """Boolean-mask indexing: the result's length depends on the mask's values."""
    scores = q @ k.transpose(-2, -1)
    return scores[..., mask.bool()].sum()


def scores_and_max(q, k, mask):
    scores = q @ k.transpose(-2, -1)
    return scores, scores.max().item()


UNTRACED = [(skip_all_ones_mask, "Python control flow on a tensor's value", "if (mask == 1).all():"),
            (absmax_scaled, "aten._local_scalar_dense", "scale = k.abs().amax().item()"),
            (kept_scores, "depends on a tensor's values", "scores[..., mask.bool()]"),
            (scores_and_max, "returns a Python number", "scores.max().item()")]


@pytest.mark.unit
@pytest.mark.parametrize("fn, why, text", UNTRACED, ids=[u[0].__name__ for u in UNTRACED])
def test_data_dependent_python_runs_the_whole_function_in_eager(fn, why, text, capfd):
    q, k, _ = qkv()
    mask = torch.ones(24, 24, dtype=torch.long).tril()
    out, program, notes = run(fn, q, k, mask)
    assert_same(out, fn(q, k, mask))
    (note,) = notes
    assert note.startswith(f"FlashTensor: could not capture {fn.__name__}: ") and why in note, note
    assert where(fn, text) in note and note.endswith("the whole function runs in eager PyTorch")
    assert "u0" not in note and "tensor_fn" not in note, note        # no internal names
    assert capfd.readouterr().err == ""


@pytest.mark.unit
def test_eager_run_that_tells_errors_apart_leaves_random_numbers_alone():
    """An untraceable function runs once in eager while capturing; the random state is restored after it."""
    def noisy_gate(x):
        if x.max() > 0:
            x = x + 0.1 * torch.randn(x.shape)
        return x
    x = qkv()[0]
    torch.manual_seed(1)
    out, program, notes = run(noisy_gate, x)
    torch.manual_seed(1)
    assert torch.equal(out, noisy_gate(x)) and len(notes) == 1


@pytest.mark.unit
def test_eager_run_that_tells_errors_apart_writes_into_no_argument():
    def tame_in_place(scores):
        if scores.abs().amax() > 1:
            scores.mul_(0.5)
        return scores.softmax(dim=-1)
    scores = qkv()[0] * 4
    ours, theirs = scores.clone(), scores.clone()
    out, program, notes = run(tame_in_place, ours)
    assert_close(out, tame_in_place(theirs))
    assert torch.equal(ours, theirs) and len(notes) == 1


@pytest.mark.unit
def test_arguments_on_two_devices_run_in_eager_where_eager_runs():
    def scores(q, k):
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1)
    q, k, _ = qkv()
    out, program, notes = run(scores, q, k.to("meta"))
    ref = scores(q, k.to("meta"))
    assert (out.device, out.shape, out.dtype) == (ref.device, ref.shape, ref.dtype)
    assert notes == ["FlashTensor: could not capture scores: its tensor arguments are on several devices (cpu, "
                     "meta); the whole function runs in eager PyTorch"]


@pytest.mark.unit
def test_a_capture_bug_costs_speed_not_the_answer(monkeypatch):
    from flashtensor.frontend import capture as frontend

    def broken(*args):
        raise KeyError("simulated bug")
    monkeypatch.setitem(frontend._RULES, torch.ops.aten._softmax.default, broken)
    q, k, v = qkv()
    out, program, notes = run(attention_outputs, q, k, v)
    assert_same(out, attention_outputs(q, k, v))
    (note,) = notes
    assert "could not capture attention_outputs: internal compiler error in capture (KeyError" in note


# ---- user errors raise eager's own exception -----------------------------------------------------

def mismatched_heads(q, k):
    return q @ k.transpose(-2, -1)[..., :8, :]


def bad_dim(q, k):
    return torch.softmax(q @ k.transpose(-2, -1), dim=4)


def other_device(q, k):
    """A tensor made on the GPU for inputs on the CPU (eager: no CUDA here, or two devices)."""
    return q @ k.transpose(-2, -1) + torch.zeros(q.shape[-2], k.shape[-2], device="cuda")


@pytest.mark.unit
@pytest.mark.parametrize("fn", [mismatched_heads, bad_dim, other_device], ids=lambda f: f.__name__)
def test_a_program_eager_rejects_raises_eagers_exception(fn, capfd):
    q, k, _ = qkv()
    with pytest.raises(Exception) as eager:
        fn(q, k)
    with pytest.raises(type(eager.value)) as ours:
        ft.compile(fn)(q, k)
    assert type(ours.value) is type(eager.value) and str(ours.value) == str(eager.value)
    assert ours.value.__notes__ == [f"FlashTensor: raised by {fn.__name__}(q: float32[1, 2, 24, 16] on cpu, "
                                    "k: float32[1, 2, 24, 16] on cpu) in eager PyTorch"]
    assert capfd.readouterr().err == ""        # no fake-tensor traceback (it goes to the debug log)


@pytest.mark.unit
def test_eagers_exception_names_the_tensors_by_their_parameters():
    """An attention helper as Hugging Face calls it (a module first, keywords, a list of tensors): the note
    names each tensor by the parameter it came in, and where in it."""
    def attn(module, query, key, value, mask=None, *, past=None, **kwargs):
        return (query @ key.transpose(-1, -2) * module.scaling + mask).softmax(-1) @ value + past[1]

    module = torch.nn.Module()
    module.scaling = 0.5
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(RuntimeError) as ours:
        ft.compile(attn)(module, q, torch.randn(1, 2, 9, 4), q, torch.zeros(8, 8), past=[q, q], extra=q)
    shape = "float32[1, 2, 8, 4] on cpu"
    assert ours.value.__notes__ == [f"FlashTensor: raised by {attn.__qualname__}(query: {shape}, "
                                    "key: float32[1, 2, 9, 4] on cpu, "
                                    f"value: {shape}, mask: float32[8, 8] on cpu, past[0]: {shape}, "
                                    f"past[1]: {shape}, extra: {shape}) in eager PyTorch"]


@pytest.mark.parametrize("fill", [
    lambda x, m: x.masked_fill(m, -1e9), lambda x, m: x.masked_fill(m, torch.tensor(-1e9)),
    lambda x, m: torch.full_like(x, -7e4) + x, lambda x, m: x.clamp(min=-1e5),
    lambda x, m: torch.full(x.shape, 1e39, dtype=torch.float32) + x.float()])
def test_a_fill_number_past_its_dtype_raises_eagers_error(fill, capfd):
    """Eager refuses to convert -1e9 to fp16 (and 1e39 to float32) where an op fills with it; fake tensors do
    not check, so the trace alone would give -inf where eager raises."""
    x, m = torch.randn(4, 8).half(), torch.rand(4, 8) > 0.5

    def scores(x, m):
        return fill(x, m).softmax(-1)

    with pytest.raises(RuntimeError, match="without overflow") as eager:
        scores(x, m)
    for compiled in (ft.compile(scores), torch.compile(scores, backend="flashtensor")):
        with pytest.raises(RuntimeError, match=str(eager.value)) as got:
            compiled(x, m)
        assert any("in eager PyTorch" in n for n in got.value.__notes__)
    assert capfd.readouterr().err == ""       # the backend's eager run prints no generated code


# ---- integer index arithmetic ---------------------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("divisor", [7, -3, 1])
@pytest.mark.parametrize("op", [
    lambda x, c: x // c, lambda x, c: torch.div(x, c, rounding_mode="floor"),
    lambda x, c: torch.div(x, c, rounding_mode="trunc"), lambda x, c: x % c, lambda x, c: torch.remainder(x, c),
    lambda x, c: torch.fmod(x, c)], ids=["floordiv", "div-floor", "div-trunc", "mod", "remainder", "fmod"])
def test_integer_rounding_is_pythons_on_negative_operands(op, divisor):
    """Floor division and remainder of index differences (negative where a key follows its query) by a number of
    either sign are lowered (no opaque node), and the captured graph and the loop form give eager's values from
    trunc_div and fmod, C's truncating // and %, which Triton computes on integers (kernels: test_mask_tensors)."""
    def fn(x):
        i, j = torch.arange(x.shape[-2])[:, None], torch.arange(x.shape[-1])[None, :]
        return x + op(i - j - 5, divisor).to(x.dtype)

    x = torch.randn(19, 23)
    g = capture(fn, [x])
    assert not any(n.op == "opaque" for n in g.nodes), g
    assert torch.equal(evaluate(g, [x])[0], fn(x))
    loops, consts = to_loops(decompose(g))
    assert torch.equal(evaluate_loops(loops, [x] + consts)[0], fn(x))


@pytest.mark.unit
@pytest.mark.parametrize("fn", [
    lambda x: x // 0.5, lambda x: torch.remainder(x, 0.7), lambda x: torch.fmod(x, 0.7),
    lambda x: x + (torch.arange(x.shape[-1]) // torch.arange(1, x.shape[-1] + 1)).to(x.dtype)],
    ids=["float-floordiv", "float-remainder", "float-fmod", "tensor-divisor"])
def test_float_and_tensor_divisor_rounding_stays_eager(fn):
    """Eager rounds a float floor division and remainder its own way, and raises on an integer division by a zero
    element: those calls stay eager ops, and the program still gives eager's answer."""
    x = torch.randn(4, 9)
    g = capture(fn, [x])
    assert any(n.op == "opaque" for n in g.nodes)
    assert torch.equal(evaluate(g, [x])[0], fn(x))
