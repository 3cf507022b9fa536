"""The exp -> exp2 rewrite (transform/exp2.py) on its own: the loop form before and after it
computes the same values in the reference evaluator, and the log2 e factor lands in the scale."""
import math

import pytest
import torch
import torch.nn.functional as F

from conftest import rel_err
from flashtensor import workloads
from flashtensor.analysis.facts import Facts
from flashtensor.frontend.capture import capture
from flashtensor.ir.loops import LNode, evaluate_loops
from flashtensor.partition.fusable import fusable_part
from flashtensor.transform.decompose import decompose
from flashtensor.transform.exp2 import LOG2E, fold_exp2
from flashtensor.transform.loopform import to_loops

pytestmark = pytest.mark.unit   # no test here launches a kernel (the tier: pyproject.toml)


def _loops(fn, args):
    loops, consts = to_loops(fusable_part(decompose(capture(fn, list(args)))))
    return loops, list(args) + consts


def _check(loops, folded, ins, tol):
    for a, b in zip(evaluate_loops(loops, ins), evaluate_loops(folded, ins)):
        if a.dtype.is_floating_point:
            assert rel_err(b, a) <= tol, rel_err(b, a)
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["attn", "h2o", "roco", "keyformer", "corm", "gemma2", "ea"])
@pytest.mark.parametrize("through_half", [True, False])
def test_same_values(name, through_half):
    fn, args = workloads.make(name, device="cpu", dtype=torch.float32, seed=11, **workloads.SMALL)
    loops, ins = _loops(fn, args)
    folded = fold_exp2(loops, through_half)
    assert not any(n.op == "exp" for n in folded.nodes)
    _check(loops, folded, ins, 1e-5)


def test_factor_merges_into_the_softmax_scale():
    fn, args = workloads.make("attn", device="cpu", dtype=torch.float16, seed=3, **workloads.SMALL)
    loops, ins = _loops(fn, args)
    scale = 1 / math.sqrt(args[0].shape[-1])
    folded = fold_exp2(loops, through_half=True)
    consts = [a for n in folded.nodes if n.op == "mul" for a in n.args if isinstance(a, float)]
    assert any(abs(c - scale * LOG2E) < 1e-12 for c in consts), consts
    assert not any(abs(c - LOG2E) < 1e-12 for c in consts), "a separate multiply by log2 e is left"
    # where eager's fp16 rounding is kept, the factor stops at the cast to float32
    kept = fold_exp2(loops, through_half=False)
    consts = [a for n in kept.nodes if n.op == "mul" for a in n.args if isinstance(a, float)]
    assert any(abs(c - LOG2E) < 1e-12 for c in consts)
    g = torch.Generator().manual_seed(5)
    fresh = [torch.randn(a.shape, generator=g).to(a.dtype) for a in args]
    _check(loops, kept, fresh, 1e-5)
    _check(loops, folded, fresh, 1e-3)    # fp16 intermediates are computed in float32, as kernels do


def test_max_read_elsewhere_is_divided_back():
    """A row max that is both inside the softmax and a program output keeps its value."""
    def fn(x, y):
        s = x @ y.transpose(-1, -2) * 0.3 - 1.5
        return F.softmax(s, dim=-1), s.amax(-1), torch.exp(-s).sum(-1)

    g = torch.Generator().manual_seed(9)
    args = (torch.randn(2, 37, 16, generator=g), torch.randn(2, 23, 16, generator=g))
    loops, ins = _loops(fn, args)
    folded = fold_exp2(loops, through_half=True)
    assert sum(n.op == "reduce" and n.attrs["kind"] == "max" for n in folded.nodes) == 1
    _check(loops, folded, ins, 1e-5)


def test_log_under_an_exp_becomes_log2_and_a_log_output_stays():
    """log x * c inside an exponential is log2 x * (c ln 2), which kernels may compute approximately;
    the same log returned on its own keeps the accurate op."""
    def fn(x, y, u):
        g = -u.log()
        return F.softmax((x @ y.transpose(-1, -2) + g) / 1.5, dim=-1), u.log().sum(-1)

    g = torch.Generator().manual_seed(4)
    args = (torch.randn(3, 19, 8, generator=g), torch.randn(3, 29, 8, generator=g),
            0.5 + torch.rand(3, 19, 29, generator=g) * 4)
    loops, ins = _loops(fn, args)
    folded = fold_exp2(loops, through_half=True)
    ops = [n.op for n in folded.nodes]
    assert ops.count("log2_approx") == 1 and ops.count("log") == 1, ops
    consts = [a for n in folded.nodes if n.op == "mul" and n.args[0].op == "log2_approx" for a in n.args[1:]]
    assert consts and abs(consts[0] + math.log(2)) < 1e-12, consts      # -log u = log2 u * -ln 2
    outer = [n.args[1] for n in folded.nodes if n.op == "mul" and n.args[0].op == "add"]
    assert outer and abs(outer[0] - LOG2E / 1.5) < 1e-12, outer      # (s + g) * log2 e / 1.5: one multiply
    _check(loops, folded, ins, 1e-5)


