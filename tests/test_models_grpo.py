"""TRL's GRPOTrainer trains a LoRA adapter on both tiny vision-language models, on CPU, offline.

Each run: 4 conversational prompts with one image each (``prompt`` = list of messages with an
``{"type": "image"}`` placeholder, ``images`` = list of one PIL image, TRL's VLM dataset
format), 4 generations per prompt, 16 completion tokens, 2 optimizer steps, KL beta 0.04
(the reference model is the base model with the adapter disabled).  Each step's generation
batch is 2 prompts x 4 completions; rewards must vary within a group in both steps, otherwise
lora_A (whose gradient is zero while lora_B is still zero) would not move.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from conftest import tiny_model

from cpr.models import build_lora_config, load_model_and_processor

pytestmark = pytest.mark.slow



@pytest.fixture
def no_network(monkeypatch):
    """Refuse and record every IP connection attempt (Unix sockets stay allowed)."""
    attempts: list[tuple] = []
    real_connect = socket.socket.connect

    def guarded(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            attempts.append(address)
            raise OSError(f"network access attempted in an offline test: {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return attempts


def _dataset(samples_dir: Path):
    """Four prompts, each with a MATH-Vision image of data/samples."""
    from datasets import Dataset
    from PIL import Image

    files = sorted((samples_dir / "mathvision" / "images").glob("*.jpg"))[:4]
    images = [Image.open(p).convert("RGB") for p in files]
    questions = ["How many squares are there?", "What is the area?", "Which option is correct?", "Find x."]
    prompts = [
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}] for q in questions
    ]
    return Dataset.from_dict({"prompt": prompts, "images": [[im] for im in images]})


@pytest.mark.parametrize("include_vision", [False, True], ids=["lm_lora", "lm_and_vision_lora"])
@pytest.mark.parametrize("kind", ["qwen2_5_vl", "internvl"])
def test_grpo_trains_lora_on_cpu(
    kind, include_vision, tmp_path, samples_dir, one_thread, no_network, record_property
):
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, processor = load_model_and_processor(tiny_model(kind), device="cpu")
    base_before = {n: p.detach().clone() for n, p in model.named_parameters()}

    completions_seen: list[list[str]] = []

    def distinct_chars(completions, **kwargs):
        texts = [c[-1]["content"] for c in completions]  # conversational completions
        completions_seen.append(texts)
        return [len(set(t)) / 100 for t in texts]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self._start)

    timer = StepTimer()
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        learning_rate=1e-2,
        beta=0.04,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        activation_checkpointing=True,  # TRL's default; exercises checkpointing on CPU
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=distinct_chars,
        args=args,
        train_dataset=_dataset(samples_dir),
        processing_class=processor,
        peft_config=build_lora_config(kind, r=8, alpha=16, dropout=0.0, include_vision=include_vision),
        callbacks=[timer],
    )
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert lora_before and all(p.requires_grad for n, p in trainer.model.named_parameters() if "lora_" in n)
    trainer.train()

    # The steps ran, each on a generation batch of 2 prompts x 4 completions.
    assert trainer.state.global_step == 2
    assert len(completions_seen) == 2 and all(len(batch) == 8 for batch in completions_seen)
    # The logged reward is the mean of our reward over the completions we were given.
    logged = [rec["reward"] for rec in trainer.state.log_history if "reward" in rec]
    expected = [sum(len(set(t)) / 100 for t in batch) / len(batch) for batch in completions_seen]
    assert logged == pytest.approx(expected, abs=1e-6)
    # In every step the rewards vary within a group, so the advantages (and gradients) are not all zero.
    for batch in completions_seen:
        groups = [batch[i : i + 4] for i in range(0, 8, 4)]
        assert any(len({len(set(t)) for t in group}) > 1 for group in groups), batch

    # Every LoRA tensor moved (lora_B leaves zero in step 1, lora_A moves in step 2) ...
    after = dict(trainer.model.named_parameters())
    unchanged = [n for n, before in lora_before.items() if torch.equal(before, after[n].detach())]
    assert unchanged == []
    vision_lora = [n for n in lora_before if ".visual." in n or ".vision_tower." in n or "projector" in n]
    assert bool(vision_lora) == include_vision
    # ... and no base weight did.
    base = trainer.model.get_base_model()
    changed_base = []
    for name, param in base.named_parameters():
        if "lora_" in name:
            continue
        original = name.replace(".base_layer.", ".")
        if not torch.equal(base_before[original], param.detach()):
            changed_base.append(name)
    assert changed_base == []
    assert len(
        {n.replace(".base_layer.", ".") for n, _ in base.named_parameters() if "lora_" not in n}
    ) == len(base_before)
    assert no_network == []

    record_property("grpo_step_seconds", [round(s, 3) for s in timer.seconds])
    print(f"{kind} include_vision={include_vision} GRPO step seconds: {[round(s, 3) for s in timer.seconds]}")


def test_network_guard_records_attempts(no_network):
    # The guard used above can fail: an IP connection is refused and recorded.
    with pytest.raises(OSError, match="network access attempted in an offline test"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    assert no_network == [("127.0.0.1", 9)]
