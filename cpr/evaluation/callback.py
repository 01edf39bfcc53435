"""The training hook: score the current policy on benchmark subsets while a trainer runs.

:class:`EvalCallback` is a ``transformers.TrainerCallback`` (works with TRL's ``GRPOTrainer``
and any ``Trainer``). Usage::

    callback = EvalCallback(                  # validation records: the hook picks the best checkpoint
        [BenchmarkSpec("crystal", crystal_validation, max_samples=200),
         BenchmarkSpec("m3cot", m3cot_validation, max_samples=100)],
        eval_steps=100,
        generation=GenerationSettings(max_new_tokens=256, batch_size=16, prompt_mode="train"),
        scoring=ScoringSettings(encoder="sentence-transformers/all-distilroberta-v1"),
        metric_for_best="crystal/match_f1",
    )
    trainer = GRPOTrainer(..., callbacks=[callback])
    callback.attach(trainer)          # the hook needs the trainer's accelerator and logger
    trainer.train()

When it runs: at ``on_step_end`` every ``eval_steps`` optimizer steps (``state.global_step``),
and at the last step (``state.max_steps``, or a step where a callback stops training); if
training ends at a step that was not evaluated (interrupted), once more in ``on_train_end``.

What it does each time:

1. **Generation on the main process only, without deadlocks.** Every rank enters TRL's
   ``unwrap_model_for_generation`` (``trl.models.utils``; under DeepSpeed ZeRO-3 it gathers the
   full parameters with ``deepspeed.zero.GatheredParameters`` and removes ZeRO's forward hooks,
   so a forward pass needs no collective; it also turns gradient checkpointing off and back on,
   with ``args.gradient_checkpointing_kwargs``) and TRL's ``DistributedBackend.summon_full_params``
   (FSDP v1). Inside it the main process generates and scores; the other ranks wait at
   ``accelerator.wait_for_everyone()`` inside the same context; then all ranks leave it
   together. Parameters are always gathered (a main-process-only forward on sharded ZeRO-3
   parameters would hang). FSDP v2 is refused (its forward always communicates).
   The model is put in eval mode for generation and back in train mode after; ``use_cache=True``
   and ``synced_gpus=False`` are passed to ``generate`` (transformers turns ``synced_gpus`` on by
   itself under ZeRO-3, an ``all_reduce`` per token that the waiting ranks never join; see
   :mod:`cpr.evaluation.generation`).
2. **Everyone gets the numbers.** The main process broadcasts the metrics (or its error, which
   every rank then raises: an error is never swallowed and no rank is left waiting) with
   ``accelerate.utils.broadcast_object_list``.
3. **Logging.** Each benchmark's overall metrics (not ``n``) go through ``transformers.Trainer.log``
   as ``eval_<benchmark>/<metric>`` (e.g. ``eval_crystal/match_f1``): transformers' TensorBoard and
   W&B callbacks rewrite the ``eval_`` prefix to ``eval/``, so the dashboards show
   ``eval/crystal/match_f1``; ``state.log_history`` (the trainer's JSON log, saved in
   ``trainer_state.json``) keeps ``eval_crystal/match_f1`` with the step. The base ``Trainer.log``
   is called on purpose: TRL's ``GRPOTrainer.log`` would flush and reset the training metrics it
   is accumulating for the next logging step; and ``control.should_log`` (which the logging event
   clears) is restored, so the training log due at the same step is still written.
4. **Files** (main process; in ``output_dir``, default ``args.output_dir``):
   ``eval_history.jsonl`` gets one line per evaluation and benchmark, ``{"step", "benchmark",
   "epoch", "seconds", <overall metrics>, "groups": {...}}``; with ``save_completions`` the
   completions and metrics of each evaluation go to ``eval/step-<step>/<benchmark>/``.
5. **Best checkpoint.** ``metric_for_best`` (``"<benchmark>/<metric>"``, e.g. ``"crystal/match_f1"``
   or ``"crystal/accuracy"``) and ``greater_is_better`` pick the best evaluation (ties keep the
   earlier one). ``best_checkpoint.json`` (written atomically) holds ``{"metric", "value",
   "greater_is_better", "step", "checkpoint", "metrics"}``. The trainer saves *after*
   ``on_step_end`` in the same step, so ``checkpoint`` is ``null`` until ``on_save`` of that step
   fills in ``<output_dir>/checkpoint-<step>``; it stays ``null`` when no checkpoint is saved at
   the best step. When ``args.metric_for_best_model`` is unset, the hook also sets
   ``state.best_metric`` / ``state.best_global_step``, so the trainer records
   ``state.best_model_checkpoint`` and its checkpoint rotation (``save_total_limit``) keeps the
   best checkpoint. On resume (``state.global_step > 0`` at ``on_train_begin``) an existing
   ``best_checkpoint.json`` at or before the resumed step is read back and compared against.

Each benchmark is evaluated on a fixed subset of its records (:func:`cpr.evaluation.runner.subset`:
at most ``max_samples``, seeded, the same at every evaluation).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback

from cpr.data.prompts import PromptTemplates
from cpr.data.records import Record
from cpr.errors import ConfigError
from cpr.evaluation.benchmarks import ScoringSettings, get_benchmark
from cpr.evaluation.generation import GenerationSettings
from cpr.evaluation.report import flat_metrics
from cpr.evaluation.runner import evaluate_model, subset
from cpr.io import append_jsonl, atomic_write_json

logger = logging.getLogger("cpr.evaluation")

__all__ = ["BEST_CHECKPOINT_FILE", "HISTORY_FILE", "BenchmarkSpec", "EvalCallback"]

HISTORY_FILE = "eval_history.jsonl"
BEST_CHECKPOINT_FILE = "best_checkpoint.json"


@dataclass
class BenchmarkSpec:
    """One benchmark the hook scores.

    Attributes:
        name: registry name (``"crystal"``, ``"m3cot"``, ``"vlrmbench"``).
        records: the loaded records (:func:`cpr.data.load_records`).
        max_samples: size cap (``None``: all records); a seeded subset, the same every time.
        seed: seed of the subset.
    """

    name: str
    records: Sequence[Record]
    max_samples: int | None = None
    seed: int = 0
    selected: list[Record] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        get_benchmark(self.name)
        if not self.records:
            raise ConfigError("no records to evaluate", field=f"eval.{self.name}.records")
        self.selected = subset(self.records, self.max_samples, self.seed)


class EvalCallback(TrainerCallback):
    """Evaluate the policy on benchmark subsets during training (see the module docstring).

    Args:
        benchmarks: the benchmarks and their records.
        eval_steps: evaluate every this many optimizer steps (>= 1).
        generation: decoding settings (default: greedy, 256 new tokens, the *training* prompt).
        scoring: scoring settings (default :class:`ScoringSettings()`).
        templates: CRYSTAL-format prompt templates (default: the packaged ones; pass the
            training run's so the policy sees its training prompt).
        output_dir: where the history and best-checkpoint files go (default ``args.output_dir``).
        metric_for_best: ``"<benchmark>/<metric>"`` with a benchmark of ``benchmarks`` and a key
            of its overall summary (``crystal``/``m3cot``: accuracy, match_f1, precision, recall,
            steps, lis, ordered_f1; ``vlrmbench``: f1, parsed).
        greater_is_better: direction of ``metric_for_best``.
        save_completions: keep each evaluation's completions and metrics under ``eval/``.

    Raises:
        ConfigError: ``eval_steps < 1``, no benchmarks, duplicate benchmark names, or a
            ``metric_for_best`` naming a benchmark not evaluated or an unknown metric.
    """

    def __init__(
        self,
        benchmarks: Sequence[BenchmarkSpec],
        *,
        eval_steps: int,
        generation: GenerationSettings | None = None,
        scoring: ScoringSettings | None = None,
        templates: PromptTemplates | None = None,
        output_dir: str | Path | None = None,
        metric_for_best: str = "crystal/match_f1",
        greater_is_better: bool = True,
        save_completions: bool = True,
    ) -> None:
        if isinstance(eval_steps, bool) or not isinstance(eval_steps, int) or eval_steps < 1:
            raise ConfigError(f"must be a positive integer, got {eval_steps!r}", field="eval.eval_steps")
        if not benchmarks:
            raise ConfigError("at least one benchmark is needed", field="eval.benchmarks")
        names = [b.name for b in benchmarks]
        if len(set(names)) != len(names):
            raise ConfigError(f"duplicate benchmark names {names}", field="eval.benchmarks")
        bench_name, _, metric = metric_for_best.partition("/")
        if bench_name not in names:
            raise ConfigError(
                f"{metric_for_best!r} names benchmark {bench_name!r}, which is not evaluated (evaluated: {names})",
                field="eval.metric_for_best",
            )
        keys = get_benchmark(bench_name).metric_keys
        if metric not in keys or metric == "n":
            raise ConfigError(
                f"{metric_for_best!r}: unknown metric {metric!r} (known: {', '.join(k for k in keys if k != 'n')})",
                field="eval.metric_for_best",
            )
        self.benchmarks = list(benchmarks)
        self.eval_steps = eval_steps
        self.generation = generation or GenerationSettings(prompt_mode="train", progress=False)
        self.scoring = scoring or ScoringSettings()
        self.templates = templates
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.metric_for_best = metric_for_best
        self.greater_is_better = greater_is_better
        self.save_completions = save_completions
        self.trainer: Any = None
        self.best: dict[str, Any] | None = None
        self.last_step: int | None = None
        self.evaluated_steps: list[int] = []

    # -- wiring ---------------------------------------------------------------

    def attach(self, trainer: Any) -> EvalCallback:
        """Give the hook its trainer (accelerator, wrapped model, logger); adds it as a callback
        if the trainer does not have it yet. Returns ``self``."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    def _out(self, args: Any) -> Path:
        return self.output_dir if self.output_dir is not None else Path(args.output_dir)

    # -- events ---------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer is None:
            raise RuntimeError("EvalCallback needs its trainer: call callback.attach(trainer) before train()")
        if self.trainer.accelerator.is_main_process:
            self._out(args).mkdir(parents=True, exist_ok=True)
        self.best = None
        path = self._out(args) / BEST_CHECKPOINT_FILE
        if state.global_step > 0 and path.is_file():
            with open(path, encoding="utf-8") as f:
                previous = json.load(f)
            if previous.get("metric") == self.metric_for_best and previous.get("step", math.inf) <= state.global_step:
                self.best = previous
                logger.info("resumed best %s = %s at step %s", self.metric_for_best, previous["value"], previous["step"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = state.global_step
        last = control.should_training_stop or (state.max_steps > 0 and step >= state.max_steps)
        if step > 0 and (step % self.eval_steps == 0 or last) and step != self.last_step:
            self._evaluate(args, state, control, kwargs.get("processing_class"))
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.best is not None and self.best["step"] == state.global_step and self.best.get("checkpoint") is None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if folder.is_dir():
                self.best["checkpoint"] = str(folder)
                if self.trainer.accelerator.is_main_process:
                    atomic_write_json(self._out(args) / BEST_CHECKPOINT_FILE, self.best)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step > 0 and state.global_step != self.last_step:
            self._evaluate(args, state, control, kwargs.get("processing_class"))
        return control

    # -- work -----------------------------------------------------------------

    def _evaluate(self, args: Any, state: Any, control: Any, processor: Any) -> None:
        from accelerate.utils import broadcast_object_list
        from trl.distributed import DistributedBackend
        from trl.models.utils import unwrap_model_for_generation

        trainer = self.trainer
        if trainer is None:
            raise RuntimeError("EvalCallback needs its trainer: call callback.attach(trainer) before train()")
        accelerator = trainer.accelerator
        processor = processor if processor is not None else trainer.processing_class
        dist = DistributedBackend(accelerator)
        if dist.fsdp_version == 2:
            raise ConfigError(
                "the evaluation hook generates on the main process only, which FSDP v2 cannot do "
                "(every forward pass communicates); use DeepSpeed ZeRO-3, FSDP v1 or DDP",
                field="eval",
            )
        step = state.global_step
        results: dict[str, dict[str, Any]] | None = None
        error: BaseException | None = None
        with (
            unwrap_model_for_generation(
                trainer.model_wrapped,
                accelerator,
                gather_deepspeed3_params=True,
                gradient_checkpointing_kwargs=getattr(args, "gradient_checkpointing_kwargs", None),
            ) as unwrapped,
            dist.summon_full_params(trainer.model_wrapped, recurse=False),
        ):
            if accelerator.is_main_process:
                try:
                    results = self._run_benchmarks(unwrapped, processor, args, step)
                except Exception as e:  # re-raised below on every rank, after the barrier
                    error = e
            accelerator.wait_for_everyone()
        payload: list[Any] = [
            None if error is None else f"{type(error).__name__}: {error}",
            None if results is None else {k: {kk: vv for kk, vv in v.items() if kk != "samples"}
                                          for k, v in results.items()},
        ]
        broadcast_object_list(payload, from_process=0)
        if error is not None:
            raise error
        if payload[0] is not None:
            raise RuntimeError(f"evaluation failed on the main process at step {step}: {payload[0]}")
        shared: dict[str, dict[str, Any]] = payload[1]
        self.last_step = step
        self.evaluated_steps.append(step)
        self._log(shared, trainer)
        self._update_best(shared, args, state)

    def _run_benchmarks(self, model: Any, processor: Any, args: Any, step: int) -> dict[str, dict[str, Any]]:
        out = self._out(args)
        results = {}
        for spec in self.benchmarks:
            start = time.perf_counter()
            completions_path = None
            if self.save_completions:
                folder = out / "eval" / f"step-{step}" / spec.name
                if folder.exists():  # a stale folder of an earlier run: never resume from it
                    shutil.rmtree(folder)
                folder.mkdir(parents=True)
                completions_path = folder / "completions.jsonl"
            metrics = evaluate_model(
                model,
                processor,
                spec.name,
                spec.selected,
                generation=self.generation,
                scoring=self.scoring,
                templates=self.templates,
                completions_path=completions_path,
            )
            metrics["seconds"] = time.perf_counter() - start
            if completions_path is not None:
                atomic_write_json(completions_path.parent / "metrics.json", metrics)
            append_jsonl(
                out / HISTORY_FILE,
                {
                    "step": step,
                    "benchmark": spec.name,
                    "epoch": getattr(self.trainer.state, "epoch", None),
                    "seconds": round(metrics["seconds"], 3),
                    **metrics["overall"],
                    "groups": metrics["groups"],
                },
            )
            results[spec.name] = metrics
        return results

    def _log(self, results: dict[str, dict[str, Any]], trainer: Any) -> None:
        logs: dict[str, float] = {}
        for metrics in results.values():
            for key, value in flat_metrics(metrics).items():
                if not key.endswith("/n"):
                    logs[f"eval_{key}"] = value
        # Base Trainer.log on purpose (module docstring, point 3). Its on_log event clears
        # control.should_log, which would drop the training log due at this step: restore it.
        should_log = trainer.control.should_log
        Trainer.log(trainer, logs)
        trainer.control.should_log = should_log

    def _update_best(self, results: dict[str, dict[str, Any]], args: Any, state: Any) -> None:
        bench_name, _, metric = self.metric_for_best.partition("/")
        value = float(results[bench_name]["overall"][metric])
        if self.best is not None:
            old = float(self.best["value"])
            better = value > old if self.greater_is_better else value < old
            if not better:
                return
        step = state.global_step
        folder = Path(args.output_dir) / f"checkpoint-{step}"
        self.best = {
            "metric": self.metric_for_best,
            "value": value,
            "greater_is_better": self.greater_is_better,
            "step": step,
            "checkpoint": str(folder) if folder.is_dir() else None,
            "metrics": {k: v for m in results.values() for k, v in flat_metrics(m).items()},
        }
        if getattr(args, "metric_for_best_model", None) is None:
            state.best_metric = value
            state.best_global_step = step
        if self.trainer.accelerator.is_main_process:
            atomic_write_json(self._out(args) / BEST_CHECKPOINT_FILE, self.best)
