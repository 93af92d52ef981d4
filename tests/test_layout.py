"""The library's layout holds: each package imports only the layers below it, no import cycle, no
module over 400 lines (diversed/__init__.py's docstring states the layers)."""

from __future__ import annotations

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1] / "diversed"
PACKAGES = ("engine", "backends", "loading", "evaluation", "training", "jobs", "pipeline", "cli")
BELOW = {
    "core": set(),
    "engine": {"core"},
    "backends": {"core", "engine"},
    "loading": {"core", "engine", "backends"},
    "evaluation": {"core", "engine"},
    "training": {"core"},
    "jobs": {"core", "engine", "backends", "loading", "evaluation", "training"},
    "pipeline": {"core", "engine", "backends", "loading", "evaluation", "training", "jobs"},
    "cli": {"core", "engine", "backends", "loading", "evaluation", "training", "jobs", "pipeline"},
}
"""What each layer may import besides itself. Core is the top-level modules (config, methods,
devices, files, head, provenance) with data/ and sandbox/; the package root only re-exports."""


def module_name(path: Path) -> str:
    parts = path.relative_to(LIBRARY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    return parts[1] if parts[1] in PACKAGES else "core"


def imports(path: Path) -> set[str]:
    """Every diversed module ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("diversed"):
            for alias in node.names:  # ``from diversed.x import y`` may name the module diversed.x.y
                sub = f"{node.module}.{alias.name}"
                is_module = (LIBRARY.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                found.add(sub if is_module else node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("diversed")}
    return found


def upward(graph: dict[str, set[str]]) -> list[str]:
    """The imports that reach a layer not below the importer's."""
    return [
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if layer(source) != "root" and layer(target) not in BELOW[layer(source)] | {layer(source), "root"}
    ]


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (the package root, which only re-exports, left out), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if target == module or layer(target) == "root":
                continue
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target, [*path, target])):
                return found
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


GRAPH = {module_name(p): imports(p) for p in LIBRARY.rglob("*.py")}


def test_every_layer_imports_only_the_layers_below_it():
    assert not upward(GRAPH), upward(GRAPH)


def test_no_import_cycle():
    assert cycle(GRAPH) is None, " -> ".join(cycle(GRAPH))


def test_the_checks_see_an_upward_import_and_a_cycle():
    assert upward({"diversed.engine.cache": {"diversed.backends.cuda.graphs"}}) == [
        "diversed.engine.cache -> diversed.backends.cuda.graphs"
    ]
    loop = {
        "diversed.backends.cpu.onednn": {"diversed.backends.cpu.packed_store"},
        "diversed.backends.cpu.packed_store": {"diversed.backends.cpu.onednn"},
    }
    assert cycle(loop) == [*sorted(loop), sorted(loop)[0]]


def test_no_module_over_400_lines():
    long = {module_name(p): n for p in LIBRARY.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
