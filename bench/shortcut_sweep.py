"""Choose the retriever shortcut's threshold on dev, offline.

``evaluate --predictions`` writes each mention's ranked candidates. Given a
retriever's file (TF-IDF or dense: scores are cosine similarities) and a
generative run's file over the same mentions, this replays the component's
``shortcut_threshold`` rule for every threshold: a mention whose top retrieved
candidate scores at least the threshold takes it first, the generator's
candidates (minus that name) fill the rest; below it, the generator's list
stands. It prints recall@1 / recall@5 per threshold and how many mentions the
shortcut took, so one generative run prices the whole sweep; confirm the
chosen threshold with a real ``evaluate --candidates.shortcut_threshold T`` run::

    python -m spacy_genbioel evaluate --linker tfidf ... --predictions tfidf.jsonl
    python -m spacy_genbioel evaluate --linker genbioel ... --candidates.retriever none --predictions free.jsonl
    python bench/shortcut_sweep.py tfidf.jsonl free.jsonl --thresholds 0.6 0.7 0.8 0.9 1.0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from spacy_genbioel.evaluation.recall import NO_GOLD_IDS, hit_rank
from spacy_genbioel.ty import Candidate


def read_predictions(path: Path) -> Iterator[dict]:
    with path.open(encoding="utf8") as lines:
        for number, line in enumerate(lines, start=1):
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err})") from None


def _candidates(record: dict) -> List[Candidate]:
    return [Candidate(tuple(ids), name, float(score)) for ids, name, score in record["candidates"]]


def combine(
    retrieved: List[Candidate], generated: List[Candidate], threshold: Optional[float], top_k: int = 5
) -> Tuple[List[Candidate], bool]:
    """The component's rule: the retriever's top candidate first when it scores at least ``threshold``."""
    if threshold is None or not retrieved or retrieved[0].score < threshold:
        return generated[:top_k], False
    first = retrieved[0]
    return [first, *[c for c in generated if c.name != first.name]][:top_k], True


def sweep(retriever: Path, generator: Path, thresholds: Sequence[Optional[float]]) -> List[Dict[str, object]]:
    pairs = []
    for number, (r, g) in enumerate(
        zip(read_predictions(retriever), read_predictions(generator), strict=True), start=1
    ):
        if (r["doc_id"], r["start"], r["end"]) != (g["doc_id"], g["start"], g["end"]):
            raise ValueError(f"line {number}: the two files list different mentions ({r['text']!r} / {g['text']!r})")
        gold = {i for i in r["gold"] if i.strip() not in NO_GOLD_IDS}
        if gold:
            pairs.append((gold, _candidates(r), _candidates(g)))
    rows = []
    for threshold in thresholds:
        at1 = at5 = taken = 0
        for gold, retrieved, generated in pairs:
            ranked, shortcut = combine(retrieved, generated, threshold)
            taken += shortcut
            rank = hit_rank(gold, ranked)
            at1 += rank is not None and rank <= 1
            at5 += rank is not None and rank <= 5
        n = len(pairs)
        rows.append(
            {"threshold": threshold, "recall@1": at1 / n, "recall@5": at5 / n, "shortcut": taken, "mentions": n}
        )
    return rows


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("retriever", type=Path, help="evaluate --predictions of the retriever (tfidf or dense)")
    parser.add_argument("generator", type=Path, help="evaluate --predictions of the generative run, same corpus")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0])
    args = parser.parse_args(argv)
    rows = sweep(args.retriever, args.generator, [None, *args.thresholds])
    print("| threshold | shortcut mentions | recall@1 | recall@5 |")
    print("|---|---|---|---|")
    for row in rows:
        label = "off" if row["threshold"] is None else f"{row['threshold']:.2f}"
        print(f"| {label} | {row['shortcut']}/{row['mentions']} | {row['recall@1']:.4f} | {row['recall@5']:.4f} |")


if __name__ == "__main__":
    main()
