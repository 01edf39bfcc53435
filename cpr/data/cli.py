"""``cpr data inspect``: load a dataset as the trainer would and show what the model will see."""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

import yaml

from cpr.data.adapters import ADAPTERS
from cpr.data.buckets import BucketConfig
from cpr.data.loader import load_records_with_report
from cpr.data.prompts import build_messages, load_templates, messages_as_text, render_target
from cpr.data.records import DIFFICULTIES
from cpr.errors import ConfigError


def register(subparsers: Any) -> None:
    """Add the ``data`` command (with its ``inspect`` sub-command) to ``cpr``'s parser."""
    data = subparsers.add_parser("data", help="inspect datasets in their published layouts")
    data.set_defaults(func=lambda args: (data.print_help(), 2)[1])
    sub = data.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    p = sub.add_parser("inspect", help="load a dataset, validate it, and print counts, buckets, step statistics "
                       "and the first prompt")
    p.add_argument("--source", required=True, choices=sorted(ADAPTERS), help="dataset adapter")
    p.add_argument("--path", default=None, help="file, folder, saved dataset or hub name (not for a generated "
                   "source: synthetic)")
    p.add_argument("--split", default=None, help="split, where the layout has splits")
    p.add_argument("--on-invalid", default="error", choices=["error", "skip"],
                   help="stop at the first invalid record (default) or skip invalid records")
    p.add_argument("--limit", type=int, default=None, help="read at most this many valid records")
    p.add_argument("--mode", default="train", choices=["train", "eval"], help="which prompt to render")
    p.add_argument("--templates", default=None, help="YAML file overriding the prompt templates")
    p.add_argument("--buckets", default=None, help="YAML file with the difficulty bucket config")
    p.add_argument("--no-image-check", action="store_true", help="do not open and verify images")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="adapter option, the value read as YAML like --set's: e.g. text_only=keep for scienceqa, "
                   "size=60 for synthetic (repeatable)")
    p.set_defaults(func=inspect_command)


def parse_options(pairs: Sequence[str], flag: str = "--option") -> dict[str, Any]:
    """``{key: value}`` of ``KEY=VALUE`` command-line options, each value read as a YAML value (as
    ``--set`` reads them: ``size=9`` gives the integer 9, ``keep`` the string, ``[1, 2]`` a list). Raises
    ``ConfigError`` (``flag`` named) for an item without ``=`` or a key, or a value that is not valid YAML."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"expected KEY=VALUE, got {pair!r}", field=flag)
        try:
            options[key.strip()] = yaml.safe_load(value) if value.strip() else value
        except yaml.YAMLError as e:
            raise ConfigError(f"{pair!r}: the value is not valid YAML ({' '.join(str(e).split())})", field=flag) from None
    return options


def source_path(source: str, path: str | None, flag: str) -> str:
    """The dataset path given for ``source``: ``path``, or ``""`` for a generated source (``synthetic``),
    which reads none. Raises :class:`ConfigError` (``flag`` named) when a source that reads files has none."""
    if path:
        return path
    if source in ADAPTERS and not ADAPTERS[source].reads_path:
        return ""
    raise ConfigError(f"source {source!r} reads a dataset: give its path", field=flag)


def inspect_command(args: argparse.Namespace) -> int:
    """Run ``cpr data inspect``; returns 0 (invalid input raises, and ``cpr`` exits 2)."""
    options = parse_options(args.option)
    templates = load_templates(args.templates)
    records, report = load_records_with_report(
        args.source, source_path(args.source, args.path, "--path"), split=args.split,
        on_invalid=args.on_invalid, buckets=BucketConfig.from_yaml(args.buckets) if args.buckets else None,
        limit=args.limit, validate_images=not args.no_image_check, options=options)
    print(report.summary())
    print(f"records: {len(records)}")
    counts = Counter(records.column("difficulty"))
    print("buckets: " + ", ".join(f"{b} {counts.get(b, 0)}" for b in DIFFICULTIES))
    if records:
        steps = [len(s) for s in records.column("reference_steps")]
        print(f"reference steps: min {min(steps)}, mean {statistics.fmean(steps):.2f}, max {max(steps)}")
        first = records[0]
        print(f"\nfirst record: id {first.id} ({first.difficulty}, {len(first.images)} image(s))")
        print(messages_as_text(build_messages(first, templates, mode=args.mode)))
        print("\n[target]")
        print(render_target(first))
    return 0
