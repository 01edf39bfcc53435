"""Ablations: a list of override sets over one experiment config, each run an ordinary run.

An ablation file (``recipes/configs/ablation_*.yaml``, ``reproduce_*.yaml``; :class:`Ablation`)::

    kind: weights                 # the table: weights (paper Table 6) or strategies (Table 5, Figure 5)
    name: reward_weights          # table title; run X is called <name>-X, in <output_dir>/X
    base_config: recipes/configs/qwen2_5_vl_3b_cpr_curriculum.yaml
    output_dir: outputs/ablation_weights
    launcher: python              # what --list puts before each command (e.g. accelerate launch ...)
    seeds: [1, 2, 3]              # runs not set to phases: [] run once per seed: X-s<seed>, seed=<seed>
    set: {phases: [cpr]}          # overrides of every run (dotted keys, YAML values, as --set)
    table: {split: validation, kl_limit: 2.0, phases: [cpr]}
    runs:                         # in order; recipe: cpr_curriculum (default) or sft_lora
      - {name: phase1, set: {phases: [answer_only]}}
      - {name: aw0.65_sw0.35, label: 0.65/0.35, set: {phase_settings.cpr.init_adapter: "@phase1"}}

Run X is ``recipes/<recipe>.py --config <base_config> --set <set> --set <X's set>`` (with ``output_dir``
and ``run_name``), run in this process; ``"@X"`` and ``phases: []``: docs/ablations.md. A finished or
diverged run is skipped (its ``config.yaml`` must match), an unfinished one continues with ``--resume``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cpr.ablation.run_folder import DIVERGED, FINISHED, NOT_STARTED, read_run
from cpr.errors import ConfigError

__all__ = ["Ablation", "Table", "commands", "load_ablation", "main", "plan", "register", "run_ablation", "run_config"]

logger = logging.getLogger("cpr.ablation")
RECIPES = {"cpr_curriculum": "recipes/cpr_curriculum.py", "sft_lora": "recipes/sft_lora.py"}
ABLATION_RECIPE = "recipes/reward_ablation.py"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Run(_Strict):
    """One run: its folder ``name``, table / legend ``label``, ``recipe`` and overrides ``set``."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    label: str | None = None
    recipe: Literal["cpr_curriculum", "sft_lora"] = "cpr_curriculum"
    set: dict[str, Any] = {}


class Table(_Strict):
    """The final evaluation on ``split`` of ``benchmark``; Discrimination, r(F1), KL max and stability from
    ``phases`` (``None``: all), scored by ``reward_function``; KL above ``kl_limit`` is unstable (``None``:
    no limit); ``paper``: the paper's rows beside ours (:mod:`cpr.ablation.tables`)."""

    split: Literal["validation", "test"] = "test"
    benchmark: Literal["crystal", "m3cot"] = "crystal"
    kl_limit: float | None = Field(2.0, gt=0)
    reward_function: str = "cpr"
    phases: list[str] | None = None
    paper: bool = True


class Ablation(_Strict):
    """An ablation file (module docstring), read by :func:`load_ablation`."""

    kind: Literal["weights", "strategies"]
    name: str = "ablation"
    base_config: str
    output_dir: str
    launcher: str = "python"
    seeds: list[int] = []
    set: dict[str, Any] = {}
    table: Table = Table()
    runs: list[Run] = Field(min_length=1)
    path: str | None = Field(None, exclude=True)  # the file, set by load_ablation


@dataclass
class Planned:
    """A run of :func:`plan`: ``pairs`` are its overrides in order, ``group`` the table row its seeds share."""

    name: str
    label: str
    group: str
    recipe: str
    pairs: list[tuple[str, Any]]
    seed: int | None


def load_ablation(path: str | Path) -> Ablation:
    """Read and check an ablation file (``base_config``: relative to the working directory, else to the file).
    Raises ``ConfigError`` for no such file, invalid YAML, an unknown key or a bad value (file and dotted key
    named), a run name or seed listed twice, an ``"@X"`` that names no earlier run, or no ``base_config``
    file."""
    from cpr.training.config import read_yaml

    if not Path(path).is_file():
        raise ConfigError("no such file", path=str(path))
    try:
        ab = Ablation.model_validate(read_yaml(path) or {})
    except ValidationError as e:
        err = e.errors()[0]
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        raise ConfigError("unknown key" if err["type"] == "extra_forbidden" else err["msg"], field=key or None,
                          path=str(path)) from None
    ab.path, names = str(path), [r.name for r in ab.runs]
    for i, run in enumerate(ab.runs):
        if run.name in names[:i]:
            raise ConfigError(f"run name {run.name!r} is used twice", field=f"runs[{i}].name", path=str(path))
        for key, value in {**ab.set, **run.set}.items():
            if isinstance(value, str) and value.startswith("@") and value[1:] not in names[:i]:
                raise ConfigError(f"{value!r} names no earlier run (runs: {', '.join(names)})",
                                  field=f"runs[{i}].set.{key}", path=str(path))
    if len(set(ab.seeds)) != len(ab.seeds):
        raise ConfigError(f"a seed is listed twice: {ab.seeds}", field="seeds", path=str(path))
    if not Path(ab.base_config).is_file() and (Path(path).parent / ab.base_config).is_file():
        ab.base_config = str(Path(path).parent / ab.base_config)
    if not Path(ab.base_config).is_file():
        raise ConfigError(f"experiment config not found: {ab.base_config}", field="base_config", path=str(path))
    return ab


