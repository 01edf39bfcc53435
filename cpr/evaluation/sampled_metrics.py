"""Sampled evaluation: ``k`` seeded completions per item beside the greedy one, scored as mean@k and pass@k.

``evaluation.decoding: {mode: sampled, ...}`` / ``cpr eval --decoding sampled``
(:class:`cpr.evaluation.generation.DecodingSettings`); the files and numbers: docs/evaluation.md.

Seeding: :func:`~cpr.evaluation.generation.batch_seed` (a resumed run draws what an uninterrupted one draws).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cpr.data.records import Record
from cpr.evaluation.generation import DecodingSettings, batch_seed, sharded_rounds

__all__ = ["SAMPLED_COMPLETIONS", "SAMPLED_SAMPLES", "add_sampled_metrics", "generate_samples"]

SAMPLED_COMPLETIONS, SAMPLED_SAMPLES = "sampled_completions.jsonl", "sampled_samples.jsonl"


def generate_samples(generator: Any, records: Sequence[Record],
                     messages_fn: Callable[[Record], list[dict[str, Any]]], decoding: DecodingSettings, *,
                     batch_size: int = 8, output_path: str | Path | None = None, progress: bool = True,
                     description: str = "sampling", shard: Any = None) -> dict[str, list[str]]:
    """``decoding.samples`` completions for every record with ``generator.sample(batch, decoding, seed)``
    (:meth:`cpr.evaluation.generation.TransformersGenerator.sample`), each finished batch appended to
    ``output_path``; ``shard`` as :func:`cpr.evaluation.generation.generate_completions`.

    Returns:
        id -> its completions in sample order, those read back from the file included (on every process).

    Raises:
        ValueError: duplicate record ids, or a generator returning the wrong number of completions.
        InputError: a malformed file, or a sample index not below ``decoding.samples`` (file, line, field).
        RuntimeError: with ``shard``, sampling failed on another process (its error named).
    """
    from cpr.errors import InputError
    from cpr.scoring import load_sampled_predictions

    k, ids = decoding.samples, [r.id for r in records]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate record id {next(i for i in ids if ids.count(i) > 1)!r}")
    done: dict[str, dict[int, str]] = {}
    if output_path is not None and Path(output_path).is_file():
        done, lines = load_sampled_predictions(output_path, skip_truncated_tail=True)
        for rid, by in done.items():
            if max(by) >= k:
                raise InputError(f"holds sample {max(by)}, but decoding draws {k} per item; use another output folder",
                                 path=output_path, line=lines[rid], record_id=rid, field="sample")
    complete = {rid for rid, by in done.items() if len(by) == k}
    batches = [records[start: start + batch_size] for start in range(0, len(records), batch_size)]
    batches = [b for b in batches if not all(r.id in complete for r in b)]

    def sample(batch: Sequence[Record]) -> list[dict[str, Any]]:
        outputs = generator.sample([messages_fn(r) for r in batch], decoding, batch_seed(decoding.seed, batch[0].id))
        if len(outputs) != len(batch) or any(len(o) != k for o in outputs):
            raise ValueError(f"generator returned {[len(o) for o in outputs]} completions for {len(batch)} prompts "
                             f"x {k} samples")
        return [{"id": r.id, "sample": j, "completion": g.text, "num_tokens": g.num_tokens, "finished": g.finished}
                for r, gens in zip(batch, outputs, strict=True) for j, g in enumerate(gens)
                if j not in done.get(r.id, {})]

    for rows in sharded_rounds(batches, shard, sample, output_path, total=len(ids), initial=len(complete & set(ids)),
                               description=description, progress=progress):
        for row in rows:
            done.setdefault(row["id"], {})[row["sample"]] = row["completion"]
    return {rid: [done[rid][j] for j in range(k)] for rid in ids}


def add_sampled_metrics(metrics: dict[str, Any], scored: Sequence[Mapping[str, Any]],
                        decoding: DecodingSettings) -> dict[str, Any]:
    """``metrics`` (the greedy metrics dict) with the sampled numbers beside the greedy ones.

    Args:
        scored: the benchmark's metrics dict of each sample index ``j`` (its records' ``j``-th completions
            scored alone), ``decoding.samples`` of them.

    Returns:
        ``metrics`` with ``overall["sampled_<key>"]`` the mean@k of every numeric overall key
        (:func:`cpr.scoring.mean_at_k`; ``sampled_lucky_guess_rate`` is over all k x n completions),
        ``overall["pass_at_k"]`` where rows have ``correct``, ``"sampled"`` (``samples_per_item``, the
        decoding, the parser counts) and ``"sampled_samples"`` (every scored row with its ``sample``).
    """
    from cpr.scoring import mean_at_k, pass_at_k

    rows = [m["samples"] for m in scored]
    overall = metrics["overall"]
    overall.update({f"sampled_{k}": v for k, v in mean_at_k([m["overall"] for m in scored]).items()})
    passed = pass_at_k(rows)
    if passed is not None:
        overall["pass_at_k"] = passed
    formats: dict[str, int] = {}
    for m in scored:
        for name, count in (m.get("formats") or {}).items():
            formats[name] = formats.get(name, 0) + count
    metrics["sampled"] = {"samples_per_item": decoding.samples, "temperature": decoding.temperature,
                          "top_p": decoding.top_p, "seed": decoding.seed, "formats": formats}
    metrics["sampled_samples"] = [{**s, "sample": j} for j, r in enumerate(rows) for s in r]
    return metrics
