"""Prompts the policy sees: templates, conversational messages, and the target JSON.

The templates live in the packaged file ``cpr/templates/prompts.yaml`` and can be overridden
from a config (a YAML path or a dict). Messages follow TRL's conversational vision-language
format: a system message and a user message whose content is one ``{"type": "image"}``
placeholder per image followed by ``{"type": "text", "text": ...}``; TRL's
``prepare_multimodal_messages`` fills the placeholders from the dataset's ``images`` column.
The target is the output format of docs/method.md section 1: ``{"reasoning_steps": [...], "answer": ...}``.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from cpr.data.records import Record, open_image, option_letters
from cpr.errors import ConfigError

MODES: tuple[str, ...] = ("train", "eval")
_USER_FIELDS = frozenset({"question", "context", "options"})
_ALLOWED_FIELDS = {
    "user": _USER_FIELDS,
    "eval_user": _USER_FIELDS,
    "context": frozenset({"context"}),
    "options": frozenset({"options"}),
    "option_line": frozenset({"letter", "text"}),
}


@dataclass(frozen=True)
class PromptTemplates:
    """Prompt strings (see ``cpr/templates/prompts.yaml`` for the defaults and placeholders).

    Attributes:
        system: training system prompt (verbatim).
        user: training user template with ``{question}``, ``{context}``, ``{options}``.
        eval_system: CRYSTAL evaluation system prompt (verbatim).
        eval_user: evaluation user template (same placeholders as ``user``).
        context: block for a record's context, with ``{context}``; omitted when there is none.
        options: block for multiple-choice options, with ``{options}`` (the option lines).
        option_line: one option line, with ``{letter}`` and ``{text}`` (default ``"A) text"``).
    """

    system: str
    user: str
    eval_system: str
    eval_user: str
    context: str
    options: str
    option_line: str

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str):
                raise ConfigError(f"expected a string, got {type(value).__name__}", field=f"prompts.{f.name}")
            allowed = _ALLOWED_FIELDS.get(f.name)
            if allowed is None:
                continue
            try:
                used = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
            except ValueError as e:
                raise ConfigError(
                    f"invalid format template ({e}); write literal braces as {{{{ }}}}",
                    field=f"prompts.{f.name}",
                ) from None
            unknown = used - allowed
            if unknown:
                raise ConfigError(
                    f"unknown placeholder(s) {sorted(unknown)}; allowed: {sorted(allowed)}",
                    field=f"prompts.{f.name}",
                )

    def for_mode(self, mode: str) -> tuple[str, str]:
        """``(system, user_template)`` for ``mode`` (``"train"`` or ``"eval"``)."""
        check_mode(mode)
        return (self.system, self.user) if mode == "train" else (self.eval_system, self.eval_user)


def check_mode(mode: str) -> str:
    """Return ``mode`` if it is ``"train"`` or ``"eval"``; else ``ValueError``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def default_templates_dict() -> dict[str, str]:
    """The packaged defaults as a dict (read from ``cpr/templates/prompts.yaml``)."""
    text = resources.files("cpr").joinpath("templates", "prompts.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def load_templates(path_or_dict: str | Path | Mapping[str, Any] | None = None) -> PromptTemplates:
    """Load the packaged templates, overridden by a YAML file or a mapping.

    A YAML file may hold the keys at top level or under a ``prompts`` key. Keys not given
    keep their defaults.

    Raises:
        ConfigError: an unknown key, a non-string value, or a template with an unknown
            placeholder (``field`` is ``prompts.<key>``).
    """
    data = default_templates_dict()
    if path_or_dict is None:
        override: Mapping[str, Any] = {}
    elif isinstance(path_or_dict, Mapping):
        override = path_or_dict
    else:
        with open(path_or_dict, encoding="utf-8") as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, Mapping):
            raise ConfigError("expected a mapping of prompt templates", field="prompts", path=path_or_dict)
        override = loaded.get("prompts", loaded) if isinstance(loaded.get("prompts"), Mapping) else loaded
    known = {f.name for f in fields(PromptTemplates)}
    unknown = set(override) - known
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)}; known: {sorted(known)}", field="prompts")
    data.update(override)
    return PromptTemplates(**{k: data[k] for k in known})


def format_options(options: list[str], templates: PromptTemplates) -> str:
    """Option lines, ``"A) first\\nB) second"`` with the default ``option_line``."""
    return "\n".join(
        templates.option_line.format(letter=letter, text=text)
        for letter, text in zip(option_letters(len(options)), options, strict=True)
    )


def user_text(record: Record, templates: PromptTemplates, *, mode: str = "train") -> str:
    """The text part of the user message for ``record``."""
    _, user_tpl = templates.for_mode(mode)
    context = templates.context.format(context=record.context) if record.context else ""
    options = (
        templates.options.format(options=format_options(record.options, templates)) if record.options else ""
    )
    return user_tpl.format(question=record.question, context=context, options=options).strip()


def build_messages(
    record: Record, templates: PromptTemplates, *, mode: str = "train", include_images: bool = False
) -> list[dict[str, Any]]:
    """Conversational prompt: system message + user message (image placeholders, then text).

    Args:
        record: the record.
        templates: prompt templates.
        mode: ``"train"`` (training system prompt) or ``"eval"`` (CRYSTAL evaluation prompt).
        include_images: put the decoded images into the placeholders (``{"type": "image",
            "image": PIL.Image}``), for generation outside TRL; by default the placeholders
            are bare and TRL fills them from the ``images`` column.

    Returns:
        ``[{"role": "system", "content": [{"type": "text", "text": ...}]},
        {"role": "user", "content": [{"type": "image"}, ..., {"type": "text", "text": ...}]}]``.
        Every content is a list of blocks so the column has one Arrow type.
    """
    system, _ = templates.for_mode(mode)
    if include_images:
        images = [{"type": "image", "image": open_image(ref)} for ref in record.images]
    else:
        images = [{"type": "image"} for _ in record.images]
    return [
        {"role": "system", "content": [{"type": "text", "text": system}]},
        {
            "role": "user",
            "content": [*images, {"type": "text", "text": user_text(record, templates, mode=mode)}],
        },
    ]


def render_target(record: Record) -> str:
    """The completion the policy should produce for ``record``, as JSON text.

    ``{"reasoning_steps": record.reference_steps, "answer": record.answer}`` (non-ASCII kept).
    Used for the supervised warm start and SFT baselines.
    """
    return json.dumps(
        {"reasoning_steps": list(record.reference_steps), "answer": record.answer}, ensure_ascii=False
    )


def messages_as_text(messages: list[dict[str, Any]], image_marker: str = "<image>") -> str:
    """Messages as readable text (``[role]`` headers, ``<image>`` per image block)."""
    out: list[str] = []
    for message in messages:
        out.append(f"[{message['role']}]")
        content = message["content"]
        if isinstance(content, str):
            out.append(content)
            continue
        for block in content:
            out.append(image_marker if block.get("type") == "image" else str(block.get("text", "")))
    return "\n".join(out)


__all__ = [
    "MODES",
    "PromptTemplates",
    "build_messages",
    "check_mode",
    "default_templates_dict",
    "format_options",
    "load_templates",
    "messages_as_text",
    "render_target",
    "user_text",
]
