"""The differential fuzzer's grammar (tests/test_fuzz.py): a drawn `Spec`, the plain-PyTorch program it stands
for, its inputs and how it is called.

The programs use the idioms real attention code uses: masks from index comparisons, from
`torch.ones(..., dtype=torch.bool).triu`, or sliced from a bool buffer built once outside (GPT-2's `bias`), filled with -inf, torch.finfo(dtype).min or -1e9, or Hugging Face's
additive (B, 1, Sq, Skv) mask built outside and passed in, with left padding, the masked scores clamped at
finfo.min by torch.max; RoPE by slicing and torch.cat, GPT-J's step-2 slices stacked back, or DeepSeek-V3's
channels de-interleaved by a view first; GPT-OSS's sink logit joined by cat; pointwise weights (sigmoid, SiLU, GELU, softplus, relu6); logsumexp and std;
lengths, positions and thresholds read off the tensors (`q.shape[-2]`, `k.size(-2)`), as real code reads them;
multi-output ops (max with its indices, var_mean); q, k, v as arguments, a list or a dict; the scale as a closure
variable, a keyword, a default or a module global that changes between calls; inputs that require grad.
"""
from __future__ import annotations

import dataclasses
import math
import os
import random
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from flashtensor.options import CONFIGS, TileConfig

# on a GPU machine (no interpreter) the programs run as compiled kernels on the GPU
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
# FLASHTENSOR_FUZZ_DTYPES=fp16,bf16 restricts a campaign (a GPU campaign in half precision, say)
_NAMED = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES = tuple(_NAMED[d] for d in os.environ.get("FLASHTENSOR_FUZZ_DTYPES", "fp32,fp16,bf16").split(","))
ROW_STATS = ("rowmax", "rowsum", "entropy", "rowcount", "rowmaxval", "argmax", "rowvar", "rowlse", "entr")
COL_STATS = ("colsum", "colsq", "colmax", "colany", "colcount", "colvar_mean", "colpool", "colmaxpool", "colcumsum",
             "colstd")
# kind "sigmoid": the pointwise weights of the scores (SiLU, GELU and ReLU attention divide by the key count); GELU's
# scores are clamped below +inf (a planted noise value), where the CPU's vectorised eager GELU gives NaN, CUDA's inf
ACTS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "sigmoid": lambda s, n: torch.sigmoid(s), "silu": lambda s, n: F.silu(s) / n,
    "gelu": lambda s, n: F.gelu(s.clamp(max=1e4)) / n,
    "gelu_tanh": lambda s, n: F.gelu(s, approximate="tanh") / n, "softplus": lambda s, n: F.softplus(s) / n,
    "relu6": lambda s, n: F.relu6(s) / n, "mish": lambda s, n: F.mish(s) / n,
    "hardsigmoid": lambda s, n: F.hardsigmoid(s)}
THRESHOLD_STATS = ("rowcount", "colany", "colcount")
# the outputs of a statistic with more than one (the others have one, named as the statistic)
OUTPUTS = {"colvar_mean": ("colvar", "colmean")}

SCALE = 1.0       # the module global that a program with scale_from "global" reads (invoke sets it)

# the tuner's configurations, then smaller tiles: at the fuzzer's lengths (at most 80) only these leave a row tile
# with tiles wholly past its diagonal (folded or skipped) and fully masked rows in it, as 4096 tokens do with the
# tuner's tiles (the held program left_padding on the GPU)
TILES = (*CONFIGS, TileConfig(32, 16, 4, 2), TileConfig(16, 32, 4, 2))


