"""Guards and calling conventions: what a plan bakes in is checked on every call, so a changed global, closure
variable, attribute, captured tensor or container never reuses the old plan; keyword arguments, defaults,
partials and callable objects call what they name; inputs that require grad get eager's gradients; and the
torch.compile backend takes Python floats."""
import functools
import math
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import flashtensor as ft
from conftest import assert_close
from flashtensor import FallbackWarning

B, H, S, D = 1, 2, 32, 16


def qkv(seed: int, s: int = S, d: int = D) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, s, d, generator=g) for _ in range(3))


def attention(q, k, v, scale=None):
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1) @ v


def fused(compiled) -> None:
    """Every plan of `compiled` runs generated kernels (the guards must not cost the fusion)."""
    assert compiled.programs and all(p.launches for p in compiled.programs.values()), \
        [p.notes for p in compiled.programs.values()]


# ---- containers of tensors ----------------------------------------------------------------------------------

def attend_to_cache(q, past, layer):
    """One layer of a per-layer KV cache: `past` is a list of (key, value) pairs, one per layer."""
    k, v = past[layer]
    return attention(q, k, v)


def test_tensors_inside_a_list_are_inputs():
    q, *_ = qkv(1)
    past = [qkv(10 + i)[1:] for i in range(3)]
    fast = ft.compile(attend_to_cache)
    assert_close(fast(q, past, 1), attend_to_cache(q, past, 1))
    # a new list whose layer-1 keys differ in the middle rows only, which the list's repr elides ("...")
    k1, v1 = past[1]
    k1 = k1.clone()
    k1[:, :, S // 2] += 3.0
    past2 = [past[0], (k1, v1), past[2]]
    assert_close(fast(q, past2, 1), attend_to_cache(q, past2, 1))
    assert len(fast.programs) == 1                       # same signature: the same plan, run on the new tensors
    fused(fast)


def test_tensors_inside_a_dict_are_inputs():
    def attend(q, kv):
        return attention(q, kv["key"], kv["value"]) + kv["bias"]

    q, k, v = qkv(2)
    fast = ft.compile(attend)
    v2 = v.clone()
    v2[:, :, S // 2:S // 2 + 2] *= -4.0
    for kv in ({"key": k, "value": v, "bias": 0.5}, {"key": k, "value": v2, "bias": 0.5}):
        assert_close(fast(q, kv), attend(q, kv))
    assert len(fast.programs) == 1
    kv = {"key": k, "value": v2, "bias": 2.0}            # a number in the dict: by value
    assert_close(fast(q, kv), attend(q, kv))
    assert len(fast.programs) == 2
    fused(fast)


@pytest.mark.unit
def test_container_structure_and_every_tensor_signature_are_in_the_key():
    from flashtensor.api.guards import Guards
    guards = Guards(attend_to_cache)
    q, k, v = qkv(5)

    def key(*args):
        call = guards.bind(args, {})
        assert call is not None
        return guards.key(call)

    base = key(q, [(k, v), (k, v)], 0)
    assert key(q, [(k.clone(), v + 1), (k, v)], 0) == base                # values are not in it
    assert key(q, [(k, v), (k, v), (k, v)], 0) != base                    # one more layer
    assert key(q, [[k, v], (k, v)], 0) != base                            # a list where a tuple was
    assert key(q, [(k[..., :8], v), (k, v)], 0) != base                   # a shape inside
    assert key(q, [(k.double(), v), (k, v)], 0) != base                   # a dtype inside
    assert key(q, [(k.transpose(-1, -2).contiguous().transpose(-1, -2), v), (k, v)], 0) != base   # strides
    assert key(q, [(k, v), (k, v)], 1) != base                            # a non-tensor leaf, by value


# ---- globals, closures, attributes, captured tensors ---------------------------------------------------------

# a model's settings, as a module-level object the attention reads
CONFIG = types.SimpleNamespace(softcap=30.0, window=None)
TEMPERATURE = 1.0


def softcapped(q, k, v):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = CONFIG.softcap * torch.tanh(s / CONFIG.softcap)
    return torch.softmax(s / temperature(), dim=-1) @ v


def temperature():
    return TEMPERATURE


def test_changed_config_attribute_and_global_replan(monkeypatch):
    q, k, v = qkv(6)
    fast = ft.compile(softcapped)
    assert_close(fast(q, k, v), softcapped(q, k, v))
    monkeypatch.setattr(CONFIG, "softcap", 2.0)
    assert_close(fast(q, k, v), softcapped(q, k, v))
    assert len(fast.programs) == 2
    monkeypatch.setattr(sys.modules[__name__], "TEMPERATURE", 0.25)    # read by a helper the function calls
    assert_close(fast(q, k, v), softcapped(q, k, v))
    assert len(fast.programs) == 3
    monkeypatch.undo()
    assert_close(fast(q, k, v), softcapped(q, k, v))                 # back: the first plan again
    assert len(fast.programs) == 3
    fused(fast)


def make_attention(scale: float):
    """A closure over its scale, with a setter (as a training loop anneals a temperature)."""
    def attend(q, k, v):
        return attention(q, k, v, scale)

    def set_scale(s: float) -> None:
        nonlocal scale
        scale = s
    return attend, set_scale


def test_changed_closure_variable_replans():
    attend, set_scale = make_attention(0.25)
    q, k, v = qkv(7)
    fast = ft.compile(attend)
    assert_close(fast(q, k, v), attend(q, k, v))
    set_scale(2.0)
    assert_close(fast(q, k, v), attend(q, k, v))
    assert len(fast.programs) == 2
    fused(fast)


ALIBI = -torch.arange(S, dtype=torch.float32).flip(0).expand(S, S) * 0.1   # a global bias the function adds


def biased(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) + ALIBI, dim=-1) @ v


def test_captured_tensor_written_or_rebound_replans(monkeypatch):
    q, k, v = qkv(8)
    fast = ft.compile(biased)
    assert_close(fast(q, k, v), biased(q, k, v))
    monkeypatch.setattr(sys.modules[__name__], "ALIBI", ALIBI.clone())   # rebound (a copy: the write below stays here)
    assert_close(fast(q, k, v), biased(q, k, v))
    sys.modules[__name__].ALIBI.mul_(8.0)                                 # written in place
    assert_close(fast(q, k, v), biased(q, k, v))
    assert len(fast.programs) == 3


def test_captured_tensor_written_through_a_closure_replans():
    mask = torch.zeros(S, S)

    def masked(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) + mask, dim=-1) @ v

    q, k, v = qkv(9)
    fast = ft.compile(masked)
    assert_close(fast(q, k, v), masked(q, k, v))
    mask[:, S // 2:] = -math.inf
    assert_close(fast(q, k, v), masked(q, k, v))
    assert len(fast.programs) == 2


SHAPES_SEEN = []        # a call log the function appends to


def logged(q, k, v):
    SHAPES_SEEN.append(tuple(q.shape))
    return attention(q, k, v)


def test_function_that_changes_what_it_reads_runs_eagerly_not_replanning_each_call():
    q, k, v = qkv(10)
    SHAPES_SEEN.clear()
    fast = ft.compile(logged)
    outs = [fast(q, k, v)]
    with pytest.warns(FallbackWarning, match="logged changes values it reads each time it runs"):
        outs.append(fast(q, k, v))
    outs += [fast(q, k, v), fast(q, k, v)]
    assert len(SHAPES_SEEN) == 4                         # its side effect, once per call, as in eager
    assert len(fast.programs) == 2
    for out in outs:
        assert_close(out, attention(q, k, v))


# ---- callable objects, partials, keyword arguments -----------------------------------------------------------

class ScaledAttention:
    """A callable with an attribute named `fn`, which ft.compile once called instead of the object."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.fn = torch.tanh

    def __call__(self, q, k, v):
        return attention(q, k, v, self.scale)


def test_callable_object_is_what_is_called():
    obj = ScaledAttention(0.5)
    q, k, v = qkv(11)
    fast = ft.compile(obj)
    assert fast.fn is obj and fast.__wrapped__ is obj
    assert_close(fast(q, k, v), obj(q, k, v))
    obj.scale = 0.125                                     # an attribute __call__ reads off self
    assert_close(fast(q, k, v), obj(q, k, v))
    assert len(fast.programs) == 2
    fused(fast)


@pytest.mark.unit
def test_compiled_function_keeps_name_doc_and_wrapped():
    fast = ft.compile(softcapped)
    assert (fast.__name__, fast.__doc__, fast.__wrapped__) == ("softcapped", softcapped.__doc__, softcapped)


def keyformer_like(q, k, v, tau=1.0, *, noise=None):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if noise is not None:
        s = s + noise
    return torch.softmax(s / tau, dim=-1) @ v


def test_keyword_arguments_and_defaults():
    q, k, v = qkv(12)
    noise = torch.randn(B, H, S, S, generator=torch.Generator().manual_seed(13))
    fast = ft.compile(keyformer_like)
    assert_close(fast(q, k, v), keyformer_like(q, k, v))                            # the default tau
    assert_close(fast(q, k, v, tau=2.0), keyformer_like(q, k, v, tau=2.0))
    assert_close(fast(q, k=k, v=v, tau=2.0), keyformer_like(q, k, v, tau=2.0))      # bound: the same plan
    assert len(fast.programs) == 2
    for n in (noise, noise * 3):                                                    # a keyword tensor: an input
        assert_close(fast(q, k, v, tau=2.0, noise=n), keyformer_like(q, k, v, tau=2.0, noise=n))
    assert len(fast.programs) == 3
    fused(fast)


@pytest.mark.unit
def test_arguments_that_do_not_fit_raise_eagers_error():
    fast = ft.compile(keyformer_like, kernels=False)
    q, k, v = qkv(14)
    for args, kwargs in [((q, k), {}), ((q, k, v), {"temperature": 2.0}), ((q, k, v, 1.0), {"tau": 2.0})]:
        with pytest.raises(TypeError) as ours:
            fast(*args, **kwargs)
        with pytest.raises(TypeError) as eager:
            keyformer_like(*args, **kwargs)
        assert str(ours.value) == str(eager.value)
    assert not fast.programs


def test_functools_partial():
    q, k, v = qkv(15)
    fast = ft.compile(functools.partial(keyformer_like, tau=0.5))
    assert_close(fast(q, k, v), keyformer_like(q, k, v, tau=0.5))
    assert_close(fast(q, k, v, tau=4.0), keyformer_like(q, k, v, tau=4.0))   # a keyword overrides the partial's
    assert len(fast.programs) == 2
    fused(fast)


# ---- a Hugging Face-style attention module -------------------------------------------------------------------

def repeat_kv(hidden_states, n_rep):
    batch, heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """As transformers' modeling code writes it: a module-level function that reads the layer it is given."""
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if module.attn_logit_softcapping is not None:
        attn_weights = torch.tanh(attn_weights / module.attn_logit_softcapping) * module.attn_logit_softcapping
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


# the model picks its attention function by name, as transformers' ALL_ATTENTION_FUNCTIONS
ATTENTION_FUNCTIONS = {"eager": eager_attention_forward, "flashtensor": ft.compile(eager_attention_forward)}


class Attention(nn.Module):
    def __init__(self, config: types.SimpleNamespace, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = config.query_pre_attn_scalar ** -0.5
        self.attn_logit_softcapping = config.attn_logit_softcapping[layer_idx]
        kv = config.num_key_value_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        attention_interface = ATTENTION_FUNCTIONS[self.config.attn_implementation]
        out, weights = attention_interface(self, q, k, v, attention_mask, scaling=self.scaling,
                                           dropout=0.0 if not self.training else self.config.attention_dropout)
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), weights


def hf_model(seed: int, implementation: str = "flashtensor") -> tuple:
    torch.manual_seed(seed)
    config = types.SimpleNamespace(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=1,
                                   query_pre_attn_scalar=D, attn_logit_softcapping=[50.0, 1.0],
                                   attention_dropout=0.1, attn_implementation=implementation)
    layers = [Attention(config, i).eval() for i in range(2)]
    x = torch.randn(B, S, H * D)
    mask = torch.triu(torch.full((S, S), -math.inf), diagonal=1)[None, None]
    return config, layers, x, mask


def hf_eager(config, layer, *args):
    config.attn_implementation = "eager"
    try:
        return layer(*args)
    finally:
        config.attn_implementation = "flashtensor"


def test_hf_style_attention_function_is_planned_per_layer():
    """Both layers pass themselves to one compiled attention function; their soft caps differ. The layer is an
    argument, keyed by its state: by its repr, the identical reprs of the two layers shared one plan."""
    config, layers, x, mask = hf_model(16)
    fast = ATTENTION_FUNCTIONS["flashtensor"]
    before = len(fast.programs)
    with torch.no_grad():
        for layer in layers:
            assert_close(layer(x, mask), hf_eager(config, layer, x, mask))
        assert len(fast.programs) == before + 2
        layers[0].attn_logit_softcapping = 20.0          # written after the first call
        assert_close(layers[0](x, attention_mask=mask), hf_eager(config, layers[0], x, mask))
    assert len(fast.programs) == before + 3
    fused(fast)


def test_hf_style_attention_under_grad_mode_runs_eager_with_gradients():
    config, (layer, _), x, mask = hf_model(17)
    fast = ATTENTION_FUNCTIONS["flashtensor"]
    before = len(fast.programs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        out, _ = layer(x, mask)
    grads = torch.autograd.grad(out.square().sum(), list(layer.parameters()))
    ref, _ = hf_eager(config, layer, x, mask)
    assert_close(grads, torch.autograd.grad(ref.square().sum(), list(layer.parameters())))
    assert len(fast.programs) == before


class Projected(nn.Module):
    """A module compiled whole: its weights are captured, so writing or replacing them must replan."""

    def __init__(self) -> None:
        super().__init__()
        self.scaling = D ** -0.5
        self.o_proj = nn.Linear(D, D)

    def forward(self, q, k, v):
        return self.o_proj(attention(q, k, v, self.scaling))


def test_compiled_module_sees_its_weights_and_attributes_change():
    module = Projected().eval()
    q, k, v = qkv(18)
    fast = ft.compile(module)
    with torch.no_grad():
        assert_close(fast(q, k, v), module(q, k, v))
        module.scaling = 0.5
        assert_close(fast(q, k, v), module(q, k, v))
        module.o_proj.weight.mul_(2.0)                   # a weight written in place (an optimizer step)
        assert_close(fast(q, k, v), module(q, k, v))
        module.o_proj = nn.Linear(D, D)                  # a submodule replaced
        assert_close(fast(q, k, v), module(q, k, v))
    assert len(fast.programs) == 4
    fused(fast)
    with warnings.catch_warnings():                      # its parameters require grad: eager under grad mode
        warnings.simplefilter("ignore", FallbackWarning)
        out = fast(q, k, v)
    grads = torch.autograd.grad(out.sum(), list(module.parameters()))
    assert_close(grads, torch.autograd.grad(module(q, k, v).sum(), list(module.parameters())))
    assert len(fast.programs) == 4


# ---- autograd ------------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_inputs_that_require_grad_get_eagers_gradients():
    q, k, v = (t.requires_grad_() for t in qkv(17))
    fast = ft.compile(attention)
    with pytest.warns(FallbackWarning, match="inputs require grad: running attention in eager PyTorch"):
        out = fast(q, k, v)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)      # said once per compiled callable
        out2 = fast(q, k, v)
    assert out.grad_fn is not None and out2.grad_fn is not None
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = torch.autograd.grad(attention(q, k, v).square().sum(), (q, k, v))
    assert_close(grads, ref)
    assert not fast.programs


@pytest.mark.unit
def test_backend_gives_eagers_gradients():
    torch._dynamo.reset()
    q, k, v = (t.requires_grad_() for t in qkv(19))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        out = torch.compile(attention, backend="flashtensor")(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = torch.autograd.grad(attention(q, k, v).square().sum(), (q, k, v))
    assert_close(grads, ref)
    torch._dynamo.reset()


# ---- the backend and Python numbers --------------------------------------------------------------------------

def test_backend_takes_another_python_float():
    """Dynamo passes a float argument as a 0-d tensor read by `.item()` once it has seen two values."""
    torch._dynamo.reset()
    q, k, _ = qkv(20)

    def scores(q, k, tau):
        return torch.softmax(q @ k.transpose(-1, -2) / tau, -1)

    fast = torch.compile(scores, backend="flashtensor")
    for tau in (1.5, 2.0, 3.0, 2.0):
        assert_close(fast(q, k, tau), scores(q, k, tau))
    torch._dynamo.reset()


def test_autocast_state_is_guarded():
    """A plan traced under autocast bakes its bf16 casts in: a call outside autocast must not reuse it (nor one
    inside reuse the float32 plan), in either order; each call gives eager's dtypes and values in its context."""
    def attn(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1)
        return p @ v, p.sum(dim=-2)

    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(3))
    compiled = ft.compile(attn, cache=False)
    for inside in (True, False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=inside):
            out, ref = compiled(q, k, v), attn(q, k, v)
        assert [o.dtype for o in out] == [r.dtype for r in ref] == [torch.bfloat16 if inside else torch.float32] * 2
        if not inside:
            assert_close(out, ref)
        else:
            for o, r in zip(out, ref):
                assert (o.float() - r.float()).abs().max() < 2e-2      # a few bf16 steps near 1
    assert len(compiled.programs) == 2



def test_float32_matmul_precision_is_guarded():
    """Options.f32_dot follows torch's float32 matmul precision (tf32x3 where eager may use TF32): a plan made at
    "high" must not serve a call at "highest", whose eager matmuls are exact; each setting plans once, and its
    kernels take the dot precision it asks for."""
    def attn(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1) @ v

    g = torch.Generator().manual_seed(13)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g) for _ in range(3))
    compiled = ft.compile(attn, cache=False)
    before = torch.get_float32_matmul_precision()
    try:
        for precision in ("high", "highest", "high"):
            torch.set_float32_matmul_precision(precision)
            assert_close(compiled(q, k, v), attn(q, k, v))
            prog = compiled.program_for((q, k, v))
            assert prog.plan.stages["emit"], prog.notes
            spec = next(iter(prog.plan.stages["emit"].values()))[0]
            assert spec.f32_dot == ("ieee" if precision == "highest" else "tf32x3"), (precision, spec.f32_dot)
    finally:
        torch.set_float32_matmul_precision(before)
    assert len(compiled.programs) == 2

def test_default_dtype_is_guarded():
    """A constant the function makes with the default dtype (`torch.full(..., 0.5)`) is traced in it: after
    torch.set_default_dtype, the plan made before must not serve."""
    def scaled(q, k):
        return torch.softmax(q @ k.transpose(-1, -2) * torch.full((), 0.5), dim=-1).sum(dim=-2)

    g = torch.Generator().manual_seed(12)
    q, k = (torch.randn(2, 24, 16, generator=g, dtype=torch.float64) for _ in range(2))
    compiled = ft.compile(scaled, cache=False)
    before = torch.get_default_dtype()
    try:
        for default in (torch.float32, torch.float64):
            torch.set_default_dtype(default)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FallbackWarning)
                out = compiled(q, k)
            assert out.dtype == scaled(q, k).dtype
            assert_close(out, scaled(q, k))
    finally:
        torch.set_default_dtype(before)
    assert len(compiled.programs) == 2
