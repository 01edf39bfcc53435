"""Source adapters, registered by name (the ``source`` argument of ``load_records``).

Built in: ``crystal``, ``mathvision``, ``tabmwp``, ``scienceqa``, ``m3cot``, ``vlrmbench``,
``jsonl``, ``synthetic`` (generated, :mod:`cpr.data.synthetic`). :func:`register_adapter` adds one (a subclass of :class:`Adapter`).
"""

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

ADAPTERS: dict[str, type[Adapter]] = {}


def register_adapter(cls: type[Adapter], *, replace: bool = False) -> type[Adapter]:
    """Register ``cls`` under ``cls.name``; ``ValueError`` if taken (unless ``replace``)."""
    if not replace and cls.name in ADAPTERS and ADAPTERS[cls.name] is not cls:
        raise ValueError(f"an adapter named {cls.name!r} is already registered")
    ADAPTERS[cls.name] = cls
    return cls


def get_adapter(name: str, **options: Any) -> Adapter:
    """Instantiate the adapter registered as ``name`` with its ``options``.

    Raises ``ConfigError`` (field ``source``) for an unknown name, listing the known ones.
    """
    try:
        cls = ADAPTERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown source {name!r} (known: {', '.join(sorted(ADAPTERS))})", field="source"
        ) from None
    return cls(**options)


for _cls in (
    CrystalAdapter,
    MathVisionAdapter,
    TabMWPAdapter,
    ScienceQAAdapter,
    M3CoTAdapter,
    VLRMBenchAdapter,
    JsonlAdapter,
    SyntheticAdapter,
):
    register_adapter(_cls)

__all__ = ["ADAPTERS", "Adapter", "RawRow", "SkipRow", "get_adapter", "register_adapter"]
