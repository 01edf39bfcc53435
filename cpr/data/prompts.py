"""Prompts the policy sees: templates (packaged ``cpr/templates/prompts.yaml``, overridable),
messages in TRL's conversational vision-language format, and the target JSON (docs/method.md section 1)."""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cpr.data.records import Record, open_image, option_letters
from cpr.errors import ConfigError

MODES: tuple[str, ...] = ("train", "eval")
_USER = frozenset({"question", "context", "options"})
_PLACEHOLDERS = {"user": _USER, "eval_user": _USER, "context": {"context"}, "options": {"options"},
                 "option_line": {"letter", "text"}}


@dataclass(frozen=True)
class PromptTemplates:
    """Prompt strings (defaults: ``cpr/templates/prompts.yaml``): the training / CRYSTAL evaluation
    ``system`` and ``eval_system`` prompts (verbatim); ``user`` / ``eval_user`` templates with
    ``{question}``, ``{context}``, ``{options}``; the ``context`` block (``{context}``, omitted when
    there is none), the ``options`` block (``{options}``: the option lines) and one ``option_line``
    (``{letter}``, ``{text}``). Bad values raise as :func:`check_templates` says (prefix ``prompts``).
    """

    system: str
    user: str
    eval_system: str
    eval_user: str
    context: str
    options: str
    option_line: str

    def __post_init__(self) -> None:
        check_templates(self, _PLACEHOLDERS, "prompts")

    def for_mode(self, mode: str) -> tuple[str, str]:
        """``(system, user_template)`` for ``mode`` (``"train"`` or ``"eval"``); ``ValueError`` otherwise."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        return (self.system, self.user) if mode == "train" else (self.eval_system, self.eval_user)


def check_templates(templates: Any, placeholders: Mapping[str, set[str] | frozenset[str]], prefix: str) -> None:
    """Check a dataclass of template strings: ``ConfigError`` (field ``<prefix>.<name>``) for a value
    that is not a string or, for the fields named in ``placeholders``, an invalid format template or a
    placeholder it does not list (other fields are used verbatim)."""
    for f in fields(templates):
        value, key = getattr(templates, f.name), f"{prefix}.{f.name}"
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {type(value).__name__}", field=key)
        if f.name not in placeholders:
            continue
        try:
            used = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as e:
            raise ConfigError(f"invalid format template ({e}); write literal braces as {{{{ }}}}", field=key) from None
        if unknown := used - placeholders[f.name]:
            allowed = sorted(placeholders[f.name])
            raise ConfigError(f"unknown placeholder(s) {sorted(unknown)}; allowed: {allowed}", field=key)


def load_templates(path_or_dict: str | Path | Mapping[str, Any] | None = None) -> PromptTemplates:
    """The packaged templates, overridden by a mapping or a YAML file (keys at top level or under
    ``prompts``); keys not given keep their defaults.

    Raises ``ConfigError``: an unknown key (field ``prompts``) or a bad template (:class:`PromptTemplates`).
    """
    data = yaml.safe_load(resources.files("cpr").joinpath("templates", "prompts.yaml").read_text(encoding="utf-8"))
    override: Any = path_or_dict or {}
    if not isinstance(override, Mapping):
        with open(override, encoding="utf-8") as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, Mapping):
            raise ConfigError("expected a mapping of prompt templates", field="prompts", path=path_or_dict)
        override = loaded["prompts"] if isinstance(loaded.get("prompts"), Mapping) else loaded
    known = {f.name for f in fields(PromptTemplates)}
    if unknown := set(override) - known:
        raise ConfigError(f"unknown key(s) {sorted(unknown)}; known: {sorted(known)}", field="prompts")
    return PromptTemplates(**{k: {**data, **override}[k] for k in known})


def user_text(record: Record, templates: PromptTemplates, *, mode: str = "train") -> str:
    """The text part of the user message for ``record``."""
    _, user = templates.for_mode(mode)
    context = templates.context.format(context=record.context) if record.context else ""
    lines = "\n".join(
        templates.option_line.format(letter=letter, text=text)
        for letter, text in zip(option_letters(len(record.options)), record.options, strict=True)
    )
    options = templates.options.format(options=lines) if record.options else ""
    return user.format(question=record.question, context=context, options=options).strip()


def build_messages(
    record: Record, templates: PromptTemplates, *, mode: str = "train", include_images: bool = False
) -> list[dict[str, Any]]:
    """Conversational prompt: ``[{"role": "system", "content": [{"type": "text", "text": ...}]},
    {"role": "user", "content": [{"type": "image"}, ..., {"type": "text", "text": ...}]}]``.

    ``mode`` picks the training or the CRYSTAL evaluation prompt. The image placeholders are bare (TRL
    fills them from the dataset's ``images`` column) unless ``include_images`` puts the decoded PIL
    images in them (``{"type": "image", "image": ...}``), for generation outside TRL. Every content
    is a list of blocks, so the column has one Arrow type.
    """
    system, _ = templates.for_mode(mode)
    images = [{"type": "image", **({"image": open_image(ref)} if include_images else {})} for ref in record.images]
    text = {"type": "text", "text": user_text(record, templates, mode=mode)}
    return [
        {"role": "system", "content": [{"type": "text", "text": system}]},
        {"role": "user", "content": [*images, text]},
    ]


def render_target(record: Record) -> str:
    """The completion the policy should produce, as JSON text (non-ASCII kept):
    ``{"reasoning_steps": record.reference_steps, "answer": record.answer}`` (docs/method.md section 1)."""
    return target_text(record.reference_steps, record.answer)


def target_text(steps: Sequence[str], answer: str) -> str:
    """:func:`render_target` of a record with these ``steps`` and ``answer``."""
    return json.dumps({"reasoning_steps": list(steps), "answer": answer}, ensure_ascii=False)


def target_prefix(steps: Sequence[str], k: int) -> str:
    """The start of :func:`target_text` up to the end of its ``k``-th step (``""`` for ``k`` 0), e.g.
    ``{"reasoning_steps": ["a", "b"`` for k 2: a completion continues it with more steps or the answer."""
    if k <= 0:
        return ""
    return '{"reasoning_steps": [' + ", ".join(json.dumps(s, ensure_ascii=False) for s in steps[:k])


def messages_as_text(messages: list[dict[str, Any]], image_marker: str = "<image>") -> str:
    """Messages as readable text: a ``[role]`` header, then ``image_marker`` per image block and the texts."""
    out: list[str] = []
    for message in messages:
        out.append(f"[{message['role']}]")
        out += [image_marker if b.get("type") == "image" else str(b.get("text", "")) for b in message["content"]]
    return "\n".join(out)
