"""``cpr eval``: generate completions with a model on a benchmark and score them.

Writes into ``--output DIR``: ``completions.jsonl`` (batch by batch; a rerun resumes), ``references.jsonl``
(CRYSTAL / M3CoT: ``cpr score``'s REFS records, so ``cpr score`` on it and ``completions.jsonl``
reproduces ``overall``; VLRMBench: the shown steps and their labels), ``samples.jsonl``, ``metrics.json``
and ``metrics.md`` (paper column order; for CRYSTAL the paper's base-model rows beside ours), and
``eval_config.json``: a rerun into DIR must use the same model, adapter, benchmark, data, image size
and decoding settings, so completions of two setups never mix. ``--decoding sampled`` adds
``sampled_completions.jsonl`` (``--samples`` rows per item, each with its ``sample`` index; ``cpr score``
re-scores it) and ``sampled_samples.jsonl``, and reports mean@k and pass@k beside the greedy numbers.

The adapter must have been trained on ``--model`` (unless ``--allow-base-mismatch``). The processor gets
the image size limits the adapter was trained with (``model.min_pixels`` / ``model.max_pixels`` of the
``config.yaml`` of its run folder, ``<run>/<phase>/adapter`` or ``<run>/<phase>/checkpoint-N``) unless
``--min-pixels`` / ``--max-pixels`` set them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cpr.errors import InputError

__all__ = ["register", "run"]

#: eval_config.json keys that must match when a run resumes into an existing output folder.
RESUME_KEYS = ("model", "adapter", "benchmark", "source", "data", "split", "prompt_mode", "max_new_tokens",
               "min_pixels", "max_pixels", "decoding")
#: The flags of sampled decoding (cpr.evaluation.generation.DecodingSettings fields) and their defaults.
SAMPLING_FLAGS = {"temperature": 1.0, "top_p": 1.0, "samples": 4, "seed": 0}


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``eval`` command to ``cpr``'s sub-parsers."""
    from cpr.evaluation.benchmarks import BENCHMARKS
    from cpr.evaluation.generation import BACKENDS, DECODING_MODES
    from cpr.scoring import add_scoring_arguments

    p = subparsers.add_parser("eval", help="generate with a model on a benchmark and score it (crystal, m3cot, "
                              "vlrmbench)", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="base model or merged checkpoint: folder or hub id")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder (PEFT) applied to --model")
    p.add_argument("--allow-base-mismatch", action="store_true",
                   help="apply --adapter even if trained on another base model (e.g. a hub id at another revision)")
    for flag in ("--min-pixels", "--max-pixels"):
        p.add_argument(flag, type=int, default=None, help="image size limit (default: the adapter's run config.yaml)")
    p.add_argument("--benchmark", required=True, choices=sorted(BENCHMARKS), help="benchmark to score")
    p.add_argument("--data", required=True, help="dataset path (or hub name) read by the source adapter")
    p.add_argument("--source", default=None, help="load_records adapter (default: the benchmark's name); e.g. "
                   "mathvision for MATH-Vision files in the CRYSTAL format")
    p.add_argument("--split", default=None, help="split to read where the layout has splits")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N valid records")
    p.add_argument("--output", required=True, type=Path, help="output folder")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new-token budget (default 256)")
    p.add_argument("--prompt-mode", choices=("eval", "train"), default="eval",
                   help="eval = CRYSTAL evaluation prompt (default), train = the training prompt")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="generation backend (default auto)")
    p.add_argument("--decoding", choices=DECODING_MODES, default="greedy",
                   help="greedy (default), or sampled: greedy plus --samples seeded completions per item, reported "
                   "as mean@k and pass@k (sampled_completions.jsonl)")
    for flag, kind, text in (("--temperature", float, "sampling temperature"), ("--top-p", float, "nucleus top_p"),
                             ("--samples", int, "k, completions per item"), ("--seed", int, "sampling seed")):
        p.add_argument(flag, type=kind, default=None, help=f"{text} of --decoding sampled (default "
                       f"{SAMPLING_FLAGS[flag[2:].replace('-', '_')]:g})")
    p.add_argument("--dtype", default="auto", help="model dtype (default auto: bf16 on GPU, fp32 on CPU)")
    add_scoring_arguments(p)
    p.add_argument("--device", default=None, help="model and encoder device (default cuda if available, else cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def _pixel_limits(args: argparse.Namespace) -> list[int | None]:
    """``[min_pixels, max_pixels]``: the flags where given, else those of the ``config.yaml`` in the
    adapter's parent or grandparent folder, else ``None``; a flag differing from the run's value warns."""
    import yaml

    from cpr.evaluation.generation import resolve_model_and_adapter

    trained: dict[str, Any] = {}
    adapter = resolve_model_and_adapter(args.model, args.adapter)[1]
    for folder in Path(adapter).resolve().parents[:2] if adapter else ():
        if (folder / "config.yaml").is_file():
            trained = (yaml.safe_load((folder / "config.yaml").read_text(encoding="utf-8")) or {}).get("model") or {}
            break
    limits = []
    for key in ("min_pixels", "max_pixels"):
        flag, run_value = getattr(args, key), trained.get(key)
        if flag is not None and run_value is not None and flag != run_value:
            print(f"cpr eval: warning: --{key.replace('_', '-')} {flag} differs from the run's model.{key} "
                  f"{run_value}, the resolution the adapter was trained at", file=sys.stderr)
        limits.append(flag if flag is not None else run_value)
    return limits


def _check_resume(out: Path, config: dict[str, Any], record_ids: set[str]) -> None:
    from dataclasses import asdict

    from cpr.evaluation.generation import DecodingSettings
    from cpr.scoring import load_predictions

    previous_path = out / "eval_config.json"
    previous = json.loads(previous_path.read_text(encoding="utf-8")) if previous_path.is_file() else config
    previous = {"decoding": asdict(DecodingSettings()), **previous}  # a folder from before sampled decoding
    for key in RESUME_KEYS:
        if previous.get(key) != config[key]:
            raise InputError(f"this folder holds completions made with {key}={previous.get(key)!r}, not "
                             f"{config[key]!r}; use another --output folder (or delete completions.jsonl to start "
                             "over)", path=previous_path, field=key)
    if (out / "completions.jsonl").is_file():
        extra = sorted(set(load_predictions(out / "completions.jsonl", skip_truncated_tail=True)[0]) - record_ids)
        if extra:
            raise InputError(f"{len(extra)} completion(s) belong to records outside this evaluation (e.g. a larger "
                             "--limit); use another --output folder so completions.jsonl matches references.jsonl",
                             path=out / "completions.jsonl", record_id=extra[0], field="id")


def _load(args: argparse.Namespace, config: dict[str, Any], max_images: int) -> tuple[Any, Any, Any]:
    """``(model, processor, generator)``: a vLLM generator (no model), or a model and ``None``."""
    from cpr.evaluation import load_model_for_eval
    from cpr.evaluation.generation import VLLMGenerator, checked_model_path, vllm_available

    pixels = {k: config[k] for k in ("min_pixels", "max_pixels")}
    use_vllm = args.backend == "vllm" or (args.backend == "auto" and vllm_available())
    if use_vllm:  # pragma: no cover - needs vLLM and a GPU
        from transformers import AutoProcessor

        from cpr.models import apply_pixel_limits, detect_family

        path, adapter = checked_model_path(args.model, args.adapter, args.allow_base_mismatch)
        processor = AutoProcessor.from_pretrained(path, padding_side="left")
        apply_pixel_limits(processor, detect_family(path), **pixels)
        return None, processor, VLLMGenerator(
            path, processor, adapter=adapter, max_new_tokens=args.max_new_tokens, max_images_per_prompt=max_images,
            mm_processor_kwargs={k: v for k, v in pixels.items() if v is not None} or None,
        )
    model, processor = load_model_for_eval(args.model, args.adapter, device=args.device, dtype=args.dtype,
                                           allow_base_mismatch=args.allow_base_mismatch, **pixels)
    return model, processor, None


def run(args: argparse.Namespace) -> int:
    """Load the records and the model, generate (resuming), score, and write the report files."""
    from dataclasses import asdict

    from cpr.data import load_records
    from cpr.evaluation import runner
    from cpr.evaluation.benchmarks import get_benchmark
    from cpr.evaluation.generation import DecodingSettings, GenerationSettings
    from cpr.io import atomic_write_json, atomic_write_text
    from cpr.scoring import flag_errors, settings_from_args

    for name in ("min_pixels", "max_pixels", "limit"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InputError(f"must be >= 1, got {getattr(args, name)}", field="--" + name.replace("_", "-"))
    given = {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k) is not None}
    if given and args.decoding != "sampled":
        raise InputError("sets sampling; add --decoding sampled", field="--" + next(iter(given)).replace("_", "-"))
    with flag_errors():
        generation = GenerationSettings(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                        prompt_mode=args.prompt_mode, backend=args.backend,
                                        progress=not args.no_progress,
                                        decoding=DecodingSettings(args.decoding, **{**SAMPLING_FLAGS, **given}))
    scoring = settings_from_args(args)
    bench = get_benchmark(args.benchmark)
    source = args.source or bench.default_source
    records = load_records(source, args.data, split=args.split, limit=args.limit)
    if not records:
        raise InputError(f"no records to evaluate (source {source})", path=args.data)
    out = Path(args.output)
    min_pixels, max_pixels = _pixel_limits(args)
    config = {"model": args.model, "adapter": args.adapter, "min_pixels": min_pixels, "max_pixels": max_pixels,
              "benchmark": bench.name, "source": source, "data": str(args.data), "split": args.split,
              "limit": args.limit, **{k: v for k, v in asdict(generation).items() if k != "progress"},
              "dtype": args.dtype, "device": args.device}
    _check_resume(out, config, {r.id for r in records})
    atomic_write_json(out / "eval_config.json", config)
    atomic_write_text(out / "references.jsonl",
                      "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in bench.references(records)))
    model, processor, generator = _load(args, config, max(len(r.images) for r in records))
    label = args.model if args.adapter is None else f"{args.model} + {args.adapter}"
    runner.evaluate_model(
        model, processor, bench.name, records, generation=generation, scoring=scoring, out_dir=out, label=label,
        title=f"{bench.name} evaluation of {label}", generator=generator,
        extra={"config": {**config, "scoring": asdict(scoring), "references_format": bench.references_format}},
    )
    print((out / "metrics.md").read_text(encoding="utf-8"))
    print(f"{len(records)} samples -> {out}", file=sys.stderr)
    return 0
