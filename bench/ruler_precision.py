"""Span precision, recall and F1 of the dictionary NER that ``package`` adds, today's rules against
the new ones, and what each costs ``spacy.load`` (docs/ner.md, "The dictionary NER that
``package`` adds").

    python bench/ruler_precision.py --json metrics/ruler_precision.json
    python bench/ruler_precision.py --split train      # what the rules were chosen on

For NCBI-disease (MEDIC 2012, label ``Disease``) and BC5CDR (CTD 2017 diseases + MeSH descriptors
and supplementary records, label: the concept's first type), the KBs built with the package's own
readers (as ``build-kb`` builds them; from ``--data``, ``$GENBIOEL_DATA`` or ``../shared/data``),
each ruler below is added to a blank English pipeline and scored on the split's documents
(title + abstract): exact character spans against the gold mentions, labels collapsed, micro
precision / recall / F1 over all documents.

* ``entity_ruler, old names``: spaCy's ``entity_ruler`` (``phrase_matcher_attr = "LOWER"``) over
  every name of at least 3 characters: ``package`` before this change. NCBI only, unless
  ``--spacy-ruler-bc5cdr`` (BC5CDR's 788k names take minutes and gigabytes that way).
* ``kb_entity_ruler, old names``: the same names, all case-insensitive, in the package's
  ``kb_entity_ruler`` (the spans must be the same as the row above: ``same_spans_as`` says so).
* ``kb_entity_ruler, new rules``: ``add_kb_entity_ruler``'s defaults (what ``package`` adds now).
* ``--ner DIR`` adds a trained spaCy NER pipeline as a row (``spacy.load``; its own tokenizer).

For each ruler: the patterns, the seconds and RSS growth of building it, and of a saved blank + ruler
pipeline the size on disk and, in a fresh process (after ``import spacy_genbioel.ner``), the seconds
and RSS growth of ``spacy.load`` (the fastest of 3; a blank English pipeline's is given for comparison:
what the ruler adds is the difference). The most frequent false-positive texts are listed per ruler.
``--abbreviation-detector`` puts scispacy's detector before each ruler, as ``package`` does: spaCy's
``entity_ruler`` then runs it over every name when the pipeline is built and when it is loaded.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: corpus -> (dev file, train file) under the data folder
SPLITS = {
    "ncbi": ("ncbi_disease/NCBIdevelopset_corpus.txt", "ncbi_disease/NCBItrainset_corpus.txt"),
    "bc5cdr": ("bc5cdr/CDR_DevelopmentSet.PubTator.txt", "bc5cdr/CDR_TrainingSet.PubTator.txt"),
}
#: the label package gives the ruler's spans (project.yml's entity_label; "": the concept's type)
LABELS = {"ncbi": "Disease", "bc5cdr": None}


def data_dir(given: str = "") -> Path:
    path = Path(given or os.environ.get("GENBIOEL_DATA", "") or ROOT.parent / "shared" / "data")
    if not (path / "vocab").is_dir():
        raise SystemExit(f"no vocab/ under {path}: give --data or set GENBIOEL_DATA")
    return path


def rss_mb() -> float:
    """RSS after a collection, with the freed heap handed back to the system (glibc), so that
    what an earlier row freed does not hide what the next one takes."""
    import ctypes
    import ctypes.util

    import psutil

    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc and hasattr(ctypes.CDLL(libc), "malloc_trim"):
        ctypes.CDLL(libc).malloc_trim(0)
    return psutil.Process().memory_info().rss / 2**20


def build_kb(corpus: str, data: Path):
    """The KB ``build-kb`` builds for the corpus (project.yml's kb_sources; no priors: they do not name anything)."""
    from spacy_genbioel.kb.build import build_kb as build

    vocab = data / "vocab"
    if corpus == "ncbi":
        return build("medic", vocab / "medic_06Jul2012.txt", progress=False)
    mesh = vocab / "mesh"
    return build(
        "ctd",
        [
            vocab / "CTD_diseases_2017.tsv.gz",
            ("mesh-tsv", mesh / "mesh_id_label_mappings.tsv"),
            ("mesh-tsv", mesh / "mesh_supp_id_label_mappings.tsv"),
        ],
        progress=False,
    )


def old_patterns(kb, label: Optional[str], min_chars: int = 3) -> List[Dict[str, Any]]:
    """``add_kb_entity_ruler``'s patterns before this change: every name of ``min_chars`` or more, case-insensitive."""
    patterns, seen = [], set()
    for concept in kb:
        tag = label or (concept.types[0] if concept.types else "ENTITY")
        for name in concept.names:
            key = (tag, name.lower())
            if len(name) >= min_chars and key not in seen:
                seen.add(key)
                patterns.append({"label": tag, "pattern": name})
    return patterns


def spacy_ruler(nlp, kb, label):
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    ruler.add_patterns(old_patterns(kb, label))
    return len(ruler)


def kb_ruler_old_names(nlp, kb, label):
    from spacy_genbioel.ner.kb_ruler import FACTORY

    return nlp.add_pipe(FACTORY, name="entity_ruler").add_patterns(old_patterns(kb, label))


def kb_ruler_new_rules(nlp, kb, label, **rules):
    from spacy_genbioel.ner.pipes import RulerRules, add_kb_entity_ruler

    return add_kb_entity_ruler(nlp, kb, label, rules=RulerRules(**rules))


def kb_ruler_new_rules_any_case(nlp, kb, label):
    """The new rules' names, all matched case-insensitively (what case sensitivity buys)."""
    from spacy_genbioel.ner.kb_ruler import FACTORY
    from spacy_genbioel.ner.pipes import ruler_patterns

    patterns = {(p["label"], p["pattern"].lower()): {**p, "case_sensitive": False} for p in ruler_patterns(kb, label)}
    return nlp.add_pipe(FACTORY, name="entity_ruler").add_patterns(patterns.values())


#: BC5CDR's gold concepts are MeSH C (diseases), D (chemicals), F (mental disorders) or supplementary records (no type)
GOLD_TYPES = ("C", "D", "F")
#: row -> (how it is added, the corpora it runs on; None: all)
RULERS: Dict[str, Tuple[Callable, Optional[Tuple[str, ...]]]] = {
    "entity_ruler, old names": (spacy_ruler, None),
    "kb_entity_ruler, old names": (kb_ruler_old_names, None),
    "kb_entity_ruler, new rules": (kb_ruler_new_rules, None),
    # one rule off at a time (NCBI: seconds each)
    "new rules, every name case-insensitive": (kb_ruler_new_rules_any_case, ("ncbi",)),
    "new rules, no stop words": (partial(kb_ruler_new_rules, stop_words=()), ("ncbi",)),
    "new rules, gene-like names kept": (partial(kb_ruler_new_rules, gene_like=True), ("ncbi",)),
    "new rules, 2-letter abbreviations left out": (partial(kb_ruler_new_rules, min_abbreviation_chars=3), ("ncbi",)),
    f"new rules, types {'+'.join(GOLD_TYPES)}": (partial(kb_ruler_new_rules, types=GOLD_TYPES), ("bc5cdr",)),
}


def gold_spans(documents) -> List[Set[Tuple[int, int]]]:
    return [{(a.start, a.end) for a in doc.annotations} for doc in documents]


def predicted_spans(nlp, documents) -> List[Set[Tuple[int, int]]]:
    return [
        {(e.start_char, e.end_char) for e in doc.ents} for doc in nlp.pipe((d.text for d in documents), batch_size=50)
    ]


def span_scores(
    documents, gold: List[Set[Tuple[int, int]]], predicted: List[Set[Tuple[int, int]]], n_examples: int = 15
) -> Dict[str, Any]:
    tp = sum(len(g & p) for g, p in zip(gold, predicted))
    n_pred, n_gold = sum(map(len, predicted)), sum(map(len, gold))
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    false_positives = Counter(doc.text[s:e] for doc, g, p in zip(documents, gold, predicted) for s, e in p - g)
    return {
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "f1": round(f1, 4),
        "tp": tp,
        "predicted": n_pred,
        "gold": n_gold,
        "top_false_positives": false_positives.most_common(n_examples),
    }


def load_cost(pipeline: Path, repeats: int = 3) -> Dict[str, Any]:
    """``spacy.load`` of ``pipeline`` in a fresh process, ``repeats`` times: the fewest seconds and
    the RSS growth (MB) of that run (on a shared machine the other load only ever adds time), and the
    seconds of the ruler's own ``from_disk`` in that process."""
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, __file__, "--measure-load", str(pipeline)],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return min(runs, key=lambda run: run["load_s"])