@dataclass(frozen=True)
class Spec:
    """One drawn program: an attention (kind "softmax"/"sigmoid") or a linear attention (kind "linear")."""
    kind: str                         # softmax | sigmoid (pointwise: `act`) | linear
    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    dim: int
    dtype: torch.dtype
    layout: str = "bhsd"              # bshd: inputs are (B, S, H, D) and the program transposes them
    expand: str = "repeat_interleave"
    scale: float = 1.0
    cap: Optional[float] = None       # tanh soft cap
    slope: Optional[float] = None     # ALiBi-like bias (j - i) * slope
    mask: str = "none"                # none | causal | band | prefix | chunked (Llama 4's: causal within chunks of
    #                                   width + 1 positions, i // c == j // c) | strided (causal, a window of width + 1
    #                                   and every (width + 1)-th key before it, by (i - j) % c: sparse transformers')
    width: int = 0                    # band window, prefix length, chunk or stride less one
    apply: str = "masked_fill"        # masked_fill | where | additive | input (an HF additive mask passed in)
    float_probs: bool = False         # softmax over s.float() (the workloads' habit for half inputs)
    stats: tuple[str, ...] = ()
    threshold: float = 0.0            # times 1 / kv_len, for the threshold statistics
    feature: str = "ea"               # linear attention: ea (softmaxes) | sima (L1 normalise over tokens)
    cast_inside: bool = False         # half dtypes: float32 inputs that the program casts to dtype first
    noise: bool = False               # softmax/sigmoid: scores plus -log(u) for a float32 input u (KeyFormer's)
    plant: Optional[float] = None     # a value put in u at one place (0, -1, NaN, a subnormal, inf)
    seed: int = 0
    config: int = 0                   # the tile config its kernels use: an index into TILES
    fill: str = "-inf"                # the masked scores' value: -inf | finfo (torch.finfo(dtype).min) | -1e9
    mask_from: str = "iota"           # iota (index comparisons) | ones (torch.ones(Sq, Skv, dtype=bool).triu/tril)
    #                                   | buffer (a captured bool matrix of every position, sliced as GPT-2 does)
    pad: int = 0                      # apply "input" or padding: each sequence's keys left-padded by up to this many
    padding: bool = False             # a (B, Skv) 0/1 mask of kept keys passed in, added as transformers'
    #                                   get_extended_attention_mask does, (1 - m) * finfo.min, before `mask` is applied
    rope: bool = False                # q and k rotated by rotate_half (slices and torch.cat), cos/sin as inputs
    rope_style: str = "half"          # half (rotate_half) | every_two (GPT-J's step-2 slices, stacked, flattened)
    #                                   | interleaved (DeepSeek-V3's: channels de-interleaved, then rotate_half)
    rope_by: str = "slice"            # the tables' rows: slice (the last lengths') | index (by an int64 input of
    #                                   position ids, as transformers did before 4.38: run before the kernels)
    scores_by: str = "matmul"         # q @ k^T | einsum | baddbmm (into zeros, alpha the scale: GPT-NeoX's)
    gate: bool = False                # a forget gate (float32 logits per key, q_len <= kv_len): the scores plus the
    #                                   running total of logsigmoid(gate) from the key to the query (the Forgetting
    #                                   Transformer's)
    eps: float = 1e-6                 # the entropy's epsilon (fp16 rounds p + 1e-9 to 0 where p is 0)
    pack: str = "args"                # how q, k, v reach the program: args | list | dict
    scale_from: str = "closure"       # closure (spec.scale) | kwarg | default (a keyword's default) | global
    rescale: Optional[float] = None   # a second call with this scale must give its own answer (the guards)
    grad: bool = False                # q, k, v require grad; the gradients of the outputs are checked too
    act: str = "sigmoid"              # kind sigmoid: the weights, a key of ACTS
    floor: bool = False               # the masked scores clamped at finfo.min by torch.max (the H2O repository's)
    sink: bool = False                # softmax: a learned logit per head joined to the scores as one more column by
    #                                   cat, dropped after the softmax (GPT-OSS's attention sinks)


def expected_to_fuse(spec: Spec) -> bool:
    """Whether the compiler fuses the program today (test_fuzz.py's floor counts only these): the IR has no
    argmax (eager needs the probabilities, so most such programs run as written), and inputs that require grad
    run eagerly by design."""
    return not (spec.grad or "argmax" in spec.stats)


def output_names(spec: Spec) -> tuple[str, ...]:
    return ("o",) + tuple(n for s in spec.stats for n in OUTPUTS.get(s, (s,)))


