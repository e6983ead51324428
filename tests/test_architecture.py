"""The package's import graph: no cycles, and no import reaching up a layer.

Built from the source with `ast`: every import counts, at module level or
inside a function, under ``TYPE_CHECKING`` too (a lazy import that dodges a
cycle is still a cycle). docs/architecture.md draws the layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

#: Layers, lowest first; a module may import only its own layer and those below.
#: A module is in the layer of its longest matching prefix; the rest is "worker".
LAYERS: dict[str, int] = {
    # core: data and rules, no I/O
    "awa.errors": 0, "awa.states": 0, "awa.options": 0, "awa.model": 0,
    # leaves the others call: metrics/traces, and the database driver layer
    "awa.telemetry": 1, "awa.db": 1, "awa.embedded": 1,
    # surfaces on top: the package's public names (``awa`` itself, matched
    # exactly), the client facade, CLI, web UI, testing, framework glue
    "awa": 3, "awa._awa": 3, "awa.__main__": 3, "awa.client": 3, "awa.sync": 3,
    "awa.cli": 3, "awa.web": 3, "awa.testing": 3, "awa.contrib": 3,
    # the worker's health listener runs inside the runtime
    "awa.web.health": 2,
}
NAMES = {0: "core", 1: "telemetry/db", 2: "enqueue/worker/maintenance/admin", 3: "surface"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "awa").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for name in names:
                if name != "awa" and not name.startswith("awa."):
                    continue
                target = resolve(name)
                # `from awa import x` in a submodule names x, not the package's re-exports
                if target and target != module and not (target == "awa" and module != "awa"):
                    graph[module].add(target)
    return graph


def _layer(module: str) -> int:
    best, rank = "", 2
    for prefix, value in LAYERS.items():
        nested = prefix != "awa" and module.startswith(prefix + ".")
        if (module == prefix or nested) and len(prefix) > len(best):
            best, rank = prefix, value
    return rank


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
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
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    assert _cycles(_graph()) == []


def test_no_import_reaches_up_a_layer() -> None:
    upward = sorted(f"{m} ({NAMES[_layer(m)]}) imports {t} ({NAMES[_layer(t)]})"
                    for m, targets in _graph().items() for t in targets
                    if _layer(t) > _layer(m))
    assert upward == []


def test_telemetry_is_a_leaf() -> None:
    """The others call telemetry; it calls nothing but the core."""
    assert {t for t in _graph()["awa.telemetry"] if _layer(t) > 0} == set()


def test_the_checks_can_fail() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("awa.db.pool") == 1 and _layer("awa.cli.jobs") == 3
    assert _layer("awa.web.health") == 2 and _layer("awa.runtime") == 2
