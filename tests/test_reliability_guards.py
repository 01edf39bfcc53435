"""Divergence guards (cpr.training.divergence): unit tests of the decisions, then each condition
injected into a real GRPO run of the tiny model on CPU (2-4 optimizer steps each).

Injected conditions: a custom reward function returning NaN at one step (registered in the test),
a loss made NaN at one step (patched ``GRPOTrainer._compute_loss``), a gradient entry made Inf after
clipping (patched ``Accelerator.clip_grad_norm_``), the real KL above a tiny limit, and a constant reward
(every group has zero reward std).
"""

from __future__ import annotations

import json
import logging
import math
import runpy
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_run_config
from transformers import TrainerControl, TrainerState

from cpr.errors import ConfigError
from cpr.training.config import config_from_dict
from cpr.training.config_sections import GuardsConfig, KLGuardConfig, NanGuardConfig, ZeroStdGuardConfig
from cpr.training.divergence import DivergenceGuard, TrainingDivergedError, drop_update

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------
# unit: what "zero the update" means with AdamW
# --------------------------------------------------------------------------------------


def _adamw_after_one_step() -> tuple[torch.nn.Parameter, torch.optim.AdamW]:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5))
    opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.01)
    p.grad = torch.randn(5)
    opt.step()
    return p, opt


def test_drop_update_leaves_adamw_parameters_and_state_untouched():
    p, opt = _adamw_after_one_step()
    before = p.detach().clone()
    exp_avg = opt.state[p]["exp_avg"].clone()
    exp_avg_sq = opt.state[p]["exp_avg_sq"].clone()
    step = float(opt.state[p]["step"])
    p.grad = torch.full((5,), float("nan"))  # a diverged step's gradient
    assert drop_update(opt) == 1
    assert p.grad is None
    opt.step()
    assert torch.equal(p.detach(), before)
    assert torch.equal(opt.state[p]["exp_avg"], exp_avg)
    assert torch.equal(opt.state[p]["exp_avg_sq"], exp_avg_sq)
    assert float(opt.state[p]["step"]) == step


def test_a_zero_gradient_would_still_move_adamw():
    """Why skip_step drops the gradient instead of zeroing it: AdamW's momentum and weight decay
    still move the parameters on a zero gradient."""
    p, opt = _adamw_after_one_step()
    before = p.detach().clone()
    exp_avg = opt.state[p]["exp_avg"].clone()
    p.grad = torch.zeros(5)
    opt.step()
    # by hand: m = beta1 * m (zero gradient), the parameter moves by lr * m_hat / (sqrt(v_hat) + eps) and decays
    assert torch.allclose(opt.state[p]["exp_avg"], 0.9 * exp_avg)
    assert not torch.equal(p.detach(), before)


# --------------------------------------------------------------------------------------
# unit: decisions of DivergenceGuard on hand-fed steps
# --------------------------------------------------------------------------------------


class _FakeTrainer:
    def __init__(self) -> None:
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.accelerator = SimpleNamespace(num_processes=1)


def _guard(cfg: GuardsConfig, tmp_path: Path):
    trainer = _FakeTrainer()
    guard = DivergenceGuard(cfg, events_path=tmp_path / "events.jsonl").bind(trainer)
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    args = SimpleNamespace(output_dir=str(tmp_path), should_save=True)
    return guard, trainer, p, opt, state, args


def _step(guard, trainer, p, opt, state, args, *, kl=None, frac=None, loss=0.5, grad=1.0, rewards=None):
    """One optimizer step as the trainer drives the guard (``rewards``: rows of the reward functions r0 and r1;
    ``grad``: every gradient entry); returns (control, whether grad survived)."""
    control = TrainerControl()
    guard.on_step_begin(args, state, control)
    for j, name in enumerate(["r0", "r1"] if rewards is not None else []):
        guard.observe_rewards(name, [row[j] for row in rewards])
    if kl is not None:
        trainer._metrics["train"]["kl"].append(kl)
    if frac is not None:
        trainer._metrics["train"]["frac_reward_zero_std"].append(frac)
    guard.observe_loss(torch.tensor(loss))
    p.grad = torch.full((3,), grad)
    guard.on_pre_optimizer_step(args, state, control, optimizer=opt)
    kept = p.grad is not None
    state.global_step += 1
    guard.on_step_end(args, state, control)
    return control, kept


