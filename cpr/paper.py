"""The CRYSTAL paper's Table 4 (CRYSTAL test set; docs/method.md section 9), for reports that put our
numbers beside it. ``None`` marks a cell the paper leaves empty ("-")."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PaperRow:
    """One row: ``model`` (as the paper writes it), ``method`` (``"base"`` or ``"CPR-Curriculum"``),
    ``accuracy`` in percent, ``match_f1``, ``precision``, ``recall``, ``lis``, ``ordered_f1`` in [0, 1],
    ``steps`` (mean predicted steps); the columns of the paper's Table 2 (docs/method.md section 3)."""

    model: str
    method: str
    accuracy: float
    match_f1: float
    precision: float
    recall: float
    steps: float | None
    lis: float | None
    ordered_f1: float

    @property
    def label(self) -> str:
        """``"<model> <method>"``, e.g. ``"Qwen2.5-VL-3B base"``."""
        return f"{self.model} {self.method}"

    def as_summary(self) -> dict[str, float | None]:
        """The row with the summary keys of :func:`cpr.scoring.summarize` (no ``n``)."""
        return {k: v for k, v in asdict(self).items() if k not in ("model", "method")}


PAPER_TABLE4: tuple[PaperRow, ...] = (
    PaperRow("Qwen2.5-VL-3B", "base", 39.85, 0.480, 0.898, 0.347, 3.73, 0.723, 0.434),
    PaperRow("Qwen2.5-VL-3B", "CPR-Curriculum", 47.52, 0.633, 0.963, 0.493, 5.10, 0.626, 0.560),
    PaperRow("InternVL3.5-4B", "base", 37.61, 0.432, 0.895, 0.325, 3.75, 0.775, 0.387),
    PaperRow("InternVL3.5-4B", "CPR-Curriculum", 45.76, 0.833, 0.903, 0.811, None, None, 0.719),
)
"""The paper's Table 4 rows (docs/method.md section 9), base models first within each model."""


def paper_rows(method: str | None = None) -> list[PaperRow]:
    """Rows of :data:`PAPER_TABLE4`, all of them or those of one ``method`` (``"base"``, ...)."""
    return [row for row in PAPER_TABLE4 if method is None or row.method == method]
