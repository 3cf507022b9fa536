"""The tuner on a timed device, run here under Triton's interpreter with the device's timer replaced: every
configuration is compiled side by side before any is timed, each compile is the exact variant (grid, arguments,
launch options) that its launch then runs, so the timed launches and the plan's run compile nothing more, and
the configuration that times fastest is the one the plan runs, matching eager."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import flashtensor as ft
import flashtensor.runtime.autotune as autotune
import flashtensor.runtime.launch as launch
from conftest import assert_close
from flashtensor.runtime.launch import Launch, Step


def decode_h2o(q, k, v):
    """A few queries against longer keys (the key loop splits), causal mask offset, and the column sums."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    sq, sk = s.shape[-2:]
    p = F.softmax(s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(sk - sq + 1), float("-inf")), dim=-1)
    return p @ v, p.sum(dim=-2)


class Recorder:
    """A kernel whose compiles (Triton's warmup) and launches are logged, then done by the real one."""

    def __init__(self, fn, log: list, source) -> None:
        self.fn, self.log, self.source = fn, log, source

    def warmup(self, *args, grid, **options):
        self.log.append(("compile", self, grid, args, options))
        return self.fn.warmup(*args, grid=grid, **options)

    def __getitem__(self, grid):
        def run(*args, **options):
            self.log.append(("launch", self, grid, args, options))
            return self.fn[grid](*args, **options)
        return run


def _same(a, b) -> bool:
    return a[2] == b[2] and a[4] == b[4] and len(a[3]) == len(b[3]) and \
        all(x is y if isinstance(x, torch.Tensor) else x == y for x, y in zip(a[3], b[3]))


@pytest.fixture
def timed_here(monkeypatch):
    """tune() times every configuration, each one's time its position from the end (the last is fastest); kernels
    record what they compile and launch."""
    log: list = []
    timings = 0

    def bench(f, **_):
        nonlocal timings
        f()
        timings += 1
        return 10.0 - timings

    def loaded(k, name=None):
        return Recorder(real(k, name), log, k if name is None else None)
    real = launch.load_kernel
    monkeypatch.setattr(autotune, "timed", lambda device: True)
    monkeypatch.setattr("triton.testing.do_bench", bench)
    monkeypatch.setattr(autotune, "load_kernel", loaded)
    monkeypatch.setattr(launch, "load_kernel", loaded)
    return log


def test_every_configuration_compiles_first_as_it_then_launches(timed_here):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (4, 300, 300))
    configs = ((128, 64, 4, 2), (64, 32, 4, 2), (32, 64, 4, 3))
    c = ft.compile(decode_h2o, cache=False, configs=configs, split_programs=16, eager_if_faster=False)
    out = c(q, k, v)
    assert_close(out, decode_h2o(q, k, v))
    log = timed_here
    kernels = {e[1] for e in log}
    assert len(kernels) >= len(configs), "one kernel per configuration at least"
    for kern in kernels:
        events = [e for e in log if e[1] is kern]
        launches = [e for e in events if e[0] == "launch"]
        if not launches:
            continue
        first = events.index(launches[0])
        assert any(e[0] == "compile" and _same(e, launches[0]) for e in events[:first]), \
            "a configuration launched a variant it was not compiled for first"
    # the fastest configuration of each kernel (the last timed) is the one the plan runs
    def key(k):
        return k.source, k.num_warps, k.num_stages
    timed: dict[str, list[tuple]] = {}
    for e in log:       # timed one at a time, so in the order of their first launches
        if e[0] == "launch" and e[1].source is not None and key(e[1].source) not in timed.get(e[1].source.name, []):
            timed.setdefault(e[1].source.name, []).append(key(e[1].source))
    (prog,) = c.programs.values()
    assert len(prog.kernels) == len(timed) and all(len(t) == len(configs) for t in timed.values()), timed.keys()
    assert all(key(kern) == timed[kern.name][-1] for kern in prog.kernels)


def test_a_configuration_that_fails_to_compile_is_left_to_its_launch(caplog):
    """compile_all logs a failing compile and returns; the tuner's launch raises it again and skips that one."""
    class Broken:
        def warmup(self, *args, **options):
            raise RuntimeError("out of shared memory")

    la = Launch.__new__(Launch)
    la.steps = lambda buffers, fixup, after_prior: [Step(Broken(), (1,), [], [], {}, [], {}, (), False)]
    la.source = type("S", (), {"name": "ft_kernel0"})()
    with caplog.at_level("DEBUG", logger="flashtensor.runtime.autotune"):
        autotune.compile_all([(la, {}, False, False)])
    assert any("out of shared memory" in r.getMessage() for r in caplog.records)