def plan(ab: Ablation) -> list[Planned]:
    """Every run of ``ab`` in order, once per seed unless its overrides say ``phases: []``; a key set both for
    every run and by the run has the run's value (one override a key)."""
    out = []
    for run in ab.runs:
        for seed in ab.seeds if ab.seeds and {**ab.set, **run.set}.get("phases") != [] else [None]:
            name = run.name if seed is None else f"{run.name}-s{seed}"
            merged = {**ab.set, **run.set, **({"seed": seed} if seed is not None else {}),  # a run's own value wins
                      "output_dir": str(Path(ab.output_dir) / name), "run_name": f"{ab.name}-{name}"}
            pairs = list(merged.items())
            out.append(Planned(name, run.label or run.name, run.name, run.recipe, pairs, seed))
    return out


def overrides(ab: Ablation, run: Planned, *, strict: bool = True, keep_unfinished: bool = False) -> list[str]:
    """The run's ``key=value`` overrides (values as one-line YAML), each ``"@X"`` replaced by run X's final
    adapter. Raises ConfigError when run X has not finished (``strict``; else that override is left out, or
    with ``keep_unfinished`` kept as ``"@X"``)."""
    out = []
    for key, value in run.pairs:
        if isinstance(value, str) and value.startswith("@"):
            value = read_run(Path(ab.output_dir) / value[1:]).final_adapter or value
            if value.startswith("@") and strict:
                raise ConfigError(f"run {run.name!r} starts from run {value[1:]!r}'s adapter, and that run has not "
                                  f"finished: run it first (--only {value[1:]})", field=key)
            if value.startswith("@"):
                if keep_unfinished:
                    out.append(f"{key}={value}")  # named, not a value to pass on
                continue
        text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False).strip()
        out.append(f"{key}={text.removesuffix('...').strip()}")
    return out


def run_config(ab: Ablation, run: Planned, *, strict: bool = True, warn_dropped: bool = True) -> Any:
    """The validated experiment config of a run (``strict``: as :func:`overrides`; ``warn_dropped``: as
    :func:`cpr.training.config.load_config`); a ConfigError names the run, the file, the override and the dotted key."""
    from cpr.ablation.lora_sft import load_sft_config
    from cpr.training.config import load_config

    try:
        return (load_sft_config if run.recipe == "sft_lora" else load_config)(
            ab.base_config, overrides(ab, run, strict=strict), warn_dropped=warn_dropped)
    except ConfigError as e:
        raise ConfigError(f"run {run.name!r}: {e.message}", field=e.field, path=e.path) from None


def _execute(ab: Ablation, run: Planned, resume: bool) -> str:
    """Run one run unless its folder holds a finished or diverged one: ``ran``, ``skipped`` or ``diverged``."""
    from cpr.ablation.lora_sft import run_sft_baseline
    from cpr.training.divergence import TrainingDivergedError
    from cpr.training.experiment import config_differences, describe_differences, run_experiment

    folder, cfg = read_run(Path(ab.output_dir) / run.name), run_config(ab, run)
    if folder.status in (FINISHED, DIVERGED):
        if diffs := config_differences(folder.path, cfg):
            raise ConfigError(f"{folder.path} holds a {folder.status} run made with another config (move it away "
                              f"or fix the ablation file): {describe_differences(diffs)}", field=diffs[0][0])
        logger.info("run %s: %s already, skipping", run.name, folder.status)
        return "skipped"
    logger.info("run %s: %s -> %s", run.name, "continuing" if resume and folder.status != NOT_STARTED else "starting",
                folder.path)
    try:  # --resume continues an unfinished run and starts one not started yet
        (run_sft_baseline if run.recipe == "sft_lora" else run_experiment)(
            cfg, resume=resume and folder.status != NOT_STARTED)
    except TrainingDivergedError as e:  # a result of the comparison; summary.json says diverged
        logger.warning("run %s: %s", run.name, e)
        return "diverged"
    return "ran"


