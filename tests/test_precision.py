"""Half-precision rounding where it decides a result (analysis/precision.py, analysis/ranges.py): the rule on
loop graphs (which values every plan rounds), the emitter's rounding in the interpreter, and programs written
as research code writes them, in fp16, whose eager result an underflow or an overflow decides."""
import importlib
import math

import pytest
import torch
import torch.nn.functional as F

import flashtensor as ft
from conftest import compiled_matches_eager
from flashtensor import workloads
from flashtensor.analysis.precision import decide
from flashtensor.codegen.lower import round_to
from flashtensor.frontend.capture import capture
from flashtensor.ir.loops import ABSOLUTE, ROUNDS
from flashtensor.partition.fusable import fusable_part
from flashtensor.transform.decompose import decompose
from flashtensor.transform.loopform import to_loops


def _causal(s):
    return torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool, device=s.device).triu(1)


def attention_entropy(q, k, v):
    """Attention and the entropy of each row with an epsilon, all in fp16: fp16(p + 1e-9) is 0 where p is,
    so eager's entropy is NaN on every row with a masked key (0 * log 0)."""
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(_causal(q @ k.transpose(-1, -2)),
                                                                         float("-inf"))
    p = torch.softmax(s, dim=-1)
    return p @ v, -(p * torch.log(p + 1e-9)).sum(-1)


def normed_scores(q, k):
    """Scores layer-normed over the keys with BERT's eps of 1e-12, which is 0 in fp16: a row of zero scores
    (a zeroed padding query) has variance 0, rsqrt(0) = inf, and 0 * inf = NaN in eager."""
    s = q @ k.transpose(-1, -2)
    x = s - s.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-12)


def squared_scores(q, k, v):
    """A softmax over squared scores: s * s past 65504 is inf in fp16, and the row's softmax NaN."""
    s = q @ k.transpose(-1, -2)
    return torch.softmax((s * s).float(), dim=-1).to(q.dtype) @ v


def sharp_softmax(q, k, v, tau=1e-3):
    """A softmax at a small temperature: s / 1e-3 past 65504 is inf in fp16."""
    s = q @ k.transpose(-1, -2) / tau
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def inverse_distance(q, k):
    """Weights 1 / (d + eps) normalised over the keys: at d = 0, 1 / 1e-6 is inf in fp16 and the row NaN."""
    s = q @ k.transpose(-1, -2)
    w = 1 / ((s - s.amax(-1, keepdim=True)).abs() + 1e-6)
    return w / w.sum(-1, keepdim=True)


def attended_keys(q, k):
    """The keys some query gives at least a uniform share 1 / S of its row (CORM's keep rule), and each key's
    total in float32 (which rounds every fp16 value as eager does): a padding query's equal scores give
    fp16(1 / S) on every key, which eager compares with the threshold rounded to fp16 as well, so every key
    counts."""
    p = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
    return (p >= 1 / k.shape[-2]).any(dim=-2), p.sum(dim=-2, dtype=torch.float32)


def padded_attention(q, k, v, attention_mask):
    """Hugging Face's eager attention: scaled scores plus the 4D mask it passes (finfo.min on padded keys), a float32
    softmax cast back, and the probability each key receives. Eager rounds s + finfo(fp16).min to -65504 for s
    above -16 and to -inf from -16 down, so a fully masked row shares its probability among the keys whose fp16
    score is above -16."""
    s = torch.matmul(q, k.transpose(-1, -2)) * 0.5 + attention_mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return p @ v, p.sum(dim=-2)


def _loops(fn, *shapes, dtype=torch.float16):
    args = [torch.randn(*sh, dtype=dtype) for sh in shapes]
    loops, _ = to_loops(fusable_part(decompose(capture(fn, args))))
    decide(loops)
    return loops


def _rounded(loops):
    return sorted(f"{n.op}{'_' + n.attrs['kind'] if n.op == 'reduce' else ''}" for n in loops.nodes
                  if n.attrs.get(ROUNDS))


QK = [(2, 64, 16), (2, 64, 16)]
QKV = QK + [(2, 64, 16)]