def test_guard_actions_resolve_per_condition_then_globally():
    cfg = GuardsConfig(action="skip_step", kl=KLGuardConfig(action="warn"))
    assert cfg.action_for("kl") == "warn"
    assert cfg.action_for("nan") == "skip_step"
    assert cfg.action_for("zero_std") == "skip_step"
    assert GuardsConfig().action_for("nan") == "stop"
    assert GuardsConfig().action_for("kl") == "warn"
    assert GuardsConfig().action_for("zero_std") == "warn"


def test_kl_warns_when_a_run_reaches_its_length_and_every_length_after(tmp_path, caplog):
    cfg = GuardsConfig(kl=KLGuardConfig(limit=10.0, consecutive_steps=2))
    g, tr, p, opt, state, args = _guard(cfg, tmp_path)
    kept = []
    with caplog.at_level(logging.WARNING, logger="cpr.training.divergence"):
        for kl in (20.0, 20.0, 5.0, 20.0, 20.0, 20.0, 20.0):
            kept.append(_step(g, tr, p, opt, state, args, kl=kl)[1])
    # runs: 1, 2*, 0, 1, 2*, 3, 4*  (* = announced: (run - 2) % 2 == 0)
    assert [e.step for e in g.events] == [2, 5, 7]
    assert all(e.action == "warn" and e.condition == "kl" for e in g.events)
    assert g.counts["kl"] == {"steps": 4, "skipped": 0}
    assert all(kept)  # warn never touches the update
    assert [r.message for r in caplog.records] == [
        "guard kl at step 2 (warning): KL 20 above the limit 10 for 2 steps in a row",
        "guard kl at step 5 (warning): KL 20 above the limit 10 for 2 steps in a row",
        "guard kl at step 7 (warning): KL 20 above the limit 10 for 4 steps in a row",
    ]
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(x["step"], x["condition"], x["values"]["streak"]) for x in lines] == [(2, "kl", 2), (5, "kl", 2), (7, "kl", 4)]


def test_zero_std_skip_step_drops_the_updates_of_the_window(tmp_path):
    cfg = GuardsConfig(zero_std=ZeroStdGuardConfig(window=2, action="skip_step"))
    g, tr, p, opt, state, args = _guard(cfg, tmp_path)
    # step 4 reuses the buffered generation of step 3 (no new value): it keeps frac 1.0
    kept = [_step(g, tr, p, opt, state, args, frac=f)[1] for f in (1.0, 1.0, 1.0, None, 0.25, 1.0)]
    assert kept == [True, False, False, False, True, True]
    assert g.skipped_steps == [2, 3, 4]
    assert g.counts["zero_std"] == {"steps": 3, "skipped": 3}
    assert g.zero_std_run == 1


def test_nan_stop_marks_the_checkpoint_and_the_state_round_trips(tmp_path):
    g, tr, p, opt, state, args = _guard(GuardsConfig(), tmp_path)
    control, kept = _step(g, tr, p, opt, state, args)
    assert kept and not control.should_training_stop
    control, kept = _step(g, tr, p, opt, state, args, loss=float("inf"), grad=float("nan"),
                          rewards=[[0.1, float("nan")], [0.2, 0.3]])
    assert not kept
    assert control.should_save and control.should_training_stop
    assert g.stopped is not None and g.stopped.step == 2
    assert g.stopped.reason == "non-finite reward r1 (1 of the batch), loss (inf), grad_norm (nan)"
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    g.on_save(args, state, control)
    marker = json.loads((folder / "diverged.json").read_text())
    assert marker["condition"] == "nan" and marker["step"] == 2 and marker["action"] == "stop"
    assert marker["values"] == {"rewards": {"r1": 1}, "loss": "inf", "grad_norm": "nan"}
    # the counters go into the checkpoint's trainer_state.json (ExportableState) and come back on resume
    TrainerState(global_step=2, stateful_callbacks=[g]).save_to_json(str(folder / "trainer_state.json"))
    g2 = DivergenceGuard(GuardsConfig())
    g2.on_train_begin(args, TrainerState.load_from_json(str(folder / "trainer_state.json")), control)
    assert g2.state_dict() == g.state_dict()
    assert g2.counts["nan"] == {"steps": 1, "skipped": 0}


