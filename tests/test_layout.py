"""The package's import layout: no module imports, directly or through others, a module that imports it
(the layers between packages are import-linter's contract in pyproject.toml, run by `make test`)."""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")


def _cycle(graph) -> list[str] | None:
    """One import cycle among the modules of ``graph`` (an import of a module's own parent package, which
    Python runs first anyway, is not counted), or ``None``."""
    edges = {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if not m.startswith(i + "."))
             for m in graph.modules}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for i in edges.get(m, ()):
            if state.get(i) == 1:
                return [*path[path.index(i):], i]
            if i not in state and (found := visit(i)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_module_of_cpr_is_part_of_an_import_cycle():
    graph = grimp.build_graph("cpr")
    assert _cycle(graph) is None


def test_the_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for m in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(m)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p")  # its parent package: not a cycle
    assert _cycle(graph) is None
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    assert _cycle(graph) == ["p.a", "p.b", "p.c", "p.a"]