@pytest.mark.unit
def test_the_cone_of_a_pole_rounds():
    loops = _loops(attention_entropy, *QKV)
    log = next(n for n in loops.nodes if n.op == "log")
    arg, p = log.args[0], log.args[0].args[0]
    assert arg.attrs.get(ROUNDS) and p.attrs.get(ROUNDS)             # p + 1e-9 and p itself
    assert not any(n.attrs.get(ROUNDS) for n in loops.nodes if n.dtype == torch.float32)
    assert not log.attrs.get(ROUNDS)                                  # log of a rounded value: bounded, exact enough
    # in bf16, p + 1e-9 is at least 1e-9: no pole is reached, nothing rounds
    assert _rounded(_loops(attention_entropy, *QKV, dtype=torch.bfloat16)) == []


@pytest.mark.unit
def test_values_that_may_overflow_round():
    assert _rounded(_loops(squared_scores, *QKV)) == ["mul"]
    assert _rounded(_loops(sharp_softmax, *QKV)) == ["div"]
    assert _rounded(_loops(squared_scores, *QKV, dtype=torch.bfloat16)) == []     # bf16 has float32's range
    # the divisor that may be zero, its cone, the reciprocal that may overflow and the quotient over it
    assert _rounded(_loops(inverse_distance, *QK)) == ["abs", "add", "cast", "div", "mul", "reciprocal", "sub"]
    # scaled scores, a soft cap, a float32 softmax cast back: bounded or of the data's size
    for scale in (0.125, 1.0):
        assert _rounded(_loops(lambda q, k, v: sharp_softmax(q, k, v, 1 / scale), *QKV)) == []


@pytest.mark.unit
def test_the_scores_a_mask_is_added_to_round():
    """An fp16 mask sum's other operand, back to the loads (the dot's cast, the scale), rounds in every plan; in
    bf16, whose steps at a mask constant are too coarse for a score to cross, nothing does."""
    shapes = QKV + [(2, 64, 64)]
    assert _rounded(_loops(padded_attention, *shapes)) == ["cast", "mul"]
    assert _rounded(_loops(padded_attention, *shapes, dtype=torch.bfloat16)) == []


@pytest.mark.unit
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_a_tanh_only_added_to_others_may_be_exact_to_an_absolute_error(dtype):
    """A soft cap (scaled, added to a mask, maxed and exponentiated by the softmax) is added only: its kernels may
    take tanh's fast form. Mish's tanh multiplies a value, and a tanh that is an output or compared with 0 matters
    relative to its size near 0: those keep the exact one."""
    def capped(q, k, v):
        s = torch.tanh(q @ k.transpose(-1, -2) / 30.0) * 30.0
        return torch.softmax(s.masked_fill(torch.ones(64, 64, dtype=torch.bool).triu(1), -math.inf), dim=-1) @ v

    def mish(q, k, v):
        return F.mish(q @ k.transpose(-1, -2)) @ v

    def signs(q, k, v):
        t = torch.tanh(q @ k.transpose(-1, -2))
        return t, (t > 0).sum(dim=-1)

    def absolute(fn):
        return [n.attrs.get(ABSOLUTE, False) for n in _loops(fn, *QKV, dtype=dtype).nodes if n.op == "tanh"]
    assert absolute(capped) == [True]
    assert absolute(mish) == [False] and absolute(signs) == [False]


def test_a_fully_masked_row_keeps_eagers_step_of_the_mask():
    """Row 0 of each batch is fully masked; its key 1 scores -31.994 in float32 and -32 once eager rounds the dot,
    so s * 0.5 + finfo.min is -inf in eager and -65504 from the float32 score, which would share row 0's
    probability with key 0 (score 0): eager gives key 0 all of it. The other rows are random."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 64, 16, generator=g).half() for _ in range(3))
    q[:, 0], k[:, :2] = 0, 0
    q[:, 0, :3] = 1.0
    k[:, 1, :3] = torch.tensor([-16.0, -15.9921875, -2.0 ** -9])    # float32 dot -31.994, fp16 -32
    k[:, 2:, 0] = -40.0 - torch.rand(2, 62, generator=g)             # -inf in row 0 either way
    mask = torch.zeros(2, 64, 64, dtype=torch.float16)
    mask[:, 0] = torch.finfo(torch.float16).min
    mask[:, 1:, 40:] = torch.finfo(torch.float16).min
    (o, _), compiled = compiled_matches_eager(padded_attention, [q, k, v, mask])
    assert torch.equal(o[:, 0], v[:, 0]) and _fused(compiled)


def column_mass(q, k, v):
    """Scores in the inputs' type, their float32 softmax's column sums: a float32 output from half inputs."""
    s = q @ k.transpose(-1, -2) * 0.125
    return s.float().softmax(dim=-1).sum(dim=-2)


def half_scores(q, k, v):
    """Scores and their softmax in the inputs' type: half outputs."""
    return (q @ k.transpose(-1, -2)).softmax(dim=-1)


