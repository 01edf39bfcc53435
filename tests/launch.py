"""Launching the recipe on two CPU processes from tests (torchrun or accelerate launch).

Every launch gets a free port (never a fixed one: other tests and runs share the machine) and a
timeout (past it, or when a test SIGKILLs it, the launcher and every rank are killed); each rank's
output also goes to its own files (torchrun's ``--log-dir`` / ``--tee``), so a failure shows every
rank's error lines and last lines instead of the tail of interleaved output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": str(REPO)}


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Launch:
    """A running or finished launch: the launcher process and the folder of its logs."""

    proc: subprocess.Popen
    logs: Path

    def launcher_log(self) -> str:
        return (self.logs / "launcher.log").read_text(errors="replace")

    def rank_stderr(self) -> dict[int, str]:
        """Each rank's standard error (``<logs>/<run id>/attempt_*/<rank>/stderr.log``, attempts joined)."""
        out: dict[int, str] = {}
        for f in sorted(self.logs.glob("*/attempt_*/*/stderr.log")):
            rank = int(f.parent.name)
            out[rank] = out.get(rank, "") + f.read_text(errors="replace")
        return out

    def report(self, lines: int = 30) -> str:
        """The launcher's last lines, then each rank's error lines and last ``lines`` lines."""
        parts = [f"launcher exit code {self.proc.returncode}; its last lines:\n{_tail(self.launcher_log(), lines)}"]
        for rank, text in sorted(self.rank_stderr().items()):
            errors = [x for x in text.splitlines() if "error" in x.lower() and "warn" not in x.lower()]
            parts.append(f"--- rank {rank} error lines:\n" + "\n".join(errors[-10:])
                         + f"\n--- rank {rank} last lines:\n{_tail(text, lines)}")
        return "\n".join(parts)

    def wait(self, timeout: float) -> int:
        """The launcher's exit code; past ``timeout`` seconds all of it is killed and the test fails."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
            raise AssertionError(f"launch still running after {timeout:.0f} s (killed)\n{self.report()}") from None

    def kill(self) -> None:
        """SIGKILL the launcher and every rank at once (torchrun starts each rank in its own session,
        so the launcher's process group does not hold them)."""
        import psutil

        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs[1:], timeout=30)


def start(launcher: list, script: str | Path, args: list, logs: Path, env: dict | None = None) -> Launch:
    """Start ``launcher`` + per-rank log options + ``script`` + ``args`` in the repository root.

    Args:
        launcher: e.g. ``[BIN / "torchrun", "--standalone", "--nproc_per_node", "2"]`` (a port the OS
            picks) or ``[BIN / "accelerate", "launch", "--config_file", ..., "--main_process_port", free_port()]``.
        script, args: the training script and its arguments.
        logs: a new folder for ``launcher.log`` and the per-rank logs.
        env: extra environment variables.
    """
    logs.mkdir(parents=True)
    accelerate = Path(launcher[0]).name == "accelerate"
    log_opts = ["--log_dir", logs, "--tee", "3"] if accelerate else ["--log-dir", logs, "--tee", "3"]
    cmd = [str(x) for x in (*launcher, *log_opts, script, *args)]
    with open(logs / "launcher.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **ENV, **(env or {})}, stdout=log, stderr=log)
    return Launch(proc, logs)


def write_reward_recipe(path: Path, name: str, score_body: str, prelude: str = "") -> Path:
    """Write a script that registers a reward function ``name`` (its ``score(self, completions, kwargs)``
    body is ``score_body``; ``completion_text`` is imported) and then runs the ``cpr_curriculum`` recipe with
    the script's arguments; ``prelude`` is Python run first. Returns ``path``."""
    body = "".join(f"        {line}\n" for line in score_body.splitlines())
    path.write_text(f"""import runpy, sys
{prelude}import cpr.rewards as R
from cpr.steps import completion_text


class Reward(R.RewardFunction):
    name = {name!r}

    def __init__(self, **_):
        pass

    def score(self, completions, kwargs):
{body}

R.REWARD_FUNCTIONS[{name!r}] = Reward
sys.argv = ["cpr_curriculum.py", *sys.argv[1:]]
runpy.run_path({str(REPO / "recipes" / "cpr_curriculum.py")!r}, run_name="__main__")
""")
    return path


def write_length_reward_recipe(path: Path, prelude: str = "") -> Path:
    """:func:`write_reward_recipe` with reward ``length`` (a learning signal for a random tiny model:
    completion characters / 100, capped at 1)."""
    return write_reward_recipe(path, "length", "return [min(len(completion_text(c)), 100) / 100 for c in completions]",
                               prelude)