def test_a_scale_both_sides_would_keep_is_factored_out():
    """(a * 2 + b * 3) under an exp: both sides keep a multiply by a constant after the log2 e factor is
    pushed in, so the sum is (a + b * 1.5) * (2 log2 e), one multiply that a running max takes outside;
    where one side absorbs the factor (a * 2 + 0.5: the constant), it is pushed into both as before."""
    def fn(x, y, z):
        a, b = x @ y.transpose(-1, -2), x @ z.transpose(-1, -2)
        return F.softmax(a * 2 + b * 3, dim=-1), F.softmax(a * 2 + 0.5, dim=-1)

    g = torch.Generator().manual_seed(6)
    args = tuple(torch.randn(3, n, 8, generator=g) for n in (19, 29, 29))
    loops, ins = _loops(fn, args)
    folded = fold_exp2(loops, through_half=True)
    factored = [n for n in folded.nodes if n.op == "mul" and n.args[0].op == "add"]
    assert len(factored) == 1 and abs(factored[0].args[1] - 2 * LOG2E) < 1e-12, factored
    inner = factored[0].args[0].args[1]
    assert inner.op == "mul" and abs(inner.args[1] - 1.5) < 1e-12, inner.args
    maxima = [n for n in folded.nodes if n.op == "reduce" and n.attrs["kind"] == "max"]
    assert any(m.args[0] is factored[0] for m in maxima)
    _check(loops, folded, ins, 1e-5)


@pytest.mark.parametrize("masked", [5, 64])
def test_a_huge_finite_constant_is_not_scaled_past_float32(masked):
    """torch.finfo(float32).min * log2 e overflows float32: an exp whose argument holds such a constant stays
    exp2((x - m) * log2 e), its max is taken unscaled, and the folded program keeps eager's finite values,
    fully masked rows (a uniform row) included."""
    def fn(q, k, mask):
        s = q @ k.transpose(-1, -2) * 0.25
        return torch.softmax(s + (1.0 - mask) * torch.finfo(s.dtype).min, dim=-1)

    g = torch.Generator().manual_seed(masked)
    q, k = torch.randn(2, 64, 16, generator=g), torch.randn(2, 64, 16, generator=g)
    mask = torch.ones(64)
    mask[64 - masked:] = 0
    loops, ins = _loops(fn, (q, k, mask))
    folded = fold_exp2(loops, through_half=True)
    consts = [n.attrs["value"] for n in folded.nodes if n.op == "scalar"] + \
        [a for n in folded.nodes for a in n.args if isinstance(a, float)]
    assert all(abs(c) <= torch.finfo(torch.float32).max for c in consts if math.isfinite(c)), consts
    out = evaluate_loops(folded, ins)[0]
    assert torch.isfinite(out).all()
    _check(loops, folded, ins, 1e-6)
    assert rel_err(out, fn(q, k, mask)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_input_under_an_exp_is_not_scaled_past_float32(dtype):
    """An input may hold any finite value of its type: Hugging Face passes its (1 - m) * finfo.min mask in, and
    finfo.min * log2 e is -inf in float32 (bf16 has float32's range), so a fully masked row's s - max(s) would be
    NaN where eager gives a uniform row. Such an exp stays exp2((x - m) * log2 e). With fp16 inputs eager rounds
    s + mask to fp16 (-65504 on the masked keys, so that row is uniform), which the kernels reproduce
    (analysis.precision.rounds_sum): the sum stays whole, and log2 e is not folded into the scale before it."""
    def fn(q, k, mask):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + mask, dim=-1)

    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 24, 16, generator=g).to(dtype), torch.randn(2, 24, 16, generator=g).to(dtype)
    keep = torch.ones(2, 24, 24).tril()
    keep[0, :, :5] = 0                                      # left padding: batch 0's first rows are fully masked
    mask = ((1 - keep) * torch.finfo(dtype).min).to(dtype)
    loops, ins = _loops(fn, (q, k, mask))
    folded = fold_exp2(loops, through_half=True)
    out = evaluate_loops(folded, ins)[0]
    assert torch.isfinite(out).all()
    _check(loops, folded, ins, 1e-6)
    half = [t.half() for t in (q, k, mask)]
    loops, _ = _loops(fn, half)
    consts = [a for n in fold_exp2(loops, through_half=True).nodes if n.op == "mul" for a in n.args
              if isinstance(a, float)]
    assert not any(abs(c - 0.25 * LOG2E) < 1e-12 for c in consts), consts    # the rounded sum keeps its scale


