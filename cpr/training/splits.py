"""Training, validation and test records of an experiment; without a validation (or test) dataset a seeded share
of the training records is held out, stratified by difficulty bucket."""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cpr.data import Records, load_records
from cpr.errors import ConfigError, InputError
from cpr.training.config_sections import DataConfig, DataSourceConfig, ExperimentConfig

if TYPE_CHECKING:  # pragma: no cover
    from cpr.data import PromptTemplates

logger = logging.getLogger("cpr.training")


@dataclass
class DataSplits:
    """The records of one experiment (:class:`cpr.data.Records`)."""

    train: Records
    validation: Records
    test: Records

    def counts(self) -> dict[str, int]:
        """Number of records per split."""
        return {"train": len(self.train), "validation": len(self.validation), "test": len(self.test)}


def load_sources(sources: Sequence[DataSourceConfig], data: DataConfig, *, key: str,
                 validate_images: bool | None = None, config_path: str | None = None) -> Records:
    """Load and concatenate datasets (``key`` names them in the log and in errors). Raises ``InputError`` for
    invalid records or an id present in two datasets, ``ConfigError`` (field ``<key>[i].<setting>``, path
    ``config_path``) when a source refuses its settings."""
    buckets = data.bucket_config
    out: list[Records] = []
    seen: dict[str, str] = {}
    for i, src in enumerate(sources):
        try:
            recs = load_records(
                src.source, src.path, split=src.split, on_invalid=data.on_invalid, buckets=buckets, limit=src.limit,
                validate_images=data.validate_images if validate_images is None else validate_images,
                options=src.options or None,
            )
        except ConfigError as e:
            if e.path is not None or (e.field or "").startswith(f"{key}["):
                raise
            field = f"{key}[{i}].{e.field}" if e.field else f"{key}[{i}]"
            raise ConfigError(e.message, field=field, path=config_path) from None
        where = src.path or f"split {src.split or 'train'}, options {src.options or {}}"  # generated: no path
        for rid in recs.column("id"):
            if rid in seen:
                raise InputError(f"duplicate id across datasets (also in {seen[rid]})", path=where, record_id=rid,
                                 field="id")
            seen[rid] = where
        logger.info("%s[%d]: %d records from %s (%s)", key, i, len(recs), where, src.source)
        out.append(recs)
    return Records.concatenate(out)


def hold_out(records: Records, size: float, seed: int) -> tuple[Records, Records]:
    """Split ``records`` into (kept, held_out), holding out ``size`` (a share < 1 or a count >= 1)
    stratified by difficulty bucket (largest-remainder allocation), seeded; both keep the input order.
    Raises ``ConfigError`` when the hold-out would leave no record to keep."""
    n_out = int(size) if size >= 1 else round(size * len(records))
    if n_out == 0:
        return records, records.select([])
    if n_out >= len(records):
        raise ConfigError(f"holding out {n_out} of {len(records)} records leaves none to train on",
                          field="data.validation_size")
    by_bucket: dict[str, list[int]] = defaultdict(list)
    for i, difficulty in enumerate(records.column("difficulty")):
        by_bucket[difficulty or ""].append(i)
    quotas = {b: n_out * len(ix) / len(records) for b, ix in by_bucket.items()}
    alloc = {b: int(q) for b, q in quotas.items()}
    for b in sorted(quotas, key=lambda b: (-(quotas[b] - alloc[b]), b))[: n_out - sum(alloc.values())]:
        alloc[b] += 1
    rng = random.Random(seed)
    chosen: set[int] = set()
    for b in sorted(by_bucket):
        ix = list(by_bucket[b])
        rng.shuffle(ix)
        chosen.update(ix[: alloc[b]])
    return records.select(i for i in range(len(records)) if i not in chosen), records.select(sorted(chosen))


def load_splits(data: DataConfig, seed_offset: int = 0, *, config_path: str | None = None) -> DataSplits:
    """Read every dataset of ``data`` and make the held-out splits it asks for (errors: :func:`load_sources`;
    ``config_path``: the YAML file they name)."""
    train = load_sources(data.train, data, key="data.train", config_path=config_path)
    if not train:
        raise ConfigError("the training datasets hold no valid records", field="data.train")
    seed = data.split_seed + seed_offset
    if data.test:
        test = load_sources(data.test, data, key="data.test", config_path=config_path)
    else:
        train, test = hold_out(train, data.test_size, seed)
    if data.validation:
        validation = load_sources(data.validation, data, key="data.validation", config_path=config_path)
    else:
        train, validation = hold_out(train, data.validation_size, seed + 1)
    return DataSplits(train=train, validation=validation, test=test)


def load_run_data(cfg: ExperimentConfig) -> tuple[DataSplits, PromptTemplates]:
    """The splits and prompt templates of a run, as the run and ``cpr train --check`` load them."""
    from cpr.data import load_templates

    return load_splits(cfg.data, config_path=cfg.config_path), load_templates(cfg.data.prompts)
