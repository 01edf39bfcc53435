"""The README and the guides against the code they describe: the minimal config loads and checks, the README
shows it as the file holds it, the command list names every ``cpr`` command and make target, and every
relative link of README.md, CONTRIBUTING.md, docs/ and reports/ points at a file of the repository."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from cpr.cli import COMMANDS, main
from cpr.training.config import load_config

REPO = Path(__file__).resolve().parents[1]
MINIMAL = REPO / "recipes" / "configs" / "minimal.yaml"


def _readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    return text.split(f"\n## {heading}\n")[1].split("\n## ")[0]


def test_readme_is_at_most_300_lines():
    assert len(_readme().splitlines()) <= 300


def test_the_readme_shows_the_minimal_config_as_the_file_holds_it():
    section = _section(_readme(), "Your own data and model")
    shown = re.findall(r"```yaml\n(.*?)```", section, re.S)
    file_lines = MINIMAL.read_text(encoding="utf-8").splitlines()
    without_header = "\n".join(line for line in file_lines if not line.startswith("#")).strip("\n") + "\n"
    assert shown == [without_header]


def test_the_reward_guide_shows_the_example_files_as_they_are():
    """docs/rewards.md shows examples/my_rewards.py and examples/my_rewards.yaml, which a test trains, word for word."""
    section = _section((REPO / "docs" / "rewards.md").read_text(encoding="utf-8"), "Writing your own reward function")
    shown = re.findall(r"```(python|yaml)\n(.*?)```", section, re.S)
    assert shown == [("python", (REPO / "examples" / "my_rewards.py").read_text(encoding="utf-8")),
                     ("yaml", (REPO / "examples" / "my_rewards.yaml").read_text(encoding="utf-8"))]


def test_the_minimal_config_loads_with_the_defaults_it_leaves_out():
    cfg = load_config(MINIMAL)
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-VL-3B-Instruct"
    assert [(d.source, d.path) for d in cfg.data.train] == [("crystal", "data/my_train.jsonl")]
    assert cfg.phases == ["answer_only", "cpr"]  # the default two phases
    assert cfg.rewards.encoder == "sentence-transformers/all-distilroberta-v1"  # the paper's encoder
    assert cfg.rewards.threshold == 0.35


def test_the_minimal_config_passes_train_check(capsys):
    # the data file is the user's, so --skip-data; the model's config ships in cpr/models/configs
    code = main(["train", "--config", str(MINIMAL), "--check", "--skip-data", "--num-processes", "4"])
    out = capsys.readouterr().out
    assert code == 0
    assert "valid for 4 processes" in out
    assert "max_pixels 602112 -> up to 768 image tokens" in out  # 602112 / (28 x 28) = 768
    assert "data: not loaded (--skip-data)" in out


def test_the_command_list_names_every_cpr_command_and_make_target():
    listed = _section(_readme(), "Commands")
    for command in COMMANDS:
        assert re.search(rf"^\| `cpr {re.escape(command)}\b", listed, re.M), command
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M).group(1).split()
    for target in phony:
        assert f"`make {target}`" in listed, target


def _documents() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md")),
            *sorted((REPO / "reports").rglob("*.md"))]


def test_the_documents_exist():
    names = {str(p.relative_to(REPO)) for p in _documents()}
    assert {"README.md", "CONTRIBUTING.md", "docs/training.md", "docs/evaluation.md", "docs/rewards.md",
            "docs/reward-hacking.md", "docs/ablations.md", "docs/choices.md", "docs/data.md", "docs/method.md",
            "reports/README.md"} <= names


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_a_file_of_the_repository(doc):
    links = re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8"))
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]
    missing = [link for link in local if not (doc.parent / link).exists()]
    assert missing == []


def test_every_script_a_document_names_exists():
    # `benchmarks/x.py`, `reports/topic/x.py`, `cpr_tools/x.py`, `recipes/x.py` and configs named in the documents
    # (a file of an earlier commit, named as `git show COMMIT:path`, is history, not a file of the tree)
    pattern = r"(?<![0-9a-f]:)((?:benchmarks|reports/[a-z_]+|cpr_tools|recipes|recipes/configs)/[A-Za-z0-9_]+\.(?:py|yaml))"
    missing = sorted({m for doc in _documents() for m in re.findall(pattern, doc.read_text(encoding="utf-8"))
                      if not (REPO / m).exists()})
    assert missing == []


def test_the_readme_record_line_is_a_valid_crystal_record(tmp_path, capsys):
    from PIL import Image

    section = _section(_readme(), "Your own data and model")
    (line,) = re.findall(r"```json\n(.*?)\n```", section, re.S)
    (tmp_path / "images").mkdir()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(tmp_path / "images" / "q1.png")
    (tmp_path / "my_train.jsonl").write_text(line + "\n", encoding="utf-8")
    code = main(["data", "inspect", "--source", "crystal", "--path", str(tmp_path / "my_train.jsonl")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "records: 1\n" in captured.out and "first record: id q1" in captured.out


def _readme_commands() -> list[list[str]]:
    """The README's ``cpr ...`` and ``... recipes/cpr_curriculum.py ...`` command lines, continuations joined and
    comments dropped, split as a shell would."""
    import shlex

    lines, blocks = [], re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and (words[0] == "cpr" or "recipes/cpr_curriculum.py" in words):
                lines.append(words)
    return lines


def test_the_readme_commands_parse_with_the_real_parsers():
    """Every README command line is accepted, as written, by the parser that runs it (a renamed or removed option
    fails here); the configs it names exist."""
    from cpr.cli import build_parser
    from cpr.training.cli import add_arguments

    commands = _readme_commands()
    assert len(commands) >= 8  # two launches, the check, four train lines, score
    for words in commands:
        if words[0] == "cpr":
            args = build_parser(only=words[1]).parse_args(words[1:])
            assert args.command == words[1]
        else:
            recipe = argparse.ArgumentParser()
            add_arguments(recipe)
            args = recipe.parse_args(words[words.index("recipes/cpr_curriculum.py") + 1:])
        if getattr(args, "config", "X.yaml") != "X.yaml":
            assert (REPO / args.config).is_file(), args.config
