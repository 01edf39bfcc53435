"""``benchmarks/gpu_check.py``: its processor for the shipped Qwen2.5-VL-3B config, and a CPU run on a tiny model."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_real_vocab_processor_uses_the_shipped_configs_token_ids():
    import json

    from PIL import Image

    from cpr.models import apply_pixel_limits
    from cpr_tools.tiny_models import default_corpus

    real_vocab_processor = runpy.run_path(str(REPO / "benchmarks" / "gpu_check.py"))["real_vocab_processor"]
    folder = REPO / "cpr/models/configs/qwen2_5_vl_3b"
    config = json.loads((folder / "config.json").read_text())
    proc = real_vocab_processor(folder, default_corpus())
    tok = proc.tokenizer
    assert len(tok) == 151657  # 151643 regular tokens, then Qwen's specials up to <|video_pad|>
    for key, token in (("image_token_id", "<|image_pad|>"), ("vision_start_token_id", "<|vision_start|>"),
                       ("video_token_id", "<|video_pad|>"), ("eos_token_id", "<|im_end|>"), ("bos_token_id", "<|endoftext|>")):
        assert tok.convert_tokens_to_ids(token) == config[key], key
    assert (tok.eos_token_id, tok.pad_token_id) == (151645, 151643)
    apply_pixel_limits(proc, "qwen2_5_vl", 3136, 602112)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = proc(text=[text], images=[[Image.new("RGB", (1200, 900))]], return_tensors="pt")
    # 1200 x 900 px under max_pixels 602112 -> resized to 868 x 644 px = 62 x 46 patches of 14 px -> 31 x 23 = 713 tokens
    assert inputs["image_grid_thw"].tolist() == [[1, 46, 62]]
    assert int((inputs["input_ids"][0] == 151655).sum()) == 46 * 62 // 4


@pytest.mark.slow
def test_gpu_check_runs_on_cpu_with_the_tiny_model():
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--model", "tiny:qwen2_5_vl", "--device", "cpu", "--steps", "2",
         "--max-completion-length", "8"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    header = "step      total s generation s    scoring s     reward s    fwd/bwd s  optimizer s      other s  reward %  gen tok/s train tok/s"
    assert header in out
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+[12]\s+\d", line)]
    assert len(rows) == 2
    for row in rows:
        total, generation, scoring, reward, fwd_bwd, optimizer, other, share, gen_tps, train_tps = map(float, row[1:])
        assert min(total, generation, scoring, reward, fwd_bwd, optimizer, gen_tps, train_tps) > 0
        assert generation + scoring + reward + fwd_bwd + optimizer + other == pytest.approx(total, abs=0.01)
        assert share == pytest.approx(100 * reward / total, abs=0.1)
    assert "| reward" in out and "% of the step" in out
    assert re.search(r"prompt: \d+ tokens \(\d+ image tokens\), 4 sequences generated at once", out)
    assert "peak GPU memory: n/a on CPU" in out and "process peak RSS:" in out
    assert re.search(r"reward on 4 well-formed completions \(\d+ steps\): [\d.]+ s = [\d.]+ % of the mean step", out)


def test_the_combined_recipe_launch_names_what_it_did_not_log(tmp_path):
    """``--recipe``'s ``combined`` variant fails a launch that exits 0 without the metrics of its options."""
    import json

    combined_problems = runpy.run_path(str(REPO / "benchmarks" / "gpu_check.py"))["combined_problems"]
    (tmp_path / "cpr").mkdir()
    (tmp_path / "cpr" / "log.jsonl").write_text(json.dumps({"step": 1, "baseline/greedy_reward": 0.1}) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"phases": [{"phase": "answer_only"}, {"phase": "cpr"}]}))
    assert combined_problems(tmp_path) == [
        "phase cpr logged no baseline/frac_zero_signal", "phase cpr logged no credit/fallback_rate",
        "phase answer_only has no dynamic_sampling totals in summary.json",
        "the final evaluation wrote no sampled completions"]
    (tmp_path / "cpr" / "log.jsonl").write_text(json.dumps(
        {"baseline/greedy_reward": 0.1, "baseline/frac_zero_signal": 1.0, "credit/fallback_rate": 1.0}) + "\n")
    (tmp_path / "summary.json").write_text(json.dumps({"phases": [{"phase": "answer_only", "dynamic_sampling": {}}]}))
    (tmp_path / "final_eval" / "crystal").mkdir(parents=True)
    (tmp_path / "final_eval" / "crystal" / "sampled_completions.jsonl").write_text("")
    assert combined_problems(tmp_path) == []


@pytest.mark.slow
def test_gpu_check_recipe_mode_launches_ddp_and_zero3_on_cpu_processes():
    """``--recipe``: the recipe on 2 gloo processes under DDP and ZeRO-3 (one step a phase, the eval hook,
    selection, the final evaluation on images above the tiny model's pixel limit), every launch exit 0; each
    launcher also with dynamic sampling, the greedy baseline with step credit and sampled evaluation, which
    log their metrics."""
    pytest.importorskip("deepspeed")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--recipe", "--model", "tiny:qwen2_5_vl",
                           "--steps", "1", "--timeout", "600"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=2600)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "gpu_check --recipe: all launches exited 0" in out
    for launch, device in (("ddp", "cpu"), ("zero3", "cpu:0")):
        block = out.split(f"\n{launch} on 2 processes: exit 0, ")[1].split("\n\n")[0]
        stages = re.findall(r"^  (.+?)\s+(\d+\.\d) s   (\S+)$", block, flags=re.M)
        assert [s for s, _, _ in stages] == ["phase answer_only: training", "phase answer_only: selection",
                                             "phase cpr: training", "final evaluation"], block
        assert all(d == device and float(t) > 0 for _, t, d in stages), block
        assert "phase answer_only: eval hook at steps [1]; selected" in block
        assert "phase cpr: eval hook at steps [1]" in block
        assert "status finished; final evaluation on 3 test records (images above 12544 pixels)" in block
        combined = out.split(f"\n{launch} + combined on 2 processes: exit 0, ")[1].split("\n\n")[0]
        assert "combined: dynamic sampling, greedy baseline with step credit, sampled evaluation logged" in combined
