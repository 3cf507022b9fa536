"""Masks as real code builds them: huge finite constants (torch.finfo(dtype).min, -finfo.max, -1e9) added or
filled in, HF-style padding masks, fully masked rows. Eager keeps every such value finite, so the kernels must
too: log2 e folded into the constant would overflow float32 (NaN everywhere, or an fp64 literal in a kernel).
Such masks, and disjunctions of index predicates (attention sinks or a window), skip the tiles they mask where
every row keeps an unmasked element; a fully masked row still gives eager's values."""
import math
import re
import warnings

import pytest
import test_fuzz
import torch

import flashtensor as ft
import fuzz_programs
from conftest import assert_close, compiled_matches_eager
from flashtensor import driver
from flashtensor.bench import programs
from flashtensor.codegen import loop
from flashtensor.codegen.emitter import Emitter
from flashtensor.options import CONFIGS, Options, TileConfig
from flashtensor.runtime.plan import Plan

B, H, S, D = 2, 2, 70, 16


def _padded(q, k, v, mask):
    """Hugging Face's padding idiom: (1 - mask) * finfo.min added to the scores."""
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    s = s + (1.0 - mask[:, None, None, :].to(s.dtype)) * torch.finfo(s.dtype).min
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def _causal_full(q, k, v):
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    causal = torch.full((S, S), torch.finfo(s.dtype).min, dtype=s.dtype, device=s.device).triu(1)
    return torch.softmax(s + causal, dim=-1) @ v


