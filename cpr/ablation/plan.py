"""Plan an ablation: the config of every run, as overrides of one ordinary experiment config.

Each run of an ablation is an ordinary experiment: the ablation's ``base_config`` with a list of
``key=value`` overrides applied by :func:`cpr.training.config.apply_overrides` (the function behind
the recipes' ``--set``), so ``--list`` can print, for each run, a recipe command line that builds
exactly the config the ablation runs in-process. The overrides of a run, in order:

1. the ablation's ``set``; then the run's own (for ``weights``: ``phase_settings.<phase>.reward_params.cpr.answer_weight``
   and ``.step_weight``; for ``strategies``: the entry's ``set``);
2. with a shared start, for ``grpo`` runs: ``warm_start.enabled=false`` and
   ``phase_settings.<first phase>.init_adapter=<output_dir>/shared_adapter``;
3. for ``grpo`` and ``sft`` runs whose final evaluation would not score the table's split:
   ``evaluation.final=true`` and ``evaluation.final_splits=<the splits it scores, plus the table's>``
   (only the table's split when ``evaluation.final`` was false), so every run scores the table's
   split itself at its end (:func:`cpr.training.evaluate.final_evaluation`) and a run launched from
   ``--list`` needs no scoring step afterwards;
4. for ``sft`` runs: ``sft=<the entry's SFTSettings fields>`` and ``sft_ranges=<error|warn>``;
5. ``output_dir=<output_dir>/<run>`` and ``run_name=<ablation name>-<run>``.

With ``seeds``, every ``grpo`` and ``sft`` run is planned once per seed as ``<run>-s<seed>``, with
``seed=<seed>`` after its own overrides (1.); ``base`` runs are planned once.

When the resulting ``phases`` leave out a phase the base config has settings for (e.g. the
composite strategy on a two-phase base config), an experiment config would reject the settings of a
phase that does not run, so the plan puts ``phase_settings=<the base settings of the phases that
do run>`` first and leaves out the overrides of the other phases (listed in ``dropped``).
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cpr.ablation.spec import AblationConfig, weight_run_name
from cpr.errors import ConfigError
from cpr.training.config import apply_overrides, read_yaml

__all__ = [
    "GRPO_RECIPE",
    "SFT_RECIPE",
    "ABLATION_RECIPE",
    "AblationPlan",
    "PlannedRun",
    "format_override",
    "plan_ablation",
    "validate_run",
]

GRPO_RECIPE = "recipes/cpr_curriculum.py"
SFT_RECIPE = "recipes/sft_lora.py"
ABLATION_RECIPE = "recipes/reward_ablation.py"
#: ExperimentConfig's default phases (when a config gives none).
_DEFAULT_PHASES = ["answer_only", "cpr"]
SHARED_START = "shared_start"
SHARED_ADAPTER = "shared_adapter"


def _yaml_value(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False, allow_unicode=True).strip()
    if text.endswith("\n..."):
        text = text[: -len("\n...")].strip()
    elif text.endswith("..."):
        text = text[:-3].strip()
    if yaml.safe_load(text) != value:
        raise ConfigError(f"value {value!r} does not survive the command line as YAML ({text!r})")
    return text


def format_override(key: str, value: Any) -> str:
    """``"key=value"`` with ``value`` written as one-line YAML (the form ``--set`` reads back).

    Raises:
        ConfigError: a value that does not read back equal (e.g. a non-YAML object).
    """
    return f"{key}={_yaml_value(value)}"


@dataclass
class PlannedRun:
    """One run of the plan.

    Attributes:
        name: folder name under the ablation's output folder.
        label: row label (table, figure legend).
        type: ``grpo``, ``base``, ``sft`` or ``shared_start``.
        output_dir: the run folder.
        overrides: ``key=value`` overrides of the base config, in order (module docstring).
        config: the base config dict with the overrides applied (an experiment config dict; for
            ``sft`` runs the SFT baseline's, :mod:`cpr.ablation.sft_baseline`).
        dropped: overrides left out because they set a phase the run does not train.
        weights: ``(answer_weight, step_weight)`` of a weights run.
        adapter: ``base`` runs: the adapter scored (``None``: the model as loaded).
        shared_adapter: the shared start's adapter this run starts from, if any.
        seed: the run's ``seed`` override (the ablation's ``seeds``), ``None`` without one.
        group: the run's table row: the entry (strategy) or weight-pair name its seeds share.
    """

    name: str
    label: str
    type: str
    output_dir: str
    overrides: list[str]
    config: dict[str, Any]
    dropped: list[str] = field(default_factory=list)
    weights: tuple[float, float] | None = None
    adapter: str | None = None
    shared_adapter: str | None = None
    seed: int | None = None
    group: str = ""

    def __post_init__(self) -> None:
        self.group = self.group or self.name


@dataclass
class AblationPlan:
    """Every run of an ablation (:func:`plan_ablation`)."""

    config: AblationConfig
    runs: list[PlannedRun]
    shared_start: PlannedRun | None
    shared_adapter: str | None

    @property
    def names(self) -> list[str]:
        """Names accepted by ``--only``: the runs, and ``shared_start`` when there is one."""
        return ([SHARED_START] if self.shared_start else []) + [r.name for r in self.runs]

    def get(self, name: str) -> PlannedRun:
        """The planned run called ``name``.

        Raises:
            ConfigError: no such run (the known names listed).
        """
        if self.shared_start is not None and name == SHARED_START:
            return self.shared_start
        for run in self.runs:
            if run.name == name:
                return run
        raise ConfigError(f"no run named {name!r}; runs: {', '.join(self.names)}", field="--only")

    def command(self, run: PlannedRun, ablation_config: str | None = None) -> str:
        """The command line that produces ``run``: an ordinary recipe (``grpo``: the CPR-Curriculum
        recipe, ``sft``: the SFT recipe) with ``--config <base_config>`` and one ``--set`` per
        override; the ablation recipe with ``--only`` for the shared start (which the ablation
        itself runs: it copies the adapter to ``shared_adapter``; with the launcher) and for
        ``base`` runs (scoring only: plain ``python``)."""
        cfg = self.config
        launcher = shlex.split(cfg.launcher)
        if run.type in ("base", SHARED_START):
            config = ablation_config or cfg.config_path or "ABLATION.yaml"
            start = launcher if run.type == SHARED_START else ["python"]  # scoring runs in one process
            return shlex.join([*start, ABLATION_RECIPE, "--config", config, "--only", run.name])
        recipe = GRPO_RECIPE if run.type == "grpo" else SFT_RECIPE
        args = [*launcher, recipe, "--config", cfg.base_config]
        for item in run.overrides:
            args += ["--set", item]
        return shlex.join(args)

    def commands(self, ablation_config: str | None = None) -> list[str]:
        """``--list``'s lines: comments, the shared start first, one command per run, then the
        command that builds the table (every run scores the table's split itself; ``--evaluate-only``
        would score finished runs that did not, e.g. ones launched before)."""
        config = ablation_config or self.config.config_path or "ABLATION.yaml"
        lines = []
        if self.shared_start is not None:
            lines.append(f"# shared start (run it first: every run starts from {self.shared_adapter})")
            lines.append(self.command(self.shared_start, config))
        lines.append("# runs (independent of each other: any order, or in parallel)")
        lines += [self.command(r, config) for r in self.runs]
        lines.append(f"# when they have finished: the table (each run scores the {self.config.split} split itself)")
        lines.append(shlex.join(["python", ABLATION_RECIPE, "--config", config, "--table-only"]))
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON (written to ``ablation_plan.json``)."""
        def one(r: PlannedRun) -> dict[str, Any]:
            return {
                "name": r.name, "label": r.label, "type": r.type, "output_dir": r.output_dir,
                "overrides": r.overrides, "dropped": r.dropped,
                "weights": list(r.weights) if r.weights else None, "adapter": r.adapter,
                "shared_adapter": r.shared_adapter, "seed": r.seed, "group": r.group, "command": self.command(r),
            }

        return {
            "kind": self.config.kind,
            "name": self.config.name,
            "base_config": self.config.base_config,
            "output_dir": self.config.output_dir,
            "split": self.config.split,
            "shared_start": one(self.shared_start) if self.shared_start else None,
            "shared_adapter": self.shared_adapter,
            "runs": [one(r) for r in self.runs],
        }