def _clamped(s, mask):
    """The H2O repository's clamp after the mask: torch.max(s + mask, finfo.min)."""
    return torch.max(s + mask, torch.tensor(torch.finfo(s.dtype).min))


def _tempered(s, mask, t):
    """A per-head temperature input multiplying the masked scores."""
    return (s + mask) * t[:, None, None]


@pytest.mark.parametrize("through", ["clamp", "maximum", "temperature"])
def test_a_huge_constant_through_a_maximum_or_product_is_not_scaled_past_float32(through):
    """finfo.min reaching an exp through torch.max(x, finfo.min) (the H2O repository), clamp(min=finfo.min) or a
    product with an input (a temperature): folding log2 e in would make a fully masked row's scores -inf and its
    probabilities NaN where eager gives a uniform row, so such an exp stays exp2((x - m) * log2 e)."""
    def fn(q, k, mask, t):
        s = q @ k.transpose(-1, -2) * 0.25
        s = {"clamp": lambda: (s + mask).clamp(min=torch.finfo(s.dtype).min), "maximum": lambda: _clamped(s, mask),
             "temperature": lambda: _tempered(s, mask, t)}[through]()
        return torch.softmax(s, dim=-1)

    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 24, 16, generator=g), torch.randn(2, 24, 16, generator=g)
    keep = torch.ones(2, 24, 24).tril()
    keep[0, :, :5] = 0                                      # batch 0's first five rows see no key
    mask = (1 - keep) * torch.finfo(torch.float32).min
    args = (q, k, mask, torch.tensor([1.0, 0.75]))
    loops, ins = _loops(fn, args)
    out = evaluate_loops(fold_exp2(loops, through_half=True), ins)[0]
    assert torch.isfinite(out).all()
    assert rel_err(out, fn(*args)) < 1e-6


def _huge_under_exp(form: str, dtype: torch.dtype):
    """A softmax over causal scores masked as `form` says, and its inputs in `dtype`."""
    def fn(q, k, mask):
        causal = torch.arange(24)[None, :] > torch.arange(24)[:, None]
        s = q @ k.transpose(-1, -2) * 0.25
        s = {"finfo": lambda: s.masked_fill(causal, torch.finfo(s.dtype).min),
             "where": lambda: torch.where(causal, torch.full_like(s, -1e9), s),
             "input": lambda: s + mask}[form]()
        return torch.softmax(s, dim=-1, dtype=torch.float32)

    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, 24, 16, generator=g).to(dtype) for _ in range(2))
    keep = torch.ones(2, 24, 24).tril()
    keep[0, :, :5] = 0                                      # batch 0's first five rows see no key
    return fn, (q, k, ((1 - keep) * torch.finfo(dtype).min).to(dtype))


@pytest.mark.parametrize("form,dtype", [("finfo", torch.float16), ("where", torch.float32),
                                        ("where", torch.bfloat16), ("input", torch.float16)])
def test_a_huge_value_under_an_exp_is_scaled_after_the_max(form, dtype):
    """fp16's finfo.min, -1e9 in a select, an fp16 mask input: float32 rounds x * log2 e by up to 2^-24 of it
    (0.004 at -65504), and on the GPU a kernel that fuses the product into the subtraction of the max rounds it
    otherwise than one that does not: a plan whose row statistics and column sums were computed so summed each
    fully masked fp16 row to 1.0015 (a GPU campaign's find). Such an exp stays exp2((x - m) * log2 e), where x - m
    is exact at the max whichever kernel computes it; no constant is scaled, and the facts of the selects stay
    finite (a scaled fp16 finfo.min rounded to fp16 is -inf, and folded the tiles past the diagonal to 0)."""
    fn, args = _huge_under_exp(form, dtype)
    loops, ins = _loops(fn, args)
    folded = fold_exp2(loops, through_half=True)
    exps = [n for n in folded.nodes if n.op == "exp2"]
    assert exps and all(e.args[0].op == "mul" and e.args[0].args[1] == LOG2E and e.args[0].args[0].op == "sub"
                        for e in exps), [e.args for e in exps]
    assert not [n for n in folded.nodes if n.op == "reduce" and isinstance(n.args[0], LNode) and
                n.args[0].op == "mul" and n.args[0].args[1:] == (LOG2E,)]      # no max over scaled values
    facts = Facts().run(folded.nodes)
    fills = [v for n in folded.nodes if n.op == "where" for _, v in facts.of(n) if isinstance(v, float)]
    assert all(math.isfinite(v) for v in fills), fills
    _check(loops, folded, ins, 1e-6)
