"""Reference-guided GRPO (:mod:`cpr.training.guidance`) on two processes equals one process.

* Unit level: two stand-in processes (threads whose ``accelerator.gather`` / ``reduce`` concatenate / sum both
  processes' tensors, as a real process group would) mark their halves of a generation batch with
  :meth:`Guidance.mark` and add :meth:`Guidance.loss_term`; given the same reward matrix, the reference rows, the
  advantages as trained, the ``guidance/`` metrics and the loss (averaged over the processes, as DDP averages the
  gradients) equal one process's over the same rows. The batch is laid out so that a group straddles the two
  processes.
* Through the recipe: a ZeRO-3 run (``accelerate launch``) and a DDP run (torchrun, gloo) on two CPU processes and
  a run on one process, at the same time, with
  ``guidance.mode: reference``: every group of every step holds exactly ``members`` reference completions, at the
  same positions as with one process, each the reference of its own record (read from what each rank scored,
  ``scored_completions[.rank1].jsonl``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import tiny_run_config
from launch import BIN, REPO, free_port, start, write_reward_recipe

from cpr.training.config_sections import GuidanceConfig
from cpr.training.guidance import Guidance, guided_rows, split_guided

# --------------------------------------------------------------------------------------
# unit: two stand-in processes over the same rows as one
# --------------------------------------------------------------------------------------


class _Group:
    """A process group of ``size`` threads: each collective call returns every member's tensor, in rank order."""

    def __init__(self, size: int) -> None:
        self.size, self.slots, self.barrier = size, [None] * size, threading.Barrier(size, timeout=30)

    def exchange(self, rank: int, tensor: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = tensor
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # nobody overwrites its slot before everyone read
        return out


class _Accelerator:
    def __init__(self, group: _Group, rank: int) -> None:
        self.group, self.process_index, self.num_processes = group, rank, group.size

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:  # accelerate: 0-d tensors gather to (processes,)
        return torch.cat([t.reshape(1) if t.dim() == 0 else t for t in self.group.exchange(self.process_index, tensor)])

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        assert reduction == "sum"
        return torch.stack(self.group.exchange(self.process_index, tensor)).sum(dim=0)


def _stand_in(group: _Group, rank: int, *, g: int, loss_type: str, weights: list[float]) -> SimpleNamespace:
    from collections import defaultdict

    return SimpleNamespace(
        accelerator=_Accelerator(group, rank), num_generations=g, reward_weights=torch.tensor(weights),
        model=SimpleNamespace(training=True), _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        loss_type=loss_type, current_gradient_accumulation_steps=2, max_completion_length=8,
        args=SimpleNamespace(steps_per_generation=2))


def _trl_advantages(rewards: torch.Tensor, weights: list[float], g: int) -> torch.Tensor:
    """TRL 1.16's group advantages of a gathered reward matrix (``sum_then_normalize``, ``scale_rewards: group``)."""
    totals = (rewards * torch.tensor(weights).unsqueeze(0)).nansum(dim=1).view(-1, g)
    mean = totals.mean(dim=1, keepdim=True)
    return ((totals - mean) / (totals.std(dim=1, keepdim=True) + 1e-4)).view(-1)


def _processes(size: int, rows: dict, rewards: torch.Tensor, logps: torch.Tensor, *, g: int, members: int,
               mode: str, loss_type: str, weights: list[float]) -> list[dict]:
    """Run ``size`` stand-in processes over ``rows`` (the generation batch's tensors, all processes' rows in TRL's
    gathered order), each on its slice: :meth:`Guidance.mark` then :meth:`Guidance.loss_term` on the whole local
    batch; per process its marked batch, loss term, TRL-side micro-batch and logged metrics."""
    group, total = _Group(size), rows["completion_ids"].size(0)
    local, out, errors = total // size, [None] * size, []
    advantages = _trl_advantages(rewards, weights, g)
    config = GuidanceConfig(mode=mode, members=members, gamma=0.3)

    def run(rank: int) -> None:
        try:
            t = _stand_in(group, rank, g=g, loss_type=loss_type, weights=weights)
            part = slice(rank * local, (rank + 1) * local)
            batch = {k: v[part].clone() for k, v in rows.items()}
            batch["advantages"] = advantages[part].clone()  # TRL's process_slice
            batch["num_items_in_batch"] = rows["completion_mask"].sum()  # gathered: the whole batch's
            guidance = Guidance(t, config)
            if mode == "reference":
                guidance._guided = guided_rows(local, rank, g, members)
            else:
                guidance._hints = rows["hints"][part].tolist()
                del batch["hints"]
            batch = guidance.mark(batch, rewards)
            guidance.log_advantage(batch)
            term = rest = None
            if mode == "reference":
                rest, guided, trained = split_guided(batch)
                term = guidance.loss_term(logps[part], rest, trained, guided)
            out[rank] = {"batch": batch, "term": term, "rest": rest, "metrics": {k: list(v) for k, v in t._metrics["train"].items()}}
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return out


def _rows(total: int, length: int, seed: int) -> tuple[dict, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, length + 1, (total,), generator=gen)
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()
    rows = {"completion_ids": torch.randint(5, 50, (total, length), generator=gen) * mask, "completion_mask": mask,
            "importance_sampling_ratio": torch.rand(total, length, generator=gen) + 0.5,
            "hints": torch.randint(0, 3, (total,), generator=gen)}
    logps = -torch.rand(total, length, generator=gen) * 3
    return rows, logps


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("members", [1, 2])
def test_two_processes_mark_and_train_the_reference_rows_as_one(members, loss_type):
    g, local, weights = 4, 6, [1.0, 0.5, 2.0]  # 3 groups of 4 over 2 x 6 rows: group 1 straddles the processes
    rows, logps = _rows(2 * local, 8, seed=members)
    rewards = torch.rand(2 * local, len(weights), generator=torch.Generator().manual_seed(7))
    rewards[4, 1] = float("nan")  # a reward function without a value for one row
    rewards[11] = 3.0  # group 2's (last) reference beats every sampled completion
    one = _processes(1, rows, rewards, logps, g=g, members=members, mode="reference", loss_type=loss_type,
                     weights=weights)
    two = _processes(2, rows, rewards, logps, g=g, members=members, mode="reference", loss_type=loss_type,
                     weights=weights)

    # the reference rows: the last `members` of each group, wherever the group's rows are
    guided = torch.cat([p["batch"]["guided"] for p in two])
    expected = [i % g >= g - members for i in range(2 * local)]
    assert guided.tolist() == one[0]["batch"]["guided"].tolist() == expected
    assert guided_rows(local, 0, g, members) + guided_rows(local, 1, g, members) == expected
    # their importance-sampling ratio 1, the sampled rows' kept
    ratio = torch.cat([p["batch"]["importance_sampling_ratio"] for p in two])
    assert torch.equal(ratio, one[0]["batch"]["importance_sampling_ratio"])
    assert bool((ratio[guided] == 1).all()) and torch.equal(ratio[~guided], rows["importance_sampling_ratio"][~guided])
    # the advantages: TRL's in the batch; in TRL's loss term those of the reference rows 0 (their own term has them)
    advantages = torch.cat([p["batch"]["advantages"] for p in two])
    assert torch.equal(advantages, one[0]["batch"]["advantages"])
    trained = torch.cat([p["rest"]["advantages"] for p in two])
    assert torch.equal(trained, one[0]["rest"]["advantages"])
    assert torch.equal(trained, torch.where(guided, torch.zeros_like(advantages), advantages))
    # the guidance metrics, the same on both processes and as with one
    for name in ("guidance/reward", "guidance/advantage", "guidance/reference_best", "guidance/ratio"):
        assert two[0]["metrics"][name] == two[1]["metrics"][name], name
        assert two[0]["metrics"][name] == pytest.approx(one[0]["metrics"][name], rel=1e-6), name
    assert one[0]["metrics"]["guidance/reference_best"][0] >= 1 / 3  # group 2 at least
    # the reference rows' loss: the processes' mean (what DDP's gradient averaging trains) is one process's
    mean_two = (two[0]["term"] + two[1]["term"]) / 2
    assert float(mean_two) == pytest.approx(float(one[0]["term"]), rel=1e-5)
    assert float(one[0]["term"]) != 0.0


@pytest.mark.slow
def test_two_processes_mask_the_prefix_hints_as_one():
    g, local, weights = 4, 6, [1.0]
    rows, logps = _rows(2 * local, 8, seed=3)
    rewards = torch.rand(2 * local, 1, generator=torch.Generator().manual_seed(1))
    kw = {"g": g, "members": 1, "mode": "prefix", "loss_type": "dapo", "weights": weights}
    one, two = _processes(1, rows, rewards, logps, **kw), _processes(2, rows, rewards, logps, **kw)
    mask = torch.cat([p["batch"]["tool_mask"] for p in two])
    assert torch.equal(mask, one[0]["batch"]["tool_mask"])
    hints = rows["hints"]
    assert mask.tolist() == [[int(j >= h) for j in range(8)] for h in hints.tolist()]
    count = (rows["completion_mask"] * mask).sum()
    assert [int(p["batch"]["num_items_in_batch"]) for p in two] == [int(one[0]["batch"]["num_items_in_batch"])] * 2
    assert int(one[0]["batch"]["num_items_in_batch"]) == int(count)


# --------------------------------------------------------------------------------------
# through the recipe: ZeRO-3 and DDP on two CPU processes, and one process
# --------------------------------------------------------------------------------------

G, MEMBERS, LOCAL, STEPS = 4, 2, 6, 2  # 12 rows a step: 3 groups, the second straddling the two processes
# DeepSpeed's shared-memory op serves inference only; its JIT build takes a minute (as in tests/test_deepspeed.py)
PRELUDE = 'import deepspeed.ops\ndeepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False\n'
LENGTH = "return [min(len(completion_text(c)), 100) / 100 for c in completions]"


def _write(folder: Path, per_device: int) -> Path:
    cfg = tiny_run_config(
        "guided", folder / "unused", seed=5, lora_r=4, limit=12, heldout=0,
        training={"per_device_train_batch_size": per_device, "num_generations": G,
                  "max_completion_length": 96,  # the references (49-84 tokens) whole
                  "temperature": 1.0, "beta": 0.0, "logging_steps": 1, "disable_tqdm": True, "report_to": "none"},
        phases=["cpr"],
        phase_settings={"cpr": {"rewards": ["format", "cpr", "length"],
                                "guidance": {"mode": "reference", "members": MEMBERS},
                                "training": {"max_steps": STEPS, "learning_rate": 1.0e-2, "save_steps": 100}}},
        evaluation={"final": False},
    )
    path = folder / f"guided{per_device}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _scored(phase: Path, rank: int) -> dict[int, list[dict]]:
    """What ``rank`` scored with the ``cpr`` reward, per step, in its rows' order."""
    name = "scored_completions.jsonl" if rank == 0 else f"scored_completions.rank{rank}.jsonl"
    out: dict[int, list[dict]] = {}
    for line in (phase / name).read_text().splitlines():
        row = json.loads(line)
        if row["reward_function"] == "cpr":
            out.setdefault(row["step"], []).append(row)
    return out


def _global_rows(phase: Path, ranks: int) -> dict[int, list[dict]]:
    """Per step, the gathered batch's rows (rank 0's, then rank 1's: TRL's gathered order)."""
    per_rank = [_scored(phase, r) for r in range(ranks)]
    assert all(p.keys() == per_rank[0].keys() for p in per_rank)
    return {s: [row for p in per_rank for row in p[s]] for s in per_rank[0]}


@pytest.mark.slow
@pytest.mark.skipif(not (BIN / "accelerate").exists(), reason="accelerate's launcher not installed next to python")
@pytest.mark.skipif(not (BIN / "torchrun").exists(), reason="torchrun not installed next to python")
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_zero3_and_ddp_on_two_processes_put_each_records_reference_where_one_process_does(tmp_path):
    from cpr.data.prompts import target_text
    from cpr.training.config_sections import DataConfig
    from cpr.training.splits import load_splits

    t0 = time.time()
    wrapper = write_reward_recipe(tmp_path / "wrapper.py", "length", LENGTH, PRELUDE)
    two_config, one_out = _write(tmp_path, LOCAL), tmp_path / "one"
    zero3 = [BIN / "accelerate", "launch", "--config_file", REPO / "accelerate_configs" / "deepspeed_zero3.yaml",
             "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", free_port()]
    ddp = [BIN / "torchrun", "--standalone", "--nproc_per_node", "2"]  # gloo on CPU, a port the OS picks
    launches = {name: start(launcher, wrapper, ["--config", two_config, "--output-dir", tmp_path / name],
                            tmp_path / f"logs-{name}", env)
                for name, launcher, env in (("zero3", zero3, None), ("ddp", ddp, {"ACCELERATE_USE_CPU": "true"}))}
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(REPO))
    single = subprocess.Popen([sys.executable, str(wrapper), "--config", str(_write(tmp_path, 2 * LOCAL)),
                               "--output-dir", str(one_out)], env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    _, err = single.communicate(timeout=400)
    assert single.returncode == 0, err[-3000:]
    for launch in launches.values():
        assert launch.wait(400) == 0, launch.report()
    print(f"ZeRO-3, DDP and one-process runs: {time.time() - t0:.0f} s wall")

    cfg = yaml.safe_load((tmp_path / f"guided{LOCAL}.yaml").read_text())
    targets = {r.id: target_text(r.reference_steps, r.answer) for r in load_splits(DataConfig(**cfg["data"])).train}
    one = _global_rows(one_out / "cpr", 1)
    assert sorted(one) == list(range(1, STEPS + 1))
    runs = {"one": one, **{name: _global_rows(tmp_path / name / "cpr", 2) for name in launches}}
    for name, run in runs.items():
        assert sorted(run) == sorted(one), name
        for step in run:
            rows = run[step]
            assert len(rows) == 2 * LOCAL, (name, step)
            # the same prompts in the same groups (the sampler's draw does not depend on the processes)
            assert [r["id"] for r in rows] == [r["id"] for r in one[step]], (name, step)
            for start_ in range(0, len(rows), G):
                group = rows[start_:start_ + G]
                assert len({r["id"] for r in group}) == 1
                refs = [i for i, r in enumerate(group) if r["completion"] in targets.values()]
                # exactly `members` reference completions, the group's last, each its own record's
                assert refs == list(range(G - MEMBERS, G)), (name, step, start_, [r["completion"][:40] for r in group])
                assert all(group[i]["completion"] == targets[group[i]["id"]] for i in refs)
        # the reference completions scored as with one process (the sampled ones differ: other random streams)
        refs = [r["reward"] for s in sorted(run) for r in run[s] if r["completion"] in targets.values()]
        assert refs == pytest.approx([r["reward"] for s in sorted(one) for r in one[s]
                                      if r["completion"] in targets.values()], abs=1e-6), name
        # the guidance metrics logged once a step
        logs = [json.loads(x) for x in ((one_out if name == "one" else tmp_path / name) / "cpr" / "log.jsonl")
                .read_text().splitlines()]
        assert [r["step"] for r in logs if "guidance/reward" in r] == list(range(1, STEPS + 1)), name
    assert any(r["completion"] not in targets.values() for rows in one.values() for r in rows)  # sampled ones too
