"""The package's structure: imports run downward through the layers, there is no import circle, and no
source file passes 600 lines (docs/design.md §8)."""
import ast
from pathlib import Path

import pytest

import flashtensor

pytestmark = pytest.mark.unit

ROOT = Path(flashtensor.__file__).parent
# lowest first; a module may import its own layer and those below it
LAYERS = [
    {"options", "knobs", "version", "testing", "workloads", "caller"},
    {"ir"},
    {"frontend", "transform", "analysis", "partition"},
    {"schedule"},
    {"codegen"},
    {"runtime"},
    {"driver"},
    {"api"},
    {"__init__"},
    {"bench", "cli", "__main__", "integrations"},
]
LAYER = {name: k for k, names in enumerate(LAYERS) for name in names}


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Package modules that `name` imports, relative imports resolved."""
    package = name.split(".") if path.name == "__init__.py" and name != "__init__" else name.split(".")[:-1]
    if name == "__init__":
        package = []
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1] if node.level > 1 else package
                mod = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("flashtensor"):
                mod = node.module[len("flashtensor."):] if node.module != "flashtensor" else ""
            else:
                continue
            # `from . import knobs` imports the module knobs; `from .ir.ops import Op` the module ir.ops
            targets = [sub if (sub := f"{mod}.{a.name}" if mod else a.name) in known else mod for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name[len("flashtensor."):] for a in node.names if a.name.startswith("flashtensor.")]
            targets += ["__init__" for a in node.names if a.name == "flashtensor"]
        for t in targets:
            t = t or "__init__"
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def _layer(mod: str) -> int:
    return LAYER[mod.split(".")[0]]


def test_imports_run_downward():
    up = [f"{m} -> {t}" for m, ts in _graph().items() for t in ts if _layer(t) > _layer(m)]
    assert not up, up


def test_no_import_circle():
    graph, state, cycles = _graph(), {}, []

    def visit(m, stack):
        state[m] = "open"
        for t in sorted(graph.get(m, ())):
            if state.get(t) == "open":
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_every_module_has_a_layer_and_none_is_long():
    mods = _modules()
    assert all(m.split(".")[0] in LAYER for m in mods), sorted(m for m in mods if m.split(".")[0] not in LAYER)
    long = {m: n for m, p in mods.items() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
