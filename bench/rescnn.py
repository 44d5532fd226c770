"""The ResCNN retriever beside its peers (issue 29 item 4): recall@1/@5/@20, mentions/s on one
thread, index build time and memory, parameters, every peer in the same run and process.

    python bench/rescnn.py --model training/ncbi/rescnn/model --kb corpus/ncbi/kb.jsonl \\
        --corpus ../shared/data/ncbi_disease/NCBIdevelopset_corpus.txt \\
        --train ../shared/data/ncbi_disease/NCBItrainset_corpus.txt --json metrics/rescnn_ncbi.json

For each KB -- the plain KB and, with ``--train``, the KB with the training
mentions added as names of their gold concepts (``build-kb
--augment-pubtator``) -- each linker (``--linkers``, default TF-IDF, MiniLM
as installed, ResCNN) is built (timed; the resident memory it adds is
measured; ResCNN's index is built afresh, MiniLM's name matrix is read from
the dense cache when there, as ``from_cache`` says) and links every gold mention at ``top_k = 20`` on one torch thread
(timed by the wall clock and by the process CPU time, which a busy shared
machine does not inflate). ``--index-only KB`` (repeatable) times only
ResCNN's index build on a further KB (the 788k-name BC5CDR KB), once per
``--index-rows`` row (``rescnn/encoder_dtype=int8``: the int8 encoder).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def parse_row(spec: str) -> Tuple[str, Dict[str, Any]]:
    """``rescnn/sparse_weight=0/index=faiss`` -> ("rescnn", {"sparse_weight": 0, "index": "faiss"})."""
    name, *pairs = spec.split("/")
    settings: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--linkers: {spec!r}: settings are key=value after '/', got {pair!r}")
        try:
            settings[key] = json.loads(value)
        except json.JSONDecodeError:
            settings[key] = value
    return name, settings


def _build(spec: str, kb, model: Path, cache_dir: str):
    from spacy_genbioel.retrieval.registry import get_retriever

    name, settings = parse_row(spec)
    if name == "rescnn":
        settings = {"model": str(model), "index_dir": cache_dir, **settings}
    return get_retriever(name, kb, **settings)


def measure(spec: str, kb, mentions, model: Path, cache_dir: str) -> Dict[str, Any]:
    """Build the linker ``spec`` on ``kb``, link ``mentions``; recall, speed and memory."""
    from spacy_genbioel.evaluation.recall import recall_at_k
    from spacy_genbioel.ty import mention_text

    rss, wall, cpu = _rss_mb(), time.monotonic(), time.process_time()
    linker = _build(spec, kb, model, cache_dir)
    name = parse_row(spec)[0]
    row: Dict[str, Any] = {
        "linker": spec,
        "build_s": round(time.monotonic() - wall, 2),
        "build_cpu_s": round(time.process_time() - cpu, 2),
        "build_rss_mb": round(_rss_mb() - rss, 1),
    }
    if name == "rescnn":
        row["index_mb"] = round(linker.index_bytes / 2**20, 1)
        row["trainable_parameters"] = linker.encoder.model.n_trainable
    elif name == "dense":
        row["index_mb"], row["from_cache"] = round(linker.name_vectors.numel() * 4 / 2**20, 1), linker.from_cache
        row["parameters"] = sum(p.numel() for p in linker.encoder.model.parameters())
    wall, cpu = time.monotonic(), time.process_time()
    predictions = linker.link(mentions, top_k=20)
    seconds, cpu_seconds = time.monotonic() - wall, time.process_time() - cpu
    result = recall_at_k(mentions, predictions, ks=(1, 5, 20), kb=kb)
    row.update({f"recall@{k}": round(v, 4) for k, v in result.recall.items()})
    row.update(
        {
            "mentions": len(mentions),
            "link_s": round(seconds, 2),
            "mentions_per_s": round(len(mentions) / seconds, 1),
            "mentions_per_cpu_s": round(len(mentions) / max(cpu_seconds, 1e-9), 1),
        }
    )
    if name in ("dense", "rescnn"):  # the encoder's share: the mentions encoded once more, alone
        texts = [kb.normalize(mention_text(m)) for m in mentions]
        cpu = time.process_time()
        linker.encoder.encode(texts, batch_size=linker.batch_size, progress=False)
        row["encode_cpu_s"] = round(time.process_time() - cpu, 2)
    print(json.dumps({"kb": kb.name, **row}), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="train-rescnn's model directory")
    parser.add_argument("--kb", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True, help="gold mentions (dev split)")
    parser.add_argument("--format", default="pubtator", help="pubtator | askapatient")
    parser.add_argument("--train", type=Path, default=None, help="training split: adds the KB + training mentions cell")
    parser.add_argument("--crosswalk", type=Path, default=None)
    parser.add_argument(
        "--abbreviations",
        action="store_true",
        help="expand short forms first (scispacy), as `evaluate --abbreviations`",
    )
    parser.add_argument(
        "--linkers",
        default="tfidf,dense,rescnn,rescnn/sparse_weight=0",
        help="rows, comma-separated; a row's settings follow its name: rescnn/sparse_weight=0/index=faiss",
    )
    parser.add_argument(
        "--train-linkers", default=None, help="linkers of the KB + training mentions cell (default: --linkers)"
    )
    parser.add_argument(
        "--index-only", type=Path, action="append", default=[], help="a further KB: ResCNN index build only"
    )
    parser.add_argument(
        "--index-rows",
        default="rescnn",
        help="the ResCNN rows each --index-only KB is built with: rescnn,rescnn/encoder_dtype=int8",
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from spacy_genbioel.corpus.load import load_corpus
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.kb.build import augment_kb

    mentions, texts = load_corpus(args.corpus, args.format, args.crosswalk)
    if args.abbreviations:
        from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander

        mentions = AbbreviationExpander().expand(mentions, texts)[0]
    kbs = [KnowledgeBase.load(args.kb)]
    if args.train is not None:
        train = load_corpus(args.train, args.format, args.crosswalk)[0]
        augmented = augment_kb(kbs[0], augment_mentions=train)[0]
        augmented.name = f"{kbs[0].name}+train"
        kbs.append(augmented)
    report: Dict[str, Any] = {
        "corpus": str(args.corpus),
        "model": str(args.model),
        "abbreviations": args.abbreviations,
        "python": sys.version.split()[0],
        "machine": platform.processor() or platform.machine(),
        "torch_threads": torch.get_num_threads(),
        "cells": [],
    }
    with tempfile.TemporaryDirectory() as cache_dir:
        for kb, names in zip(kbs, [args.linkers, args.train_linkers or args.linkers]):
            rows: List[Dict[str, Any]] = [
                measure(name, kb, mentions, args.model, cache_dir) for name in names.split(",")
            ]
            report["cells"].append({"kb": kb.name, "kb_names": len(kb.names), "rows": rows})
        for path in args.index_only:
            kb = KnowledgeBase.load(path)
            for spec in args.index_rows.split(","):
                rss, wall, cpu = _rss_mb(), time.monotonic(), time.process_time()
                linker = _build(spec, kb, args.model, cache_dir)
                row = {
                    "kb": str(path),
                    "linker": spec,
                    "kb_names": len(kb.names),
                    "build_s": round(time.monotonic() - wall, 1),
                    "build_cpu_s": round(time.process_time() - cpu, 1),
                    "build_rss_mb": round(_rss_mb() - rss, 1),
                    "index_mb": round(linker.index_bytes / 2**20, 1),
                }
                del linker
                print(json.dumps(row), flush=True)
                report.setdefault("index_only", []).append(row)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf8")


if __name__ == "__main__":
    main()