def _apply(base: dict[str, Any], overrides: list[str]) -> tuple[dict[str, Any], list[str], list[str]]:
    """Apply overrides, pruning the settings of phases that do not run (module docstring)."""
    data = apply_overrides(base, overrides)
    phases = data.get("phases", _DEFAULT_PHASES)
    settings = data.get("phase_settings") or {}
    if not isinstance(phases, list) or not isinstance(settings, dict) or all(k in phases for k in settings):
        return data, list(overrides), []
    kept = {k: copy.deepcopy(v) for k, v in (base.get("phase_settings") or {}).items() if k in phases}
    new = [format_override("phase_settings", kept)]
    dropped = []
    for item in overrides:
        parts = item.partition("=")[0].strip().split(".")
        if parts[0] == "phase_settings" and len(parts) >= 2 and parts[1] not in phases:
            dropped.append(item)
        else:
            new.append(item)
    return apply_overrides(base, new), new, dropped


def _read_base(path: str) -> dict[str, Any]:
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", path=path)
    return data


def _pairs(mapping: dict[str, Any]) -> list[str]:
    return [format_override(k, v) for k, v in mapping.items()]


def _final_split_overrides(base: dict[str, Any], overrides: list[str], split: str) -> list[str]:
    """The overrides that make a run's final evaluation score ``split`` (module docstring, item 3)."""
    evaluation = apply_overrides(base, overrides).get("evaluation") or {}
    final = evaluation.get("final", True) if isinstance(evaluation, dict) else True
    scored = evaluation.get("final_splits", ["test"]) if isinstance(evaluation, dict) else ["test"]
    scored = list(scored) if final is not False and isinstance(scored, list) else []
    if split in scored:
        return []
    return [format_override("evaluation.final", True), format_override("evaluation.final_splits", scored + [split])]


