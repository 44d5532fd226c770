"""Choose fusion features on training predictions only: fit on one cross-fitted fold, score the other.

``bench/crossfit.sh`` leaves per-fold predictions of every source on held-out training folds;
this fits the fusion on all folds but one and scores the one left out, in turn, and prints the
pooled recall@1 / recall@5, for the full feature set and with feature groups dropped (a dropped
feature's column is zeroed, which is the same as leaving it out of the model). With ``--dev``
(a ``bench/variants.sh`` output folder), it also replays the fusion fitted on every fold on the
dev predictions there: a report, never a selection signal::

    python bench/fusion_swap.py bench_out/ncbi_crossfit --variant plain --drop gap --drop log_prior,exact
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np

from spacy_genbioel.kb import KnowledgeBase
from spacy_genbioel.linking.reranking import fusion as fusion_module
from spacy_genbioel.training import fusion_fit
from spacy_genbioel.training.fusion_fit import read_fusion_examples

SOURCES = ["genbioel", "tfidf", "dense"]


def load_fold(folder: Path, fold: Path, variant: str):
    kb = KnowledgeBase.load(folder / "folds" / fold.name / f"kb_{variant}.jsonl")
    return read_fusion_examples({s: [fold / f"{variant}_{s}.jsonl"] for s in SOURCES}, kb), kb


def without(drop: Sequence[str]):
    """``fusion_features`` with the features named ``*_<d>`` or ``<d>`` zeroed, for every ``d`` in ``drop``."""
    features = fusion_module.fusion_features

    def zeroed(text, lists, sources, depth, kb, priors=None):
        ids, names, x = features(text, lists, sources, depth, kb, priors)
        for j, name in enumerate(fusion_module.feature_names(sources)):
            if any(name == d or name.endswith("_" + d) for d in drop):
                x[:, j] = 0.0
        return ids, names, x

    return zeroed


def swap(folds, drop: Sequence[str]) -> List[float]:
    fusion_fit.fusion_features = without(drop)
    try:
        hits = np.zeros(2)
        n = 0
        for k, (held, kb) in enumerate(folds):
            train = [ex for j, (examples, _) in enumerate(folds) if j != k for ex in examples]
            model = fusion_fit.fit_fusion(train, None, SOURCES)
            recall = fusion_fit.score_fusion(model, held, kb)["fusion"]
            hits += [recall["recall@1"] * len(held), recall["recall@5"] * len(held)]
            n += len(held)
        return list(hits / n)
    finally:
        fusion_fit.fusion_features = fusion_module.fusion_features


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("crossfit", type=Path, help="bench/crossfit.sh output folder (fold-<i>/ predictions, folds/)")
    parser.add_argument("--variant", default="plain", help="plain | aug")
    parser.add_argument(
        "--drop",
        action="append",
        default=[],
        help="comma-separated feature groups to drop (gap, rr, score, in, exact, log_prior, tfidf_gap...)",
    )
    parser.add_argument(
        "--dev", type=Path, help="a bench/variants.sh folder: replay the all-folds fusion on its dev predictions"
    )
    args = parser.parse_args(argv)
    folds = [load_fold(args.crossfit, f, args.variant) for f in sorted(args.crossfit.glob("fold-*")) if f.is_dir()]
    print("| features | fold-swap recall@1 | recall@5 | dev replay recall@1 | recall@5 |")
    print("|---|---|---|---|---|")
    for drop in [[], *[d.split(",") for d in args.drop]]:
        r1, r5 = swap(folds, drop)
        dev = ""
        if args.dev:
            fusion_fit.fusion_features = without(drop)
            model = fusion_fit.fit_fusion([ex for examples, _ in folds for ex in examples], None, SOURCES)
            kb = KnowledgeBase.load(args.dev / f"kb_{args.variant}.jsonl")
            examples = read_fusion_examples({s: [args.dev / f"{args.variant}_{s}.jsonl"] for s in SOURCES}, kb)
            recall = fusion_fit.score_fusion(model, examples, kb)["fusion"]
            fusion_fit.fusion_features = fusion_module.fusion_features
            dev = f" {recall['recall@1']:.4f} | {recall['recall@5']:.4f}"
        print(f"| all{' minus ' + ', '.join(drop) if drop else ''} | {r1:.4f} | {r5:.4f} |{dev or ' | '} |")


if __name__ == "__main__":
    main()
