"""Reference numbers published in the CRYSTAL paper, for reports that put ours beside them.

Source: CRYSTAL paper (arXiv 2603.13099), Table 4 (CRYSTAL test set), restated in docs/method.md section 9.
Columns are those of the paper's Table 2 (docs/method.md section 3): Accuracy in percent, Match F1,
precision, recall, mean predicted steps, LIS ratio and Ordered Match F1 in [0, 1]. ``None``
marks a cell the paper leaves empty ("-").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PAPER_TABLE4", "PaperRow", "paper_rows"]


@dataclass(frozen=True)
class PaperRow:
    """One row of the paper's Table 4 (CRYSTAL test).

    Attributes:
        model: model name as the paper writes it.
        method: ``"base"`` (no training) or ``"CPR-Curriculum"``.
        accuracy: answer accuracy in percent.
        match_f1, precision, recall: step Match F1 and its precision / recall, in [0, 1].
        steps: mean number of predicted steps (``None`` where the paper gives none).
        lis: LIS ratio in [0, 1] (``None`` where the paper gives none).
        ordered_f1: Ordered Match F1 in [0, 1].
    """

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
        return {
            "accuracy": self.accuracy,
            "match_f1": self.match_f1,
            "precision": self.precision,
            "recall": self.recall,
            "steps": self.steps,
            "lis": self.lis,
            "ordered_f1": self.ordered_f1,
        }


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