def _filled(value):
    def fn(q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        causal = torch.ones(S, S, dtype=torch.bool).triu(1)
        fill = value(s.dtype) if callable(value) else value
        return torch.softmax(s.masked_fill(causal, fill), dim=-1) @ v
    return fn


def _inputs(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(3)]


def _check(fn, args):
    prog = compiled_matches_eager(fn, args)[1].program_for(args)
    assert prog.launches, prog.notes                        # fused, not a fallback
    for k in prog.kernels:                                  # no literal float32 cannot hold (Triton makes it fp64)
        for lit in re.findall(r"(?<![\w.])-?\d+\.\d*e\+(\d+)", k.source):
            assert int(lit) <= 38, k.source
    return prog


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("padded", [0, 5, S], ids=["none", "five", "all"])
def test_padding_mask_of_finfo_min(dtype, padded):
    q, k, v = _inputs(dtype, padded)
    mask = torch.ones(B, S)
    mask[:, S - padded:] = 0            # padded keys; with all of them masked every row is fully masked
    _check(_padded, (q, k, v, mask))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_causal_mask_of_finfo_min_is_one_online_pass(dtype):
    prog = _check(_causal_full, _inputs(dtype, 1))
    assert "in 1 pass(es)" in ft.explain(ft.compile(_causal_full, cache=False), *_inputs(dtype, 1)).properties[0].loop
    assert prog.kernels


@pytest.mark.parametrize("fill", [lambda dt: torch.finfo(dt).min, lambda dt: -torch.finfo(dt).max, -1e9, -math.inf],
                         ids=["finfo.min", "-finfo.max", "-1e9", "-inf"])
def test_masked_fill_constants(fill):
    _check(_filled(fill), _inputs(torch.float32, 2))


# ---- huge finite constants skip tiles, where every row keeps an unmasked element ------------------------------

TILES = (TileConfig(16, 16, 4, 2),)      # small tiles, so that small shapes have whole tiles to skip


def _skips(fn, args) -> list[str]:
    """Compile with small tiles, match eager, and return the skipped regions that explain shows."""
    compiled = ft.compile(fn, cache=False, configs=TILES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(*args)
    assert_close(out, fn(*args))
    assert compiled.program_for(args).launches
    return [r for p in ft.explain(compiled, *args).properties for r in p.skipped]


def _bottom_right(s):
    """Index tensors of a bottom-right aligned causal mask: query i sits at key position i + kv_len - q_len."""
    q_len, kv_len = s.shape[-2:]
    return (torch.arange(q_len, device=s.device)[:, None] + (kv_len - q_len),
            torch.arange(kv_len, device=s.device)[None, :])


def _scores(q, k):
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


MASKS = {   # the causal mask as Hugging Face, nanoGPT-like and x-transformers code writes it
    "masked_fill finfo.min": lambda s, i, j: s.masked_fill(j > i, torch.finfo(s.dtype).min),
    "(1 - mask) * finfo.min": lambda s, i, j: s + (1.0 - (j <= i).to(s.dtype)) * torch.finfo(s.dtype).min,
    "full(finfo.min).triu": lambda s, i, j: s + torch.full(s.shape[-2:], torch.finfo(s.dtype).min,
                                                           dtype=s.dtype, device=s.device).triu(s.shape[-1] - s.shape[-2] + 1),
    "-1e9": lambda s, i, j: s.masked_fill(j > i, -1e9),
    "-finfo.max": lambda s, i, j: s.masked_fill(j > i, -torch.finfo(s.dtype).max),
}
# -1e9 overflows fp16: eager's masked_fill raises there
COMBOS = [(m, dt) for m in MASKS for dt in (torch.float32, torch.float16) if (m, dt) != ("-1e9", torch.float16)]


def _causal(mask):
    def fn(q, k, v):
        s = _scores(q, k)
        return torch.softmax(MASKS[mask](s, *_bottom_right(s)).float(), dim=-1).to(q.dtype) @ v
    return fn


def _qkv(dtype, q_len, kv_len):
    g = torch.Generator().manual_seed(int(torch.randint(1 << 30, ())))
    q = torch.randn(B, H, q_len, D, generator=g).to(dtype)
    return q, *(torch.randn(B, H, kv_len, D, generator=g).to(dtype) for _ in range(2))


@pytest.mark.parametrize("mask, dtype", COMBOS)
def test_huge_finite_causal_masks_skip_the_masked_tiles(mask, dtype):
    """exp(s + c - m) is exactly 0 for c = finfo.min or -1e9 once the row max is attained at an unmasked key,
    which the diagonal gives every row: the tiles above it are skipped, as with -inf (fp16 rounds s + finfo.min
    to -65504 as eager does)."""
    skipped = _skips(_causal(mask), _qkv(dtype, S, S))
    assert len(skipped) == 1 and " and " not in skipped[0], skipped      # j - i - 1 >= 0, on every row


@pytest.mark.parametrize("mask, dtype", [c for c in COMBOS if c[0] in ("masked_fill finfo.min", "-1e9")])
def test_fully_masked_rows_of_a_huge_mask_give_eagers_values(mask, dtype):
    """q_len > kv_len bottom-right: the first q_len - kv_len rows have no key. Eager's finite answer there
    (finfo.min absorbs s: uniform; -1e9 does not: a softmax of the scores) needs every tile of those rows, so
    tiles are skipped only on row tiles past them: the skipped region carries the row condition."""
    q_len, kv_len = 100, 40        # rows 0..59 have no key; the row tile 64..79 skips keys 32..39
    args = _qkv(dtype, q_len, kv_len)
    assert _causal(mask)(*args)[:, :, : q_len - kv_len].isfinite().all()
    skipped = _skips(_causal(mask), args)
    assert len(skipped) == 1 and " and " in skipped[0], skipped


def _mish_weights(added):
    """Sigmoid-style attention, weights mish(s) / n over scores with a causal finfo.min mask, `added` to s as a
    tensor (fp16's s + finfo.min is -inf for s <= -16, and mish of -inf is NaN) or filled in."""
    def fn(q, k, v):
        s = _scores(q, k)
        i, j = _bottom_right(s)
        fill = torch.finfo(s.dtype).min
        s = s + torch.zeros(s.shape[-2:], dtype=s.dtype).masked_fill(j > i, fill) if added else \
            s.masked_fill(j > i, fill)
        return torch.nn.functional.mish(s) / s.shape[-1] @ v
    return fn


def test_a_mask_sum_that_overflows_to_minus_inf_skips_no_tile():
    """Above the diagonal mish(s + finfo.min) is x times a 0 the facts find (exp of a huge negative value): 0 where
    s + finfo.min is finite, NaN where fp16 takes it to -inf, which eager does for every score at most -16 (the
    forty-third session's CPU campaign, seed 6500: NaN rows lost where a tile was skipped). So an fp16 sum skips
    nothing, and matches eager's NaN; float32's sum and fp16's fill, which stay finite, skip as before."""
    q, k, v = _qkv(torch.float16, S, S)
    q = q * 4         # scores well below -16 in every row
    assert _mish_weights(True)(q, k, v).isnan().any()
    assert _skips(_mish_weights(True), (q, k, v)) == []
    assert len(_skips(_mish_weights(False), (q, k, v))) == 1
    assert len(_skips(_mish_weights(True), tuple(t.float() for t in (q, k, v)))) == 1


def _padded_causal(q, k, v, pad):
    """A left-padded batch: an additive (B, S) padding mask from the data, the causal part by masked_fill with
    finfo.min (transformers' get_extended_attention_mask, then the model's causal mask)."""
    s = _scores(q, k) + pad[:, None, None, :].to(q.dtype)
    s = s.masked_fill(torch.arange(S)[None, :] > torch.arange(S)[:, None], torch.finfo(s.dtype).min)
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("fill", ["finfo.min", "-10000"])
def test_left_padding_masks_whole_rows_and_matches_eager(fill, dtype):
    """Padded query rows see only padded keys. With finfo.min in the padding, eager's rows are uniform over every
    key, the skipped ones too; with -10000 (moderate beside finfo.min) they concentrate on their own keys. The
    padding is a mask read from a tensor, shared by the heads: both regions, the padded keys and the keys past the
    diagonal on rows that keep a key, are skipped at run time (tests/test_mask_tensors.py), where each row's
    keys are known."""
    q, k, v = _qkv(dtype, S, S)
    pad = torch.zeros(B, S)
    pad[0, :40] = torch.finfo(dtype).min if fill == "finfo.min" else -10000.0
    pad[1, :3] = -10000.0
    assert not _skips(_padded_causal, (q, k, v, pad))
    runtime = ft.explain(ft.compile(_padded_causal, cache=False, configs=TILES), q, k, v, pad).properties[0].runtime
    assert len(runtime) == 2 and all(r.startswith("some ") for r in runtime), runtime


def _with_mask_input(q, k, v, mask):
    s = q @ k.transpose(-1, -2) / math.sqrt(D) + mask
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def test_an_fp16_mask_input_rounds_fully_masked_rows_as_eager():
    """transformers' eager attention adds its (B, 1, S, S) mask as an input of the model's dtype, finfo.min where a
    key is masked. fp16 rounds s + finfo.min to -65504, so a left-padded query row, which sees no key, is uniform
    over every key; the kernels round that sum too (in float32 s's differences survive: 0.5 off on those rows).
    bf16's finfo.min absorbs s in float32 as well."""
    q, k, v = _inputs(torch.float16, 5)
    keep = torch.ones(B, 1, S, S, dtype=torch.bool).tril()
    keep[0, ..., :20] = False                                   # batch 0: keys 0..19 padded, rows 0..19 see none
    mask = torch.where(keep, 0.0, torch.finfo(torch.float16).min).half()
    _check(_with_mask_input, [q, k, v, mask])


def _bert_padding_causal(fill):
    def fn(q, k, v, attention_mask):
        """The extended-mask idiom of BERT-era code, `(1.0 - mask) * fill` with fill -10000.0 or -1e9, on float32
        scores that ALiBi makes large, plus a causal mask the same way: a left-padded row sees no key."""
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        s = s - 0.5 * (torch.arange(S)[:, None] - torch.arange(S)[None, :]).abs()
        s = s + (1.0 - attention_mask[:, None, None, :].float()) * fill
        s = s + torch.ones(S, S).triu(1) * fill
        return torch.softmax(s, dim=-1) @ v
    return fn


@pytest.mark.parametrize("fill", [-10000.0, -1e9])
def test_a_fully_masked_row_rounds_on_the_constants_grid_as_eager(fill):
    """float32 rounds s + fill to multiples of |fill| * 2^-23 (1e-3 for -10000, 64 for -1e9), which decides eager's
    fully masked rows: the kernels keep that sum as eager computes it (log2 e is not folded into it) and match
    eager there to float32's tolerance."""
    q, k, v = _inputs(torch.float32, 11)
    attention_mask = torch.ones(B, S, dtype=torch.long)
    attention_mask[0, :30] = 0
    fn = _bert_padding_causal(fill)
    out = ft.compile(fn, cache=False)(q, k, v, attention_mask)
    assert_close(out, fn(q, k, v, attention_mask))


# ---- disjunctions: attention sinks and a sliding window ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_sinks_and_a_window_skip_the_keys_between_them(dtype):
    """StreamingLLM's `(j <= i) & ((j < n_sink) | (j > i - window))` filled with finfo.min: the keys between
    the sinks and the window (a region bounded on both sides, a gap in the loop: rows 96..111 skip keys
    16..79) and those above the diagonal are skipped."""
    q, k, v = _qkv(dtype, 128, 128)
    skipped = _skips(lambda q, k, v: programs.streaming_sinks(q, k, v, 4, 16), (q, k, v))
    assert len(skipped) == 2 and sum(" and " in r for r in skipped) == 1, skipped


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_sliding_window_skips_the_keys_before_it(dtype):
    """Mistral's `(j > i) | (j <= i - window)` filled with finfo.min: two regions, one on each side."""
    q, k, v = _qkv(dtype, 128, 128)
    skipped = _skips(lambda q, k, v: programs.mistral_sliding_window(q, k, v, 16), (q, k, v))
    assert len(skipped) == 2 and " and " not in "".join(skipped), skipped


# ---- the loop's bounds, evaluated: which tiles a program visits -----------------------------------------------

class _TL:
    """The scalar arithmetic of the loop bounds (codegen/loop.py segments) in Python; operands are non-negative
    where they divide, so floor division is Triton's."""
    minimum, maximum = staticmethod(min), staticmethod(max)

    @staticmethod
    def where(c, a, b):
        return a if c else b


def _visits(fn, shapes, cfg=CONFIGS[0]):
    """The first kernel's schedule, blocks and, per row tile, the loop tiles it visits (planned on meta tensors:
    nothing runs)."""
    args = [torch.empty(*sh, dtype=torch.float16, device="meta") for sh in shapes]
    call = driver.Call(fn, args, torch.device("cpu"), Options(candidate=0))
    plan = Plan()
    driver._run(driver.FRONT, plan, call)
    driver._run(driver.SEARCH[:-1], plan, call)
    em = Emitter(plan.stages["emit"][0][0], cfg)
    segs = loop.segments(em)
    s = em.s
    br, bl = em.blk[s.row], em.blk[s.loop]
    visits = {}
    for r0 in range(0, s.row.extent, br):
        env = {"tl": _TL, "fin": 1, "r0": r0}
        for line in em.pre:
            exec(line, env)
        visits[r0] = sorted({l0 for a, b, _, _ in segs for l0 in range(env[a], env[b], bl)})
    return s, br, bl, visits


def _inside(s, i, j) -> torch.Tensor:
    """Whether (row i, loop j) lies in some skipped region (i, j broadcast index tensors)."""
    out = torch.zeros(torch.broadcast_shapes(i.shape, j.shape), dtype=torch.bool)
    for reg in s.skip:
        ok = torch.ones_like(out)
        for h in reg:
            ok &= (h.const + h.coeff(s.row) * i + h.coeff(s.loop) * j) >= 0
        out |= ok
    return out


SINKS = lambda q, k, v: programs.streaming_sinks(q, k, v, 4, q.shape[-2] // 4)   # noqa: E731
WINDOW = lambda q, k, v: programs.mistral_sliding_window(q, k, v, q.shape[-2] // 4)   # noqa: E731


@pytest.mark.unit
@pytest.mark.parametrize("fn, q_len, kv_len", [(SINKS, 600, 600), (WINDOW, 600, 600),
                                               (_causal("masked_fill finfo.min"), 700, 450)],
                         ids=["sinks", "window", "fully-masked-rows"])
def test_every_tile_left_out_lies_in_a_skipped_region(fn, q_len, kv_len):
    """Each loop tile a program does not visit is wholly inside a skipped region, on every row of its tile."""
    s, br, bl, visits = _visits(fn, [(1, 2, q_len, 16), (1, 1, kv_len, 16), (1, 1, kv_len, 16)])
    left_out = 0
    for r0, tiles in visits.items():
        i = torch.arange(r0, min(r0 + br, q_len))[:, None]
        for l0 in set(range(0, kv_len, bl)) - set(tiles):
            assert _inside(s, i, torch.arange(l0, min(l0 + bl, kv_len))[None, :]).all(), (r0, l0)
            left_out += 1
    assert left_out > 0


@pytest.mark.unit
def test_sinks_and_a_window_visit_only_their_own_tiles_at_4096():
    """At S=4096 (window 1024) a row tile past the window visits the sink tile and the window's tiles, the
    same number whatever its row, and the whole plan about half the causal plan's tiles."""
    shapes = [(1, 2, 4096, 128), (1, 1, 4096, 128), (1, 1, 4096, 128)]
    _, br, bl, sinks = _visits(SINKS, shapes)
    _, _, _, causal = _visits(_causal("masked_fill finfo.min"), shapes)
    past = [len(t) for r0, t in sinks.items() if r0 >= 1024 + br]
    assert len(set(past)) == 1 and past[0] <= 1 + (1024 + br) // bl + 2, past
    assert sum(map(len, sinks.values())) <= 0.55 * sum(map(len, causal.values()))


@pytest.mark.unit
def test_segments_empty_at_compile_time_are_found_in_each_pass():
    """loop.empty_in folds the bounds' constants per pass (`fin` 1, the first; 0, the fixup) and knows nothing of
    a value read or computed at run time, nor of a floor division Triton might round otherwise (the bounds of a
    band mask over one key, as the kernel of tests/test_fuzz.py's folded_early_exit_loops has them)."""
    class Pre:
        pre = ["lo = 0 * fin", "hi = 22 - (22 - 22) * fin", "ua = tl.minimum(tl.maximum(0, lo), hi)",
               "ub = tl.maximum(ua, tl.minimum(0, ((tl.maximum(--29, 0) + 0) // 1) // 32 * 32))",
               "sp = hi - (hi - tl.minimum(tl.maximum((((tl.maximum(--29, 0) + 0) // 1) + 31) // 32 * 32, ub), hi)) * fin",
               "top = 8 + (hi - 8) * fin", "r = tl.load(p)", "neg = (0 - 5) // 2"]
    em = Pre()
    assert loop.empty_in(em, "lo", "ua") == {0, 1}
    assert loop.empty_in(em, "ua", "ub") == {0, 1}
    assert loop.empty_in(em, "ub", "sp") == set()       # [0, 22) in both
    assert loop.empty_in(em, "sp", "hi") == {0, 1}
    assert loop.empty_in(em, "top", "hi") == {1}        # [8, 22) in the fixup pass only
    assert loop.empty_in(em, "r", "lo") == set() and loop.empty_in(em, "neg", "lo") == set()


@pytest.mark.unit
def test_a_segment_said_empty_is_empty_on_every_row():
    """Against the bounds evaluated per row tile: each segment empty_in leaves out visits no tile in that pass, on
    a band mask over one key whose column statistic stops early (the fuzz find folded_early_exit_loops)."""
    spec = test_fuzz.FOUND[test_fuzz.FOUND_IDS.index("folded_early_exit_loops")]
    args = [torch.empty_like(t, device="meta") for t in fuzz_programs.inputs(spec)]
    found = 0
    for _, plan in driver.candidate_plans(fuzz_programs.flat(spec), args, Options()):
        for kernel in (k for ks in plan.stages["emit"].values() for k in ks):
            em = Emitter(kernel, CONFIGS[0])
            if em.s.loop is None:
                continue
            for a, b, _, _ in loop.segments(em):
                for fin in loop.empty_in(em, a, b):
                    found += 1
                    for r0 in range(0, em.s.row.extent if em.s.row else 1, em.blk[em.s.row] if em.s.row else 1):
                        env = {"tl": _TL, "fin": fin, "r0": r0}
                        for line in em.pre:
                            exec(line, env)
                        assert env[a] >= env[b], (kernel.name, a, b, fin, r0)
    assert found, "no segment empty at compile time: the test checks nothing"


# ---- captured masks recognised as index predicates (transform/constants.py) ---------------------------------------

def _grid(rows=S, cols=S, shift=0):
    return torch.arange(rows)[:, None] + shift, torch.arange(cols)[None, :]


@pytest.mark.parametrize("name, keep, form", [
    ("causal", lambda i, j: j <= i, "d<=0"),
    ("triu", lambda i, j: j > i, "d>=1"),
    ("window", lambda i, j: (j <= i) & (j > i - 16), "d<=0 & d>=-15"),
    ("two-sided window", lambda i, j: (j - i).abs() < 8, "d<=7 & d>=-7"),
    ("sinks", lambda i, j: (j <= i) & ((j < 4) | (j > i - 16)), "d<=0 & (j<4 | d>=-15)"),
    ("prefix", lambda i, j: (j <= i) | (j < 16), "d<=0 | j<16"),
    ("everything", lambda i, j: (i >= 0) & (j >= 0), ""),
])
def test_index_masks_are_found_in_constants(name, keep, form):
    from flashtensor.transform.constants import Atom, evaluate, index_form

    def show(f):
        if isinstance(f, Atom):
            return f"{f.test}{f.c}"
        inner = [show(p) if isinstance(p, Atom) or len(p.parts) < 2 else f"({show(p)})" for p in f.parts]
        return (" | " if f.disjunction else " & ").join(inner)
    m = keep(*_grid())
    f = index_form(m)
    assert f is not None and show(f) == form
    assert torch.equal(evaluate(f, S, S, m.device), m)


@pytest.mark.parametrize("keep", [
    lambda i, j: (j <= i) & (i // 16 == j // 16),          # packed documents
    lambda i, j: (i * 7 + j * 3) % 5 == 0,
    lambda i, j: (j <= i) & (j % 2 == 0),
])
def test_masks_of_no_index_form_stay_constants(keep):
    from flashtensor.transform.constants import index_form
    assert index_form(keep(*_grid())) is None


@pytest.mark.parametrize("kind", ["bool", "uint8 tril buffer", "additive finfo.min", "additive -inf"])
def test_a_captured_mask_becomes_index_comparisons_and_matches_eager(kind):
    """GPT-2's `bias` buffer (a tril of ones, sliced to the keys and the last queries), a bool matrix, or an additive
    mask of 0 and finfo.min or -inf: the decomposed graph holds no constant, and the compiled kernels skip its tiles
    at compile time and match eager, for fewer queries than keys too."""
    sq = 50
    i, j = _grid(sq, S, S - sq)
    full = torch.tril(torch.ones(S, S, dtype=torch.bool))
    masks = {"bool": full, "uint8 tril buffer": full.to(torch.uint8)[None, None],
             "additive finfo.min": torch.zeros(S, S).masked_fill(~full, torch.finfo(torch.float32).min),
             "additive -inf": torch.zeros(S, S).masked_fill(~full, -math.inf)}
    buffer = masks[kind]

    def fn(q, k, v):
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        mask = buffer[..., S - sq:S, :S]
        if mask.dtype == torch.float32:
            s = s + mask
        else:
            s = torch.where(mask.bool(), s, torch.finfo(s.dtype).min)
        return torch.softmax(s, dim=-1) @ v
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, H, sq, D, generator=g)
    k, v = (torch.randn(B, H, S, D, generator=g) for _ in range(2))
    plan = driver.build(fn, [q, k, v]).plan
    assert not any(n.op == "const" and n.attrs["value"].numel() > 1 for n in plan.decomposed.nodes)
    compiled = ft.compile(fn, cache=False)
    assert_close(compiled(q, k, v), fn(q, k, v))
    props = ft.explain(compiled, q, k, v).properties[0]
    assert props.skipped and not props.runtime, props


@pytest.mark.parametrize("value, kept", [
    (torch.randn(S, S), False),                                           # a captured bias table: more values
    (torch.full((S, S), -1e9), False),                                    # one value
    (torch.tril(torch.ones(S, S)).masked_fill(torch.eye(S, dtype=torch.bool), math.nan), False),   # a NaN
    (torch.where(torch.tril(torch.ones(S, S, dtype=torch.bool)), 2.0, -1e9), True),    # two values, causal
])
def test_only_two_valued_constants_of_index_form_are_rewritten(value, kept):
    from flashtensor.ir.graph import Builder
    from flashtensor.transform.constants import as_index_predicate
    b = Builder()
    n = b.add("const", (), tuple(value.shape), value.dtype, value=value)
    assert (as_index_predicate(Builder(), n) is not None) is kept


def test_an_epsilon_rounded_away_keeps_the_masked_tiles():
    """The entropy -(p * log(p + 1e-9)) is 0 on masked keys in float32, so their tiles are skipped; fp16 rounds
    p + 1e-9 to 0 there, whose log is -inf and p times it NaN, so eager's rows are NaN and those tiles must run
    (analysis/facts.py holds each constant as its node's dtype does and follows it through the log)."""
    def fn(q, k, v):
        s = _scores(q, k)
        i, j = _bottom_right(s)
        p = torch.softmax(s.masked_fill(j > i, float("-inf")), dim=-1)
        return -(p * torch.log(p + 1e-9)).sum(-1)

    skipped = {}
    for dtype in (torch.float32, torch.float16):
        args = _qkv(dtype, S, S)
        compiled = ft.compile(fn, cache=False, configs=TILES)
        out, ref = compiled(*args), fn(*args)
        assert bool(ref.isnan().any()) == (dtype == torch.float16)
        assert_close(out, ref)      # NaN where eager has it
        skipped[dtype] = [r for p in ft.explain(compiled, *args).properties for r in p.skipped]
    masked = [r for r in skipped[torch.float32] if " and " not in r]      # j - i - 1 >= 0, on every row
    assert len(masked) == 1 and masked[0] not in skipped[torch.float16], skipped


@pytest.mark.parametrize("entropy", ["entr", "xlogy"])
def test_entropies_without_an_epsilon_fuse_and_skip_the_masked_tiles(entropy):
    """torch.special.entr(p) and -torch.xlogy(p, p), the entropy with eager's 0 where p is 0: each lowers to
    where(p == 0, 0, ...) (frontend/activations.py), and the facts fold p == 0 on masked keys, so those tiles are
    skipped as for the causal softmax alone, in float32 and fp16."""
    def fn(q, k, v):
        s = _scores(q, k)
        i, j = _bottom_right(s)
        p = torch.softmax(s.masked_fill(j > i, float("-inf")), dim=-1)
        return p @ v, (torch.special.entr(p) if entropy == "entr" else -torch.xlogy(p, p)).sum(-1)

    for dtype in (torch.float32, torch.float16):
        skipped = _skips(fn, _qkv(dtype, S, S))
        assert len(skipped) == 1 and " and " not in skipped[0], skipped


def _biased(mask: str):
    """A T5-style bias tensor added to the scores, then the causal mask: filled in (the bias's masked values are
    discarded), filled in from a bool mask passed in (its tiles skipped at run time), or added as finfo.min (they
    still reach the sum: NaN + finfo.min is NaN)."""
    def fn(q, k, v, bias, above):
        s = q @ k.transpose(-1, -2) / math.sqrt(D) + bias
        i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
        if mask == "additive":
            s = s + torch.zeros(S, S).masked_fill(j > i, torch.finfo(s.dtype).min)
        else:
            s = s.masked_fill(above if mask == "passed" else j > i, torch.finfo(s.dtype).min)
        return torch.softmax(s, dim=-1) @ v
    return fn


@pytest.mark.parametrize("mask, where, flagged", [
    ("fill", "masked", False), ("fill", "kept", True), ("passed", "masked", False), ("additive", "masked", True)])
def test_values_a_mask_discards_are_not_checked(mask, where, flagged):
    """The finite check reads an input on the tiles the loop skips only where its values there reach a result: a
    NaN and an inf the causal masked_fill discards (the mask built inside or passed in) leave the flag 0 (the first
    pass is exact; before, the check read the whole bias, twice the kept tiles' bytes, and sent the call to the
    fixup pass), one on a kept tile or under an additive mask sets it, and every output is eager's (NaN rows
    included). (A discarded value on a tile the loop computes, across the diagonal, is still checked.)"""
    from test_mask_tensors import _run

    from flashtensor.codegen.artifact import FINITE
    q, k, v = _inputs(torch.float32, 11)
    bias = torch.randn(B, H, S, S, generator=torch.Generator().manual_seed(12))
    i, j = 50, (66 if where == "masked" else 3)       # key 66 lies in a tile above the diagonal's
    bias[0, 1, i, j], bias[1, 0, i - 7, j] = float("nan"), float("inf")
    above = torch.ones(S, S, dtype=torch.bool).triu(1).expand(B, 1, S, S)
    args = (q, k, v, bias, above)
    fn = _biased(mask)
    compiled = ft.compile(fn, cache=False, configs=TILES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(*args)
    ref = fn(*args)
    assert ref.isnan().any() == flagged
    assert_close(out, ref)
    prog = compiled.program_for(args)
    assert prog.launches and any("tiles it skipped" in kn.source for kn in prog.kernels) == (mask == "additive")
    assert bool(ft.explain(compiled, *args).properties[0].runtime) == (mask == "passed")
    assert _run(prog, args)[0][FINITE].isnan().item() == flagged
