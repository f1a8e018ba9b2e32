"""The layers of the source, held by reading every module's imports (ast, nothing runs).

    worldline.wire     the vocabulary of the wire: errors, paths, frames, the policy
                       (imports neither side, and at its top only the standard library)
    worldline.client   the CLI, the clients, the hooks; of the daemon only its one
                       entry point (``worldline.daemon.main``, by which the CLI starts it)
    worldline.daemon   never the client; within it:
        storage        never capture
        capture        never the world nor the edge
        the domain     (all but ``daemon/edge/`` and ``daemon/main.py``) never grpc

and no import cycle among the modules of worldline: neither among the imports a
module makes when it is imported (at its top level, under ``try``/``if`` too), which
would leave a module half-initialised, nor counting the imports made inside functions.
A function's import runs after every module has loaded, so it cannot break a start;
it is how a module defers a heavy or optional import (grpc for ``worldline hook``,
psycopg for the fleet), not a way around a circle: two modules that need each other
are one module, or share a third. ``CALL_CYCLES_ALLOWED`` names a function's import
that may close a circle, each with its reason (none today). ``if TYPE_CHECKING:``
imports never run and are left out.

A failure names each offending import: the module, its line and what it imports.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Source folders and the package each holds (pyproject.toml's package-dir).
PACKAGES = (("client/langgraph", "worldline.langgraph"), ("client", "worldline.client"),
            ("daemon", "worldline.daemon"), ("proto/worldline/wire", "worldline.wire"),
            ("proto/worldline/v1", "worldline.v1"))
ENTRY_POINT = "worldline.daemon.main"  # the daemon's one door for the client (the CLI)
WORLD = "worldline.daemon.world"  # a module today, a package when split: both match
DOMAIN_EXEMPT = ("worldline.daemon.edge", "worldline.daemon.main")
# (importing module, imported module) of a function's import allowed to close a circle,
# with the reason; empty: every circle is a finding.
CALL_CYCLES_ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (a package's submodule when ``from pkg import mod``)
    line: int
    when: str  # "top": as the source is imported; "call": in a function; "typing": never

    def __str__(self) -> str:
        return f"{self.source} (line {self.line}) imports {self.target}"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder, package in PACKAGES:
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts]
            if any(p in ("tests", "__pycache__") for p in parts) or path.name.endswith(
                    ("_pb2.py", "_pb2_grpc.py")):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            found.setdefault(name, path)  # client/langgraph is worldline.langgraph
    return found


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(name: str, path: Path) -> list[Import]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[Import] = []

    def resolve(module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = package.split(".")
        base = base[:len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def visit(nodes: list[ast.AST], when: str) -> None:
        for child in nodes:
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(list(ast.iter_child_nodes(child)), "call" if when == "top" else when)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                visit(child.body, "typing")
                visit(child.orelse, when)
            elif isinstance(child, ast.Import):
                out.extend(Import(name, alias.name, child.lineno, when) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = resolve(child.module, child.level)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    out.append(Import(name, sub if sub in MODULES else base, child.lineno, when))
            else:
                visit(list(ast.iter_child_nodes(child)), when)

    visit(tree.body, "top")
    return list(dict.fromkeys(out))  # `from m import a, b` is one import of m


IMPORTS = [imp for name, path in MODULES.items() for imp in _imports(name, path)]


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _offending(source: tuple[str, ...], target: tuple[str, ...],
               allowed=lambda imp: False) -> list[str]:
    return [str(imp) for imp in IMPORTS
            if _under(imp.source, *source) and _under(imp.target, *target) and not allowed(imp)]


def _hold(rule: str, offending: list[str]) -> None:
    """Fail naming every import that breaks ``rule``, one a line."""
    if offending:
        pytest.fail(f"{rule}:\n  " + "\n  ".join(offending), pytrace=False)


def test_the_modules_are_found():
    """The walk sees the source (a guard against a test that passes on nothing)."""
    assert {"worldline.daemon.main", "worldline.client.cli", "worldline.wire.errors",
            "worldline.daemon.storage.store", "worldline.daemon.capture.snapshot"} <= set(MODULES)
    assert any(imp.target == "grpc" for imp in IMPORTS)


def test_the_daemon_never_imports_the_client():
    _hold("the daemon imports the client",
          _offending(("worldline.daemon",), ("worldline.client", "worldline.langgraph")))


def test_the_client_imports_of_the_daemon_only_its_entry_point():
    entry = lambda imp: imp.target == ENTRY_POINT and imp.source == "worldline.client.cli"
    _hold(f"the client imports the daemon beyond {ENTRY_POINT}",
          _offending(("worldline.client", "worldline.langgraph"), ("worldline.daemon",), entry))


def test_the_wire_imports_neither_side():
    _hold("the wire imports a side of it", _offending(
        ("worldline.wire",), ("worldline.daemon", "worldline.client", "worldline.langgraph")))


def test_the_wire_loads_only_the_standard_library():
    """``worldline hook`` (a new process on every tool call) loads the wire: at their top,
    its modules import the standard library and each other, nothing heavier."""
    heavy = [str(imp) for imp in IMPORTS if _under(imp.source, "worldline.wire")
             and imp.when == "top" and imp.target.split(".")[0] not in sys.stdlib_module_names
             and not _under(imp.target, "worldline.wire")]
    _hold("the wire loads more than the standard library", heavy)


def test_storage_never_imports_capture():
    _hold("storage imports capture",
          _offending(("worldline.daemon.storage",), ("worldline.daemon.capture",)))


def test_capture_never_imports_the_world_nor_the_edge():
    _hold("capture imports the world or the edge",
          _offending(("worldline.daemon.capture",), (WORLD, "worldline.daemon.edge")))


def test_the_domain_never_imports_grpc():
    edge = lambda imp: _under(imp.source, *DOMAIN_EXEMPT)
    _hold("the domain imports grpc", _offending(
        ("worldline.daemon",), ("grpc", "grpc_health", "grpc_reflection"), edge))


def cycles(imports: list[Import]) -> list[list[Import]]:
    """The import cycles among the modules of ``imports`` (Tarjan's strongly connected
    components; each circle given as one path of imports around it)."""
    graph: dict[str, list[Import]] = {}
    for imp in imports:
        if imp.target in MODULES and imp.target != imp.source:
            graph.setdefault(imp.source, []).append(imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for imp in graph.get(v, ()):
            w = imp.target
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_circle(graph, sorted(c)[0], c) for c in components]


def _circle(graph: dict[str, list[Import]], start: str, within: set[str]) -> list[Import]:
    """One path of imports from ``start`` back to it, inside one component (BFS)."""
    paths: dict[str, list[Import]] = {start: []}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for imp in graph.get(v, ()):
            if imp.target == start:
                return paths[v] + [imp]
            if imp.target in within and imp.target not in paths:
                paths[imp.target] = paths[v] + [imp]
                queue.append(imp.target)
    raise AssertionError(f"no circle through {start}")


def test_no_import_cycles_at_import_time():
    found = cycles([imp for imp in IMPORTS if imp.when == "top"])
    _hold("import cycles at import time (each: a path of imports back to its first module)",
          [" -> ".join(map(str, circle)) for circle in found])


def test_no_import_cycles_through_functions():
    found = cycles([imp for imp in IMPORTS if imp.when == "top" or (
        imp.when == "call" and (imp.source, imp.target) not in CALL_CYCLES_ALLOWED)])
    _hold("import cycles counting imports inside functions (each: a path of imports back"
          " to its first module)", [" -> ".join(map(str, circle)) for circle in found])


def test_cycles_finds_a_circle():
    """The check above can fail: a circle of two made-up imports is found."""
    a, b = "worldline.daemon.ids", "worldline.daemon.records"
    found = cycles([Import(a, b, 1, "top"), Import(b, a, 2, "top")])
    assert [[(i.source, i.target) for i in c] for c in found] == [[(a, b), (b, a)]]
