"""Launching a plan's kernels: each step goes through Triton's own launch path the first time it meets a
specialisation (which compiles or finds the kernel), then launches that compiled kernel itself, with the same
arguments, grid and constants; a new alignment of an input's pointer goes through Triton again. The unit test
replaces Triton's kernel and driver with recorders; the GPU test runs real kernels on unaligned views."""
from __future__ import annotations

import math
import types

import pytest
import torch
from triton.knobs import HookChain

import flashtensor as ft
from conftest import assert_close
from flashtensor import knobs, workloads
from flashtensor.runtime import launch
from flashtensor.runtime.launch import Step
from flashtensor.testing import as_tuple, compare_with_exact


class Kernel:
    """A compiled kernel that records its direct launches."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, log: list) -> None:
        self.log = log

    def launch_metadata(self, grid, stream, *args):
        return ("metadata of", grid)

    def run(self, *args):
        self.log.append(("direct", args))


class JitFunction:
    """A @triton.jit function that records the launches through Triton and hands back its compiled kernel."""

    arg_names = ["x", "out", "n", "MODE", "PDL"]

    def __init__(self) -> None:
        self.log: list = []
        self.kernel = Kernel(self.log)

    def __getitem__(self, grid):
        def run(*args, **options):
            self.log.append(("triton", grid, args, options))
            return self.kernel
        return run


@pytest.mark.unit
def test_a_step_launches_through_triton_once_per_specialisation_then_directly(monkeypatch):
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_stream", lambda device: 7)
    hooks = types.SimpleNamespace(launch_enter_hook=HookChain(), launch_exit_hook=HookChain(reversed=True))
    monkeypatch.setattr(launch, "_triton", lambda: (None, hooks))     # Triton's own chains, empty
    fn = JitFunction()
    options = {"MODE": 0, "PDL": False, "num_warps": 4}
    step = Step(fn, (12,), [("in", 0), ("tmp", 0)], [5], options, [0], {}, ("spec",), True)
    base, out = torch.empty(64, dtype=torch.float16), torch.empty(8)
    aligned, unaligned = base[8:], base[1:]      # 16 bytes in, 2 bytes in
    for x in (aligned, aligned, unaligned, unaligned, aligned):
        step.launch({("in", 0): x, ("tmp", 0): out})
    kinds = [e[0] for e in fn.log]
    assert kinds == ["triton", "direct", "triton", "direct", "direct"], kinds
    assert fn.log[0] == ("triton", (12,), (aligned, out, 5), options)
    # grid, stream, the kernel's handles, no launch metadata or hooks, then every argument and the constants
    assert fn.log[1][1] == (12, 1, 1, 7, "function", "metadata", None, None, None, aligned, out, 5, 0, False)
    assert fn.log[3][1][9] is unaligned
    # a profiler's hook: the launch builds its metadata and passes the chains
    hooks.launch_enter_hook.add(print)
    hooks.launch_exit_hook.add(print)
    step.launch({("in", 0): aligned, ("tmp", 0): out})
    assert fn.log[-1][1][6:9] == (("metadata of", (12,)), hooks.launch_enter_hook, hooks.launch_exit_hook)


@pytest.mark.skipif(not torch.cuda.is_available() or knobs.interpret(), reason="launches real kernels on a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_direct_launches_match_eager_on_aligned_and_unaligned_inputs(dtype):
    def h2o(q, k, v):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        p = torch.softmax(s.float(), dim=-1)
        return (p.to(q.dtype) @ v), p.sum(dim=-2)

    g = torch.Generator(device="cuda").manual_seed(3)
    shape = (1, 4, 200, 64)
    fast = ft.compile(h2o, cache=False, eager_if_faster=False)
    for offset in (0, 0, 1, 1, 0):      # an offset of one element leaves the view's pointer unaligned
        q, k, v = (torch.randn(math.prod(shape) + 1, device="cuda", dtype=dtype, generator=g)[offset:]
                   [:math.prod(shape)].view(shape) for _ in range(3))
        with torch.no_grad():
            exact = as_tuple(h2o(q.double(), k.double(), v.double()))
            for o, r, x in zip(as_tuple(fast(q, k, v)), as_tuple(h2o(q, k, v)), exact):
                m = compare_with_exact(o, r, x, dtype)
                assert m.ok, m.problem
    (prog,) = fast.programs.values()
    keys = [key for la in prog.launches for key in la._kernels]
    assert any(all(key[2:]) for key in keys) and any(not all(key[2:]) for key in keys), keys


def test_a_call_reuses_the_last_calls_intermediates_and_never_its_outputs(monkeypatch):
    """A program keeps the intermediates of its last call on this thread and stream at the same sizes (row
    statistics, run-time ranges) and writes them again; outputs are new each call, so an earlier call's results
    stay as they were. Each call takes the next finite-check flag of a pool, zeroed whole as it comes round (here
    of 3): a call launches no fill of its own, and the flag a non-finite input set leaves the next calls' alone."""
    def h2o(q, k, v):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        p = torch.softmax(s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1),
                                        -math.inf), dim=-1)
        return p @ v, p.sum(dim=-2)

    monkeypatch.setattr(launch._Flags, "SIZE", 3)
    device = "cuda" if torch.cuda.is_available() and not knobs.interpret() else "cpu"
    g = torch.Generator().manual_seed(8)
    a, b, c = ([torch.randn(1, 2, 40, 16, generator=g).to(device) for _ in range(3)] for _ in range(3))
    c[1][0, 1, 7, 3] = math.inf            # one key not finite: the fixup pass runs
    fast = ft.compile(h2o, cache=False, eager_if_faster=False)
    calls = (a, b, c, a, b, a, c, a)
    got, flags = [], []
    for k, args in enumerate(calls):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            got.append(fast(*args))
        (prog,) = fast.programs.values()
        ((_, held, _),) = prog._kept.values()
        if k == 0:
            first = dict(held)
            continue
        assert held.keys() == first.keys() and all(held[key] is first[key] for key in held)
        pool = held[launch.FLAGS]
        flags.append(pool.at)
        zeroed = {tuple(e.input_shapes[0]) for e in prof.events() if e.name in ("aten::zero_", "aten::fill_")
                  and e.input_shapes[0] in ([1], [3])}    # a flag or the pool (tests poison new outputs by fills)
        assert zeroed == ({(3,)} if pool.at == 0 else set()), (k, zeroed)
    assert flags == [1, 2, 0, 1, 2, 0, 1]
    for args, outs in zip(calls, got):
        exact = as_tuple(h2o(*(t.double() for t in args)))
        for o, r, x in zip(outs, as_tuple(h2o(*args)), exact):
            m = compare_with_exact(o, r, x, torch.float32)
            assert m.ok, m.problem
    assert got[0][0] is not got[3][0] and got[0][0].data_ptr() != got[3][0].data_ptr()