def extra_names(spec: Spec) -> tuple[str, ...]:
    """The inputs after q, k and v, in the order the program takes them."""
    return ("u",) * spec.noise + ("mask",) * (spec.apply == "input" or spec.padding) + ("cos", "sin") * spec.rope + \
        ("position_ids",) * (spec.rope and spec.rope_by == "index") + ("gate",) * spec.gate + ("sinks",) * spec.sink


def _expand_heads(x: torch.Tensor, spec: Spec) -> torch.Tensor:
    """GQA: each of kv_heads heads serves heads // kv_heads query heads."""
    g = spec.heads // spec.kv_heads
    if g == 1:
        return x
    if spec.expand == "repeat_interleave":
        return x.repeat_interleave(g, dim=1)
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, g, s, d).reshape(b, h * g, s, d)


def _wide(dtype: torch.dtype) -> torch.dtype:
    """float32 for half inputs, the input's own type otherwise (float64 for the exact reference)."""
    return torch.promote_types(dtype, torch.float32)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb (GPT-J's with every_two; DeepSeek-V3's with interleaved, which first
    de-interleaves the channels by a view, a transpose and a reshape); the queries sit at the last q_len of the
    keys' positions."""
    n = x.shape[-2]
    if style == "interleaved":
        b, h, s, d = x.shape
        x = x.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d)
    return x * cos[-n:] + (_rotate_every_two(x) if style == "every_two" else _rotate_half(x)) * sin[-n:]


BUFFER = 128     # positions of the captured masks (mask_from "buffer"): more than any drawn length
WIDTHS = 41      # band widths drawn: 0..40


def _kept_positions(mask: str, width: int) -> torch.Tensor:
    """The keys each query position keeps, as a model registers such a buffer: built before any program runs (a
    program traced on fake tensors would make it fake) and captured, one tensor per mask, so a plan's guards see
    the same constant on every call. Row r is position r - BUFFER, so that more queries than keys (bottom-right
    aligned: the first ones before every key) slice it."""
    keep = torch.tril(torch.ones(2 * BUFFER, BUFFER, dtype=torch.bool, device=DEVICE), -BUFFER)
    return keep & torch.triu(torch.ones_like(keep), -BUFFER - width) if mask == "band" else keep


KEPT = {("causal", 0): _kept_positions("causal", 0),
        **{("band", w): _kept_positions("band", w) for w in range(WIDTHS)}}