def test_a_none_reward_is_not_a_nan(tmp_path):
    # TRL turns a reward function's None (no reward for that completion) into NaN; the guard sees the
    # function's own output, so only a NaN the function returned counts as a non-finite reward.
    g, tr, p, opt, state, args = _guard(GuardsConfig(), tmp_path)
    control, kept = _step(g, tr, p, opt, state, args, rewards=[[0.1, None], [0.2, None], [0.3, 0.4]])
    assert kept and g.events == [] and not control.should_training_stop
    control, kept = _step(g, tr, p, opt, state, args, rewards=[[0.1, math.nan], [0.2, None]])
    assert [e.reason for e in g.events] == ["non-finite reward r1 (1 of the batch)"]


def test_skip_step_is_refused_where_it_cannot_drop_an_update():
    g = DivergenceGuard(GuardsConfig(nan=NanGuardConfig(action="skip_step")))
    with pytest.raises(ConfigError) as e:
        g.check_supported(deepspeed=True, fp16_scaler=False)
    assert e.value.field == "guards.nan.action"
    assert "DeepSpeed" in str(e.value)
    g = DivergenceGuard(GuardsConfig(action="skip_step"))
    with pytest.raises(ConfigError) as e:
        g.check_supported(deepspeed=False, fp16_scaler=True)
    assert e.value.field == "guards.action"
    DivergenceGuard(GuardsConfig()).check_supported(deepspeed=True, fp16_scaler=True)  # no skip_step: fine


# --------------------------------------------------------------------------------------
# integration: the tiny model, 2-4 GRPO steps on CPU
# --------------------------------------------------------------------------------------



def _completion_len(c) -> int:
    from cpr.steps import completion_text

    return len(completion_text(c))


def _register(monkeypatch):
    """Custom reward functions for the runs (registered the way a user would register one)."""
    from cpr import rewards as R

    class LengthReward(R.RewardFunction):
        """Completion length / 100, capped at 1: varies within every group, so GRPO learns."""

        name = "length"

        def __init__(self, **_):
            pass

        def score(self, completions, kwargs):
            return [min(_completion_len(c), 100) / 100 for c in completions]

    class NanAtStep2(R.RewardFunction):
        """NaN for every completion generated for optimizer step 2 (global_step 1), else 0."""

        name = "nan_at_step2"

        def __init__(self, **_):
            pass

        def score(self, completions, kwargs):  # through RewardFunction.__call__: NaN reaches the guard
            bad = kwargs["trainer_state"].global_step == 1
            return [math.nan if bad else 0.0 for _ in completions]

    class LengthOrNone(LengthReward):
        """LengthReward for completions at even positions of the batch, no reward (None) for the others."""

        name = "length_or_none"

        def score(self, completions, kwargs):
            return [r if i % 2 == 0 else None for i, r in enumerate(super().score(completions, kwargs))]

    class Constant(R.RewardFunction):
        name = "constant"

        def __init__(self, **_):
            pass

        def score(self, completions, kwargs):
            return [0.5 for _ in completions]

    for cls in (LengthReward, NanAtStep2, LengthOrNone, Constant):
        monkeypatch.setitem(R.REWARD_FUNCTIONS, cls.name, cls)


def _config(tmp_path: Path, rewards: list[str], *, steps: int, save_steps: int = 1, guards: dict | None = None) -> dict:
    return tiny_run_config(
        "guards", tmp_path / "run", seed=11, lora_r=8, limit=16, heldout=0,
        training={
            "per_device_train_batch_size": 8,
            "num_generations": 4,
            "max_completion_length": 16,
            "temperature": 1.0,
            "beta": 0.04,
            "learning_rate": 1.0e-2,
            "logging_steps": 1,
            "disable_tqdm": True,
            "max_steps": steps,
            "save_steps": save_steps,
        },
        phases=["cpr"],
        phase_settings={"cpr": {"rewards": rewards}},
        guards=guards or {},
        evaluation={"final": False},
    )