@pytest.mark.unit
def test_poison_fills_the_buffers_a_plan_allocates():
    """With knobs.poison() (conftest sets it for every test) outputs and intermediates start as NaN or the most
    negative int32, as a GPU's recycled memory may hold anything: a kernel reading what none wrote fails here."""
    with knobs.override(poison=False):
        assert launch._empty() is torch.empty
    with knobs.override(poison=True):
        make = launch._empty()
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            assert make((2, 3), dtype=dtype, device="cpu").isnan().all()
        assert (make((5,), dtype=torch.int32, device="cpu") == -2 ** 31).all()
        assert (make((5,), dtype=torch.int64, device="cpu") == -2 ** 31).all()


@pytest.mark.skipif(not knobs.interpret(), reason="the order of the interpreter's programs (tests/conftest.py)")
def test_the_interpreter_runs_a_grids_programs_last_to_first():
    """Each program stores the count of programs that ran before it: under the tests' interpreter the last runs
    first, so a kernel whose programs read one another's writes fails on the CPU as it may on a GPU."""
    import triton
    import triton.language as tl

    @triton.jit
    def order(counter, out):
        tl.store(out + tl.program_id(0), tl.atomic_add(counter, 1))

    counter, out = torch.zeros(1, dtype=torch.int32), torch.full((5,), -1, dtype=torch.int32)
    order[(5,)](counter, out)
    assert out.tolist() == [4, 3, 2, 1, 0]


def test_a_call_launches_each_kernel_then_each_fixup_pass_from_one_list_per_sizes(monkeypatch):
    """run_kernels launches a call's kernels, then their fixup passes (MODE=1, which return at once for finite
    inputs), in that order, from one list of steps a program keeps per sizes: a second call at the same sizes
    launches the same steps, a call at new sizes in the same plan new ones; every call matches eager."""
    fn, args = workloads.make("h2o", device="cpu", dtype=torch.float32, S=70, H=2, D=16, seed=1)
    c = ft.compile(fn, cache=False, dynamic=True)
    c(*args)        # planning launches the kernels too
    seen: list = []
    real = Step.launch
    monkeypatch.setattr(Step, "launch", lambda self, buffers: seen.append(self) or real(self, buffers))
    calls = []
    for S in (70, 70, 66):
        fn, args = workloads.make("h2o", device="cpu", dtype=torch.float32, S=S, H=2, D=16, seed=S)
        seen.clear()
        assert_close(c(*args), fn(*args))
        calls.append(list(seen))
    order = [(s.fn.__name__, s.options["MODE"]) for s in calls[0]]
    assert order == [("ft_kernel0", 0), ("ft_kernel1", 0), ("ft_kernel0", 1), ("ft_kernel1", 1)], order
    assert [id(s) for s in calls[1]] == [id(s) for s in calls[0]]
    assert not {id(s) for s in calls[2]} & {id(s) for s in calls[0]}
