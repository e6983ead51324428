"""The package's import graph: no cycles, and no import reaching up a layer.

Built from the source with `ast`: every import counts, at module level or
inside a function, under ``TYPE_CHECKING`` too (a lazy import that dodges a
cycle is still a cycle). docs/architecture.md draws the layers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"

#: Layers, lowest first; a module may import only its own layer and those below.
#: A module is in the layer of its longest matching prefix (``awa`` itself is
#: matched exactly). docs/architecture.md draws the same picture.
LAYERS: dict[str, int] = {
    "awa.core": 0,                       # rules and data, no I/O
    "awa.db": 1, "awa.telemetry": 1,     # the driver layer; metrics, traces, job log
    "awa.enqueue": 2,                    # value -> job row
    "awa.maintenance": 3,                # periodic services (leader, rescue, cron...)
    "awa.worker": 4,                     # claim -> execute -> complete
    "awa.admin": 5,                      # operator actions from outside a worker
    # surfaces: the public API, the client facade, CLI, web, testing, integrations
    "awa": 6, "awa._awa": 6, "awa._moved": 6, "awa.__main__": 6, "awa.bridge": 6,
    "awa.callback_contract": 6, "awa.client": 6, "awa.sync": 6, "awa.cli": 6, "awa.web": 6,
    "awa.testing": 6, "awa.contrib": 6,
}
NAMES = {0: "core", 1: "db/telemetry", 2: "enqueue", 3: "maintenance", 4: "worker",
         5: "admin", 6: "surface"}


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
        graph[module] = _imports(module, path.name == "__init__.py", path.read_text(),
                                 set(modules), str(path))
    return graph


def _imports(module: str, is_package: bool, source: str, modules: set[str],
             filename: str = "<source>") -> set[str]:
    """The modules of ``modules`` that ``source`` (the text of ``module``) imports."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    package = module if is_package else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        names: list[str] = []
        reexport = False  # reads a name that `awa/__init__.py` re-exports
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            reexport = "awa" in names
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            reexport = base == "awa" and any(f"awa.{alias.name}" not in modules
                                             for alias in node.names)
        for name in names:
            if name != "awa" and not name.startswith("awa."):
                continue
            target = resolve(name)
            # `from awa import sub` in a submodule names the submodule `awa.sub` (the
            # package itself is already loaded); any other name from `awa` is one of
            # the surface's re-exports (`__version__` too), an import of the surface
            if target == "awa" and module != "awa" and not reexport:
                continue
            if target and target != module:
                targets.add(target)
    return targets


def _layer(module: str) -> int:
    best, rank = "", -1
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
    graph = _graph()
    for module in (m for m in graph if m.startswith("awa.telemetry")):
        assert {t for t in graph[module] if not t.startswith("awa.telemetry")
                and _layer(t) > 0} == set(), module


def test_the_checks_can_fail() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("awa.db.pool") == 1 and _layer("awa.cli.jobs") == 6
    assert _layer("awa.worker.health") == 4 and _layer("awa.enqueue.producer") == 2
    assert _layer("awa") == 6 and _layer("awa.core.states") == 0


def test_a_name_from_the_package_is_an_import_of_the_surface() -> None:
    modules = {"awa", "awa.core", "awa.core.version", "awa.worker", "awa.worker.presence"}
    imports = lambda source: _imports("awa.worker.presence", False, source, modules)  # noqa: E731
    assert imports("from awa import __version__") == {"awa"}
    assert imports("import awa") == {"awa"}
    assert imports("from awa import core") == {"awa.core"}
    assert imports("from awa.core.version import __version__") == {"awa.core.version"}


def test_every_module_has_a_layer() -> None:
    assert sorted(m for m in _graph() if _layer(m) < 0) == []


def test_the_architecture_doc_draws_every_module() -> None:
    """docs/architecture.md's diagram names every module of each layered subpackage,
    and a paragraph introduces each subpackage: the map matches the code."""
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    diagram = doc.split("```")[1]
    missing = []
    for package in ("core", "db", "telemetry", "enqueue", "maintenance", "worker", "admin"):
        if f"**`awa/{package}`**" not in doc:
            missing.append(f"paragraph for awa/{package}")
        for path in (SRC / "awa" / package).glob("*.py"):
            if path.stem != "__init__" and path.stem not in diagram:
                missing.append(f"awa.{package}.{path.stem}")
    assert missing == []


#: A module's entry in docs/architecture.md's module list: ``- `path` — summary``.
DOC_ENTRY = re.compile(r"^- `awa/(?P<path>[^`]+\.py)` — (?P<summary>.+)$", re.MULTILINE)


def _summary(path: Path) -> str | None:
    """A module's description: its docstring's first paragraph on one line (None: no
    docstring, allowed only for an empty file)."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    return " ".join(doc.split("\n\n")[0].split()) if doc else None


def _doc_entries() -> dict[str, str]:
    doc = (SRC.parent / "docs" / "architecture.md").read_text()
    return {m["path"]: m["summary"] for m in DOC_ENTRY.finditer(doc)}


def test_the_architecture_doc_describes_each_module_as_its_docstring_does() -> None:
    """docs/architecture.md lists every module with its docstring's first paragraph,
    word for word: a module added, removed or redescribed fails here until the list
    says the same (the message has the lines to paste)."""
    listed = _doc_entries()
    wrong = []
    for path in sorted((SRC / "awa").rglob("*.py")):
        name = path.relative_to(SRC / "awa").as_posix()
        summary = _summary(path)
        if summary is None:
            if path.read_text().strip():
                wrong.append(f"{name}: a module needs a docstring")
            continue
        if listed.pop(name, None) != summary:
            wrong.append(f"- `awa/{name}` — {summary}")
    wrong += [f"listed but no such module: awa/{name}" for name in listed]
    assert wrong == [], "\n".join(wrong)


def test_comments_cite_only_what_this_repository_holds() -> None:
    """A rule is said where it applies, or cites a doc of this repository: the
    design spec's sections and ADR numbers are not here for a reader to follow."""
    cite = re.compile(r"spec §|\bADR-?\d+")
    found = [f"{path.relative_to(SRC.parent)}:{n}"
             for root in (SRC / "awa", SRC.parent / "docs", SRC.parent / "tests")
             for path in sorted(root.rglob("*")) if path.suffix in {".py", ".sql", ".md"}
             and path.name != "test_architecture.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if cite.search(line)]
    assert found == []