def measure_load(pipeline: str) -> None:
    import spacy

    import spacy_genbioel.ner  # noqa: F401  the kb_entity_ruler factory (until setup.cfg names it as an entry point)

    before, began = rss_mb(), time.perf_counter()
    nlp = spacy.load(pipeline)
    seconds = time.perf_counter() - began
    grown = rss_mb() - before
    began = time.perf_counter()  # the ruler alone, read again into the loaded pipeline: no import or start-up costs
    nlp.get_pipe("entity_ruler").from_disk(Path(pipeline) / "entity_ruler")
    print(
        json.dumps(
            {
                "load_s": round(seconds, 2),
                "load_rss_mb": round(grown, 1),
                "ruler_from_disk_s": round(time.perf_counter() - began, 3),
                "pipes": nlp.pipe_names,
            }
        )
    )


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def run_ruler(
    name: str, add: Callable, kb, label, documents, gold, tmp: Path, abbreviations: bool = False
) -> Tuple[Dict[str, Any], List[Set]]:
    import spacy

    nlp = spacy.blank("en")
    if abbreviations:
        nlp.add_pipe("abbreviation_detector")  # scispacy's, before the ruler, as package adds it
    before, began = rss_mb(), time.perf_counter()
    n_patterns = add(nlp, kb, label)
    row: Dict[str, Any] = {
        "ruler": name,
        "patterns": n_patterns,
        "build_s": round(time.perf_counter() - began, 1),
        "build_rss_mb": round(rss_mb() - before, 1),
    }
    began = time.perf_counter()
    predicted = predicted_spans(nlp, documents)
    row["annotate_s"] = round(time.perf_counter() - began, 2)
    row.update(span_scores(documents, gold, predicted))
    saved = tmp / name.replace(", ", "_").replace(" ", "_")
    nlp.to_disk(saved)
    row["disk_mb"] = round(dir_mb(saved), 1)
    del nlp
    gc.collect()
    row.update(load_cost(saved))
    return row, predicted


