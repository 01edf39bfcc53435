"""Markdown reports of a metrics dict, in the paper's column order.

Where the records are CRYSTAL's test set (:func:`is_crystal_test`) the overall table also lists the
CRYSTAL paper's base-model rows (Table 4, docs/method.md section 9), labelled as paper numbers measured
on the full CRYSTAL test set; beside numbers on other records they would compare unlike things.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cpr.markdown import format_value, markdown_table, summary_table

__all__ = ["flat_metrics", "format_value", "is_crystal_test", "markdown_table", "render_markdown", "sampled_columns",
           "summary_table"]


def is_crystal_test(sources: Sequence[tuple[str, str | None]]) -> bool:
    """True when the records come from CRYSTAL's test set only: ``sources`` (``(adapter, split)`` of each
    dataset the records were read from) is non-empty and each is the ``crystal`` adapter's ``test`` split."""
    return bool(sources) and all(source == "crystal" and split == "test" for source, split in sources)


def render_markdown(metrics: Mapping[str, Any], *, model_label: str = "this model", title: str | None = None,
                    paper_rows: bool = False) -> str:
    """The markdown report of one benchmark's metrics dict (:mod:`cpr.evaluation.benchmarks.base`): the
    overall table (with ``paper_rows``, for CRYSTAL, the paper's base-model rows: pass it only for records of
    CRYSTAL's test set, :func:`is_crystal_test`), then one table per group kind (a kind with ``group_labels``
    is listed under its parent kind, e.g. M3CoT topics under their domain). Ends with a newline."""
    from cpr.evaluation.benchmarks import get_benchmark
    from cpr.paper import paper_rows as paper_table

    bench = get_benchmark(metrics["benchmark"])
    rows: list[tuple[Sequence[str], Mapping[str, Any]]] = [((model_label, "this run"), metrics["overall"])]
    paper_rows = paper_rows and bench.name == "crystal"
    if paper_rows:
        rows += [((r.label, "paper, Table 4 (CRYSTAL test)"), r.as_summary()) for r in paper_table("base")]
    parts = [f"# {title or bench.name + ' evaluation'}", "", bench.description + ".", "", "## Overall", "",
             summary_table(("Model", "Numbers"), rows, bench.columns), ""]
    if paper_rows:
        parts += ["Rows marked *paper* are the CRYSTAL paper's base-model numbers (arXiv 2603.13099, Table 4, "
                  "full CRYSTAL test set), copied for comparison, not computed here.", ""]
    overall = metrics["overall"]
    if isinstance(overall.get("lucky_guess_rate"), (int, float)):
        parts += [f"Lucky-guess rate (correct answer, Match F1 below 0.5): {overall['lucky_guess_rate']:.2f}% of the "
                  "greedy completions.", ""]
    if metrics.get("sampled"):
        k = int(metrics["sampled"]["samples_per_item"])
        parts += [f"## Sampled decoding ({k} per item, temperature {metrics['sampled']['temperature']:g}, top_p "
                  f"{metrics['sampled']['top_p']:g}, seed {metrics['sampled']['seed']})", "",
                  summary_table(("Model",), [((model_label,), overall)], sampled_columns(bench.columns, k, overall)),
                  "", f"mean@{k}: the mean over an item's {k} samples, then over items (pass@1 of reasoning-RL "
                  f"papers); pass@{k}: percent of items with a correct sample; Lucky: the lucky-guess rate over all "
                  "sampled completions.", ""]
    for kind in bench.group_kinds:
        groups = metrics.get("groups", {}).get(kind)
        if groups is None:
            continue
        labels = metrics.get("group_labels", {}).get(kind)
        if labels:
            parent = next(k for k in bench.group_kinds if k != kind)
            table = summary_table((parent.capitalize(), kind.capitalize()),
                                  [((labels.get(g, "unknown"), g), s) for g, s in groups.items()], bench.columns)
        else:
            table = summary_table((kind.capitalize(),), [((g,), s) for g, s in groups.items()], bench.columns)
        parts += [f"## By {kind}", "", table, ""]
    for name, key, sep in (("Scoring", "scoring", " = "), ("Completion formats", "formats", " ")):
        if metrics.get(key):
            parts.append(f"{name}: " + ", ".join(f"{k}{sep}{v}" for k, v in metrics[key].items()) + ".")
    return "\n".join(parts).rstrip() + "\n"


def sampled_columns(columns: Sequence[tuple[str, str, int]], k: int,
                    overall: Mapping[str, Any] | None = None) -> list[tuple[str, str, int]]:
    """The sampled-decoding columns of a benchmark's ``columns``: ``"<title> mean@<k>"`` of each
    (``sampled_<key>``), ``"Acc pass@<k>"`` and ``"Lucky mean@<k>"``; with ``overall``, only the keys it holds."""
    out = [(f"{title} mean@{k}", f"sampled_{key}", dec) for title, key, dec in columns]
    out += [(f"Acc pass@{k}", "pass_at_k", 2), (f"Lucky mean@{k}", "sampled_lucky_guess_rate", 2)]
    return [c for c in out if overall is None or c[1] in overall]


def flat_metrics(metrics: Mapping[str, Any], *, groups: bool = False) -> dict[str, float]:
    """``{"<benchmark>/<key>": value}`` of the overall summary (with ``groups``, also
    ``"<benchmark>/<kind>/<group>/<key>"``), numbers only."""

    def numbers(prefix: str, summary: Mapping[str, Any]) -> dict[str, float]:
        return {f"{prefix}/{k}": float(v) for k, v in summary.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}

    name = metrics["benchmark"]
    out = numbers(name, metrics["overall"])
    for kind, by in metrics.get("groups", {}).items() if groups else ():
        for group, summary in by.items():
            out.update(numbers(f"{name}/{kind}/{group}", summary))
    return out
