"""The package's import layout: no module imports, directly or through others, a module that imports it
(the layers between packages are import-linter's contract in pyproject.toml, run by `make test`); no
script or test reaches a module by editing ``sys.path``."""

from __future__ import annotations

import re
from pathlib import Path

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


def test_no_python_file_of_the_repository_edits_sys_path():
    """cpr and cpr_tools (the tiny models, the step pairs) are installed packages (pyproject.toml): recipes,
    tests, benchmarks and report probes import them as such, and the scripts tests write out do too."""
    repo = Path(__file__).resolve().parents[1]
    edit = re.compile(r"sys\.path\.(?:insert|append|extend)\(|sys\.path\s*(?:\+=|=[^=])")
    found = [f"{path.relative_to(repo)}:{n}"
             for folder in ("cpr", "cpr_tools", "recipes", "tests", "benchmarks", "reports")
             for path in sorted((repo / folder).rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if edit.search(line)]
    assert found == []