def plan_ablation(cfg: AblationConfig) -> AblationPlan:
    """Plan every run of ``cfg`` (nothing is validated or run; see :func:`validate_run`).

    Raises:
        ConfigError: an unreadable base config, or a run whose phases are unknown.
    """
    base = _read_base(cfg.base_config)
    out = Path(cfg.output_dir)
    common = _pairs(cfg.set)
    shared_adapter = str(out / SHARED_ADAPTER) if cfg.shared_start.type != "none" else None

    def finish(name: str, overrides: list[str]) -> list[str]:
        return overrides + [format_override("output_dir", str(out / name)), format_override("run_name", f"{cfg.name}-{name}")]

    shared = None
    if cfg.shared_start.type != "none":
        ov = finish(SHARED_START, common + _pairs(cfg.shared_start.set))
        data, ov, dropped = _apply(base, ov)
        shared = PlannedRun(SHARED_START, "shared start", SHARED_START, str(out / SHARED_START), ov, data, dropped)

    def shared_overrides(base_ov: list[str]) -> list[str]:
        phases = apply_overrides(base, base_ov).get("phases", _DEFAULT_PHASES)
        if not isinstance(phases, list) or not phases:
            raise ConfigError(f"expected a non-empty list of phases, got {phases!r}", field="phases")
        return [
            format_override("warm_start.enabled", False),
            format_override(f"phase_settings.{phases[0]}.init_adapter", shared_adapter),
        ]

    def seeded(group: str, trained: bool) -> list[tuple[str, int | None, list[str]]]:
        """(run name, seed, seed override) of each seed of a run group (the trained ones only)."""
        if not cfg.seeds or not trained:
            return [(group, None, [])]
        return [(f"{group}-s{seed}", seed, [format_override("seed", seed)]) for seed in cfg.seeds]

    runs: list[PlannedRun] = []
    if cfg.kind == "weights":
        for a, s in cfg.weights:
            group = weight_run_name(a, s)
            for name, seed, seed_ov in seeded(group, True):
                key = f"phase_settings.{cfg.phase}.reward_params.cpr"
                ov = common + [format_override(f"{key}.answer_weight", a), format_override(f"{key}.step_weight", s)]
                ov += seed_ov
                if shared_adapter:
                    ov += shared_overrides(ov)
                ov += _final_split_overrides(base, ov, cfg.split)
                data, ov2, dropped = _apply(base, finish(name, ov))
                runs.append(PlannedRun(name, f"{a:.2f}/{s:.2f}", "grpo", str(out / name), ov2, data, dropped,
                                       weights=(a, s), shared_adapter=shared_adapter, seed=seed, group=group))
    else:
        for entry, (name, seed, seed_ov) in [(e, x) for e in cfg.runs for x in seeded(e.name, e.type != "base")]:
            ov = common + _pairs(entry.set) + seed_ov
            uses_shared = None
            adapter = None
            if entry.type == "grpo" and shared_adapter and entry.shared_start:
                ov += shared_overrides(ov)
                uses_shared = shared_adapter
            if entry.type in ("grpo", "sft"):
                ov += _final_split_overrides(base, ov, cfg.split)
            if entry.type == "sft":
                ov += [format_override("sft", entry.sft), format_override("sft_ranges", entry.ranges)]
            if entry.type == "base":
                adapter = shared_adapter if entry.adapter == SHARED_START else entry.adapter
                uses_shared = shared_adapter if entry.adapter == SHARED_START else None
            if entry.type == "sft":  # the SFT baseline ignores the GRPO sections: nothing to prune
                ov = finish(name, ov)
                data, dropped = apply_overrides(base, ov), []
            else:
                data, ov, dropped = _apply(base, finish(name, ov))
            runs.append(PlannedRun(name, entry.title, entry.type, str(out / name), ov, data, dropped,
                                   adapter=adapter, shared_adapter=uses_shared, seed=seed, group=entry.name))
    return AblationPlan(config=cfg, runs=runs, shared_start=shared, shared_adapter=shared_adapter)


