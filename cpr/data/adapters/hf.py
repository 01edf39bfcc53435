"""Reading Hugging Face datasets: a ``save_to_disk`` folder, or a hub name via ``load_dataset``.

Rows are read as stored, a few at a time from the memory-mapped Arrow table: an image cell is
its encoded ``{"bytes", "path"}`` dict, so loading decodes no image. A hub name
that cannot be reached (offline machines, gated datasets) raises an :class:`InputError` that
names the dataset and says how to give a local copy instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cpr.data.adapters.base import RawRow
from cpr.errors import InputError

_HUB_NAME_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DISK_MARKERS = ("dataset_dict.json", "state.json", "dataset_info.json")


def is_saved_dataset(path: Path) -> bool:
    """True when ``path`` is a folder written by ``Dataset(Dict).save_to_disk``."""
    return path.is_dir() and any((path / m).is_file() for m in _DISK_MARKERS)


def looks_like_hub_name(text: str) -> bool:
    """True for ``owner/name`` strings that are not existing local paths."""
    return bool(_HUB_NAME_RE.match(text)) and not Path(text).exists()


def offline_message(name: str, source: str, error: BaseException, alternatives: str = "") -> str:
    """The explanation given when a hub dataset cannot be loaded (``alternatives``: other local
    formats the adapter reads, e.g. "a parquet or JSON-lines export")."""
    return (
        f"{source}: cannot load the Hugging Face dataset '{name}' ({type(error).__name__}: {error}). "
        f"This machine cannot download it (offline, or the dataset is gated). On a machine with hub "
        f"access run `datasets.load_dataset('{name}').save_to_disk('DIR')`, copy DIR here and pass "
        f"DIR as the path" + (f" ({alternatives} of the same columns also works)" if alternatives else "")
    )


def hf_rows(
    path_or_name: str | Path, split: str | None, source: str, *, alternatives: str = ""
) -> Iterator[RawRow]:
    """Rows of the ``split`` of a ``save_to_disk`` folder or an ``owner/name`` hub dataset.

    Rows are read as stored, 32 at a time from the memory-mapped table (see :func:`arrow_rows`);
    their ``path`` names the dataset and split (``DIR[test]``), their ``base_dir`` is the local
    folder (string image paths are relative to it) and their ``split`` the split's name.

    Args:
        path_or_name: a ``save_to_disk`` folder or an ``owner/name`` hub id.
        split: the split to use; may be ``None`` when the dataset has exactly one.
        source: adapter name, for messages.
        alternatives: other local formats the adapter reads, named in the offline message.

    Raises:
        InputError: unreachable hub dataset, unknown split, or several splits and none chosen.
    """
    import datasets

    text = str(path_or_name)
    local = Path(text).expanduser()
    if local.exists():
        if not is_saved_dataset(local):
            raise InputError(
                f"{source}: not a dataset saved with save_to_disk (no {' / '.join(_DISK_MARKERS)})",
                path=local,
            )
        obj = datasets.load_from_disk(str(local))
        where, folder = str(local), local
    elif looks_like_hub_name(text):
        try:
            obj = datasets.load_dataset(text, split=split)
        except (ConnectionError, OSError, datasets.exceptions.DatasetNotFoundError) as e:
            raise InputError(offline_message(text, source, e, alternatives), path=text) from e
        where, folder = text, None
    else:
        raise InputError(f"{source}: path does not exist (and is not an owner/name hub id)", path=local)

    if isinstance(obj, datasets.DatasetDict):
        names = list(obj.keys())
        if split is None:
            if len(names) != 1:
                raise InputError(
                    f"{source}: the dataset has splits {names}; choose one with split=...",
                    path=where,
                    field="split",
                )
            split = names[0]
        if split not in obj:
            raise InputError(f"{source}: no split {split!r} (available: {names})", path=where, field="split")
        obj = obj[split]
        where = f"{where}[{split}]"
    elif split is not None and obj.split is not None and str(obj.split) != split:
        raise InputError(
            f"{source}: the dataset holds split {str(obj.split)!r}, not {split!r}", path=where, field="split"
        )
    elif split is None and obj.split is not None:
        split = str(obj.split)
    batches = obj.with_format("arrow").iter(batch_size=32)
    yield from arrow_rows(batches, where, base_dir=folder, split=split)


def arrow_rows(
    batches: Iterable[Any], where: str | Path, *, base_dir: Path | None = None, split: str | None = None
) -> Iterator[RawRow]:
    """Rows of Arrow record batches (or tables) as stored: image cells stay encoded
    ``{"bytes", "path"}`` dicts and only one batch is held in memory."""
    index = 0
    for batch in batches:
        for data in batch.to_pylist():
            rid = None if data.get("id") is None else str(data["id"])
            yield RawRow(data, where, record_id=rid, base_dir=base_dir, index=index, split=split)
            index += 1
