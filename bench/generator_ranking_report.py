"""Pool the halves of ``bench/generator_ranking.sh``: recall@1 of each row overall and on the mentions the
fine-tuned model's cascade hands to the generator (the same mentions for every generator: the cascade's early
and retrieval steps do not read it), with error classes there and which of them the forced ranking and
retrieval's own ranking each get right::

    python bench/generator_ranking_report.py OUT/metrics [--deferred-by NAME]

Every pair ``half0_<name>.json``, ``half1_<name>.json`` in the folder is pooled: the script's own models first,
then any other name (a cascade fitted elsewhere, say ``crossfit``, measured on the same halves). The deferred
mentions are those of ``--deferred-by``'s cascade (default ``ft``, else the first name found).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

MODELS = ("ft", "angel", "rank", "margin", "margin2x", "listwise", "listwise2x", "fused")


def pooled(folder: Path, model: str) -> dict:
    halves = [json.loads((folder / f"half{i}_{model}.json").read_text(encoding="utf8")) for i in (0, 1)]
    rows = {}
    for name in halves[0]["rows"]:
        per = [h["rows"][name] for h in halves]
        rows[name] = {
            "rank": [r for p in per for r in p["per_mention"]["rank"]],
            "path": [q for p in per for q in p["per_mention"]["path"]],
            "per_cpu_second": sum(h["mentions"] for h in halves) / sum(p["cpu_seconds"] for p in per),
        }
    return rows


def mentions(folder: Path, model: str) -> list:
    """``(text, gold IDs)`` per pooled mention, where both halves recorded them (bench/cascade.py does now)."""
    halves = [json.loads((folder / f"half{i}_{model}.json").read_text(encoding="utf8")) for i in (0, 1)]
    if not all("mention_text" in h for h in halves):
        return []
    return [(t, g) for h in halves for t, g in zip(h["mention_text"], h["mention_gold"])]


_CODE = re.compile(r"(?=.*\d)(?=.*[A-Za-z])")


def error_class(text: str, gold) -> str:
    """A mention's kind, by its surface alone: what the deferred errors are made of."""
    if len(gold) > 1:
        return "composite (several gold IDs)"
    if len(text.split()) <= 2 and _CODE.match(text):
        return "code or formula (letters and digits)"
    if len(text) <= 5 or (text.isupper() and " " not in text):
        return "short form left"
    return "one word" if " " not in text else "phrase"


def measured(folder: Path) -> list:
    """The names with both halves in ``folder``: :data:`MODELS` in their order, then the others sorted."""
    names = {p.name[len("half1_") : -len(".json")] for p in folder.glob("half1_*.json")}
    names = {n for n in names if (folder / f"half0_{n}.json").exists()}
    return [m for m in MODELS if m in names] + sorted(names - set(MODELS))


def recall_at_1(ranks, which) -> float:
    which = list(which)
    return sum(ranks[i] == 1 for i in which) / len(which) if which else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path)
    parser.add_argument("--deferred-by", default=None, help="whose cascade's deferred mentions (default: ft)")
    args = parser.parse_args()
    names = measured(args.metrics)
    if not names:
        parser.error(f"{args.metrics}: no half0_<name>.json and half1_<name>.json pair")
    data = {m: pooled(args.metrics, m) for m in names}
    by = args.deferred_by or ("ft" if "ft" in data else names[0])
    if by not in data or "cascade" not in data[by]:
        parser.error(f"--deferred-by {by}: no cascade row among {', '.join(names)}")
    deferred = [i for i, p in enumerate(data[by]["cascade"]["path"]) if p not in ("early", "retrieval")]
    every = range(len(data[by]["cascade"]["path"]))
    print(f"{len(every)} mentions, {len(deferred)} deferred by {by}'s cascade")
    for model, rows in data.items():
        for name, row in rows.items():
            classes = Counter(
                "top1" if r == 1 else "top2-5" if r else "not in top 5" for r in (row["rank"][i] for i in deferred)
            )
            print(
                f"{model:6s} {name:20s} recall@1 {recall_at_1(row['rank'], every):.4f}  deferred "
                f"{recall_at_1(row['rank'], deferred):.4f} {dict(sorted(classes.items()))}  "
                f"{row['per_cpu_second']:.1f} per CPU s"
            )
        if "forced_alone" in rows and "retrieval_only" in rows:
            print(f"{model:6s} deferred, forced ranking vs retrieval's: {complementarity(rows, deferred)}")
    found = mentions(args.metrics, by)
    if found:
        print(f"error classes of the {len(deferred)} deferred ({by}): mentions, first by each row, gold in no top 5")
        for name, counts in by_class(found, data[by], deferred).items():
            print(f"  {name:38s} {counts}")


def by_class(found: list, rows: dict, which) -> dict:
    """Per error class of ``which`` mentions: how many, how many each row puts first, and how many have gold in
    no row's top 5."""
    out: dict = {}
    for i in which:
        counts = out.setdefault(error_class(*found[i]), Counter())
        counts["mentions"] += 1
        for name, row in rows.items():
            counts[f"{name} first"] += row["rank"][i] == 1
        counts["gold in no top 5"] += not any(row["rank"][i] for row in rows.values())
    return {k: dict(v) for k, v in sorted(out.items(), key=lambda kv: -kv[1]["mentions"])}


def complementarity(rows: dict, which) -> dict:
    """On ``which`` mentions: how many the generator's forced ranking and retrieval's own ranking put first
    together, alone, or neither (gold retrieved, by either, or by none)."""
    forced, retrieval = rows["forced_alone"]["rank"], rows["retrieval_only"]["rank"]
    counts = Counter()
    for i in which:
        f, r = forced[i] == 1, retrieval[i] == 1
        if f or r:
            counts["both first" if f and r else "only forced first" if f else "only retrieval first"] += 1
        else:
            counts["neither first, gold in a top 5" if forced[i] or retrieval[i] else "gold in no top 5"] += 1
    return dict(sorted(counts.items()))


if __name__ == "__main__":
    main()
