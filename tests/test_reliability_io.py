"""Atomic writes and crash-safe JSON lines appends (cpr.io), as the run folder uses them.

A kill during an atomic write leaves the previous version of the file (tested by failing the
rename, and by SIGKILL-ing a subprocess that rewrites a file in a loop); a kill during an append
leaves at most a truncated last line, which readers drop and the next append cuts off.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from cpr.errors import InputError
from cpr.io import (
    append_jsonl,
    append_jsonl_many,
    atomic_write_json,
    read_jsonl,
    repair_truncated_tail,
    rewrite_jsonl,
)
from cpr.training.logs import JsonlLogCallback, ScoredCompletionLog, read_log


def test_failed_rename_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    atomic_write_json(target, {"status": "running", "phases": [1]})
    before = target.read_bytes()

    def no_rename(src, dst):
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="killed before the rename"):
        atomic_write_json(target, {"status": "finished", "phases": [1, 2]})
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


CHILD = """
import sys
from cpr.io import atomic_write_json
path = sys.argv[1]
big = ["x" * 1000] * 2000          # ~2 MB per version: the kill lands mid-write often
i = 0
print("ready", flush=True)
while True:
    atomic_write_json(path, {"version": i, "payload": big})
    i += 1
"""


def test_sigkill_during_atomic_writes_never_leaves_a_broken_file(tmp_path):
    target = tmp_path / "phase_done.json"
    atomic_write_json(target, {"version": -1, "payload": []})
    versions = []
    for k in range(6):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(target)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05 + 0.03 * k)
        deadline = time.monotonic() + 60  # the last writer is killed only once a version replaced the file (load)
        while k == 5 and json.loads(target.read_text())["version"] < 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        data = json.loads(target.read_text())  # always a whole version
        assert data["payload"] in ([], ["x" * 1000] * 2000)
        versions.append(data["version"])
    assert max(versions) >= 0  # the writers did replace the file
    # the killed writers' temporary files are the only debris; the target itself is whole
    assert all(p.name.startswith(".phase_done.json.") for p in tmp_path.iterdir() if p != target)


def test_append_after_a_truncated_line_cuts_it_first(tmp_path):
    path = tmp_path / "eval_history.jsonl"
    append_jsonl(path, {"step": 1, "accuracy": 0.5})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"step": 2, "accur')  # what a killed writer leaves
    assert [r for _, r in read_jsonl(path, skip_truncated_tail=True)] == [{"step": 1, "accuracy": 0.5}]
    with pytest.raises(InputError, match="eval_history.jsonl:2"):
        list(read_jsonl(path))
    append_jsonl(path, {"step": 2, "accuracy": 0.75})
    assert path.read_text() == '{"step": 1, "accuracy": 0.5}\n{"step": 2, "accuracy": 0.75}\n'


def test_repair_truncated_tail_keeps_whole_lines(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c"')
    assert repair_truncated_tail(path) is True
    assert path.read_text() == '{"a": 1}\n{"b": 2}\n'
    assert repair_truncated_tail(path) is False
    path.write_text('{"only partial')
    assert repair_truncated_tail(path) is True and path.read_text() == ""
    assert repair_truncated_tail(tmp_path / "missing.jsonl") is False


def test_a_batch_of_lines_is_one_write(tmp_path, monkeypatch):
    calls = []
    real = os.write

    def counting(fd, data):
        calls.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", counting)
    rows = [{"step": 3, "id": str(i), "reward": i / 10} for i in range(50)]
    append_jsonl_many(tmp_path / "s.jsonl", rows)
    assert len(calls) == 1
    assert [r for _, r in read_jsonl(tmp_path / "s.jsonl")] == rows


def test_rewrite_jsonl_keeps_matching_rows_atomically(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    assert rewrite_jsonl(path, lambda r: r["step"] <= 2) == (2, 1)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert rewrite_jsonl(tmp_path / "none.jsonl", lambda r: True) == (0, 0)
    assert not (tmp_path / "none.jsonl").exists()


def test_run_logs_write_whole_lines_and_nan_as_strings(tmp_path):
    log = JsonlLogCallback(tmp_path / "log.jsonl")
    state = SimpleNamespace(is_world_process_zero=True, global_step=7)
    log.on_log(None, state, None, logs={"loss": float("nan"), "reward": 0.25})
    scored = ScoredCompletionLog(tmp_path / "scored_completions.jsonl", rank=2)
    assert scored.path.name == "scored_completions.rank2.jsonl"
    scored([{"step": 6, "reward": 1.0}, {"step": 6, "reward": float("inf")}])
    assert read_log(tmp_path / "log.jsonl") == [{"step": 7, "loss": "nan", "reward": 0.25}]
    assert read_log(scored.path) == [{"step": 6, "reward": 1.0}, {"step": 6, "reward": "inf"}]


def _strict(text: str):
    """json.loads refusing NaN / Infinity, as every strict (RFC 8259) parser does."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_every_json_writer_writes_strict_json_non_finite_as_null(tmp_path):
    import numpy as np

    from cpr.io import atomic_write_jsonl, json_text

    summary = {"phases": [{"kl_max": float("nan"), "reward_trend": {"first": float("inf"), "last": 0.5}}],
               "scores": np.array([1.5, np.nan]), "n": np.int64(3), "neg": -float("inf"), "path": tmp_path}
    expected = {"phases": [{"kl_max": None, "reward_trend": {"first": None, "last": 0.5}}], "scores": [1.5, None],
                "n": 3, "neg": None, "path": str(tmp_path)}
    atomic_write_json(tmp_path / "summary.json", summary)
    assert _strict((tmp_path / "summary.json").read_text()) == expected
    append_jsonl_many(tmp_path / "a.jsonl", [summary, {"x": (float("nan"), 1)}])
    atomic_write_jsonl(tmp_path / "b.jsonl", [summary])
    rows = [_strict(line) for p in ("a.jsonl", "b.jsonl") for line in (tmp_path / p).read_text().splitlines()]
    assert rows == [expected, {"x": [None, 1]}, expected]
    assert rewrite_jsonl(tmp_path / "a.jsonl", lambda r: "x" in r) == (1, 1)
    assert _strict((tmp_path / "a.jsonl").read_text()) == {"x": [None, 1]}
    assert json_text({"a": float("nan")}) == '{"a": null}'
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        json_text({"a": object()})
