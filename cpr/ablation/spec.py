"""The ablation config: one YAML file describes a set of runs and the table built from them.

Two kinds share the format (``kind: weights | strategies``); see the commented files
``recipes/configs/ablation_*.yaml``::

    kind: weights                  # weights: paper Table 6; strategies: paper Table 5 + Figure 5
    name: reward_weights           # title of the table; run names are prefixed with it
    base_config: recipes/configs/qwen2_5_vl_3b_cpr_curriculum.yaml   # an ordinary experiment config
    output_dir: outputs/ablation_weights   # each run goes to <output_dir>/<run name>/
    launcher: python               # how --list starts a recipe, e.g. "accelerate launch --config_file X"
    torch_threads: null            # torch CPU threads while the ablation runs in this process (null: torch's default)
    seeds: [1, 2, 3]               # optional: every trained run once per seed (table: mean +/- std over seeds)
    set: {phases: [cpr]}           # overrides for every run: dotted keys, YAML values (as --set)
    shared_start:                  # optional: trained once, its LoRA adapter seeds every run
      type: phases                 # none | warm_start (the base config's warm_start section) | phases
      set: {phases: [answer_only]} # overrides of the shared start's own experiment (type phases)
    table: {split: validation, benchmark: crystal, kl_limit: 2.0, reward_function: cpr, phases: [cpr], paper: true}
    # kind: weights
    phase: cpr                     # the phase whose cpr reward gets the weights
    weights: [[0.8, 0.2], [0.7, 0.3], [0.65, 0.35], [0.5, 0.5], [0.35, 0.65], [0.2, 0.8]]
    # kind: strategies
    runs:
      - {name: base, label: Base model, type: base, adapter: null}   # evaluation only
      - {name: sft, label: LoRA SFT, type: sft, sft: {max_steps: 500, learning_rate: 2.0e-5}}
      - {name: composite, label: Composite, set: {phases: [composite]}}
    figure: {file: training_dynamics.png, dpi: 120}

:func:`load_ablation_config` checks every key (an unknown key or a bad value raises
:class:`cpr.errors.ConfigError` naming the dotted key and the file); the runs' experiment
configs themselves are built and validated by :mod:`cpr.ablation.plan`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cpr.errors import ConfigError

__all__ = [
    "DEFAULT_KL_LIMIT",
    "KINDS",
    "PAPER_WEIGHT_PAIRS",
    "RESERVED_NAMES",
    "SHARED_START_TYPES",
    "AblationConfig",
    "FigureConfig",
    "RunEntry",
    "SharedStartConfig",
    "TableConfig",
    "ablation_config_from_dict",
    "load_ablation_config",
    "weight_run_name",
]

KINDS = ("weights", "strategies")
SHARED_START_TYPES = ("none", "warm_start", "phases")
RUN_TYPES = ("grpo", "base", "sft")
SPLITS = ("validation", "test")
#: The six (answer_weight, step_weight) pairs of the paper's sweep (docs/method.md section 7).
PAPER_WEIGHT_PAIRS: tuple[tuple[float, float], ...] = (
    (0.8, 0.2), (0.7, 0.3), (0.65, 0.35), (0.5, 0.5), (0.35, 0.65), (0.2, 0.8),
)
#: A logged KL above this marks a run unstable (project choice; the paper's largest KL max is 1.684).
DEFAULT_KL_LIMIT = 2.0
#: Names under the ablation's output folder that are not runs.
RESERVED_NAMES = ("shared_start", "shared_adapter")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class SharedStartConfig:
    """A LoRA adapter trained once and handed to every run as its first phase's ``init_adapter``.

    Attributes:
        type: ``none``; ``warm_start`` (the supervised LoRA warm start of the base config's
            ``warm_start`` section, run once with :func:`cpr.training.warm_start.run_warm_start`);
            or ``phases`` (an ordinary experiment, the base config with ``set`` applied, e.g.
            ``phases: [answer_only]``; its hand-over adapter, the best phase-1 checkpoint, is used).
        set: overrides of the shared start's experiment, applied after the ablation's ``set``.
    """

    type: str = "none"
    set: dict[str, Any] = field(default_factory=dict)


@dataclass
class TableConfig:
    """What the table is built from.

    Attributes:
        split: the evaluation scored in the table: ``validation`` (each run's final adapter on the
            run's validation split: the plan adds it to the runs' ``evaluation.final_splits``;
            default for ``weights``, as the paper's Table 6) or ``test`` (the runner's final
            evaluation; default for ``strategies``).
        benchmark: the benchmark of that evaluation (``crystal``).
        kl_limit: a logged KL above it marks a run unstable (``None``: none).
        reward_function: whose scored completions give Discrimination and r(F1) (``cpr``).
        phases: phases whose logs give Discrimination, r(F1), KL max and stability (``None``: for
            ``weights`` the weighted phase, for ``strategies`` every phase).
        paper: show the paper's numbers beside ours, labelled as such.
    """

    split: str | None = None
    benchmark: str = "crystal"
    kl_limit: float | None = DEFAULT_KL_LIMIT
    reward_function: str = "cpr"
    phases: list[str] | None = None
    paper: bool = True


@dataclass
class FigureConfig:
    """The training-dynamics figure of a strategy comparison (PNG)."""

    file: str = "training_dynamics.png"
    dpi: int = 120


@dataclass
class RunEntry:
    """One run of a strategy comparison.

    Attributes:
        name: folder name under the ablation's ``output_dir``.
        label: row label in the table and legend (default: ``name``).
        type: ``grpo`` (an ordinary experiment: the base config with ``set`` applied), ``base``
            (no training: the model is scored on the same split) or ``sft`` (the LoRA
            fine-tuning baseline, :mod:`cpr.ablation.sft_baseline`, on the base config's model,
            LoRA, data, rewards and evaluation sections).
        set: overrides of this run, applied after the ablation's ``set``.
        shared_start: ``grpo``: start the first phase from the shared start's adapter (when the
            ablation has one).
        adapter: ``base``: ``null`` (the model as loaded), ``shared_start`` (the shared start's
            adapter, e.g. the demo's warm start) or a LoRA adapter folder.
        sft: ``sft``: :class:`cpr.training.sft.SFTSettings` fields.
        ranges: ``sft``: ``error`` or ``warn`` when settings leave the M3CoT baseline's ranges.
    """

    name: str
    label: str | None = None
    type: str = "grpo"
    set: dict[str, Any] = field(default_factory=dict)
    shared_start: bool = True
    adapter: str | None = None
    sft: dict[str, Any] = field(default_factory=dict)
    ranges: str = "error"

    @property
    def title(self) -> str:
        """The label, or the name when no label is given."""
        return self.label or self.name


@dataclass
class AblationConfig:
    """A whole ablation (module docstring). Build with :func:`load_ablation_config`.

    ``seeds``: train every ``grpo`` and ``sft`` run once per seed (run ``<name>-s<seed>`` with the
    override ``seed=<seed>``: the GRPO sampling, the new LoRA adapters and the sampler order change;
    the data, the shared start and the ``base`` runs do not); the table reports the mean and the
    sample standard deviation over the seeds (:mod:`cpr.ablation.tables`). Empty: one run each, with
    the base config's seed.

    ``torch_threads``: ``torch.set_num_threads`` while :func:`cpr.ablation.runner.run_ablation` runs
    (``None``: torch's default). On a small shared CPU one thread is the robust choice for tiny
    models: with every core busy elsewhere, more intra-op threads than free cores slow training
    down many times over (measured on the 2-core machine of this project: a 40-step warm start took
    22 s with one thread and 160-275 s with two while another job ran).
    """

    kind: str
    name: str
    base_config: str
    output_dir: str
    launcher: str = "python"
    torch_threads: int | None = None
    seeds: list[int] = field(default_factory=list)
    set: dict[str, Any] = field(default_factory=dict)
    shared_start: SharedStartConfig = field(default_factory=SharedStartConfig)
    table: TableConfig = field(default_factory=TableConfig)
    figure: FigureConfig = field(default_factory=FigureConfig)
    phase: str = "cpr"
    weights: list[tuple[float, float]] = field(default_factory=lambda: list(PAPER_WEIGHT_PAIRS))
    runs: list[RunEntry] = field(default_factory=list)
    config_path: str | None = None

    @property
    def split(self) -> str:
        """The evaluated split of the table (``table.split`` or the kind's default)."""
        if self.table.split:
            return self.table.split
        return "validation" if self.kind == "weights" else "test"

    @property
    def table_stem(self) -> str:
        """``ablation_weights`` or ``ablation_strategies`` (the table files' name)."""
        return f"ablation_{self.kind}"


def weight_run_name(answer_weight: float, step_weight: float) -> str:
    """Folder name of a weights run, e.g. ``aw0.65_sw0.35``."""
    return f"aw{answer_weight:.2f}_sw{step_weight:.2f}"


# --------------------------------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------------------------------


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"expected a mapping, got {type(value).__name__}", field=key)
    return {str(k): v for k, v in value.items()}


def _check_keys(data: Mapping[str, Any], known: tuple[str, ...], prefix: str) -> None:
    for k in data:
        if k not in known:
            key = f"{prefix}.{k}" if prefix else str(k)
            raise ConfigError(f"unknown key; known keys here: {sorted(known)}", field=key)


def _str(value: Any, key: str, *, choices: tuple[str, ...] | None = None, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"expected a non-empty string, got {value!r}", field=key)
    if choices is not None and value not in choices:
        raise ConfigError(f"must be one of {', '.join(choices)}, got {value!r}", field=key)
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"expected true or false, got {value!r}", field=key)
    return value


def _number(value: Any, key: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"expected a finite number, got {value!r}", field=key)
    return float(value)


def _overrides(value: Any, key: str) -> dict[str, Any]:
    data = _mapping(value, key)
    for k in data:
        if not k or any(not part for part in k.split(".")):
            raise ConfigError(f"not a dotted config key: {k!r}", field=f"{key}.{k}")
    return data


def _name(value: Any, key: str) -> str:
    name = _str(value, key)
    if not _NAME.match(name) or name in RESERVED_NAMES:
        raise ConfigError(
            f"{name!r} cannot name a run folder (letters, digits, '_', '.', '-'; not {', '.join(RESERVED_NAMES)})",
            field=key,
        )
    return name


def _run_entry(data: Any, key: str) -> RunEntry:
    data = _mapping(data, key)
    _check_keys(data, ("name", "label", "type", "set", "shared_start", "adapter", "sft", "ranges"), key)
    if "name" not in data:
        raise ConfigError("missing run name", field=f"{key}.name")
    entry = RunEntry(name=_name(data["name"], f"{key}.name"))
    if "label" in data:
        entry.label = _str(data["label"], f"{key}.label", optional=True)
    if "type" in data:
        entry.type = _str(data["type"], f"{key}.type", choices=RUN_TYPES)
    entry.set = _overrides(data.get("set"), f"{key}.set")
    if "shared_start" in data:
        entry.shared_start = _bool(data["shared_start"], f"{key}.shared_start")
    if "adapter" in data:
        entry.adapter = _str(data["adapter"], f"{key}.adapter", optional=True)
    entry.sft = _mapping(data.get("sft"), f"{key}.sft")
    if "ranges" in data:
        entry.ranges = _str(data["ranges"], f"{key}.ranges", choices=("error", "warn"))
    only = {"base": ("adapter",), "sft": ("sft", "ranges"), "grpo": ("shared_start",)}
    for typ, keys in only.items():
        for k in keys:
            if k in data and entry.type != typ:
                raise ConfigError(f"applies to runs of type {typ} only (this run is {entry.type})", field=f"{key}.{k}")
    return entry


def _resolve(path: str, base: Path | None) -> str:
    p = Path(os.path.expanduser(path))
    if not p.is_absolute() and base is not None and not p.exists() and (base / p).exists():
        return str(base / p)
    return str(p)


def ablation_config_from_dict(data: Any, *, config_path: str | None = None) -> AblationConfig:
    """Build and check an :class:`AblationConfig` from a mapping (module docstring).

    ``base_config`` is resolved relative to the working directory, else to the ablation
    config's folder, and must exist.

    Raises:
        ConfigError: an unknown key or an invalid value; the dotted key (and the file) named.
    """
    try:
        return _from_dict(data, config_path)
    except ConfigError as e:
        if config_path and e.path is None:
            raise ConfigError(e.message, field=e.field, path=config_path) from None
        raise


def _from_dict(data: Any, config_path: str | None) -> AblationConfig:
    data = _mapping(data, "(top level)")
    known = ("kind", "name", "base_config", "output_dir", "launcher", "torch_threads", "seeds", "set", "shared_start",
             "table", "figure", "phase", "weights", "runs")
    _check_keys(data, known, "")
    for k in ("kind", "base_config", "output_dir"):
        if k not in data:
            raise ConfigError("missing", field=k)
    kind = _str(data["kind"], "kind", choices=KINDS)
    here = Path(config_path).resolve().parent if config_path else None
    base_config = _resolve(_str(data["base_config"], "base_config"), here)
    if not Path(base_config).is_file():
        raise ConfigError(f"experiment config not found: {base_config}", field="base_config")
    cfg = AblationConfig(
        kind=kind,
        name=_name(data.get("name", f"ablation_{kind}"), "name"),
        base_config=base_config,
        output_dir=_str(data["output_dir"], "output_dir"),
        config_path=config_path,
    )
    if "launcher" in data:
        cfg.launcher = _str(data["launcher"], "launcher")
    if data.get("torch_threads") is not None:
        n = data["torch_threads"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"expected a positive integer or null, got {n!r}", field="torch_threads")
        cfg.torch_threads = n
    seeds = data.get("seeds") or []
    if not isinstance(seeds, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds):
        raise ConfigError(f"expected a list of integer seeds, got {seeds!r}", field="seeds")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"a seed is listed twice: {seeds}", field="seeds")
    cfg.seeds = list(seeds)
    cfg.set = _overrides(data.get("set"), "set")

    ss = _mapping(data.get("shared_start"), "shared_start")
    _check_keys(ss, ("type", "set"), "shared_start")
    cfg.shared_start = SharedStartConfig(
        type=_str(ss.get("type", "none"), "shared_start.type", choices=SHARED_START_TYPES),
        set=_overrides(ss.get("set"), "shared_start.set"),
    )
    if cfg.shared_start.set and cfg.shared_start.type == "none":
        raise ConfigError("overrides given for a shared start of type none", field="shared_start.set")

    tb = _mapping(data.get("table"), "table")
    _check_keys(tb, ("split", "benchmark", "kl_limit", "reward_function", "phases", "paper"), "table")
    table = TableConfig()
    if "split" in tb:
        table.split = _str(tb["split"], "table.split", choices=SPLITS, optional=True)
    if "benchmark" in tb:
        table.benchmark = _str(tb["benchmark"], "table.benchmark", choices=("crystal", "m3cot"))
    if "kl_limit" in tb:
        table.kl_limit = None if tb["kl_limit"] is None else _number(tb["kl_limit"], "table.kl_limit")
        if table.kl_limit is not None and table.kl_limit <= 0:
            raise ConfigError(f"must be > 0, got {table.kl_limit}", field="table.kl_limit")
    if "reward_function" in tb:
        table.reward_function = _str(tb["reward_function"], "table.reward_function")
    if tb.get("phases") is not None:
        phases = tb["phases"]
        if not isinstance(phases, list) or not phases or not all(isinstance(p, str) and p for p in phases):
            raise ConfigError(f"expected a non-empty list of phase names, got {phases!r}", field="table.phases")
        table.phases = list(phases)
    if "paper" in tb:
        table.paper = _bool(tb["paper"], "table.paper")
    cfg.table = table

    fg = _mapping(data.get("figure"), "figure")
    _check_keys(fg, ("file", "dpi"), "figure")
    cfg.figure = FigureConfig(
        file=_str(fg.get("file", "training_dynamics.png"), "figure.file"),
        dpi=int(_number(fg.get("dpi", 120), "figure.dpi")),
    )
    if not cfg.figure.file.endswith(".png") or "/" in cfg.figure.file:
        raise ConfigError(f"expected a PNG file name, got {cfg.figure.file!r}", field="figure.file")

    if kind == "weights":
        for k in ("runs",):
            if k in data:
                raise ConfigError("applies to kind strategies only", field=k)
        cfg.phase = _str(data.get("phase", "cpr"), "phase")
        if "weights" in data:
            pairs = data["weights"]
            if not isinstance(pairs, list) or not pairs:
                raise ConfigError(f"expected a list of [answer_weight, step_weight] pairs, got {pairs!r}", field="weights")
            cfg.weights = []
            for i, pair in enumerate(pairs):
                key = f"weights[{i}]"
                if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                    raise ConfigError(f"expected [answer_weight, step_weight], got {pair!r}", field=key)
                a, s = _number(pair[0], key), _number(pair[1], key)
                if a < 0 or s < 0 or a + s <= 0:
                    raise ConfigError(f"weights must be >= 0 and not both 0, got {list(pair)}", field=key)
                cfg.weights.append((a, s))
        names = [weight_run_name(a, s) for a, s in cfg.weights]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"a weight pair is listed twice ({dup[0]})", field="weights")
    else:
        for k in ("phase", "weights"):
            if k in data:
                raise ConfigError("applies to kind weights only", field=k)
        runs = data.get("runs")
        if not isinstance(runs, list) or not runs:
            raise ConfigError("expected a non-empty list of runs", field="runs")
        cfg.runs = [_run_entry(r, f"runs[{i}]") for i, r in enumerate(runs)]
        names = [r.name for r in cfg.runs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"run name {dup[0]!r} is used twice", field="runs")
        for i, r in enumerate(cfg.runs):
            if r.type == "base" and r.adapter == "shared_start" and cfg.shared_start.type == "none":
                raise ConfigError("adapter: shared_start needs a shared_start section", field=f"runs[{i}].adapter")
    return cfg


def load_ablation_config(path: str | Path) -> AblationConfig:
    """Read and check an ablation config YAML file.

    Raises:
        ConfigError: invalid YAML, an unknown key or an invalid value (file and dotted key named).
        FileNotFoundError: ``path`` does not exist.
    """
    from cpr.training.config import read_yaml

    path = Path(path)
    return ablation_config_from_dict(read_yaml(path), config_path=str(path))