def _adapter(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _recipe_main():
    return runpy.run_path(str(REPO / "recipes" / "cpr_curriculum.py"), run_name="cpr_recipe")["main"]


@pytest.mark.slow
def test_nan_reward_stops_through_the_recipe(tmp_path, monkeypatch, capsys, one_thread):
    import yaml

    _register(monkeypatch)
    cfg_file = tmp_path / "nan.yaml"
    cfg_file.write_text(yaml.safe_dump(_config(tmp_path, ["length", "nan_at_step2"], steps=3)))
    monkeypatch.setattr(sys, "argv", ["cpr_curriculum.py", "--config", str(cfg_file)])
    rc = _recipe_main()()
    err = capsys.readouterr().err
    assert rc == 3  # TrainingDivergedError.exit_code: a diverged run, not a failed one (2)
    errors = [line for line in err.splitlines() if line.startswith("cpr_curriculum: error:")]
    assert len(errors) == 1 and "Traceback" not in err
    phase = tmp_path / "run" / "cpr"
    assert errors[0] == (
        "cpr_curriculum: error: phase cpr diverged at step 2: non-finite reward nan_at_step2 (8 of the batch) "
        f"(guard nan, action stop); checkpoint {phase / 'checkpoint-2'} is marked diverged.json; "
        f"{tmp_path / 'run' / 'summary.json'} has status 'diverged'"
    )
    marker = json.loads((phase / "checkpoint-2" / "diverged.json").read_text())
    assert (marker["step"], marker["condition"], marker["action"]) == (2, "nan", "stop")
    assert marker["values"]["rewards"] == {"nan_at_step2": 8}
    assert (phase / "checkpoint-2" / "checkpoint_complete.json").is_file()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert summary["diverged"]["step"] == 2 and summary["diverged"]["checkpoint"] == str(phase / "checkpoint-2")
    assert summary["phases"][0]["guards"]["stopped"]["reason"] == marker["reason"]
    assert not (phase / "adapter").exists() and not (phase / "phase_done.json").exists()
    # step 1 learned (lora_B left zero), step 2's update was not applied, and resume skips the diverged checkpoint
    one, two = _adapter(phase / "checkpoint-1"), _adapter(phase / "checkpoint-2")
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in one.items())
    assert _same(one, two)
    from cpr.training.checkpoints import checkpoint_status, last_checkpoint

    assert checkpoint_status(phase / "checkpoint-2") == "diverged"
    assert last_checkpoint(phase) == phase / "checkpoint-1"
    logged = [r["step"] for r in map(json.loads, (phase / "log.jsonl").read_text().splitlines()) if "loss" in r]
    assert logged == [1, 2]  # stopped after step 2 of 3


