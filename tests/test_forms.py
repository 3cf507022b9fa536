"""The emitter's local forms (codegen/forms.py), each on its own: on a program where it applies, it fires (its
Triton shows in the source) and the kernels match eager; with it left out of FORMS, the same program still
matches eager through the op's own template (or, for a power, runs in eager with the reason)."""
import math
import re

import pytest
import torch

from conftest import compiled_matches_eager
from flashtensor import workloads as W
from flashtensor.codegen import forms

G = torch.Generator().manual_seed(11)


def _h2o(dtype):
    return W.make("h2o", device="cpu", dtype=dtype, S=70, H=2, D=32, seed=3)


def _thin_divisor():
    return (lambda x: x / x.abs().sum(-1, keepdim=True)), (torch.randn(3, 37, 300, generator=G),)


def _plus_zero():
    fn = lambda q, k: torch.softmax(q @ k.transpose(-1, -2) + 0.0, dim=-1)
    return fn, tuple(torch.randn(2, 40, 16, generator=G) for _ in range(2))


def _square():
    return (lambda x: (torch.softmax(x, -1) ** 2).sum(-1)), (torch.randn(3, 37, 300, generator=G),)


# form, program, what its Triton looks like, what the op's own template looks like instead
CASES = {
    "normalised_exp": (lambda: _h2o(torch.float32), r"p_\d+ = tl\.exp2\(", r"rcp_\d+ = 1\.0 / "),
    "thin_divisor": (_thin_divisor, r"rcp_\d+ = 1\.0 / ", r"x_\d+ = \(x_\d+ / x_\d+\)"),
    # without it, the product eager rounds goes through triton_helpers._mul_rn
    "fp16_scale": (lambda: _h2o(torch.float16), r"_scale_f16\(", r"_mul_rn\(x_\d+, " + re.escape(repr(1 / math.sqrt(32)))),
    "identity_operand": (_plus_zero, None, r" \+ 0\.0\)"),
    "square": (_square, r"(x_\d+) = (x_\d+) \* \2\n", r"_pow\("),
}


def _sources(fn, args):
    plan = compiled_matches_eager(fn, args)[1].program_for(args).plan
    return "\n".join(k.source for k in plan.kernels), plan.notes


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("kept", [True, False], ids=["with", "without"])
def test_each_form_fires_and_leaving_it_out_keeps_the_answer(name, kept, monkeypatch):
    build, fired, plain = CASES[name]
    rule = getattr(forms, name)
    assert rule in forms.FORMS
    if not kept:
        monkeypatch.setattr(forms, "FORMS", [f for f in forms.FORMS if f is not rule])
    src, notes = _sources(*build())
    assert src, notes
    if fired:
        assert bool(re.search(fired, src)) is kept, name
    if plain:
        assert bool(re.search(plain, src)) is not kept, name


@pytest.mark.parametrize("fill", [-math.inf, -1e4, -1e9], ids=["-inf", "-1e4", "-1e9"])
def test_a_huge_finite_fill_keeps_the_normaliser_apart(fill):
    """A fully masked row's max is the mask's fill: folded into m + log2 d, float32 rounds -1e9 * log2 e to a
    step of 128, which swallowed log2 d (each probability 1 where eager has 1 / Skv), and -1e4 * log2 e to a step
    of 2^-10 (3e-4 off). A max that may hold a constant or input past forms.FOLD_LIMIT keeps exp2(x - m) / d."""
    def fn(q, k):
        gone = torch.ones(47, 35, dtype=torch.bool).triu(-11)     # bottom-right causal: 12 fully masked rows
        p = torch.softmax((q @ k.transpose(-1, -2)).masked_fill(gone, fill), dim=-1)
        return p.sum(dim=-2), p.amax(dim=-2)

    src, _ = _sources(fn, (torch.randn(2, 47, 16, generator=G), torch.randn(2, 35, 16, generator=G)))
    assert bool(re.search(r"p_\d+ = tl\.exp2\(", src)) is (fill == -math.inf)
