"""Annotation throughput of pipelines that differ in their NER (CNN vs transformer),
side by side in one run on the same abstracts, and where the time goes.

    python bench/ner_pipelines.py --pipeline cnn=packages/ncbi_tiny_ner_cnn \\
        --pipeline transformer=packages/ncbi_tiny_ner_transformer --docs 200 --json metrics/ner_pipelines_ncbi.json

For every pipeline, on the first ``--docs`` BC5CDR train + dev abstracts
(``bench/annotate_scale.py``'s input, from ``$GENBIOEL_DATA`` or ``../shared/data``):

* ``annotate``: documents/s and mentions/s of the ``annotate`` command (local
  engine) on one torch thread and on ``--threads`` (default 2), as users run it;
* ``components``: seconds per pipe (tokenizer, abbreviation detector, tok2vec,
  ner, genbioel) over the same documents with ``nlp.pipe``'s batching, on the
  same thread counts, so the NER's share of the time is visible next to the linker's.

The load average before and after each measurement goes into the JSON: on a
shared machine the figures move with the other load.
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
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from annotate_scale import data_dir, one_run, write_abstracts  # noqa: E402


def component_seconds(pipeline: Path, texts: List[str], threads: int, batch_size: int) -> Dict[str, Any]:
    """Seconds per pipe over ``texts`` on ``threads`` torch threads (pipeline loaded and
    warmed up outside the clock), timed as ``benchmark --pipeline`` times them."""
    import spacy
    import torch

    from spacy_genbioel.workflows.benchmark_annotate import time_pipes

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        nlp = spacy.load(pipeline)
        nlp(texts[0])  # warm-up: allocator, lazy resources
        load = os.getloadavg()
        docs, seconds = time_pipes(nlp, texts, batch_size)
        total = sum(seconds.values())
    finally:
        torch.set_num_threads(before)
    return {
        "threads": threads,
        "documents": len(docs),
        "entities": sum(len(doc.ents) for doc in docs),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "share": {k: round(v / total, 3) for k, v in seconds.items()},
        "documents_per_s": round(len(docs) / total, 2),
        "load_average_before": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pipeline", action="append", required=True, help="NAME=DIR, repeatable")
    parser.add_argument("--data", default="", help="the shared data folder (default: $GENBIOEL_DATA or ../shared/data)")
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument(
        "--threads", type=int, default=2, help="the multi-thread run's torch threads (the other has one)"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    pipelines = {}
    for spec in args.pipeline:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_dir():
            raise SystemExit(f"--pipeline {spec!r}: give NAME=DIR with an existing pipeline directory")
        pipelines[name] = Path(path)
    report: Dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "pipelines": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        docs_file = tmp_path / "abstracts.jsonl"
        n = write_abstracts(data_dir(args.data), args.docs, docs_file)
        texts = [
            f"{r['title']} {r['abstract']}" for r in map(json.loads, docs_file.read_text(encoding="utf8").splitlines())
        ]
        report["documents"] = n
        for name, path in pipelines.items():
            rows: Dict[str, Any] = {"path": str(path), "annotate": [], "components": []}
            for threads in sorted({1, args.threads}):
                run_name = "local-1t" if threads == 1 else "local"
                import torch

                torch.set_num_threads(threads)
                rows["annotate"].append(
                    one_run(run_name, docs_file, path, tmp_path / f"out-{name}-{threads}", 50, args.batch_size)
                )
                rows["components"].append(component_seconds(path, texts, threads, args.batch_size))
                print(json.dumps({"pipeline": name, "threads": threads, **rows["annotate"][-1]}), flush=True)
                print(json.dumps({"pipeline": name, **rows["components"][-1]}), flush=True)
            report["pipelines"][name] = rows
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf8")
    print("| pipeline | threads | annotate docs/s | mentions/s | tok2vec s | ner s | genbioel s | NER share |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in report["pipelines"].items():
        for run, comp in zip(rows["annotate"], rows["components"]):
            sec, share = comp["seconds"], comp["share"]
            ner_share = share.get("tok2vec", 0) + share.get("ner", 0)
            print(
                f"| {name} | {comp['threads']} | {run['documents_per_s']} | {run['mentions_per_s']} | "
                f"{sec.get('tok2vec', 0)} | {sec.get('ner', 0)} | {sec.get('genbioel', 0)} | {ner_share:.0%} |"
            )


if __name__ == "__main__":
    main()
