"""Source adapters, registered by name (the ``source`` argument of ``load_records``): ``crystal``,
``mathvision``, ``tabmwp``, ``scienceqa``, ``m3cot``, ``vlrmbench``, ``jsonl``, ``synthetic`` (generated,
:mod:`cpr.data.synthetic`); :func:`register_adapter` adds a subclass of :class:`Adapter`."""

from __future__ import annotations

from typing import Any

from cpr.data.adapters.base import Adapter, RawRow, SkipRow
from cpr.data.adapters.crystal import CrystalAdapter
from cpr.data.adapters.jsonl import JsonlAdapter
from cpr.data.adapters.m3cot import M3CoTAdapter
from cpr.data.adapters.mathvision import MathVisionAdapter
from cpr.data.adapters.scienceqa import ScienceQAAdapter
from cpr.data.adapters.synthetic import SyntheticAdapter
from cpr.data.adapters.tabmwp import TabMWPAdapter
from cpr.data.adapters.vlrmbench import VLRMBenchAdapter
from cpr.errors import ConfigError

__all__ = ["ADAPTERS", "Adapter", "RawRow", "SkipRow", "get_adapter", "register_adapter"]

ADAPTERS: dict[str, type[Adapter]] = {}


def register_adapter(cls: type[Adapter]) -> type[Adapter]:
    """Register ``cls`` under ``cls.name``; ``ValueError`` if another adapter has the name."""
    if ADAPTERS.get(cls.name, cls) is not cls:
        raise ValueError(f"an adapter named {cls.name!r} is already registered")
    ADAPTERS[cls.name] = cls
    return cls


def get_adapter(name: str, **options: Any) -> Adapter:
    """The adapter registered as ``name``, built with ``options``; ``ConfigError`` (field ``source``)
    for an unknown name, listing the known ones."""
    if name not in ADAPTERS:
        raise ConfigError(f"unknown source {name!r} (known: {', '.join(sorted(ADAPTERS))})", field="source")
    return ADAPTERS[name](**options)


for _cls in (CrystalAdapter, MathVisionAdapter, TabMWPAdapter, ScienceQAAdapter, M3CoTAdapter, VLRMBenchAdapter,
             JsonlAdapter, SyntheticAdapter):
    register_adapter(_cls)