@pytest.mark.slow
def test_nan_loss_skip_step_drops_exactly_that_update(tmp_path, monkeypatch, one_thread):
    import trl

    from cpr.training.experiment import run_experiment

    _register(monkeypatch)
    real = trl.GRPOTrainer._compute_loss

    def nan_at_step2(self, model, inputs):
        loss = real(self, model, inputs)
        return loss * float("nan") if self.state.global_step == 1 else loss

    monkeypatch.setattr(trl.GRPOTrainer, "_compute_loss", nan_at_step2)
    cfg = config_from_dict(_config(tmp_path, ["length"], steps=3, guards={"nan": {"action": "skip_step"}}))
    summary = run_experiment(cfg)
    assert summary["status"] == "finished"
    g = summary["phases"][0]["guards"]
    assert g["skipped_steps"] == [2]
    assert g["counts"]["nan"] == {"steps": 1, "skipped": 1}
    phase = tmp_path / "run" / "cpr"
    events = [json.loads(x) for x in (phase / "guard_events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["condition"], e["action"]) for e in events] == [(2, "nan", "skip_step")]
    assert events[0]["reason"] == "non-finite loss (nan), grad_norm (nan)"
    one, two, three = (_adapter(phase / f"checkpoint-{s}") for s in (1, 2, 3))
    assert _same(one, two)  # the NaN step changed nothing
    assert not _same(two, three) and all(torch.isfinite(v).all() for v in three.values())
    opt1 = torch.load(phase / "checkpoint-1" / "optimizer.pt", weights_only=False)["state"]
    opt2 = torch.load(phase / "checkpoint-2" / "optimizer.pt", weights_only=False)["state"]
    assert opt1.keys() == opt2.keys()
    for k in opt1:  # Adam moments and step count untouched by the skipped step
        assert float(opt1[k]["step"]) == float(opt2[k]["step"]) == 1.0
        assert torch.equal(opt1[k]["exp_avg"], opt2[k]["exp_avg"])
        assert torch.equal(opt1[k]["exp_avg_sq"], opt2[k]["exp_avg_sq"])
    rows = [json.loads(x) for x in (phase / "log.jsonl").read_text().splitlines()]
    assert [r["guards/skipped_steps"] for r in rows if "loss" in r] == [0.0, 1.0, 1.0]


@pytest.mark.slow
def test_inf_grad_norm_warns_and_keeps_training(tmp_path, monkeypatch, caplog, one_thread):
    from accelerate import Accelerator

    from cpr.training.experiment import run_experiment

    _register(monkeypatch)
    real, clipped = Accelerator.clip_grad_norm_, []

    def inf_at_step2(self, parameters, max_norm, norm_type=2):
        parameters = list(parameters)
        norm = real(self, parameters, max_norm, norm_type)
        clipped.append(norm)
        if len(clipped) == 2:  # the second optimizer step: one gradient entry overflows after clipping
            next(p for p in parameters if p.grad is not None).grad.view(-1)[0] = float("inf")
        return norm

    monkeypatch.setattr(Accelerator, "clip_grad_norm_", inf_at_step2)
    cfg = config_from_dict(_config(tmp_path, ["length"], steps=2, guards={"action": "warn"}))
    with caplog.at_level(logging.WARNING, logger="cpr.training.divergence"):
        summary = run_experiment(cfg)
    assert summary["status"] == "finished"
    warnings = [r.message for r in caplog.records if r.name == "cpr.training.divergence"]
    assert warnings == ["guard nan at step 2 (warning): non-finite grad_norm (inf)"]
    g = summary["phases"][0]["guards"]
    assert g["counts"]["nan"] == {"steps": 1, "skipped": 0} and g["skipped_steps"] == []
    phase = tmp_path / "run" / "cpr"
    assert not _same(_adapter(phase / "checkpoint-1"), _adapter(phase / "checkpoint-2"))  # warn: update applied
    assert (phase / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_kl_above_limit_for_consecutive_steps_stops(tmp_path, monkeypatch, one_thread):
    from cpr.training.experiment import run_experiment

    _register(monkeypatch)
    guards = {"kl": {"limit": 1.0e-9, "consecutive_steps": 2, "action": "stop"}}
    cfg = config_from_dict(_config(tmp_path, ["length"], steps=4, save_steps=10, guards=guards))
    with pytest.raises(TrainingDivergedError) as e:
        run_experiment(cfg)
    phase = tmp_path / "run" / "cpr"
    rows = {r["step"]: r for r in map(json.loads, (phase / "log.jsonl").read_text().splitlines()) if "kl" in r}
    # step 1: policy == reference (LoRA B starts at zero), KL exactly 0; steps 2 and 3 above 1e-9
    assert rows[1]["kl"] == 0.0 and rows[2]["kl"] > 1e-9 and rows[3]["kl"] > 1e-9
    assert sorted(rows) == [1, 2, 3]
    event = e.value.event
    assert (event["step"], event["condition"]) == (3, "kl")
    assert event["values"]["streak"] == 2
    assert event["values"]["kl"] == pytest.approx(rows[3]["kl"], rel=1e-6)
    assert e.value.checkpoint == str(phase / "checkpoint-3")
    assert json.loads((phase / "checkpoint-3" / "diverged.json").read_text())["condition"] == "kl"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "diverged"


@pytest.mark.slow
def test_a_reward_returning_none_trains_and_logs_its_share(tmp_path, monkeypatch, one_thread):
    from cpr.training.experiment import run_experiment
    from cpr.training.logs import read_log

    _register(monkeypatch)
    summary = run_experiment(config_from_dict(_config(tmp_path, ["length", "length_or_none"], steps=2, save_steps=10)))
    assert summary["status"] == "finished"  # no TypeError, and the nan guard (action stop) did not fire
    assert summary["phases"][0]["guards"]["counts"]["nan"] == {"steps": 0, "skipped": 0}
    rows = [r for r in read_log(tmp_path / "run" / "cpr" / "log.jsonl") if "reward" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["rewards/length_or_none/none_frac"] == 0.5 and r["rewards/length/none_frac"] == 0.0
        assert math.isfinite(r["rewards/length_or_none/mean"]) and math.isfinite(r["reward"])


@pytest.mark.slow
def test_constant_reward_warns_about_zero_std(tmp_path, monkeypatch, caplog, one_thread):
    from cpr.training.experiment import run_experiment

    _register(monkeypatch)
    guards = {"zero_std": {"window": 2, "fraction": 0.5}}
    cfg = config_from_dict(_config(tmp_path, ["constant"], steps=4, save_steps=10, guards=guards))
    with caplog.at_level(logging.WARNING, logger="cpr.training.divergence"):
        summary = run_experiment(cfg)
    warnings = [r.message for r in caplog.records if r.name == "cpr.training.divergence"]
    text = "every group's reward std was zero for {} steps in a row (no learning signal)"
    assert warnings == [
        f"guard zero_std at step 2 (warning): {text.format(2)}",
        f"guard zero_std at step 4 (warning): {text.format(4)}",
    ]
    assert summary["status"] == "finished"
    assert summary["phases"][0]["frac_reward_zero_std"] == 1.0  # what TRL logged
    assert summary["phases"][0]["guards"]["counts"]["zero_std"] == {"steps": 3, "skipped": 0}


def test_zero_std_window_scales_with_a_short_phase(tmp_path, caplog):
    """The 50-step window would never fire in a phase shorter than 50 steps: it is
    min(window, max(1, ceil(fraction * max_steps))), fraction 0.25 by default."""
    z = ZeroStdGuardConfig()
    assert [z.window_for(n) for n in (1, 4, 8, 30, 200, 1000, 0)] == [1, 1, 2, 8, 50, 50, 50]
    assert ZeroStdGuardConfig(window=5, fraction=0.5).window_for(30) == 5
    g, tr, p, opt, state, args = _guard(GuardsConfig(), tmp_path)
    state.max_steps = 8
    g.on_train_begin(args, state, TrainerControl())
    with caplog.at_level(logging.WARNING, logger="cpr.training.divergence"):
        for frac in (1.0, 1.0, 0.5, 1.0, 1.0):
            _step(g, tr, p, opt, state, args, frac=frac)
    assert [r.message for r in caplog.records] == [
        f"guard zero_std at step {s} (warning): every group's reward std was zero for 2 steps in a row "
        "(no learning signal)" for s in (2, 5)
    ]


def test_with_the_greedy_baseline_zero_std_reads_the_groups_without_signal(tmp_path, caplog):
    """Issue 33: with ``baseline: greedy`` tied samples still learn when their greedy completion differs, so the
    guard reads ``baseline/frac_zero_signal``, not TRL's ``frac_reward_zero_std`` (here 1.0 at every step)."""
    cfg = GuardsConfig(zero_std=ZeroStdGuardConfig(window=2))
    trainer = _FakeTrainer()
    g = DivergenceGuard(cfg, events_path=tmp_path / "events.jsonl", baseline="greedy").bind(trainer)
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], lr=0.1)
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    args = SimpleNamespace(output_dir=str(tmp_path), should_save=True)
    with caplog.at_level(logging.WARNING, logger="cpr.training.divergence"):
        for signal in (0.0, 0.5, 1.0, 1.0):
            control = TrainerControl()
            g.on_step_begin(args, state, control)
            trainer._metrics["train"]["frac_reward_zero_std"].append(1.0)
            trainer._metrics["train"]["baseline/frac_zero_signal"].append(signal)
            g.observe_loss(torch.tensor(0.5))
            p.grad = torch.ones(3)
            g.on_pre_optimizer_step(args, state, control, optimizer=opt)
            state.global_step += 1
    assert [r.message for r in caplog.records] == [
        "guard zero_std at step 4 (warning): every group's samples tied their greedy completion's reward for 2 "
        "steps in a row (no learning signal)"]
    assert g.counts["zero_std"]["steps"] == 1
    assert [e.values for e in g.events] == [{"baseline/frac_zero_signal": 1.0, "run": 2}]