def run_ner(path: str, documents, gold) -> Dict[str, Any]:
    import spacy

    began = time.perf_counter()
    nlp = spacy.load(path)
    row: Dict[str, Any] = {"ruler": f"trained NER {path}", "load_s": round(time.perf_counter() - began, 2)}
    row.update(span_scores(documents, gold, predicted_spans(nlp, documents)))
    return row


def main(argv: Optional[Iterable[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="", help="the shared data folder (default: $GENBIOEL_DATA or ../shared/data)")
    parser.add_argument("--corpus", action="append", choices=sorted(SPLITS), help="corpora to score (default: both)")
    parser.add_argument("--split", choices=("dev", "train"), default="dev")
    parser.add_argument(
        "--ner",
        action="append",
        default=[],
        metavar="CORPUS=DIR",
        help="a trained spaCy NER pipeline scored beside the rulers (ncbi=training/ncbi/ner_cnn/model-best)",
    )
    parser.add_argument(
        "--spacy-ruler-bc5cdr", action="store_true", help="spaCy's entity_ruler on BC5CDR too (slow, GBs)"
    )
    parser.add_argument(
        "--abbreviation-detector",
        action="store_true",
        help="scispacy's abbreviation detector before each ruler, as package builds pipelines",
    )
    parser.add_argument("--only", action="append", help="only these rows (by name; default: all)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--measure-load", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_load:
        measure_load(args.measure_load)
        return {}
    from spacy_genbioel.corpus.pubtator import read_pubtator

    data = data_dir(args.data)
    ners = dict(spec.split("=", 1) for spec in args.ner)
    results: Dict[str, Any] = {
        "split": args.split,
        "abbreviation_detector": args.abbreviation_detector,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "machine": f"{cpu_model()}, {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "corpora": {},
    }
    with tempfile.TemporaryDirectory(prefix="ruler_precision_") as tmp:
        import spacy

        blank = spacy.blank("en")
        blank.add_pipe("entity_ruler")  # empty: the from_disk that measure_load times
        blank.to_disk(Path(tmp) / "blank")
        results["blank_pipeline"] = load_cost(
            Path(tmp) / "blank"
        )  # what any spacy.load of a blank English pipeline costs
        for corpus in args.corpus or sorted(SPLITS, reverse=True):
            documents = list(read_pubtator(data / SPLITS[corpus][args.split == "train"]))
            gold = gold_spans(documents)
            began = time.perf_counter()
            kb = build_kb(corpus, data)
            entry: Dict[str, Any] = {
                "documents": len(documents),
                "gold_spans": sum(map(len, gold)),
                "concepts": len(kb),
                "names": sum(len(c.names) for c in kb),
                "kb_s": round(time.perf_counter() - began, 1),
                "rows": [],
            }
            spans: Dict[str, List[Set]] = {}
            for name, (add, corpora) in RULERS.items():
                if (
                    (args.only and name not in args.only)
                    or (corpora and corpus not in corpora)
                    or (add is spacy_ruler and corpus == "bc5cdr" and not args.spacy_ruler_bc5cdr)
                ):
                    continue
                row, spans[name] = run_ruler(
                    name, add, kb, LABELS[corpus], documents, gold, Path(tmp), args.abbreviation_detector
                )
                if name == "kb_entity_ruler, old names" and "entity_ruler, old names" in spans:
                    row["same_spans_as"] = {"entity_ruler, old names": spans[name] == spans["entity_ruler, old names"]}
                entry["rows"].append(row)
                print(
                    json.dumps({"corpus": corpus, **{k: v for k, v in row.items() if k != "top_false_positives"}}),
                    flush=True,
                )
            if corpus in ners:
                entry["rows"].append(run_ner(ners[corpus], documents, gold))
            results["corpora"][corpus] = entry
            del kb
            gc.collect()
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf8")
    return results


def table(results: Dict[str, Any]) -> str:
    blank = results["blank_pipeline"]
    lines = [
        f"{results['date']}, {results['machine']}, load average {results['load_average_before']} -> "
        f"{results['load_average_after']}",
        f"split: {results['split']}; a blank English pipeline (an empty entity_ruler) "
        f"loads in {blank['load_s']} s (+{blank['load_rss_mb']} MB RSS)",
        "| corpus | ruler | patterns | P | R | F1 | "
        "build s | build RSS MB | disk MB | spacy.load s | load RSS MB | ruler from_disk s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for corpus, entry in results["corpora"].items():
        for row in entry["rows"]:
            cells = [
                row.get(k, "")
                for k in (
                    "patterns",
                    "precision",
                    "recall",
                    "f1",
                    "build_s",
                    "build_rss_mb",
                    "disk_mb",
                    "load_s",
                    "load_rss_mb",
                    "ruler_from_disk_s",
                )
            ]
            lines.append(f"| {corpus} | {row['ruler']} | " + " | ".join(str(c) for c in cells) + " |")
    for corpus, entry in results["corpora"].items():
        for row in entry["rows"]:
            fps = ", ".join(f"{text!r} {n}" for text, n in row["top_false_positives"][:10])
            lines.append(f"{corpus} / {row['ruler']}: top false positives: {fps}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