def validate_run(plan: AblationPlan, run: PlannedRun, *, shared_ready: bool | None = None) -> Any:
    """Build and validate a planned run's config (imports the training stack).

    Args:
        plan: the plan.
        run: one of its runs.
        shared_ready: whether the shared adapter exists (default: look). When it does not, the
            config is validated without the ``init_adapter`` that points at it.

    Returns:
        The :class:`cpr.training.config.ExperimentConfig` (``grpo``, ``base``, ``shared_start``) or
        :class:`cpr.ablation.sft_baseline.SFTBaselineConfig` (``sft``).

    Raises:
        ConfigError: an invalid config (dotted key named), a weights run whose phase does not
            run or does not use the ``cpr`` reward, or a base run's adapter folder without
            ``adapter_config.json``.
    """
    from cpr.training.config import config_from_dict

    cfg = plan.config
    data = copy.deepcopy(run.config)
    if shared_ready is None:
        shared_ready = plan.shared_adapter is not None and Path(plan.shared_adapter, "adapter_config.json").is_file()
    if run.type == "sft":
        from cpr.ablation.sft_baseline import sft_baseline_from_dict

        return sft_baseline_from_dict(data, config_path=cfg.base_config)
    if run.shared_adapter and not shared_ready and run.type == "grpo":
        for settings in (data.get("phase_settings") or {}).values():
            if isinstance(settings, dict) and settings.get("init_adapter") == run.shared_adapter:
                settings.pop("init_adapter")
    try:
        exp = config_from_dict(data, config_path=cfg.base_config)
    except ConfigError as e:
        raise ConfigError(f"run {run.name!r}: {e.message}", field=e.field, path=e.path) from None
    if run.weights is not None:
        from cpr.rewards import REWARD_SETS

        if cfg.phase not in exp.phases:
            raise ConfigError(f"run {run.name!r} does not train phase {cfg.phase!r} (phases: {exp.phases})", field="phase")
        phase = exp.phase(cfg.phase)
        names = [n for n, _ in REWARD_SETS[phase.rewards]] if isinstance(phase.rewards, str) else list(phase.rewards)
        if "cpr" not in names:
            raise ConfigError(
                f"phase {cfg.phase!r} of run {run.name!r} uses rewards {names}, without cpr: the weights do nothing",
                field="phase",
            )
    if run.type == "base" and run.adapter and run.adapter != run.shared_adapter:
        if not Path(run.adapter, "adapter_config.json").is_file():
            raise ConfigError(f"no LoRA adapter (adapter_config.json) in {run.adapter}", field=f"runs.{run.name}.adapter")
    return exp
