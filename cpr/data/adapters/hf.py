"""Reading Hugging Face datasets (a ``save_to_disk`` folder or a hub name) and Arrow batches, a few rows
at a time and as stored: an image cell stays its encoded ``{"bytes", "path"}`` dict, nothing is decoded."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cpr.data.adapters.base import RawRow
from cpr.errors import DatasetNotAvailableError, InputError

_HUB_NAME_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_DISK_MARKERS = ("dataset_dict.json", "state.json", "dataset_info.json")


def is_saved_dataset(path: Path) -> bool:
    """True when ``path`` is a folder written by ``Dataset(Dict).save_to_disk``."""
    return path.is_dir() and any((path / m).is_file() for m in _DISK_MARKERS)


def looks_like_hub_name(text: str) -> bool:
    """True for ``owner/name`` strings that are not existing local paths."""
    return bool(_HUB_NAME_RE.match(text)) and not Path(text).exists()


def hf_rows(path_or_name: str | Path, split: str | None, source: str, *, alternatives: str = "") -> Iterator[RawRow]:
    """Rows of ``split`` (``None``: the only one) of a ``save_to_disk`` folder or an ``owner/name`` hub
    dataset (:func:`arrow_rows`), their ``path`` naming the dataset and split (``DIR[test]``).

    Raises ``DatasetNotAvailableError`` (an ``InputError``) for an unreachable hub dataset (saying how to give
    a local copy, or the adapter's ``alternatives`` format; ``offline`` when the hub cannot be reached at all),
    ``InputError`` for an unknown split, or several splits and none chosen.
    """
    import datasets

    local = Path(str(path_or_name)).expanduser()
    name = str(path_or_name)
    if local.exists():
        if not is_saved_dataset(local):
            raise InputError(f"{source}: not a dataset saved with save_to_disk (no {' / '.join(_DISK_MARKERS)})", path=local)
        obj, where, folder = datasets.load_from_disk(str(local)), str(local), local
    elif looks_like_hub_name(name):
        try:
            obj, where, folder = datasets.load_dataset(name, split=split), name, None
        except (ConnectionError, OSError, datasets.exceptions.DatasetNotFoundError) as e:
            raise DatasetNotAvailableError(
                f"{source}: cannot load the Hugging Face dataset '{name}' ({type(e).__name__}: {e}). This machine "
                f"cannot download it (offline, or the dataset is gated). On a machine with hub access run "
                f"`datasets.load_dataset('{name}').save_to_disk('DIR')`, copy DIR here and pass DIR as the path"
                + (f" ({alternatives} of the same columns also works)" if alternatives else ""),
                path=name, offline=isinstance(e, ConnectionError)) from e
    else:
        raise InputError(f"{source}: path does not exist (and is not an owner/name hub id)", path=local)
    if isinstance(obj, datasets.DatasetDict):
        names = list(obj)
        if split is None and len(names) != 1:
            raise InputError(f"{source}: the dataset has splits {names}; choose one with split=...", path=where, field="split")
        split = split or names[0]
        if split not in obj:
            raise InputError(f"{source}: no split {split!r} (available: {names})", path=where, field="split")
        obj, where = obj[split], f"{where}[{split}]"
    elif split is not None and obj.split is not None and str(obj.split) != split:
        raise InputError(f"{source}: the dataset holds split {str(obj.split)!r}, not {split!r}", path=where, field="split")
    split = split or (str(obj.split) if obj.split is not None else None)
    yield from arrow_rows(obj.with_format("arrow").iter(batch_size=32), where, base_dir=folder, split=split)


def arrow_rows(batches: Iterable[Any], where: str | Path, *, base_dir: Path | None = None,
               split: str | None = None) -> Iterator[RawRow]:
    """Rows of Arrow record batches (or tables) as stored, one batch held in memory at a time."""
    index = 0
    for batch in batches:
        for data in batch.to_pylist():
            rid = None if data.get("id") is None else str(data["id"])
            yield RawRow(data, where, record_id=rid, base_dir=base_dir, index=index, split=split)
            index += 1
