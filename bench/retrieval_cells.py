"""The retrieval pipeline (no generator: exact match, TF-IDF and MiniLM fused by the package's default
weights) against each retriever alone and scispacy's candidate generator, every row in one process, on
dev mentions: NCBI-disease dev (MEDIC 2012), BC5CDR dev (CTD diseases + MeSH) and the AskAPatient
validation folds, each with the plain vocabulary and with the training split's mentions added as names
(and its gold IDs as priors). recall@1, recall@5 and mentions per second (one torch thread; retrievers'
indexes built before the clock; scispacy's in memory).

    OMP_NUM_THREADS=1 python bench/retrieval_cells.py ncbi --json metrics/retrieval_ncbi.json
    OMP_NUM_THREADS=1 python bench/retrieval_cells.py bc5cdr --json metrics/retrieval_bc5cdr.json
    OMP_NUM_THREADS=1 python bench/retrieval_cells.py aap --json metrics/retrieval_aap.json   # 10 folds, mean ± sd

``--fusion FILE`` measures another retrieval-only fusion; ``--rows`` picks rows (retrieval,
retrieval_no_minilm, retrieval_phrases, tfidf, dense, scispacy, exact).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Dict, List

import torch

from spacy_genbioel.corpus.load import load_corpus
from spacy_genbioel.evaluation.report import evaluate_linker
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.kb.build import augment_kb, build_kb
from spacy_genbioel.linking.reranking.fusion import FusionModel
from spacy_genbioel.linking.reranking.retrieval_only import DEFAULT_RETRIEVAL_FUSION, retrieval_reranker
from spacy_genbioel.linking.settings import RerankerSettings
from spacy_genbioel.retrieval.registry import get_retriever

ROWS = ("retrieval", "retrieval_no_minilm", "tfidf", "dense", "scispacy")
#: the shipped fusion for lay phrases (AskAPatient's fit), a row of its own
PHRASES = "genbioel:retrieval_phrases"


class Fused:
    """The component's retrieval-only stage as a Linker (``link``), counting each mention's path."""

    def __init__(self, reranker):
        self.reranker, self.paths = reranker, Counter()

    def link(self, mentions, top_k=5):
        results, paths = self.reranker.link(mentions, top_k)
        self.paths.update(paths)
        return results


def corpora(name: str, data: Path):
    """``[(cell label, dev mentions, dev texts, plain KB, training mentions)]`` of a corpus."""
    vocab = data / "vocab"
    if name == "ncbi":
        kb = build_kb("medic", str(vocab / "medic_06Jul2012.txt"))
        dev, texts = load_corpus(data / "ncbi_disease/NCBIdevelopset_corpus.txt", "pubtator")
        train, _ = load_corpus(data / "ncbi_disease/NCBItrainset_corpus.txt", "pubtator")
        return [("ncbi dev", dev, texts, kb, train)]
    if name == "bc5cdr":
        walk = vocab / "bc5cdr_legacy_id_crosswalk.tsv"
        kb = build_kb(
            "ctd",
            [
                vocab / "CTD_diseases_2017.tsv.gz",
                ("mesh-tsv", vocab / "mesh/mesh_id_label_mappings.tsv"),
                ("mesh-tsv", vocab / "mesh/mesh_supp_id_label_mappings.tsv"),
            ],
            crosswalk=walk,
        )
        dev, texts = load_corpus(data / "bc5cdr/CDR_DevelopmentSet.PubTator.txt", "pubtator", walk)
        train, _ = load_corpus(data / "bc5cdr/CDR_TrainingSet.PubTator.txt", "pubtator", walk)
        return [("bc5cdr dev", dev, texts, kb, train)]
    if name == "aap":
        kb = build_kb("askapatient", str(data / "askapatient/askapatient.json"))
        return [
            (
                f"aap fold {k}",
                load_corpus(data / f"askapatient/AskAPatient.fold-{k}.validation.txt", "askapatient")[0],
                {},
                kb,
                load_corpus(data / f"askapatient/AskAPatient.fold-{k}.train.txt", "askapatient")[0],
            )
            for k in range(10)
        ]
    raise SystemExit(f"unknown corpus {name}: ncbi, bc5cdr or aap")


def measure(kb: KnowledgeBase, mentions, fusion: FusionModel, rows) -> Dict[str, Dict]:
    built: Dict[str, object] = {}

    def retriever(source, model_dir=None):
        if source not in built:
            built[source] = get_retriever(source, kb)
        return built[source]

    linkers = {}
    for row in rows:
        if row == "retrieval":
            linkers[row] = Fused(
                retrieval_reranker(fusion, kb, retriever, RerankerSettings(), installed=lambda m: True)
            )
        elif row == "retrieval_no_minilm":
            linkers[row] = Fused(
                retrieval_reranker(fusion, kb, retriever, RerankerSettings(), installed=lambda m: False)
            )
        elif row == "retrieval_phrases":
            linkers[row] = Fused(
                retrieval_reranker(
                    FusionModel.load(PHRASES), kb, retriever, RerankerSettings(), installed=lambda m: True
                )
            )
        else:
            linkers[row] = retriever(row)
    out = {}
    for row, linker in linkers.items():
        linker.link(mentions[:32], 5)  # indexes and encoders built, caches warm: not on the clock
        if isinstance(linker, Fused):
            linker.paths.clear()
        cpu = time.process_time()
        report = evaluate_linker(linker, mentions, top_k=5, kb=kb, bins=None, name=row)
        cpu = time.process_time() - cpu
        out[row] = {
            "recall@1": round(report.recall.recall[1], 4),
            "recall@5": round(report.recall.recall[5], 4),
            "mentions_per_second": round(report.mentions_per_second, 1),
            "mentions_per_cpu_second": round(len(mentions) / cpu, 1) if cpu > 0 else None,
        }
        if isinstance(linker, Fused):
            out[row]["paths"] = dict(linker.paths)
        logging.info("%s: %s", row, out[row])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", choices=["ncbi", "bc5cdr", "aap"])
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("GENBIOEL_DATA", "../shared/data")))
    parser.add_argument("--fusion", type=Path, default=DEFAULT_RETRIEVAL_FUSION)
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--variants", default="plain,aug")
    parser.add_argument("--no-abbreviations", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    fusion = FusionModel.load(args.fusion)
    rows = [r for r in args.rows.split(",") if r]
    cells: Dict[str, Dict] = {}
    for label, dev, texts, kb, train in corpora(args.corpus, args.data):
        dev = [m for m in dev if m.ids and not all(i in ("-1", "") for i in m.ids)]
        if texts and not args.no_abbreviations:
            from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander

            dev, _ = AbbreviationExpander().expand(dev, texts)
        for variant in args.variants.split(","):
            cell_kb = kb if variant == "plain" else augment_kb(kb, augment_mentions=train, prior_mentions=train)[0]
            logging.info("%s, %s KB (%d names): %d mentions", label, variant, cell_kb.n_names, len(dev))
            cells[f"{label}/{variant}"] = {"mentions": len(dev), "rows": measure(cell_kb, dev, fusion, rows)}
    summary = summarize(cells, rows)
    result = {
        "corpus": args.corpus,
        "fusion": str(args.fusion),
        "date": date.today().isoformat(),
        "machine": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "cells": cells,
        "summary": summary,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    for variant, by_row in summary.items():
        print(f"\n{args.corpus} {variant}")
        for row, figures in by_row.items():
            print(f"  {row:20s} " + "  ".join(f"{k} {v}" for k, v in figures.items()))


def summarize(cells: Dict[str, Dict], rows: List[str]) -> Dict[str, Dict[str, Dict[str, str]]]:
    """Per variant and row: the cell's figures, or mean ± sd over folds."""
    out: Dict[str, Dict[str, Dict[str, str]]] = {}
    for variant in sorted({key.split("/")[1] for key in cells}):
        keys = [k for k in cells if k.endswith("/" + variant)]
        out[variant] = {}
        for row in rows:
            figures = {}
            for metric in ("recall@1", "recall@5", "mentions_per_cpu_second"):
                values = [cells[k]["rows"][row][metric] for k in keys]
                mean = statistics.fmean(values)
                figures[metric] = f"{mean:.4f}" if len(values) == 1 else f"{mean:.4f} ± {statistics.stdev(values):.4f}"
                if metric == "mentions_per_cpu_second":
                    figures[metric] = f"{mean:.1f}"
            out[variant][row] = figures
    return out


if __name__ == "__main__":
    main()
