"""Prompt templates, messages, targets and the GRPO dataset (cpr.data.prompts, cpr.data.grpo)."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from cpr.data import (
    Record,
    build_messages,
    load_records,
    load_templates,
    messages_as_text,
    render_target,
    to_grpo_dataset,
)
from cpr.errors import ConfigError


@pytest.fixture(scope="module")
def templates():
    return load_templates()


@pytest.fixture()
def mc_record(samples_dir) -> Record:
    image = samples_dir / "tabmwp" / "tables" / "3671.png"
    return Record(
        id="t1",
        images=[image, image],
        question="How soon can she get to Lanberry?",
        options=["1:15 P.M.", "3:15 P.M."],
        answer="B",
        reference_steps=["Find Hillsboro.", "Take the next train."],
        difficulty="easy",
        source="tabmwp",
        meta={"context": "Malia is at Hillsboro at 2.15 P.M."},
    )


def test_packaged_defaults(templates):
    assert '{"reasoning_steps": [' in templates.system and "14 words" in templates.system
    assert "single-clause" in templates.system and "letter" in templates.system
    assert "insufficient information" in templates.eval_system
    assert "single clause" in templates.eval_system and "letter" in templates.eval_system
    assert templates.option_line == "{letter}) {text}"


def test_messages_train(mc_record, templates):
    messages = build_messages(mc_record, templates)
    assert messages == [
        {"role": "system", "content": [{"type": "text", "text": templates.system}]},
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "image"},
                {
                    "type": "text",
                    "text": "Context: Malia is at Hillsboro at 2.15 P.M.\n"
                    "Question: How soon can she get to Lanberry?\n"
                    "Options:\nA) 1:15 P.M.\nB) 3:15 P.M.",
                },
            ],
        },
    ]
    assert messages_as_text(messages) == "\n".join(
        [
            "[system]",
            templates.system,
            "[user]",
            "<image>",
            "<image>",
            "Context: Malia is at Hillsboro at 2.15 P.M.",
            "Question: How soon can she get to Lanberry?",
            "Options:",
            "A) 1:15 P.M.",
            "B) 3:15 P.M.",
        ]
    )


def test_messages_free_form_eval(templates):
    rec = Record(
        id="f", images=["x.png"], question="What is x?", options=[], answer="3", reference_steps=["s"]
    )
    messages = build_messages(rec, templates, mode="eval")
    assert messages[0]["content"][0]["text"] == templates.eval_system
    assert messages[1]["content"][-1] == {"type": "text", "text": "Question: What is x?"}
    with pytest.raises(ValueError, match=r"mode must be one of \('train', 'eval'\), got 'test'"):
        build_messages(rec, templates, mode="test")


def test_include_images(mc_record, templates):
    blocks = build_messages(mc_record, templates, include_images=True)[1]["content"]
    assert [b["type"] for b in blocks] == ["image", "image", "text"]
    assert isinstance(blocks[0]["image"], Image.Image) and blocks[0]["image"].size == (435, 258)


def test_render_target(mc_record):
    text = render_target(mc_record)
    assert json.loads(text) == {"reasoning_steps": ["Find Hillsboro.", "Take the next train."], "answer": "B"}
    rec = Record(id="u", images=[], question="q", options=[], answer="60°", reference_steps=["∠A = 60°."])
    assert render_target(rec) == '{"reasoning_steps": ["∠A = 60°."], "answer": "60°"}'


def test_override_from_dict_and_yaml(tmp_path, mc_record):
    custom = load_templates({"user": "Q: {question}\n{options}{context}", "option_line": "({letter}) {text}"})
    text = build_messages(mc_record, custom)[1]["content"][-1]["text"]
    assert (
        text == "Q: How soon can she get to Lanberry?\nOptions:\n(A) 1:15 P.M.\n(B) 3:15 P.M.\n"
        "Context: Malia is at Hillsboro at 2.15 P.M."
    )
    path = tmp_path / "p.yaml"
    path.write_text("prompts:\n  system: Be brief.\n", encoding="utf-8")
    loaded = load_templates(path)
    assert loaded.system == "Be brief." and loaded.eval_system == load_templates().eval_system


@pytest.mark.parametrize(
    ("override", "field", "message"),
    [
        ({"sytem": "x"}, "prompts", "unknown key(s) ['sytem']"),
        ({"user": "{question} {image}"}, "prompts.user", "unknown placeholder(s) ['image']"),
        ({"option_line": "{letter}) {txt}"}, "prompts.option_line", "unknown placeholder(s) ['txt']"),
        ({"eval_user": "{question"}, "prompts.eval_user", "invalid format template"),
        ({"system": 3}, "prompts.system", "expected a string, got int"),
    ],
)
def test_template_errors(override, field, message):
    with pytest.raises(ConfigError) as e:
        load_templates(override)
    assert e.value.field == field and e.value.message.startswith(message)


def test_grpo_dataset_matches_trl_format(samples_dir, templates):
    from trl.data_utils import is_conversational, prepare_multimodal_messages

    records = load_records("tabmwp", samples_dir / "tabmwp", limit=5)
    ds = to_grpo_dataset(records, templates)
    assert ds.column_names == [
        "prompt",
        "images",
        "answer",
        "reference_steps",
        "options",
        "question",
        "id",
        "difficulty",
        "source",
    ]
    assert len(ds) == 5
    for i, rec in enumerate(records):
        row = ds[i]
        assert row["prompt"] == build_messages(rec, templates)  # no spurious "text": None keys
        assert is_conversational(row)
        assert [im.size for im in row["images"]] == [Image.open(p).size for p in rec.images]
        assert (row["answer"], row["reference_steps"], row["options"], row["question"]) == (
            rec.answer,
            rec.reference_steps,
            rec.options,
            rec.question,
        )
        assert (row["id"], row["difficulty"], row["source"]) == (rec.id, rec.difficulty, "tabmwp")
        filled = prepare_multimodal_messages(row["prompt"], images=row["images"])
        image_blocks = [b for b in filled[1]["content"] if b["type"] == "image"]
        assert [b["image"] for b in image_blocks] == row["images"]
    # images are stored as paths and decoded on access
    assert ds.data.column("images").to_pylist()[0] == [{"bytes": None, "path": str(records[0].images[0])}]


def test_grpo_dataset_eval_mode_and_text_only_rows(samples_dir, templates):
    image = samples_dir / "tabmwp" / "tables" / "5739.png"
    recs = [
        Record(id="a", images=[image], question="Q1", options=["x", "y"], answer="A", reference_steps=["s"]),
        Record(id="b", images=[], question="Q2", options=[], answer="2", reference_steps=["t"]),
    ]
    ds = to_grpo_dataset(recs, templates, mode="eval")
    assert ds[0]["prompt"][0]["content"][0]["text"] == templates.eval_system
    assert ds[1]["images"] == [] and ds[1]["prompt"][1]["content"] == [
        {"type": "text", "text": "Question: Q2"}
    ]
    assert ds[1]["difficulty"] is None
    with pytest.raises(ValueError, match="mode must be one of"):
        to_grpo_dataset(recs, templates, mode="dev")
