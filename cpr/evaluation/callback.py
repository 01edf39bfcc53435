"""The eval hook: score the policy on benchmark subsets while a trainer (e.g. TRL's ``GRPOTrainer``) runs.

It runs every ``eval_steps`` optimizer steps and at the last one, every rank inside TRL's
``unwrap_model_for_generation`` generating its share (FSDP v2 is refused); the main process scores, and the
metrics and any rank's error are gathered so every rank logs or raises. Metrics go through the base
``Trainer.log`` as ``eval_<benchmark>/<metric>`` (TRL's ``GRPOTrainer.log`` would flush its training metrics).
The main process writes ``eval_history.jsonl``, ``eval/step-<step>/<benchmark>/`` and ``best_checkpoint.json``
(``{"metric", "value", "greater_is_better", "step", "checkpoint", "metrics"}``; ties keep the earlier step;
``state.best_metric`` is set unless ``args.metric_for_best_model`` is, so checkpoint rotation keeps it).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from cpr.data.prompts import PromptTemplates
from cpr.data.records import Record
from cpr.errors import ConfigError
from cpr.evaluation.benchmarks import get_benchmark
from cpr.evaluation.generation import GenerationSettings, TransformersGenerator, gather_checked
from cpr.evaluation.model_eval import ROW_KEYS, evaluate_model, subset
from cpr.evaluation.report import flat_metrics, sampled_columns
from cpr.io import append_jsonl, atomic_write_json
from cpr.scoring import ScoringSettings
from cpr.trl_internals import log_as_trainer

__all__ = ["BEST_CHECKPOINT_FILE", "HISTORY_FILE", "BenchmarkSpec", "EvalCallback"]

HISTORY_FILE = "eval_history.jsonl"
BEST_CHECKPOINT_FILE = "best_checkpoint.json"


@dataclass
class BenchmarkSpec:
    """One benchmark the hook scores: its registry ``name``, its ``records``, and the fixed seeded subset
    of at most ``max_samples`` of them (``None``: all) scored at every evaluation."""

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
    """Evaluate the policy on benchmark subsets during training (module docstring); call
    :meth:`attach` with the trainer before ``train()``.

    Args:
        generation: decoding settings (default greedy, 256 new tokens, the *training* prompt).
        output_dir: folder of the hook's files (default ``args.output_dir``).
        metric_for_best: ``"<benchmark>/<metric>"``, a key of that benchmark's overall summary (with
            sampled decoding also ``sampled_<metric>`` (mean@k) or ``pass_at_k``).

    Raises ``ConfigError`` for ``eval_steps < 1``, no or duplicate benchmarks, or a ``metric_for_best``
    naming a benchmark not evaluated or an unknown metric."""

    def __init__(self, benchmarks: Sequence[BenchmarkSpec], *, eval_steps: int,
                 generation: GenerationSettings | None = None, scoring: ScoringSettings | None = None,
                 templates: PromptTemplates | None = None, output_dir: str | Path | None = None,
                 metric_for_best: str = "crystal/match_f1", greater_is_better: bool = True) -> None:
        if isinstance(eval_steps, bool) or not isinstance(eval_steps, int) or eval_steps < 1:
            raise ConfigError(f"must be a positive integer, got {eval_steps!r}", field="eval.eval_steps")
        names = [b.name for b in benchmarks]
        if not names or len(set(names)) != len(names):
            raise ConfigError(f"need distinct benchmarks, got {names}", field="eval.benchmarks")
        bench_name, _, metric = metric_for_best.partition("/")
        if bench_name not in names:
            raise ConfigError(f"{metric_for_best!r} names benchmark {bench_name!r}, which is not evaluated "
                              f"(evaluated: {names})", field="eval.metric_for_best")
        bench = get_benchmark(bench_name)
        keys = bench.metric_keys[1:]
        if generation is not None and generation.decoding.sampled:  # mean@k and pass@k of sampled decoding
            keys += tuple(key for _, key, _ in sampled_columns(bench.columns, generation.decoding.samples))
        if metric not in keys:
            raise ConfigError(f"{metric_for_best!r}: unknown metric {metric!r} (known: {', '.join(keys)})",
                              field="eval.metric_for_best")
        self.benchmarks, self.eval_steps, self.templates = list(benchmarks), eval_steps, templates
        self.generation = generation or GenerationSettings(prompt_mode="train", progress=False)
        self.scoring = scoring or ScoringSettings()
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.metric_for_best, self.greater_is_better = metric_for_best, greater_is_better
        self.trainer: Any = None
        self.best: dict[str, Any] | None = None
        self.evaluated_steps: list[int] = []

    def attach(self, trainer: Any) -> EvalCallback:
        """Give the hook its trainer (accelerator, wrapped model, logger), adding it as a callback if
        the trainer does not have it yet. Returns ``self``."""
        self.trainer = trainer
        if self not in trainer.callback_handler.callbacks:
            trainer.add_callback(self)
        return self

    def _out(self, args: Any) -> Path:
        return self.output_dir if self.output_dir is not None else Path(args.output_dir)

    def _need_trainer(self) -> None:
        if self.trainer is None:
            raise RuntimeError("EvalCallback needs its trainer: call callback.attach(trainer) before train()")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._need_trainer()
        self.best = None
        path = self._out(args) / BEST_CHECKPOINT_FILE
        if state.global_step > 0 and path.is_file():
            previous = json.loads(path.read_text(encoding="utf-8"))
            if previous.get("metric") == self.metric_for_best and previous.get("step", math.inf) <= state.global_step:
                self.best = previous

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = state.global_step
        last = control.should_training_stop or 0 < state.max_steps <= step
        if step > 0 and (step % self.eval_steps == 0 or last):
            self._evaluate(args, state, kwargs.get("processing_class"))
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        best = self.best
        if best is not None and best["step"] == state.global_step and best.get("checkpoint") is None and folder.is_dir():
            best["checkpoint"] = str(folder)
            if self.trainer.accelerator.is_main_process:
                atomic_write_json(self._out(args) / BEST_CHECKPOINT_FILE, best)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step > 0:
            self._evaluate(args, state, kwargs.get("processing_class"))
        return control

    def _evaluate(self, args: Any, state: Any, processor: Any) -> None:
        from trl.distributed import DistributedBackend
        from trl.models.utils import unwrap_model_for_generation

        self._need_trainer()
        step = state.global_step
        if self.evaluated_steps[-1:] == [step]:
            return
        trainer, accelerator = self.trainer, self.trainer.accelerator
        dist = DistributedBackend(accelerator)
        if dist.fsdp_version == 2:
            raise ConfigError("the evaluation hook generates with the full parameters on each process, which FSDP v2 "
                              "cannot give (every forward pass communicates); use DeepSpeed ZeRO-3, FSDP v1 or DDP", field="eval")
        results: dict[str, dict[str, Any]] = {}
        error: BaseException | None = None
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        synced = accelerator.num_processes > 1 and plugin is not None and plugin.zero_stage == 3
        with (
            unwrap_model_for_generation(trainer.model_wrapped, accelerator, gather_deepspeed3_params=True,
                                        gradient_checkpointing_kwargs=getattr(args, "gradient_checkpointing_kwargs",
                                                                              None)) as unwrapped,
            dist.summon_full_params(trainer.model_wrapped, recurse=False),
        ):
            try:
                results = self._run_benchmarks(unwrapped, processor or trainer.processing_class, args, step,
                                               accelerator, synced)
            except Exception as e:  # raised below on every rank, after the gather
                error = e
        local = {k: {kk: vv for kk, vv in v.items() if kk not in ROW_KEYS} for k, v in results.items()}
        metrics = gather_checked(local, error, "evaluation", f" at step {step}")[0]  # the main process's
        self.evaluated_steps.append(step)
        logs = {f"eval_{k}": v for m in metrics.values() for k, v in flat_metrics(m).items() if not k.endswith("/n")}
        # the base Trainer.log (module docstring); its on_log event clears control.should_log: restore it
        should_log = trainer.control.should_log
        log_as_trainer(trainer, logs)
        trainer.control.should_log = should_log
        self._update_best(metrics, args, state)

    def _run_benchmarks(self, model: Any, processor: Any, args: Any, step: int, accelerator: Any,
                        synced: bool) -> dict[str, dict[str, Any]]:
        """Every rank generates its share; the main process scores, writes and returns the metrics."""
        from cpr.distributed import process_state

        out = self._out(args)
        main = accelerator.is_main_process
        results = {}
        for spec in self.benchmarks:
            folder = out / "eval" / f"step-{step}" / spec.name
            if main and folder.exists():  # a stale folder of an earlier run: never resume
                shutil.rmtree(folder)
            accelerator.wait_for_everyone()  # the folder is gone before any rank reads it
            generator = TransformersGenerator(model, processor, self.generation.max_new_tokens, synced_gpus=synced)
            metrics = evaluate_model(model, processor, spec.name, spec.selected, generation=self.generation,
                                     scoring=self.scoring, templates=self.templates, out_dir=folder,
                                     label=f"step {step}", generator=generator, shard=process_state())
            if metrics is None:
                continue
            append_jsonl(out / HISTORY_FILE, {"step": step, "benchmark": spec.name,
                                              "epoch": getattr(self.trainer.state, "epoch", None),
                                              "seconds": metrics["seconds"], **metrics["overall"],
                                              "groups": metrics["groups"]})
            results[spec.name] = metrics
        return results

    def _update_best(self, results: dict[str, dict[str, Any]], args: Any, state: Any) -> None:
        bench_name, _, metric = self.metric_for_best.partition("/")
        value = float(results[bench_name]["overall"][metric])
        if self.best is not None:
            old = float(self.best["value"])
            if not (value > old if self.greater_is_better else value < old):
                return
        step = state.global_step
        folder = Path(args.output_dir) / f"checkpoint-{step}"
        self.best = {"metric": self.metric_for_best, "value": value, "greater_is_better": self.greater_is_better,
                     "step": step, "checkpoint": str(folder) if folder.is_dir() else None,
                     "metrics": {k: v for m in results.values() for k, v in flat_metrics(m).items()}}
        if getattr(args, "metric_for_best_model", None) is None:
            state.best_metric = value
            state.best_global_step = step
        if self.trainer.accelerator.is_main_process:
            atomic_write_json(self._out(args) / BEST_CHECKPOINT_FILE, self.best)