def masked(spec: Spec, sq: Any, sk: Any, device: Any) -> Optional[torch.Tensor]:
    """The (sq, sk) positions the mask removes (bottom-right aligned), or None; sq and sk are the lengths as the
    program reads them off its tensors (symbolic in a shape-generic trace). mask_from "ones" builds the causal
    and band parts as code often does, from a bool matrix of ones; the prefix's columns stay a comparison."""
    off = sk - sq
    if spec.mask_from == "buffer" and spec.mask in ("causal", "band"):
        return ~KEPT[spec.mask, spec.width if spec.mask == "band" else 0][BUFFER + off:BUFFER + off + sq, :sk]
    if spec.mask_from == "ones" and spec.mask in ("causal", "band"):
        ones = torch.ones(sq, sk, dtype=torch.bool, device=device)
        above = ones.triu(off + 1)
        return above | ones.tril(off - spec.width - 1) if spec.mask == "band" else above
    i = torch.arange(sq, device=device)[:, None] + off
    j = torch.arange(sk, device=device)[None, :]
    c = spec.width + 1
    if spec.mask == "chunked":
        return (j > i) | (torch.div(i, c, rounding_mode="floor") != j // c)
    if spec.mask == "strided":
        return (j > i) | ((i - j >= c) & ((i - j) % c != 0))
    return {"none": None, "causal": j > i, "band": (j > i) | (j < i - spec.width),
            "prefix": (j > i) & (j >= spec.width)}[spec.mask]


def probabilities(spec: Spec, q: torch.Tensor, k: torch.Tensor, extra: dict, scale: float) -> torch.Tensor:
    """The (B, H, Sq, Skv) probabilities of a softmax/sigmoid program; q, k in (B, H, S, D)."""
    sq, sk = q.shape[-2], k.size(-2)      # the lengths as real code reads them: off the tensors
    if spec.scores_by == "einsum":
        s = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    elif spec.scores_by == "baddbmm":
        b, h, d = q.shape[0], q.shape[1], q.shape[-1]
        zeros = torch.zeros(b * h, sq, sk, dtype=q.dtype, device=q.device)
        s = torch.baddbmm(zeros, q.reshape(b * h, sq, d), k.reshape(b * h, sk, d).transpose(1, 2), beta=1.0,
                          alpha=scale).view(b, h, sq, sk)
    else:
        s = q @ k.transpose(-1, -2) * scale
    if spec.cap is not None:
        s = torch.tanh(s / spec.cap) * spec.cap
    if spec.slope is not None:
        i = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
        j = torch.arange(sk, device=q.device)[None, :]
        s = s + (j - i).to(s.dtype) * spec.slope
    if "gate" in extra:     # queries sit at the last sq of the keys' positions
        c = torch.cumsum(F.logsigmoid(extra["gate"]), dim=-1)
        s = s + (c[..., sk - sq:, None] - c[..., None, :]).to(s.dtype)
    if spec.padding:
        s = s + (1.0 - extra["mask"][:, None, None, :].to(s.dtype)) * torch.finfo(s.dtype).min
    m = masked(spec, *s.shape[-2:], q.device) if spec.apply != "input" else None
    if spec.apply == "input":
        s = s + extra["mask"]
    elif m is not None:
        fill = {"-inf": -math.inf, "finfo": torch.finfo(s.dtype).min, "-1e9": -1e9}[spec.fill]
        if spec.apply == "masked_fill":
            s = s.masked_fill(m, fill)
        elif spec.apply == "where":
            s = torch.where(m, torch.full_like(s, fill), s)
        else:
            s = s + torch.zeros(m.shape, dtype=s.dtype, device=s.device).masked_fill(m, fill)
    if spec.floor:
        s = torch.max(s, torch.tensor(torch.finfo(s.dtype).min, device=s.device))
    if "u" in extra:
        s = s.to(_wide(s.dtype)) - torch.log(extra["u"])
    if spec.kind == "sigmoid":
        return ACTS[spec.act](s, sk)
    s = s.to(_wide(s.dtype)) if spec.float_probs else s
    if "sinks" in extra:    # GPT-OSS's: the sink's column joined, the softmax taken, the column dropped
        col = extra["sinks"].reshape(1, -1, 1, 1).expand(s.shape[0], -1, s.shape[-2], 1)
        return torch.softmax(torch.cat([s, col.to(s.dtype)], dim=-1), dim=-1)[..., :-1]
    return torch.softmax(s, dim=-1)


def _stat(name: str, p: torch.Tensor, spec: Spec) -> tuple[torch.Tensor, ...]:
    thr = spec.threshold / p.shape[-1]        # relative to a uniform row over the keys (CORM's 1 / t)
    return {
        "rowmax": lambda: (p.amax(dim=-1),),
        "rowsum": lambda: (p.sum(dim=-1),),
        "entropy": lambda: (-(p * torch.log(p + spec.eps)).sum(dim=-1),),
        "rowcount": lambda: ((p > thr).sum(dim=-1),),
        "rowmaxval": lambda: (p.max(dim=-1).values,),         # the indices output unused
        "argmax": lambda: (p.max(dim=-1).indices,),
        "rowvar": lambda: (torch.var_mean(p, dim=-1)[0],),    # the mean output unused
        "rowlse": lambda: (torch.logsumexp(p * 4.0, dim=-1),),
        "entr": lambda: (torch.special.entr(p).sum(dim=-1),),    # the entropy with 0 where p is 0
        "colsum": lambda: (p.sum(dim=-2),),
        "colsq": lambda: ((p * p).sum(dim=-2),),
        "colmax": lambda: (p.amax(dim=-2),),
        "colany": lambda: ((p >= thr).any(dim=-2),),
        "colcount": lambda: ((p > thr).sum(dim=-2),),
        "colvar_mean": lambda: torch.var_mean(p, dim=-2),
        # SnapKV's and PyramidKV's smoothed votes
        "colpool": lambda: (F.avg_pool1d(p.sum(dim=-2), kernel_size=5, padding=2, stride=1),),
        "colmaxpool": lambda: (F.max_pool1d(p.mean(dim=-2), kernel_size=3, padding=1, stride=1),),
        "colcumsum": lambda: (p.sum(dim=-2).cumsum(dim=-1),),
        "colstd": lambda: (p.std(dim=-2),),
    }[name]()


def prepared(spec: Spec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, extra: dict) -> tuple:
    """q, k, v as the attention reads them, in (B, H, S, D): cast (where the program casts float32 inputs;
    the float64 reference passes them rounded), transposed, rotated, k and v expanded to every head."""
    if spec.cast_inside and q.dtype == torch.float32:
        q, k, v = (t.to(spec.dtype) for t in (q, k, v))
    if spec.layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if "cos" in extra:
        cos, sin = extra["cos"], extra["sin"]
        if "position_ids" in extra:
            cos, sin = cos[extra["position_ids"]], sin[extra["position_ids"]]
        q, k = _rope(q, cos, sin, spec.rope_style), _rope(k, cos, sin, spec.rope_style)
    return q, _expand_heads(k, spec), _expand_heads(v, spec)


def _scale(spec: Spec, scale: float) -> float:
    if spec.scale_from == "global":
        return SCALE
    return spec.scale if spec.scale_from == "closure" else scale


def build(spec: Spec) -> Callable:
    """The drawn program as a plain-PyTorch function over the spec, taking q, k, v as spec.pack says, the other
    inputs (extra_names) positionally after them, and a keyword `scale` defaulting to spec.scale."""
    def attention(q, k, v, extra: dict, scale: float):
        q, k, v = prepared(spec, q, k, v, extra)
        p = probabilities(spec, q, k, extra, _scale(spec, scale))
        o = p.to(v.dtype) @ v
        if spec.layout == "bshd":
            o = o.transpose(1, 2)
        return (o, *(t for name in spec.stats for t in _stat(name, p, spec)))

    def linear(q, k, v, extra: dict, scale: float):
        k, v = _expand_heads(k, spec), _expand_heads(v, spec)
        if spec.feature == "ea":
            q, k = q.softmax(dim=-1), k.softmax(dim=-2)
        else:
            q, k = F.normalize(q, p=1, dim=-2), F.normalize(k, p=1, dim=-2)
        return q @ (k.transpose(-2, -1) @ v)

    body = linear if spec.kind == "linear" else attention
    names = extra_names(spec)

    def positional(q, k, v, *extra, scale=spec.scale):
        return body(q, k, v, dict(zip(names, extra)), scale)

    def listed(qkv, *extra, scale=spec.scale):
        q, k, v = qkv
        return body(q, k, v, dict(zip(names, extra)), scale)

    def keyed(qkv, *extra, scale=spec.scale):
        return body(qkv["q"], qkv["k"], qkv["v"], dict(zip(names, extra)), scale)

    return {"args": positional, "list": listed, "dict": keyed}[spec.pack]


def invoke(spec: Spec, fn: Callable, tensors: Sequence[torch.Tensor], scale: Optional[float] = None) -> Any:
    """fn (the program or its compiled form) called as the spec says with the scale `scale` (spec.scale if None):
    passed as a keyword, left to the default where it is the default, or set as the module global first."""
    global SCALE
    scale = spec.scale if scale is None else scale
    q, k, v, *extra = tensors
    first = {"args": (q, k, v), "list": ([q, k, v],), "dict": ({"q": q, "k": k, "v": v},)}[spec.pack]
    kw = {"scale": scale} if spec.scale_from == "kwarg" or spec.scale_from == "default" and scale != spec.scale \
        else {}
    if spec.scale_from == "global":
        SCALE = scale
    return fn(*first, *extra, **kw)


def flat(spec: Spec) -> Callable:
    """The program as a function of its tensors alone, called as the spec says (scripts/kernel_hashes.py)."""
    fn = build(spec)
    return lambda *tensors: invoke(spec, fn, tensors)


def inputs(spec: Spec) -> tuple[torch.Tensor, ...]:
    """q, k, v, then extra_names(spec), on DEVICE, from the spec's seed."""
    g = torch.Generator().manual_seed(spec.seed)
    shapes = [(spec.batch, h, n, spec.dim) for h, n in
              ((spec.heads, spec.q_len), (spec.kv_heads, spec.kv_len), (spec.kv_heads, spec.kv_len))]
    if spec.kind == "linear":   # linear attention reads tokens along the same axis for q, k and v
        shapes[0] = (spec.batch, spec.heads, spec.kv_len, spec.dim)
    out = []
    for shape in shapes:
        if spec.layout == "bshd":
            shape = (shape[0], shape[2], shape[1], shape[3])
        out.append(torch.randn(*shape, generator=g).to(DEVICE, torch.float32 if spec.cast_inside else spec.dtype))
    if spec.noise:
        u = 0.05 + 2 * torch.rand(spec.batch, spec.heads, spec.q_len, spec.kv_len, generator=g)
        if spec.plant is not None:
            u.view(-1)[int(torch.randint(u.numel(), (1,), generator=g))] = spec.plant
        out.append(u.to(DEVICE))
    if spec.apply == "input":   # Hugging Face's: (1 - m) * finfo.min, m the kept positions, left padding per sequence
        gone = masked(spec, spec.q_len, spec.kv_len, "cpu")
        keep = torch.ones(spec.batch, 1, spec.q_len, spec.kv_len, dtype=torch.bool)
        if gone is not None:    # a captured buffer's slice lives where the buffer does (the GPU in a GPU campaign)
            keep &= ~gone.cpu()
        for b, pad in enumerate(torch.randint(0, spec.pad + 1, (spec.batch,), generator=g).tolist()):
            keep[b, ..., :pad] = False
        out.append(((1.0 - keep.to(spec.dtype)) * torch.finfo(spec.dtype).min).to(DEVICE))
    if spec.padding:
        kept = torch.ones(spec.batch, spec.kv_len, dtype=torch.long)
        for b, pad in enumerate(torch.randint(0, spec.pad + 1, (spec.batch,), generator=g).tolist()):
            kept[b, :pad] = 0
        out.append(kept.to(DEVICE))
    if spec.rope:
        pos = torch.arange(max(spec.q_len, spec.kv_len), dtype=torch.float32)[:, None]   # _rope takes the last
        freq = 10000.0 ** (-torch.arange(0, spec.dim, 2, dtype=torch.float32) / spec.dim)
        angle = torch.cat((pos * freq, pos * freq), dim=-1)
        out += [angle.cos().to(DEVICE, spec.dtype), angle.sin().to(DEVICE, spec.dtype)]
        if spec.rope_by == "index":
            out.append(torch.arange(len(pos), device=DEVICE))
    if spec.gate:
        out.append((2 + torch.randn(spec.batch, spec.heads, spec.kv_len, generator=g)).to(DEVICE))
    if spec.sink:
        out.append((2 * torch.randn(spec.heads, generator=g)).to(DEVICE, spec.dtype))
    return tuple(out)


def resized(spec: Spec, count: int = 2) -> list[Spec]:
    """`count` more length pairs of the same program (test_fuzz.py's resize step), each new and with a fresh seed,
    keeping the spec's relation of q_len to kv_len (equal, at most or any; linear attention's are equal).
    Drawn from a generator seeded by the spec, so hypothesis's draw of specs, and the default fixed draw, stay
    as they were."""
    rng = random.Random(f"{spec.seed}:{spec.q_len}:{spec.kv_len}")
    seen, out = {(spec.q_len, spec.kv_len)}, []
    while len(out) < count:
        kv = rng.randint(1, 80)
        q = kv if spec.q_len == spec.kv_len else rng.randint(1, kv if spec.q_len < spec.kv_len else 80)
        if (q, kv) not in seen:
            seen.add((q, kv))
            out.append(dataclasses.replace(spec, q_len=q, kv_len=kv, pad=min(spec.pad, kv - 1),
                                           seed=rng.randint(0, 2 ** 16)))
    return out


@st.composite
def calls(draw) -> dict:
    """How the program is called: containers, keywords, a scale that changes between calls, grad."""
    scale_from = draw(st.sampled_from(["closure", "closure", "kwarg", "default", "global"]))
    return dict(pack=draw(st.sampled_from(["args", "args", "args", "list", "dict"])), scale_from=scale_from,
                rescale=draw(st.sampled_from([None, 0.5, 0.125])) if scale_from != "closure" else None,
                grad=draw(st.sampled_from([False] * 9 + [True])))


@st.composite
def specs(draw) -> Spec:
    kind = draw(st.sampled_from(["softmax", "softmax", "softmax", "sigmoid", "linear"]))
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 1, 2]))
    kv_len = draw(st.integers(1, 80))
    dtype = draw(st.sampled_from(DTYPES))
    common = dict(batch=draw(st.sampled_from([1, 1, 2])), heads=heads, kv_heads=kv_heads, kv_len=kv_len,
                  dim=draw(st.sampled_from([16, 32])), dtype=dtype,
                  expand=draw(st.sampled_from(["repeat_interleave", "expand"])),
                  seed=draw(st.integers(0, 2 ** 16)), config=draw(st.integers(0, len(TILES) - 1)), **draw(calls()))
    if kind == "linear":
        common["rescale"] = None       # linear attention has no scale: a second call would rightly reuse the plan
        return Spec(kind, q_len=kv_len, feature=draw(st.sampled_from(["ea", "sima"])), **common)
    q_len = draw(st.one_of(st.just(kv_len), st.integers(1, kv_len), st.integers(1, 80)))
    mask = draw(st.sampled_from(["none", "causal", "causal", "band", "prefix", "chunked", "strided"]))
    apply = draw(st.sampled_from(["masked_fill", "where", "additive", "input"]))
    stats = draw(st.lists(st.sampled_from(ROW_STATS + COL_STATS), max_size=2, unique=True))
    noise = draw(st.sampled_from([False, False, True]))
    fills = ["-inf", "-inf", "finfo"] + ["-1e9"] * (dtype != torch.float16)    # fp16 rounds -1e9 to -inf
    return Spec(
        kind, q_len=q_len, layout=draw(st.sampled_from(["bhsd", "bshd"])),
        scale=draw(st.sampled_from([1.0, 0.25, 1 / math.sqrt(common["dim"])])),
        cap=draw(st.one_of(st.none(), st.sampled_from([5.0, 30.0]))),
        slope=draw(st.one_of(st.none(), st.sampled_from([0.05, -0.5]))),
        mask=mask, width=draw(st.integers(0, WIDTHS - 1)), apply=apply,
        float_probs=draw(st.booleans()), stats=tuple(stats), threshold=draw(st.sampled_from([0.5, 1.0, 2.0])),
        cast_inside=dtype != torch.float32 and draw(st.booleans()), noise=noise,
        plant=draw(st.sampled_from([None, None, 0.0, -1.0, math.nan, 1e-40, math.inf])) if noise else None,
        fill=draw(st.sampled_from(fills)), mask_from=draw(st.sampled_from(["iota", "ones", "buffer"])),
        padding=(padding := apply != "input" and draw(st.sampled_from([False, False, False, True]))),
        pad=draw(st.integers(0, kv_len - 1)) if apply == "input" or padding else 0,
        rope=(rope := draw(st.sampled_from([False] * 5 + [True]))),
        rope_by=draw(st.sampled_from(["slice", "index"])) if rope else "slice",
        rope_style=draw(st.sampled_from(["half", "every_two", "interleaved"])) if rope else "half",
        act=draw(st.sampled_from(["sigmoid", "sigmoid", *ACTS])) if kind == "sigmoid" else "sigmoid",
        floor=draw(st.sampled_from([False, False, True])),
        sink=kind == "softmax" and draw(st.sampled_from([False] * 5 + [True])),
        gate=draw(st.sampled_from([False] * 5 + [True])) and q_len <= kv_len,     # queries at the last q_len keys
        eps=draw(st.sampled_from([1e-6, 1e-9])), scores_by=draw(st.sampled_from(["matmul", "matmul", "einsum", "baddbmm"])),
        **common)
