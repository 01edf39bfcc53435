"""notebooks/analysis.ipynb runs headless (nbclient, a kernel on this venv's python) on a real run
folder and on a real ablation folder produced here by short tiny-model runs, and writes its figures."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import yaml
from conftest import tiny_run_config
from PIL import Image

from cpr.ablation.sweep import load_ablation, run_ablation

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "analysis.ipynb"


def test_notebook_has_a_parameter_cell_first():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    # nbformat 4.5: every cell has a unique id (else nbformat warns, and fills in ids as it reads the file)
    ids = [c.get("id") for c in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]]
    assert all(ids) and len(set(ids)) == len(ids)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", [])
    assert code[0].source.startswith('RUN_DIR = "outputs/demo"')
    assert all(not c.get("outputs") for c in code)  # stored without outputs


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernel spec whose python is this test's (the venv's), found through JUPYTER_PATH."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "cpr-test-venv"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "cpr test venv", "language": "python",
    }))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(root))
    yield "cpr-test-venv"
    mp.undo()


@pytest.fixture(scope="module")
def strategies(tmp_path_factory, one_thread_module):
    """A strategy comparison: the base tiny model (no training) and a two-step CPR run with eval hook."""
    tmp = tmp_path_factory.mktemp("strategies")
    base = tmp / "base.yaml"
    base.write_text(yaml.safe_dump(tiny_run_config(
        "nb", tmp / "unused",
        training={"per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 16,
                  "save_steps": 1, "learning_rate": 1e-3},
        phases=["cpr"],
        phase_settings={"cpr": {"curriculum": {"schedule": "staged", "stage_fractions": [0.5, 0.75]},
                                "training": {"max_steps": 2}}},
        evaluation={"eval_steps": 1, "max_new_tokens": 16, "batch_size": 2},
        guards={"kl": {"limit": 7.5}},  # the notebook draws this limit, read from the run's config.yaml
    )))
    path = tmp / "abl.yaml"
    path.write_text(yaml.safe_dump({
        "kind": "strategies", "name": "nb", "base_config": str(base), "output_dir": str(tmp / "abl"),
        "runs": [{"name": "base", "label": "Base", "set": {"phases": []}}, {"name": "cpr", "label": "CPR-Curriculum"}],
    }))
    run_ablation(load_ablation(path))
    return tmp / "abl"


def _execute(kernel: str, run_dir: Path, fig_dir: Path, diagnosis: Path | None = None) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    params.source = (f"RUN_DIR = {str(run_dir)!r}\nFIG_DIR = {str(fig_dir)!r}\nKL_LIMIT = None\n"
                     f"DIAGNOSIS = {None if diagnosis is None else str(diagnosis)!r}")
    NotebookClient(nb, kernel_name=kernel, timeout=240, resources={"metadata": {"path": str(REPO)}}).execute()
    return nb


def _check_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 5_000, path
    with Image.open(path) as im:
        pixels = np.asarray(im.convert("RGB")).reshape(-1, 3)
    assert im.width >= 400 and im.height >= 300 and len(np.unique(pixels, axis=0)) >= 5, path


def _stdout(nb: nbformat.NotebookNode) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                   if o.get("output_type") == "stream")


@pytest.mark.slow
def test_notebook_on_an_ablation_folder(kernel, strategies, tmp_path):
    nb = _execute(kernel, strategies, tmp_path / "figs")
    made = sorted(str(p.relative_to(tmp_path / "figs")) for p in (tmp_path / "figs").rglob("*.png"))
    assert made == ["ablation_strategies.png", "cpr/bucket_mix.png", "cpr/f1_vs_accuracy.png", "cpr/hack_monitors.png",
                    "cpr/kl.png", "cpr/reward_components.png", "training_dynamics.png"]
    for name in made:
        _check_png(tmp_path / "figs" / name)
    assert "ablation folder" in _stdout(nb) and "7 figures in" in _stdout(nb)
    assert "no DIAGNOSIS: no learning curves" in _stdout(nb)
    assert "cpr: KL limit 7.5 (the run's guards.kl.limit)" in _stdout(nb)
    tables = [o for c in nb.cells for o in c.get("outputs", []) if "text/markdown" in o.get("data", {})]
    assert any("# Strategy comparison: nb" in o["data"]["text/markdown"] for o in tables)
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 7


def _scores(f1: float, sampled_f1: float) -> dict:
    return {"greedy": {"match_f1": f1, "accuracy": 100 * f1}, "sampled": {"match_f1": sampled_f1, "accuracy": 50.0}}


@pytest.mark.slow
def test_notebook_on_a_run_folder(kernel, strategies, tmp_path):
    diagnosis = tmp_path / "diagnosis.json"  # a diagnosis with one curve: warm start, steps 30 and 60 of 3,840
    diagnosis.write_text(json.dumps({
        "warm_start|val0x9": _scores(0.5, 0.4),
        "cpr|seed1|val0x9|": {**_scores(0.6, 0.45), "completions": 3840,
                              "curve": {"30": _scores(0.55, 0.42), "60": _scores(0.6, 0.45)}}}))
    nb = _execute(kernel, strategies / "cpr", tmp_path / "figs", diagnosis)
    made = sorted(p.name for p in (tmp_path / "figs").rglob("*.png"))
    assert made == ["bucket_mix.png", "f1_vs_accuracy.png", "hack_monitors.png", "kl.png", "learning_curves.png",
                    "reward_components.png"]
    assert "cpr (val0x9, 1 seed) 0:0.500/0.400 1920:0.550/0.420 3840:0.600/0.450" in _stdout(nb)
    for path in (tmp_path / "figs").rglob("*.png"):
        _check_png(path)
    assert "run folder" in _stdout(nb) and "a run folder: no ablation table" in _stdout(nb)
    assert "cpr: KL limit 7.5 (the run's guards.kl.limit)" in _stdout(nb)
