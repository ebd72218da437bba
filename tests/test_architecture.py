"""The rooms of docs/architecture.md hold: no import cycle in `app/` (type-only
imports included), and each room imports only the rooms its table allows."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parent.parent / "app"
# room -> the rooms of `app` it may import (docs/architecture.md)
ALLOWED = {
    "config": set(),
    "record": set(),
    "metrics": {"record"},
    "engines": {"config", "record"},
    "policies": {"config", "engines", "record"},
    "routing": {"config", "engines", "policies", "record"},
    "drafters": set(),
    "embedded": {"config", "drafters"},
    "bench": {"config", "record", "server"},
    "server": {"api"},
    "frontends": {"api", "config", "engines", "server"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """module -> the `app` modules it imports anywhere (functions and TYPE_CHECKING too)."""
    modules = {module_name(p): p for p in APP.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            found: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("app"):
                found.append(node.module)
                found += [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
            elif isinstance(node, ast.Import):
                found += [a.name for a in node.names if a.name.startswith("app")]
            graph[name] |= {m for m in found if m in modules and m != name}
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "app"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_app() -> None:
    assert cycles(imports()) == []


def test_cycle_finder_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_room_imports_only_what_its_row_allows() -> None:
    wrong = []
    for module, targets in imports().items():
        here = room(module)
        if here not in ALLOWED:
            continue
        for target in targets:
            there = room(target)
            if there != here and there not in ALLOWED[here]:
                wrong.append(f"{module} imports {target}")
    assert wrong == []
