"""Markdown reports of a metrics dict, in the paper's column order.

:func:`render_markdown` writes, for any benchmark, a table of the overall numbers followed by
one table per group (source, difficulty, domain, topic, task). For the CRYSTAL benchmark the
overall table also lists the CRYSTAL paper's base-model rows (Table 4, docs/method.md section 9,
:mod:`cpr.paper`), labelled as paper numbers: they are measured on the full CRYSTAL test set,
not on the records evaluated here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpr.evaluation.benchmarks import Benchmark, get_benchmark
from cpr.paper import paper_rows

__all__ = ["flat_metrics", "format_value", "markdown_table", "render_markdown", "summary_table"]

GROUP_TITLES = {
    "source": "Source",
    "difficulty": "Difficulty",
    "domain": "Domain",
    "topic": "Topic",
    "task": "Task",
}


def format_value(value: Any, decimals: int) -> str:
    """``value`` with ``decimals`` decimals; ``"-"`` for ``None``."""
    if value is None:
        return "-"
    return f"{float(value):.{decimals}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table (header row, separator, rows); ``|`` inside cells is escaped."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *(line(r) for r in rows)])


def summary_table(
    label_titles: Sequence[str],
    rows: Sequence[tuple[Sequence[str], Mapping[str, Any]]],
    columns: Sequence[tuple[str, str, int]],
) -> str:
    """Table with label columns, ``n``, then ``columns`` (title, key, decimals) of each summary.

    A summary without ``n`` (paper rows) shows ``-`` there.
    """
    header = [*label_titles, "n", *(title for title, _, _ in columns)]
    body = []
    for labels, summary in rows:
        n = summary.get("n")
        cells = [*labels, "-" if n is None else str(int(n))]
        cells += [format_value(summary.get(key), dec) for _, key, dec in columns]
        body.append(cells)
    return markdown_table(header, body)


def _overall_table(metrics: Mapping[str, Any], bench: Benchmark, model_label: str) -> str:
    rows: list[tuple[Sequence[str], Mapping[str, Any]]] = [((model_label, "this run"), metrics["overall"])]
    if bench.name == "crystal":
        for row in paper_rows("base"):
            rows.append(((row.label, "paper, Table 4 (CRYSTAL test)"), row.as_summary()))
    return summary_table(("Model", "Numbers"), rows, bench.columns)


def _group_table(metrics: Mapping[str, Any], kind: str, bench: Benchmark) -> str:
    groups = metrics["groups"][kind]
    labels = metrics.get("group_labels", {}).get(kind)
    title = GROUP_TITLES.get(kind, kind.capitalize())
    if labels:  # e.g. topic -> domain
        parent = next(k for k in bench.group_kinds if k != kind)
        rows = [((labels.get(name, "unknown"), name), s) for name, s in groups.items()]
        return summary_table((GROUP_TITLES.get(parent, parent.capitalize()), title), rows, bench.columns)
    rows = [((name,), s) for name, s in groups.items()]
    return summary_table((title,), rows, bench.columns)


def render_markdown(metrics: Mapping[str, Any], *, model_label: str = "this model", title: str | None = None) -> str:
    """The markdown report of one benchmark's metrics dict.

    Args:
        metrics: a metrics dict (:mod:`cpr.evaluation.benchmarks.base`).
        model_label: how the evaluated model is named in the tables.
        title: the heading (default ``"<benchmark> evaluation"``).

    Returns:
        Markdown text ending with a newline.
    """
    bench = get_benchmark(metrics["benchmark"])
    parts = [f"# {title or bench.name + ' evaluation'}", "", bench.description + ".", ""]
    parts += ["## Overall", "", _overall_table(metrics, bench, model_label), ""]
    if bench.name == "crystal":
        parts += [
            "Rows marked *paper* are the CRYSTAL paper's base-model numbers (arXiv 2603.13099, Table 4, "
            "full CRYSTAL test set), copied for comparison, not computed here.",
            "",
        ]
    for kind in bench.group_kinds:
        if kind in metrics.get("groups", {}):
            parts += [f"## By {kind}", "", _group_table(metrics, kind, bench), ""]
    scoring = metrics.get("scoring") or {}
    if scoring:
        parts += ["Scoring: " + ", ".join(f"{k} = {v}" for k, v in scoring.items()) + "."]
    formats = metrics.get("formats") or {}
    if formats:
        parts += ["Completion formats: " + ", ".join(f"{k} {v}" for k, v in formats.items()) + "."]
    return "\n".join(parts).rstrip() + "\n"


def flat_metrics(metrics: Mapping[str, Any], *, groups: bool = False) -> dict[str, float]:
    """``{"<benchmark>/<key>": value}`` of the overall summary (and with ``groups``,
    ``"<benchmark>/<kind>/<group>/<key>"`` too), numbers only."""
    name = metrics["benchmark"]
    out = {f"{name}/{k}": float(v) for k, v in metrics["overall"].items() if _is_number(v)}
    if groups:
        for kind, by in metrics.get("groups", {}).items():
            for group, summary in by.items():
                for k, v in summary.items():
                    if _is_number(v):
                        out[f"{name}/{kind}/{group}/{k}"] = float(v)
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
