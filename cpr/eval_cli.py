"""``cpr eval``: generate completions with a model on a benchmark and score them.

The files, the base-model check, the settings recorded for a model (:func:`resolve_settings`) and
``--run-split``: docs/evaluation.md, "Evaluate and score". ``eval_config.json`` in ``--output DIR`` holds
:data:`RESUME_KEYS`, which a rerun into DIR must match, so completions of two setups never mix.
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
RESUME_KEYS = ("model", "adapter", "benchmark", "source", "data", "split", "options", "prompts", "prompt_mode",
               "max_new_tokens", "min_pixels", "max_pixels", "decoding")
#: The flags of sampled decoding (cpr.evaluation.generation.DecodingSettings fields) and their defaults.
SAMPLING_FLAGS = {"temperature": 1.0, "top_p": 1.0, "samples": 4, "seed": 0}


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``eval`` command to ``cpr``'s sub-parsers."""
    from cpr.evaluation.benchmarks import BENCHMARKS
    from cpr.evaluation.generation import BACKENDS, DECODING_MODES
    from cpr.scoring import add_scoring_arguments
    from cpr.training.config_sections import EVAL_SPLITS

    of_run = "the adapter's run's "
    p = subparsers.add_parser("eval", help="generate with a model on a benchmark and score it (crystal, m3cot, "
                              "vlrmbench)", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="base model or merged checkpoint: folder or hub id; a folder cpr "
                   "export wrote is evaluated as its run evaluates (its cpr_eval_settings.json stands in for the "
                   f"run's settings below) (default: {of_run}model.name_or_path)")
    p.add_argument("--adapter", default=None, help="LoRA adapter folder (PEFT) applied to --model")
    p.add_argument("--allow-base-mismatch", action="store_true",
                   help="apply --adapter even if trained on another base model (e.g. a hub id at another revision)")
    for flag in ("--min-pixels", "--max-pixels"):
        p.add_argument(flag, type=int, default=None, help=f"image size limit (default: {of_run}model.{flag[2:].replace('-', '_')})")
    p.add_argument("--benchmark", default=None, choices=sorted(BENCHMARKS),
                   help="benchmark to score (default with --run-split: crystal)")
    p.add_argument("--run-split", choices=EVAL_SPLITS, default=None,
                   help="score the adapter's run's own records of this split, as its final evaluation did "
                   "(instead of --data)")
    p.add_argument("--data", default=None, help="dataset path (or hub name) read by the source adapter (none for "
                   "a generated source: synthetic)")
    p.add_argument("--source", default=None, help="load_records adapter (default: the benchmark's name); e.g. "
                   "mathvision for MATH-Vision files in the CRYSTAL format")
    p.add_argument("--split", default=None, help="split to read where the layout has splits")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="source adapter option, the value read as YAML (e.g. size=300 for synthetic; repeatable)")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N valid records")
    p.add_argument("--output", required=True, type=Path, help="output folder")
    p.add_argument("--prompts", default=None, help=f"prompt templates YAML (default: {of_run}data.prompts, else the "
                   "packaged templates)")
    p.add_argument("--batch-size", type=int, default=None, help=f"prompts per generate call (default: {of_run}"
                   "evaluation.batch_size, else 8)")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"new-token budget (default: {of_run}"
                   "evaluation.max_new_tokens, else 256)")
    p.add_argument("--prompt-mode", choices=("eval", "train"), default=None,
                   help="eval = CRYSTAL evaluation prompt, train = the training prompt (default: "
                   f"{of_run}evaluation.prompt_mode, else eval)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="generation backend (default: transformers for an adapter of a run, as its evaluations, "
                   "else auto)")
    p.add_argument("--decoding", choices=DECODING_MODES, default=None,
                   help="greedy, or sampled: greedy plus --samples seeded completions per item, reported as mean@k and "
                   f"pass@k (sampled_completions.jsonl) (default: {of_run}evaluation.decoding, else greedy)")
    for flag, kind, text in (("--temperature", float, "sampling temperature"), ("--top-p", float, "nucleus top_p"),
                             ("--samples", int, "k, completions per item"), ("--seed", int, "sampling seed")):
        p.add_argument(flag, type=kind, default=None, help=f"{text} of sampled decoding (default: {of_run}"
                       f"evaluation.decoding, else {SAMPLING_FLAGS[flag[2:].replace('-', '_')]:g})")
    p.add_argument("--dtype", default=None, help=f"model dtype (default: {of_run}model.dtype, else auto: bf16 on "
                   "GPU, fp32 on CPU)")
    add_scoring_arguments(p, defaults=False, fallback=f"{of_run}rewards / evaluation.answer_mode, else ")
    p.add_argument("--device", default=None, help="model and encoder device (default cuda if available, else cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The evaluation's settings: each flag where given, else the value recorded for the model (the adapter's
    run's :func:`cpr.training.evaluate.eval_settings`, or an exported model's
    :data:`~cpr.training.evaluate.EVAL_SETTINGS_FILE`), else the default.

    Returns:
        ``{"model", "adapter", "run_config" (path or None), "cfg" (the run's ExperimentConfig or None),
        "recorded" (the file the values were taken from, or None), "taken" ({setting: value} taken from it),
        "dtype", "attn_implementation", "trust_remote_code", "min_pixels", "max_pixels", "prompts",
        "prompt_mode", "max_new_tokens", "batch_size", "backend", "decoding" (DecodingSettings), "scoring"
        (ScoringSettings)}``.

    Raises:
        InputError: no ``--model`` and no run to take it from; a bad flag value, or a sampling flag with greedy
            decoding (flag named); an unreadable exported settings file.
        ConfigError: an unreadable run ``config.yaml`` (file and key named).
    """
    from cpr.evaluation.generation import resolve_model_and_adapter
    from cpr.models import check_adapter_weights
    from cpr.scoring import SCORING_DEFAULTS, ScoringSettings, flag_errors
    from cpr.training.config import read_run_config
    from cpr.training.evaluate import eval_settings, read_eval_settings, run_of_adapter

    if args.model is None and args.adapter is None:
        raise InputError("give the model to evaluate (--model), or an adapter of a run (--adapter)", field="--model")
    model, adapter = resolve_model_and_adapter(args.model, args.adapter) if args.model else (None, args.adapter)
    if adapter is not None and not (Path(adapter) / "adapter_config.json").is_file():
        raise InputError("not a PEFT adapter folder (no adapter_config.json)", path=adapter, field="--adapter")
    if adapter is not None:
        check_adapter_weights(adapter, field="--adapter")
    config_path = run_of_adapter(adapter)
    cfg = read_run_config(config_path) if config_path else None
    exported = read_eval_settings(model) if cfg is None and model is not None and Path(model).expanduser().is_dir() else None
    recorded, values = (config_path, eval_settings(cfg)) if cfg is not None else exported or (None, None)
    taken: dict[str, Any] = {}

    def pick(name: str, default: Any) -> Any:
        flag = getattr(args, name, None)
        if flag is not None:
            return flag
        if values is None or name not in values:
            return default
        if values[name] is not None:
            taken[name] = values[name]
        return values[name]

    if model is None:
        model = cfg.model.name_or_path if cfg is not None and cfg.model.name_or_path else None
        if model is None:
            where = "its folder holds no run (no config.yaml)" if cfg is None else f"{config_path} has no model.name_or_path"
            raise InputError(f"give the base model the adapter was trained on: {where}", field="--model")
        taken["model"] = model
    out: dict[str, Any] = {"model": model, "adapter": adapter, "run_config": config_path, "cfg": cfg,
                           "recorded": recorded, "taken": taken}
    for key in ("min_pixels", "max_pixels"):
        flag, run_value = getattr(args, key), (values or {}).get(key)
        if flag is not None and run_value is not None and flag != run_value:
            print(f"cpr eval: warning: --{key.replace('_', '-')} {flag} differs from the run's model.{key} "
                  f"{run_value}, the resolution the {'adapter' if cfg is not None else 'model'} was trained at",
                  file=sys.stderr)
        out[key] = pick(key, None)
    for key, default in (("dtype", "auto"), ("attn_implementation", None), ("prompts", None),
                         ("prompt_mode", "eval"), ("max_new_tokens", 256), ("batch_size", 8),
                         ("backend", "auto")):
        out[key] = pick(key, default)
    out["trust_remote_code"] = bool((values or {}).get("trust_remote_code", False))
    out["decoding"] = _decoding(args, (values or {}).get("decoding"), taken)
    scoring = {key: pick(key, default) for key, default in SCORING_DEFAULTS.items()}
    with flag_errors():
        # guard "paper": an evaluation scores as the paper does (the guard shapes training rewards only)
        out["scoring"] = ScoringSettings(**scoring, device=args.device,
                                         batch_size=(values or {}).get("encoder_batch_size") or 64, guard="paper")
    return out


def _decoding(args: argparse.Namespace, recorded: dict[str, Any] | None, taken: dict[str, Any]) -> Any:
    """The ``--decoding`` flags' DecodingSettings over the ``recorded`` ones (noted in ``taken``)."""
    from cpr.evaluation.generation import DecodingSettings
    from cpr.scoring import flag_errors

    given = {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k) is not None}
    if args.decoding is None and recorded is not None:
        base = dict(recorded)
        if base["mode"] != "greedy":  # greedy is the default either way: the line names sampled decoding only
            taken["decoding"] = base
    else:
        base = {"mode": args.decoding or "greedy", **SAMPLING_FLAGS}
    if given and base["mode"] != "sampled":
        raise InputError("sets sampling; add --decoding sampled", field="--" + next(iter(given)).replace("_", "-"))
    with flag_errors():
        return DecodingSettings(**{**base, **given})


def _run_split_records(args: argparse.Namespace, settings: dict[str, Any], benchmark: str) -> list[Any]:
    """The records of split ``--run-split`` that the run's final evaluation scores on ``benchmark``."""
    from cpr.training.evaluate import benchmark_records
    from cpr.training.splits import load_splits

    cfg, config_path = settings["cfg"], settings["run_config"]
    if cfg is None:
        raise InputError("--run-split scores the records of the run an adapter belongs to; this adapter lies in no "
                         "run folder (no config.yaml in its parent or grandparent folder)", field="--run-split")
    for flag in ("data", "source", "split", "option"):
        if getattr(args, flag):
            raise InputError(f"--run-split reads the run's own data ({config_path}); leave out --{flag}", field=f"--{flag}")
    found = {name: records for name, records, _ in benchmark_records(cfg, load_splits(cfg.data), args.run_split)}
    if benchmark not in found:
        raise InputError(f"the run's final evaluation scores no {benchmark} records on its {args.run_split} split "
                         f"(it scores: {', '.join(found) or 'nothing'})", path=config_path, field="--benchmark")
    return found[benchmark][: args.limit] if args.limit else found[benchmark]


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


def _load(args: argparse.Namespace, settings: dict[str, Any], max_images: int) -> tuple[Any, Any, Any]:
    """``(model, processor, generator)``: a vLLM generator (no model), or a model and ``None``."""
    from cpr.evaluation import load_model_for_eval
    from cpr.evaluation.generation import VLLMGenerator, checked_model_path, vllm_available

    pixels = {k: settings[k] for k in ("min_pixels", "max_pixels")}
    backend, model, adapter = settings["backend"], settings["model"], settings["adapter"]
    if backend == "vllm" or (backend == "auto" and vllm_available()):  # pragma: no cover - needs vLLM and a GPU
        from transformers import AutoProcessor

        from cpr.models import apply_pixel_limits, detect_family

        path, adapter = checked_model_path(model, adapter, args.allow_base_mismatch)
        processor = AutoProcessor.from_pretrained(path, padding_side="left")
        apply_pixel_limits(processor, detect_family(path), **pixels)
        mm_kwargs = {k: v for k, v in pixels.items() if v is not None} or None
        return None, processor, VLLMGenerator(path, processor, adapter=adapter,
                                              max_new_tokens=settings["max_new_tokens"],
                                              max_images_per_prompt=max_images, mm_processor_kwargs=mm_kwargs)
    model, processor = load_model_for_eval(model, adapter, device=args.device, dtype=settings["dtype"],
                                           allow_base_mismatch=args.allow_base_mismatch,
                                           attn_implementation=settings["attn_implementation"],
                                           trust_remote_code=settings["trust_remote_code"], **pixels)
    return model, processor, None


def run(args: argparse.Namespace) -> int:
    """Load the records and the model, generate (resuming), score, and write the report files."""
    from dataclasses import asdict

    from cpr.data import load_records, load_templates
    from cpr.data.cli import parse_options, source_path
    from cpr.evaluation import model_eval
    from cpr.evaluation.benchmarks import get_benchmark
    from cpr.evaluation.generation import GenerationSettings
    from cpr.evaluation.report import is_crystal_test
    from cpr.io import atomic_write_json
    from cpr.scoring import flag_errors

    for name in ("min_pixels", "max_pixels", "limit"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise InputError(f"must be >= 1, got {getattr(args, name)}", field="--" + name.replace("_", "-"))
    settings = resolve_settings(args)
    keys = ("max_new_tokens", "batch_size", "prompt_mode", "backend", "decoding")
    with flag_errors():
        generation = GenerationSettings(**{k: settings[k] for k in keys}, progress=not args.no_progress)
    scoring = settings["scoring"]
    if args.benchmark is None and args.run_split is None:
        raise InputError("give the benchmark to score (crystal, m3cot or vlrmbench)", field="--benchmark")
    bench = get_benchmark(args.benchmark or "crystal")
    options = parse_options(args.option)
    if args.run_split is not None:
        from cpr.training.evaluate import on_crystal_test

        records = _run_split_records(args, settings, bench.name)
        source, data, split = "run", str(settings["run_config"].parent), args.run_split
        paper_rows = on_crystal_test(settings["cfg"], bench.name, split)
    else:
        source = args.source or bench.default_source
        data, split = source_path(source, args.data, "--data"), args.split
        records = load_records(source, data, split=split, limit=args.limit, options=options or None)
        paper_rows = is_crystal_test([(source, split)])
    if not records:
        raise InputError(f"no records to evaluate (source {source})", path=data or None)
    templates = load_templates(settings["prompts"])
    if settings["taken"]:  # the settings taken from the adapter's run or the exported model's settings file
        shown = ", ".join("prompts (the run's templates)" if k == "prompts" and settings["cfg"] is None
                          else f"{k} {v}" for k, v in settings["taken"].items())
        source = "the adapter's run" if settings["cfg"] is not None else "the exported model's settings"
        print(f"cpr eval: from {source} ({settings['recorded']}): {shown} (a flag overrides each)",
              file=sys.stderr)
    out = Path(args.output)
    prompts = settings["prompts"]
    config = {"model": settings["model"], "adapter": settings["adapter"], "min_pixels": settings["min_pixels"],
              "max_pixels": settings["max_pixels"], "benchmark": bench.name, "source": source, "data": data,
              "split": split, "options": options or None, "limit": args.limit,
              "prompts": prompts if prompts is None or isinstance(prompts, dict) else str(prompts),
              **{k: v for k, v in asdict(generation).items() if k != "progress"},
              "dtype": settings["dtype"], "device": args.device,
              "from_run": {"config": str(settings["recorded"]), "settings": list(settings["taken"])}
              if settings["recorded"] else None}
    _check_resume(out, config, {r.id for r in records})
    atomic_write_json(out / "eval_config.json", config)
    model, processor, generator = _load(args, settings, max(len(r.images) for r in records))
    label = settings["model"] if settings["adapter"] is None else f"{settings['model']} + {settings['adapter']}"
    model_eval.evaluate_model(
        model, processor, bench.name, records, generation=generation, scoring=scoring, templates=templates,
        out_dir=out, label=label, title=f"{bench.name} evaluation of {label}", generator=generator, paper_rows=paper_rows,
        extra={"config": {**config, "scoring": asdict(scoring), "references_format": bench.references_format}},
    )
    print((out / "metrics.md").read_text(encoding="utf-8"))
    print(f"{len(records)} samples -> {out}", file=sys.stderr)
    return 0
