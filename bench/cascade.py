"""The generator alone, today's fusion, the fusion over forced scores and the cascade, side by side.

One process, one thread (``torch.set_num_threads(1)`` unless ``--threads``), the same mentions
for every row: recall@1 / recall@5 (a candidate hits when any of its IDs is gold, ``evaluate``'s
rule), mentions/s of the component's linking (retrievers fitted and indexes loaded before the
clock starts; wall and process CPU time), and the share of mentions per path (``retrieval``, ``forced``, ``beam``)::

    python bench/cascade.py --pipeline training/ncbi/tiny/crossfit/models/fold-0/pipeline_plain \\
        --corpus ../shared/data/ncbi_disease/NCBIdevelopset_corpus.txt \\
        --fusion training/ncbi/tiny/crossfit/fusion_plain.json \\
        --cascade training/ncbi/tiny/crossfit/cascade_plain.json \\
        --out metrics/cascade_ncbi_plain.json

Rows: ``generator`` (beam search, no fusion), ``fusion`` (beam search, then the fusion fitted on
beam lists: today's default), ``forced_fusion`` (every mention: forced scores of the retrieved
names, the cascade's fusion; nothing settled, no beam), ``cascade`` (its default: settle, forced),
``cascade_weak_beam`` (beam search also where retrieval looks weak), ``retrieval_only`` (every
mention settled by retrieval: the cascade's floor, what the retrievers and the fusion cost without the
generator), ``forced_alone`` (the generator's forced ranking of the names TF-IDF and MiniLM retrieve, no fusion)
and ``cascade_int8`` (the generator's linear layers in int8); each row also reports recall@1 on the mentions it
hands to the generator (``deferred``) and, per mention, the gold concept's rank and the path (``per_mention``);
``--pipeline-row NAME=DIR`` adds a row measured
on another pipeline as it links (the retrieval-only pipeline of ``package --kb KB``, say); ``--variant rescnn=F,C`` adds
those rows with other fusion files as ``fusion_rescnn``, ... (``--variant b2=F,C,2``: at 2 beams, for files fitted on
2-beam lists); ``<row>_grouped`` (generator, fusion, cascade, cascade_weak_beam): the row with a decoder batch per
prompt length (``decoding.mixed_prompts = false``), as before mixed prompt batches. ``--abstracts 1000`` also annotates
that many abstracts through ``nlp.pipe`` (the pipeline's NER included) with today's fusion and the cascade.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections import Counter
from datetime import date
from pathlib import Path

import spacy
import torch

from spacy_genbioel.corpus.load import load_corpus
from spacy_genbioel.evaluation.recall import gold_id_set, hit_rank
from spacy_genbioel.linking.settings import load_overrides, nested_overrides


def rows(fusion: str, cascade: str, label: str = "", beams: int = 0):
    """The rows of one fusion file and one cascade file; ``label``: a variant (``--variant``), whose rows
    are named ``<row>_<label>`` and leave out the generator alone; ``beams``: the generator's beam width
    under the fusion (``reranker.generator_beams``; 0: the pipeline's), for files fitted on lists of that width."""
    off = {"reranker.fusion": None, "reranker.cascade": "off"}
    table = {
        "generator": off,
        "fusion": {"reranker.fusion": fusion, "reranker.cascade": "off"},
        "forced_fusion": {
            "reranker.fusion": cascade,
            "reranker.cascade": "on",
            "reranker.settle_threshold": 2.0,
            "reranker.beam": "never",
        },
        "cascade": {"reranker.fusion": cascade, "reranker.cascade": "on", "reranker.beam": "never"},
        # the generator's forced ranking of the names TF-IDF and MiniLM retrieve, no fusion: what the
        # cascade asks it, alone
        "forced_alone": {
            **off,
            "decoding.search": "forced",
            "candidates.retriever": "tfidf+dense",
            "candidates.num_candidates": 5,
            "decoding.exact_match": False,
        },
        "cascade_weak_beam": {"reranker.fusion": cascade, "reranker.cascade": "on", "reranker.beam": "weak"},
        # the floor of the cascade's cost: every mention settled by the first retrievers' fusion, the generator
        # (and any deferred retriever) never run: what retrieval and the fusion cost on their own
        "retrieval_only": {
            "reranker.fusion": cascade,
            "reranker.cascade": "on",
            "reranker.beam": "never",
            "reranker.settle_threshold": 0.0,
            "reranker.early_threshold": 0.0,
        },
        # the cascade with the generator's linear layers in int8 (dynamic quantization, CPU)
        "cascade_int8": {
            "reranker.fusion": cascade,
            "reranker.cascade": "on",
            "reranker.beam": "never",
            "dtype": "int8",
        },
    }
    # the same with one decoder batch per prompt length (before mixed prompt batches, linking/decoding/prompt_batch.py)
    table.update(
        {
            f"{name}_grouped": {**table[name], "decoding.mixed_prompts": False}
            for name in ("generator", "fusion", "cascade", "cascade_weak_beam")
        }
    )
    if beams:
        table = {name: {**settings, "reranker.generator_beams": beams} for name, settings in table.items()}
    if not label:
        return table
    return {f"{name}_{label}": settings for name, settings in table.items() if not name.startswith("generator")}


def variant(text: str):
    """``LABEL=FUSION,CASCADE[,BEAMS]`` -> ``(label, fusion, cascade, beams)`` (beams 0: the pipeline's)."""
    label, sep, files = text.partition("=")
    fusion, comma, rest = files.partition(",")
    cascade, _, beams = rest.partition(",")
    if not (sep and comma and label and fusion and cascade) or (beams and not beams.isdigit()):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected LABEL=FUSION.json,CASCADE.json[,BEAMS]")
    return label, fusion, cascade, int(beams or 0)


def pipeline_row(text: str):
    """``NAME=DIR`` -> ``(name, Path(DIR))``: a row measured on another pipeline, as it links."""
    name, sep, folder = text.partition("=")
    if not (sep and name and folder):
        raise argparse.ArgumentTypeError(f"--pipeline-row {text!r}: expected NAME=PIPELINE_DIR")
    return name, Path(folder)


def measure(pipeline: Path, settings: dict, mentions, repeats: int) -> dict:
    nlp = spacy.load(pipeline, config={"components": {"genbioel": load_overrides(nested_overrides(settings))}})
    component = nlp.get_pipe("genbioel")
    component.link(mentions[:8])  # load the model, fit the retrievers, read the indexes
    component.stats.clear()
    best = cpu = float("inf")
    for _ in range(repeats):
        component.stats.clear()
        start, start_cpu = time.perf_counter(), time.process_time()
        results, paths = component.link_paths(mentions)
        best, cpu = min(best, time.perf_counter() - start), min(cpu, time.process_time() - start_cpu)
    hits = [hit_rank(gold_id_set(m), found[:5]) for m, found in zip(mentions, results)]
    n = len(mentions)
    shares = Counter(paths)
    # the mentions this row hands to the generator (neither settled early nor by retrieval)
    deferred = [h for h, p in zip(hits, paths) if p not in ("early", "retrieval")]
    return {
        "recall@1": round(sum(h == 1 for h in hits) / n, 4),
        "recall@5": round(sum(h is not None for h in hits) / n, 4),
        "seconds": round(best, 3),
        "mentions_per_second": round(n / best, 2),
        "cpu_seconds": round(cpu, 3),
        "mentions_per_cpu_second": round(n / cpu, 2),
        "paths": {p: round(c / n, 4) for p, c in sorted(shares.items())},
        "deferred": {
            "mentions": len(deferred),
            "recall@1": round(sum(h == 1 for h in deferred) / len(deferred), 4) if deferred else None,
        },
        # per mention, for recall on another row's deferred mentions: rank of the gold concept (0: not in
        # the top 5), the path and the first concept linked (error classes)
        "per_mention": {
            "rank": [h or 0 for h in hits],
            "path": list(paths),
            "top": [sorted(found[0].ids)[0] if found else None for found in results],
        },
    }


def annotate_rows(pipeline: Path, table: dict, names, texts) -> dict:
    """Documents/s and mentions/s through ``nlp.pipe`` (the NER included) per row, on ``texts``."""
    from spacy_genbioel.workflows.benchmark_annotate import time_pipes

    out = {}
    for name in names:
        nlp = spacy.load(pipeline, config={"components": {"genbioel": load_overrides(nested_overrides(table[name]))}})
        time_pipes(nlp, texts[:4])  # load and fit before the clock
        nlp.get_pipe("genbioel").stats.clear()
        docs, seconds = time_pipes(nlp, texts)
        total = sum(seconds.values())
        n_mentions = sum(len(doc.ents) for doc in docs)
        paths = nlp.get_pipe("genbioel").stats
        out[name] = {
            "documents_per_second": round(len(docs) / total, 2),
            "mentions_per_second": round(n_mentions / total, 2),
            "mentions": n_mentions,
            "genbioel_seconds": round(seconds["genbioel"], 2),
            "paths": {p: round(c / max(n_mentions, 1), 4) for p, c in sorted(paths.items())},
        }
        print("annotate", name, json.dumps(out[name]), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True, help="gold mentions: the dev split")
    parser.add_argument(
        "--format", default="pubtator", help="the corpus format (pubtator, askapatient, ...: load_corpus's)"
    )
    parser.add_argument("--fusion", required=True, help="fusion fitted on beam lists (today's)")
    parser.add_argument("--cascade", required=True, help="fusion fitted on forced lists with --cascade")
    parser.add_argument(
        "--variant",
        type=variant,
        action="append",
        default=[],
        help="LABEL=FUSION,CASCADE[,BEAMS]: the same rows with other fusion files (other retrievers, "
        "lists of another beam width), named <row>_LABEL",
    )
    parser.add_argument(
        "--pipeline-row",
        type=pipeline_row,
        action="append",
        default=[],
        help="NAME=DIR: a row measured on another pipeline as it links (`package --kb KB` without --model: "
        "the retrieval-only pipeline)",
    )
    parser.add_argument("--crosswalk", type=Path, default=None)
    parser.add_argument("--no-abbreviations", action="store_true")
    parser.add_argument("--limit", type=int, default=0, help="first N mentions (0: all)")
    parser.add_argument("--rows", default="", help="comma-separated rows (default: all)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--abstracts",
        type=int,
        default=0,
        help="also annotate this many abstracts (BC5CDR train then dev) through nlp.pipe, per --annotate-rows",
    )
    parser.add_argument("--annotate-rows", default="fusion,cascade")
    parser.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    mentions, texts = load_corpus(args.corpus, args.format, args.crosswalk)
    if not args.no_abbreviations:
        from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander

        mentions, _ = AbbreviationExpander().expand(mentions, texts)
    if args.limit:
        mentions = mentions[: args.limit]
    table = rows(args.fusion, args.cascade)
    for label, fusion, cascade, beams in args.variant:
        table.update(rows(fusion, cascade, label, beams))
    others = dict(args.pipeline_row)
    chosen = [r for r in args.rows.split(",") if r] or [*table, *others]
    report = {
        "machine": f"{platform.processor() or platform.machine()}, {args.threads} thread(s)",
        "date": str(date.today()),
        "pipeline": str(args.pipeline),
        "corpus": str(args.corpus),
        "mentions": len(mentions),
        # what each per-mention list indexes: the mention as linked (short forms expanded) and its gold IDs
        "mention_text": [m.text for m in mentions],
        "mention_gold": [sorted(gold_id_set(m)) for m in mentions],
        "rows": {},
    }
    for name in chosen:
        report["rows"][name] = (
            measure(others[name], {}, mentions, args.repeats)
            if name in others
            else measure(args.pipeline, table[name], mentions, args.repeats)
        )
        print(name, json.dumps(report["rows"][name]), flush=True)
    base = report["rows"].get("fusion")
    if base:
        for row in report["rows"].values():
            row["speedup_vs_fusion"] = round(row["mentions_per_second"] / base["mentions_per_second"], 2)
            row["cpu_speedup_vs_fusion"] = round(row["mentions_per_cpu_second"] / base["mentions_per_cpu_second"], 2)
    gen = report["rows"].get("generator")
    if gen:
        for row in report["rows"].values():
            row["speedup_vs_generator"] = round(row["mentions_per_second"] / gen["mentions_per_second"], 2)
            row["cpu_speedup_vs_generator"] = round(row["mentions_per_cpu_second"] / gen["mentions_per_cpu_second"], 2)
    if args.abstracts:
        from spacy_genbioel.workflows.benchmark_annotate import benchmark_documents

        documents, source = benchmark_documents(args.data_dir, args.abstracts)
        texts = [f"{d.title} {d.abstract}".strip() for d in documents]
        report["annotate"] = {
            "abstracts": len(texts),
            "source": source,
            "rows": annotate_rows(args.pipeline, table, [r for r in args.annotate_rows.split(",") if r], texts),
        }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf8")


if __name__ == "__main__":
    main()
