"""Disk full in a run: one error that names the folder, the space left and the space a checkpoint needs."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from cpr.errors import CprError

#: What torch's checkpoint writer (a zip archive) says when a write came up short, as on a full disk.
_TORCH_SHORT_WRITE = ("inline_container", "PytorchStreamWriter failed writing")


class DiskFullError(CprError):
    """No space left where the run writes: the one-line message names the folder, its free space and the space a
    checkpoint needs; the original error is the ``__cause__``."""


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def checkpoint_size(run_dir: Path) -> int:
    """Bytes of the largest ``checkpoint-N`` folder of the run in ``run_dir``; 0 without one."""
    return max((_size(c) for c in Path(run_dir).glob("*/checkpoint-*") if c.is_dir()), default=0)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def disk_full_error(exc: BaseException, run_dir: Path) -> DiskFullError | None:
    """A :class:`DiskFullError` for ``exc`` when its cause / context chain holds an ``OSError`` ENOSPC or EDQUOT,
    or torch's short-write error while ``run_dir`` has less free space than a checkpoint takes; else ``None``."""
    needed = None
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        full = isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)
        if not full and isinstance(e, RuntimeError) and any(s in str(e) for s in _TORCH_SHORT_WRITE):
            needed = checkpoint_size(run_dir)
            full = _free(run_dir) < max(needed, 2**20)
        if full:
            needed = checkpoint_size(run_dir) if needed is None else needed
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
            need = f"a checkpoint of this run takes {_mib(needed)}" if needed else "no checkpoint was saved yet"
            return DiskFullError(
                f"no space left on the device of {run_dir} ({_mib(_free(run_dir))} free; {need}): "
                f"{type(e).__name__}: {first}; the complete checkpoints are kept: free space (or lower "
                f"save_total_limit) and continue with --resume")
        e = e.__cause__ or e.__context__
    return None


def _free(folder: Path) -> int:
    """Free bytes on ``folder``'s filesystem (of its nearest existing parent)."""
    folder = Path(folder)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free