def _select(runs: list[Planned], only: Sequence[str]) -> list[Planned]:
    for name in only:
        if name not in [r.name for r in runs]:
            raise ConfigError(f"no run named {name!r}; runs: {', '.join(r.name for r in runs)}", field="--only")
    return [r for r in runs if not only or r.name in only]


def run_ablation(ab: Ablation, *, only: Sequence[str] = (), resume: bool = False, table_only: bool = False) -> dict:
    """Run the ablation's runs (or those in ``only``; every config checked before anything trains, one
    starting from an unfinished run without that ``init_adapter``), then write the table and figures; returns
    ``{"ran", "skipped", "diverged": [names], "statuses": {name: status}, "outputs": {what: path}}``. Raises
    ``ConfigError`` for an unknown name in ``only``, an invalid run config, an unfinished run folder without
    ``resume``, or a run whose ``"@X"`` has not finished."""
    from cpr.ablation.tables import write_outputs
    from cpr.distributed import process_state
    from cpr.training.logs import close_run_log, open_run_log

    runs, state = plan(ab), process_state()
    selected = _select(runs, only)
    handler = open_run_log(ab.output_dir, "ablation.log", write=state.is_main_process)
    done: dict[str, list[str]] = {"ran": [], "skipped": [], "diverged": []}
    try:
        for run in [] if table_only else selected:
            run_config(ab, run, strict=False)
        for run in [] if table_only else selected:
            done[_execute(ab, run, resume)].append(run.name)
            state.wait_for_everyone()  # the main process has written the run's summary.json
        outputs = write_outputs(ab, runs) if state.is_main_process else {}
    finally:
        close_run_log(handler)
    return {**done, "statuses": {r.name: read_run(Path(ab.output_dir) / r.name).status for r in runs},
            "outputs": {k: str(v) for k, v in outputs.items()}}


def commands(ab: Ablation, only: Sequence[str] = ()) -> list[str]:
    """``--list``'s lines (docs/ablations.md): per run (those in ``only``, else all), in order, a comment with
    its recipe and ``--set`` overrides (``@X`` until run X finished) and its ``--only NAME --resume`` command;
    then ``--table-only``."""
    launcher, config = shlex.split(ab.launcher), ab.path or "ABLATION.yaml"
    lines = ["# runs, in order (one that starts from another run's adapter needs that run finished); each command "
             "starts its run, continues it when run again after a crash, and skips it once finished"]
    for run in _select(plan(ab), only):
        sets = [x for item in overrides(ab, run, strict=False, keep_unfinished=True) for x in ("--set", item)]
        lines.append(f"# {run.name}: " + shlex.join([RECIPES[run.recipe], "--config", ab.base_config, *sets]))
        lines.append(shlex.join([*launcher, ABLATION_RECIPE, "--config", config, "--only", run.name, "--resume"]))
    return [*lines, "# when they have finished: the table",
            shlex.join(["python", ABLATION_RECIPE, "--config", config, "--table-only"])]


def run(args: argparse.Namespace) -> int:
    """``cpr ablate`` / ``recipes/reward_ablation.py``: run the ablation the parsed arguments describe."""
    ab = load_ablation(args.config)
    only = [n.strip() for v in args.only for n in v.split(",") if n.strip()]
    if args.list:
        for run_ in _select(plan(ab), only):  # the listed commands build valid configs (the list alone on the console)
            run_config(ab, run_, strict=False, warn_dropped=False)
        print("\n".join(commands(ab, only)))
        return 0
    result = run_ablation(ab, only=only, resume=args.resume, table_only=args.table_only)
    if result["outputs"].get("markdown"):
        print("\n" + Path(result["outputs"]["markdown"]).read_text(encoding="utf-8"))
    print(json.dumps({k: result[k] for k in ("ran", "skipped", "diverged", "statuses")}, indent=1))
    return 0


def register(subparsers: Any) -> None:
    """Add ``cpr ablate`` (also ``recipes/reward_ablation.py``) to the ``cpr`` command line."""
    p = subparsers.add_parser("ablate", help="run an ablation (a list of override sets), build its table and figures",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="ablation YAML (recipes/configs/ablation_*.yaml)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only this run (repeatable or comma-separated); the table covers every run")
    p.add_argument("--resume", action="store_true", help="continue unfinished runs from their last checkpoint")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print one command line per run and exit")
    mode.add_argument("--table-only", action="store_true", help="build the table and figures from what has finished")
    p.set_defaults(func=run)


def main(argv: Sequence[str] | None = None) -> int:
    """``cpr ablate ARGV`` (``recipes/reward_ablation.py``); the exit code."""
    from cpr.errors import run_command

    parser = argparse.ArgumentParser(prog="cpr")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["ablate", *(sys.argv[1:] if argv is None else argv)])
    return run_command("cpr ablate", args.func, args)
