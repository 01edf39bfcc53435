"""The demo's testbed (recipes/configs/demo.yaml): its warm start learns from a teacher that states few of the
reference steps, and only true ones, the CRYSTAL paper's precise and terse base model (Table 4, Qwen2.5-VL-3B:
P 0.898, R 0.347) in miniature, where a step reward has missing steps to teach. Pinned on a sample of the training
records the warm start sees, scored by the project's Match F1 at the demo's threshold, so that a change to the
teacher, the task or the config cannot silently remove what the demo demonstrates."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from cpr.data.synthetic import generate
from cpr.matching import get_encoder, score_batch
from cpr.training.config import load_config
from cpr.training.warm_start import teacher_records

DEMO = Path(__file__).resolve().parents[1] / "recipes" / "configs" / "demo.yaml"


def test_the_demo_warm_start_targets_are_precise_and_state_few_steps(offline_encoder_path):
    cfg = load_config(str(DEMO))
    records = list(generate(120, seed=0, split="train"))  # the demo's training split, first 120 items
    taught = teacher_records(records, cfg.warm_start.step_keep, cfg.seed)
    scores = score_batch([t.reference_steps for t in taught], [r.reference_steps for r in records],
                         encoder=get_encoder(offline_encoder_path), threshold=cfg.rewards.threshold)
    precision = statistics.mean(s.precision for s in scores)
    recall = statistics.mean(s.recall for s in scores)
    # Oracle without the encoder: the teacher states a subset of the reference steps word for word, so each
    # stated step matches its own reference step and recall is the share of steps stated.
    stated = statistics.mean(len(t.reference_steps) / len(r.reference_steps) for t, r in zip(taught, records, strict=True))
    assert precision == pytest.approx(1.0)
    assert recall == pytest.approx(stated, abs=1e-12)
    assert recall <= 0.7
    assert precision - recall >= 0.3
