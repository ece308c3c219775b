"""The package's shape is checked, not hoped for: every import (module-level or inside a function)
goes down the layers, no module is in an import cycle, nothing imports the package root, and no
module grows past 1,000 lines. A new module must be given a layer here, on purpose."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "analyzer"
MAX_LINES = 1000

# Lowest first: a module may import its own layer and the ones before it (architecture.md).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "analyzer._version",
            "analyzer.errors",
            "analyzer.magic",
            "analyzer.vocabulary",
            "analyzer.contract",
            "analyzer.contract_frames",
            "analyzer.model",
            "analyzer.dstack",
            "analyzer.catalogue",
            "analyzer.collector",
            "analyzer.cores",
            "analyzer.interrupts",
            "analyzer.gitleaks",
            "analyzer.redact",
            "analyzer.times",
            "analyzer.progress",
            "analyzer.outputs",
        ),
    ),
    ("sources", ("analyzer.sources",)),
    ("pipeline", ("analyzer.pipeline",)),
    (
        "api",
        (
            "analyzer.api",
            "analyzer.service",
            "analyzer.bundle",
            "analyzer.dataset",
            "analyzer.ingest",
            "analyzer.cluster",
            "analyzer.cluster_local",
            "analyzer.synth",
        ),
    ),
    ("render", ("analyzer.render", "analyzer.terminal")),
    ("cli", ("analyzer.cli", "analyzer.__main__")),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int | None:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def _imports(module: str) -> set[str]:
    """Every analyzer module this one imports, anywhere in its body (lazy imports count)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{alias.name}" for alias in node.names]
            names = [n if n in MODULES else base for n in names]
        else:
            continue
        for name in names:
            while name not in MODULES and "." in name:
                name = name.rpartition(".")[0]
            if name in MODULES and name != module:
                targets.add(name)
    return targets


GRAPH = {module: _imports(module) for module in MODULES}


def test_every_module_has_a_layer():
    assert sorted(m for m in MODULES if m != "analyzer" and _layer(m) is None) == []


def test_nothing_imports_the_package_root():
    """The root loads the public names lazily; importing it from inside would load everything
    (and tie every module into one cycle, as `from analyzer import __version__` once did)."""
    assert sorted(m for m, targets in GRAPH.items() if "analyzer" in targets) == []


def test_imports_only_go_down_the_layers():
    upward = sorted(
        f"{module} ({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})"
        for module, targets in GRAPH.items()
        if module != "analyzer"
        for target in targets
        if target != "analyzer" and _layer(target) > _layer(module)
    )
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_over_a_thousand_lines(module):
    lines = MODULES[module].read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{module}: {lines} lines"


def test_the_checks_can_fail():
    """The cycle finder finds a cycle through three modules and none in a chain, and the
    layers rank the CLI above detection (so a lazy `from analyzer.cli import` in detect fails)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert _layer("analyzer.cli.visual") > _layer("analyzer.pipeline.detect")
    assert _layer("analyzer.not_a_layer") is None
