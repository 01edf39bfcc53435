"""The CRYSTAL paper's reward-weight ablation (Table 6), for tables that put ours beside it.

Source: CRYSTAL paper (arXiv 2603.13099), Table 6, restated in docs/method.md section 7. Columns: validation
accuracy in percent, Match F1 and recall in [0, 1], Discrimination (mean reward of correct-answer
completions minus that of wrong-answer ones), r(F1) (Pearson correlation of reward with step F1)
and the largest logged KL. The paper gives no row for 0.20 / 0.80 (one of the six pairs of the sweep).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PAPER_TABLE6", "PaperWeightRow", "paper_weight_row"]


@dataclass(frozen=True)
class PaperWeightRow:
    """One row of the paper's Table 6 (``answer_weight`` / ``step_weight`` = a_w / s_w)."""

    answer_weight: float
    step_weight: float
    accuracy: float
    match_f1: float
    recall: float
    discrimination: float
    r_f1: float
    kl_max: float

    def as_dict(self) -> dict[str, float]:
        """The row with the keys of :func:`cpr.ablation.tables.build_weights_table`'s rows."""
        return {
            "answer_weight": self.answer_weight,
            "step_weight": self.step_weight,
            "accuracy": self.accuracy,
            "match_f1": self.match_f1,
            "recall": self.recall,
            "discrimination": self.discrimination,
            "r_f1": self.r_f1,
            "kl_max": self.kl_max,
        }


PAPER_TABLE6: tuple[PaperWeightRow, ...] = (
    PaperWeightRow(0.80, 0.20, 81.79, 0.676, 0.553, 0.865, 0.338, 1.274),
    PaperWeightRow(0.70, 0.30, 82.61, 0.731, 0.627, 0.797, 0.410, 0.456),
    PaperWeightRow(0.65, 0.35, 82.70, 0.728, 0.634, 0.763, 0.448, 0.372),
    PaperWeightRow(0.50, 0.50, 79.39, 0.730, 0.629, 0.662, 0.563, 1.218),
    PaperWeightRow(0.35, 0.65, 78.53, 0.736, 0.642, 0.560, 0.670, 1.684),
)
"""The paper's values (docs/method.md section 7), in the paper's order."""


def paper_weight_row(answer_weight: float, step_weight: float) -> PaperWeightRow | None:
    """The paper's row for ``(answer_weight, step_weight)`` (to 1e-9), or ``None`` if it has none."""
    for row in PAPER_TABLE6:
        if abs(row.answer_weight - answer_weight) < 1e-9 and abs(row.step_weight - step_weight) < 1e-9:
            return row
    return None