@pytest.mark.unit
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_float32_outputs_of_half_inputs_make_a_plan_faithful(dtype):
    """Faithful (every half intermediate rounded as eager rounds it) where a float32 output comes from half inputs
    or an input is cast to a half type, in fp16 and bf16 alike; a half program with half outputs is not."""
    def cast_inside(q, k, v):
        return half_scores(q.to(dtype), k.to(dtype), v)
    assert decide(_loops(column_mass, *QKV, dtype=dtype)).faithful
    assert decide(_loops(cast_inside, *QKV, dtype=torch.float32)).faithful
    assert not decide(_loops(half_scores, *QKV, dtype=dtype)).faithful


@pytest.mark.unit
@pytest.mark.parametrize("name", ["attn", "h2o", "roco", "keyformer", "corm", "gemma2"])
def test_reference_workloads_round_nothing(name):
    fn, args = workloads.make(name, device="cpu", dtype=torch.float16, **workloads.SMALL)
    loops, _ = to_loops(fusable_part(decompose(capture(fn, list(args)))))
    decide(loops)
    assert _rounded(loops) == []


_ROUND_KERNEL = """import triton
import triton.language as tl


@triton.jit
def round_kernel(x_ptr, y_ptr, N: tl.constexpr):
    o = tl.arange(0, N)
    x = tl.load(x_ptr + o)
    tl.store(y_ptr + o, {})
"""


def test_emitted_rounding_is_round_to_nearest_with_overflow(tmp_path, monkeypatch):
    """The emitter's fp16 rounding, run in the interpreter, is torch's x.half(): to nearest even, from 65520 to
    inf, at most 2^-25 to 0."""
    (tmp_path / "rounding_kernel.py").write_text(_ROUND_KERNEL.format(round_to(torch.float16, "x")))
    monkeypatch.syspath_prepend(str(tmp_path))
    kernel = importlib.import_module("rounding_kernel").round_kernel
    x = torch.tensor([65504.0, 65519.0, 65520.0, 1e5, -7e4, 2.0 ** -25, 2.0 ** -24 * 0.51, 1 + 2.0 ** -11,
                      1 + 3 * 2.0 ** -11, 1e-9, 0.1, -3.3e-5, math.inf, 1.0, 2.0, 3.0])
    y = torch.empty_like(x)
    kernel[(1,)](x, y, N=16)
    assert torch.equal(y, x.half().float()), (y, x.half().float())


@pytest.mark.parametrize("fn, shapes, scale", [
    (attention_entropy, QKV, 1.0), (squared_scores, QKV, 6.0), (sharp_softmax, QKV, 3.0),
    (inverse_distance, QK, 1.0)])
def test_eager_rounding_decides(fn, shapes, scale):
    g = torch.Generator().manual_seed(7)
    args = [torch.randn(*sh, generator=g, dtype=torch.float16) * scale for sh in shapes]
    out, compiled = compiled_matches_eager(fn, args)
    outs = out if isinstance(out, tuple) else (out,)
    assert any(o.isnan().any() for o in outs)       # eager's NaN, which float32 kernels did not give
    assert _fused(compiled)


def _fused(compiled) -> bool:
    (prog,) = compiled.programs.values()
    return bool(prog.launches) and not prog.notes


def test_zero_variance_rows_are_nan_as_in_eager():
    g = torch.Generator().manual_seed(8)
    q, k = (torch.randn(2, 64, 16, generator=g, dtype=torch.float16) for _ in range(2))
    q[:, 40:] = 0                                   # padding queries
    out, compiled = compiled_matches_eager(normed_scores, [q, k])
    assert out[:, 40:].isnan().all() and out[:, :40].isfinite().all() and _fused(compiled)


def test_a_threshold_compares_as_eager_rounds_it():
    g = torch.Generator().manual_seed(9)
    q, k = (torch.randn(2, 21, 16, generator=g, dtype=torch.float16) for _ in range(2))
    q[:, 15:] = 0                                   # padding queries: fp16(1 / 21) on every key, below 1 / 21
    compiled = ft.compile(attended_keys, cache=False)
    kept, _ = compiled(q, k)
    assert kept.all() and torch.equal(kept, attended_keys(q, k)[0]) and _fused(compiled)
