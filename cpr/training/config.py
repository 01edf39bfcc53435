"""Experiment configuration: one YAML file describes a whole run, read by OmegaConf (so ``5e-4`` is a number) with
``--set key=value`` overrides; :func:`load_config` checks everything before any model loads, raising
:class:`cpr.errors.ConfigError` with the dotted key.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cpr.errors import ConfigError
from cpr.training.config_checks import _validate
from cpr.training.config_sections import ExperimentConfig, _parse


def config_from_dict(data: Mapping[str, Any], *, config_path: str | None = None) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from a mapping (a run's ``training_effective`` ignored).
    Raises ``ConfigError`` for an unknown key or an invalid value (dotted key and ``config_path`` named)."""
    if isinstance(data, Mapping):
        data = {k: v for k, v in data.items() if k != "training_effective"}
    try:
        cfg = _parse(ExperimentConfig, data)
        cfg.config_path = config_path
        return _validate(cfg)
    except ConfigError as e:
        raise ConfigError(e.message, field=e.field, path=e.path or config_path) from None


def read_run_config(path: str | Path) -> ExperimentConfig:
    """A run's resolved ``config.yaml`` as an :class:`ExperimentConfig`, type-checked but not cross-checked (a
    recipe's reward functions and datasets need not be at hand): what ``cpr eval`` reads of an adapter's run.
    Raises ``ConfigError`` (file and key named) for unreadable YAML, not a mapping, an unknown key or a wrong
    type; ``FileNotFoundError`` when ``path`` does not exist."""
    data = read_yaml(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"expected a mapping, got {type(data).__name__}", path=path)
    try:
        return _parse(ExperimentConfig, {k: v for k, v in data.items() if k != "training_effective"})
    except ConfigError as e:
        raise ConfigError(e.message, field=e.field, path=path) from None


def load_config(path: str | Path, overrides: Sequence[str] = (), *, warn_dropped: bool = True) -> ExperimentConfig:
    """Read a YAML experiment config, apply ``key=value`` overrides (:func:`apply_overrides`), validate it. An
    override of ``phases`` also leaves out the ``phase_settings`` and ``evaluation.compare`` entries of the
    phases it drops (a warning unless ``warn_dropped`` is false). Raises ``ConfigError`` (file, override and
    dotted key named) for unreadable YAML, an unknown key or an invalid value; ``FileNotFoundError`` when
    ``path`` does not exist."""
    data = read_yaml(path)
    if overrides and isinstance(data, dict):
        file_phases = data.get("phases", ExperimentConfig.model_fields["phases"].default)
        data = apply_overrides(data, overrides)
        phases, settings, evaluation = data.get("phases"), data.get("phase_settings"), data.get("evaluation")
        if "phases" in map(_name, overrides) and isinstance(phases, list) and isinstance(file_phases, list):
            gone = [p for p in file_phases if p not in phases]
            if isinstance(settings, dict) and any(k in gone for k in settings):
                logging.getLogger("cpr.training").log(logging.WARNING if warn_dropped else logging.DEBUG,
                                                      "phases %s: leaving out phase_settings of %s", phases,
                                                      sorted(str(k) for k in settings if k in gone))
                data["phase_settings"] = {k: v for k, v in settings.items() if k not in gone}
            if isinstance(evaluation, dict) and isinstance(evaluation.get("compare"), list):
                evaluation["compare"] = [c for c in evaluation["compare"] if c not in gone]
    try:
        return config_from_dict(data, config_path=str(path))
    except ConfigError as e:  # name the last override that set the key, a key above it or one below it
        key = (e.field or "").replace("[", ".").replace("]", "")
        given = [o for o in overrides if e.field and (f"{key}.".startswith(f"{_name(o)}.") or _name(o).startswith(f"{key}."))]
        if not given or e.path != str(path):
            raise
        raise ConfigError(e.message, field=e.field, path=f"{path} (--set {given[-1]})") from None


def config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """:func:`load_config` of the parsed arguments of :func:`cpr.training.cli.add_arguments`."""
    overrides = list(args.overrides)
    if args.output_dir:
        overrides.append(f"output_dir={args.output_dir}")
    if args.phases:
        overrides.append(f"phases=[{args.phases}]")
    return load_config(args.config, overrides)


def _name(override: str) -> str:
    return override.partition("=")[0].strip().replace("[", ".").replace("]", "")


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``data`` with ``key.sub=value`` / ``key[i].sub=value`` overrides (YAML values) applied in order, each
    replacing what was there, a mapping included. Raises ``ConfigError`` naming an override that cannot apply."""
    conf = OmegaConf.create(dict(data))
    for item in overrides:
        if "=" not in item or not _name(item):
            raise ConfigError(f"override {item!r} is not of the form key.sub=value", field=item)
        key = item.partition("=")[0].strip()
        try:
            OmegaConf.update(conf, key, None, merge=False)  # replace rather than merge a mapping
            conf.merge_with_dotlist([f"{key}={item.partition('=')[2]}"])
        except (OmegaConfBaseException, yaml.YAMLError) as e:
            raise ConfigError(f"cannot apply override {item!r}: {' '.join(str(e).split())}", field=key) from None
    return OmegaConf.to_container(conf)


def read_yaml(path: str | Path) -> Any:
    """The content of a YAML file as plain dicts and lists, read by OmegaConf. Raises ``ConfigError`` (invalid
    YAML, the file named) or ``FileNotFoundError``."""
    try:
        return OmegaConf.to_container(OmegaConf.load(path))
    except yaml.YAMLError as e:
        raise ConfigError("invalid YAML: " + " ".join(str(e).split()), path=path) from None
