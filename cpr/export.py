"""``cpr export``: merge a run's LoRA adapter into the base model it records and write a folder to serve.

The folder is a plain checkpoint of the base architecture (PEFT's ``merge_and_unload``: ``W + (alpha / r) B A``
in every adapted linear) with the run's processor, a model card and ``cpr_eval_settings.json``
(docs/evaluation.md, "Export a trained model").
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cpr.errors import InputError


def _run_files(run_dir: Path, adapter: str | None) -> tuple[Path, str | None, str | None, str]:
    """(adapter, config.yaml text, final table, run name) of a run folder; InputError without adapter."""
    from cpr.training.evaluate import final_eval_dir

    summary_file = run_dir / "summary.json"
    if not summary_file.is_file():
        raise InputError("not a run folder (no summary.json)", path=run_dir, field="--run")
    try:
        summary = json.loads(summary_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON ({e.msg} at line {e.lineno})", path=summary_file) from None
    final = summary.get("final_adapter") if summary.get("status") == "finished" else None
    if adapter is None and not final:
        raise InputError(f"the run has no final adapter (status {summary.get('status')!r}); pass a "
                         "checkpoint with --adapter", path=summary_file, field="final_adapter")
    config, table = (f.read_text(encoding="utf-8") if f.is_file() else None
                     for f in (run_dir / "config.yaml", final_eval_dir(run_dir, "test") / "metrics.md"))
    return Path(adapter or final), config, table, str(summary.get("run_name") or run_dir.name)


def model_card(name: str, base: str, adapter: Path, config_yaml: str | None, table: str | None) -> str:
    """The exported folder's ``README.md`` (Hugging Face model card with YAML front matter)."""
    config = f"## Training config\n\n```yaml\n{config_yaml.rstrip()}\n```\n" if config_yaml else ""
    return f"""---
base_model: {base}
library_name: transformers
pipeline_tag: image-text-to-text
tags: [cpr, grpo, lora, process-reward]
---
# {name}

`{base}` with the LoRA adapter `{adapter}` merged into its weights. Trained by cpr with GRPO on process \
rewards (Match F1 and the Causal Process Reward of the CRYSTAL paper).

```python
from transformers import AutoModelForImageTextToText, AutoProcessor
model = AutoModelForImageTextToText.from_pretrained("<this folder>", dtype="auto")
processor = AutoProcessor.from_pretrained("<this folder>")
```

Serve with `vllm serve <this folder>`.

## Final evaluation

{table.strip() if table else "The run has no final evaluation table."}

{config}"""


def export_merged(adapter: str | Path, output: str | Path, *, base: str | None = None, dtype: str = "auto",
                  name: str | None = None, config_yaml: str | None = None, table: str | None = None,
                  overwrite: bool = False, eval_settings: Mapping[str, Any] | None = None) -> Path:
    """Merge the LoRA ``adapter`` folder into its base model and write the folder ``output`` (written as
    ``<output>.partial``, renamed when complete; returned). ``base``: ``None`` takes the one the adapter
    records, another is refused. ``dtype``: ``auto`` (the base checkpoint's own, float32 when it names
    none) or a name. ``name``, ``config_yaml``, ``table``: the model card's title, the run's config and
    final table. ``overwrite`` replaces an existing non-empty ``output``. ``eval_settings``: the run's
    :func:`cpr.training.evaluate.eval_settings`, written as ``{"adapter", "settings"}`` into
    :data:`cpr.training.evaluate.EVAL_SETTINGS_FILE`.

    Raises ``InputError`` (not an adapter folder, or ``output`` exists without ``overwrite``),
    ``ConfigError`` (``base`` is not the recorded base), ``ModelNotAvailableError`` (no base model).
    """
    from peft import PeftModel
    from transformers import AutoConfig, AutoProcessor

    from cpr.models import check_adapter_base, load_model_and_processor, resolve_model_path

    adapter, output = Path(adapter), Path(output)
    recorded = check_adapter_base(adapter, base, field="base") or base  # None: the adapter records no base
    if output.exists() and any(output.iterdir()) and not overwrite:
        raise InputError("the output folder exists and is not empty; pass --overwrite to replace it", path=output)
    if dtype == "auto":
        own = getattr(AutoConfig.from_pretrained(resolve_model_path(recorded)), "dtype", None)
        dtype = str(own).removeprefix("torch.") if own is not None else "float32"
    model, processor = load_model_and_processor(recorded, dtype=dtype, device="cpu", gradient_checkpointing=False)
    if (adapter / "processor_config.json").is_file() or (adapter / "preprocessor_config.json").is_file():
        processor = AutoProcessor.from_pretrained(adapter)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    partial = output.with_name(output.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    merged.save_pretrained(partial)
    processor.save_pretrained(partial)
    (partial / "README.md").write_text(model_card(name or output.name, recorded, adapter, config_yaml, table), encoding="utf-8")
    if eval_settings is not None:
        from cpr.io import atomic_write_json
        from cpr.training.evaluate import EVAL_SETTINGS_FILE

        atomic_write_json(partial / EVAL_SETTINGS_FILE, {"adapter": str(adapter), "settings": dict(eval_settings)})
    if output.exists():
        shutil.rmtree(output)
    partial.rename(output)
    return output


def _run(args: argparse.Namespace) -> int:
    from cpr.training.config import read_run_config
    from cpr.training.evaluate import EVAL_SETTINGS_FILE, eval_settings, run_of_adapter

    config_yaml = table = name = None
    if args.run:
        adapter, config_yaml, table, name = _run_files(Path(args.run), args.adapter)
        run_config = Path(args.run) / "config.yaml" if args.adapter is None else run_of_adapter(adapter)
    elif args.adapter:
        adapter = Path(args.adapter)
        run_config = run_of_adapter(adapter)
    else:
        raise InputError("pass a run folder (--run) or an adapter folder (--adapter)", field="--run")
    settings = None  # how the adapter's run evaluates, when it belongs to one
    if run_config is not None and run_config.is_file():
        settings = eval_settings(read_run_config(run_config), self_contained=True)
    out = export_merged(adapter, args.output, base=args.base, dtype=args.dtype, name=name, config_yaml=config_yaml,
                        table=table, overwrite=args.overwrite, eval_settings=settings)
    print(f"merged {adapter} into its base model -> {out}")
    if settings is not None:
        print(f"{out / EVAL_SETTINGS_FILE}: how {run_config.parent} evaluates (prompts, decoding, scoring); "
              f"cpr eval --model {out} takes it")
    return 0


def register(subparsers: Any) -> None:
    """Add ``cpr export`` to the ``cpr`` command line."""
    p = subparsers.add_parser(
        "export", help="merge a run's LoRA adapter into its base model and write a folder to serve",
        description="Merge a run's final LoRA adapter (or any adapter) into the base model it was trained on and "
        "write model, processor and a model card (the run's config and final table) for transformers and vLLM.")
    p.add_argument("--run", help="a run folder (its summary.json names the final adapter)")
    p.add_argument("--adapter", help="an adapter folder (a checkpoint-N, or instead of the run's final adapter)")
    p.add_argument("--base", help="the base model; default: the one the adapter records (another one is refused)")
    p.add_argument("--output", required=True, help="the folder to write")
    p.add_argument("--dtype", default="auto", help="auto (the base checkpoint's dtype), bfloat16, float16 or float32")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    p.set_defaults(func=_run)
