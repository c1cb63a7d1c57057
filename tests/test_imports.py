"""No import circles in the package, and the fabric never imports the experiments.

A circle means two modules that cannot be read, tested or moved apart, and Python
resolves it only as long as each side imports the other late; so every import
counts here: at the top, inside a function, and under ``TYPE_CHECKING``. The check
reads the source with ``ast`` (nothing is imported), so it sees the code as written.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "innet_aggregation"
ROOT = PACKAGE.name


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = (package.name, *path.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` (at ``path``) imports, anywhere in it.
    ``from a import b`` is module ``a.b`` where that is a module, else ``a``."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[:len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    found = modules(package)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each as
    a path through its modules, so a failure names the imports to break."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(cycle_in(sorted(component), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def cycle_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One circle through the component's first module: a -> b -> ... -> a."""
    members, start = set(component), component[0]
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(edges[path[-1]] & members):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return component


def test_no_import_circles():
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_fabric_does_not_import_experiments():
    """The testbed is what experiments run on: it imports none of them."""
    edges = graph()
    wrong = sorted(f"{a} -> {b}" for a, targets in edges.items()
                   if a.startswith(f"{ROOT}.testbed") for b in targets
                   if b.startswith(f"{ROOT}.experiments"))
    assert not wrong, "the fabric imports experiments:\n" + "\n".join(wrong)


@pytest.mark.parametrize("source, circle", [
    ({"a": "from . import b\n", "b": "def f():\n    from .a import x\n"}, "a -> b -> a"),
    ({"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
      "b": "import pkg.a\n"}, "a -> b -> a"),
    ({"a": "from .b import c\n", "b/__init__.py": "", "b/c": "from ..a import y\n"},
     "a -> b.c -> a"),
])
def test_a_circle_is_found(tmp_path, source, circle):
    """The check itself: a circle through a function's import, a ``TYPE_CHECKING``
    import and a subpackage is named."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in source.items():
        path = package / (name if name.endswith(".py") else f"{name}.py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = circles(graph(package))
    assert [" -> ".join(m.removeprefix("pkg.") for m in c) for c in found] == [circle]
