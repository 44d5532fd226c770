"""Documents/s of ``annotate`` with the local engine and with 1 and 2 local Ray
workers, side by side on the same abstracts, and what that means for PubMed.

    python bench/annotate_scale.py --pipeline /tmp/demo_pipe --json metrics/annotate_scale.json
    python bench/annotate_scale.py --pipeline packages/ncbi_tiny --docs 1000 --runs local,local-1t,ray-1,ray-2
    python bench/annotate_scale.py --project metrics/annotate_scale.json --gpu-mentions-per-s 489.4

Input: the first ``--docs`` abstracts of BC5CDR train then dev (1,000 = both
splits whole) from ``$GENBIOEL_DATA`` or ``../shared/data``, written once as
one JSONL file (title + abstract), so every run reads the same documents. Each
run annotates them into a fresh folder, one after the other in this process:

* ``local``: the local engine, one process, torch's default thread count;
* ``local-1t``: the same on one torch thread (what one Ray CPU worker gets);
* ``ray-N``: ``--engine ray --n-process N`` on a local Ray started for the run
  (N CPUs, one torch thread per worker).

``documents_per_s`` is the summary's (from the pipeline loaded, or every Ray
worker ready, to the last chunk committed); ``wall_s`` is the whole call,
start-up included (Ray's own start and each worker's pipeline load are in
``start_s``). Chunk files of the ``ray-N`` runs are compared byte for byte
with ``local-1t``'s. The projection divides PubMed's mentions (36M abstracts
x ``--mentions-per-abstract``) by N workers at one worker's measured
mentions/s (``ray-1``'s), assuming linear scaling and that linking is the
cost; the GPU line uses ``--gpu-mentions-per-s`` (docs/benchmarks.md's H100
decoder-only figure: the linker alone, without NER or the driver).
``--project REPORT.json`` redoes only the projection of a report.

On a shared machine the figures move with the other load: the JSON records
the load average before and after each run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict

PUBMED_ABSTRACTS = 36_000_000


def data_dir(given: str = "") -> Path:
    path = Path(given or os.environ.get("GENBIOEL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    if not (path / "bc5cdr").is_dir():
        raise SystemExit(f"no bc5cdr/ under {path}: give --data or set GENBIOEL_DATA")
    return path


def write_abstracts(data: Path, n: int, target: Path) -> int:
    """The first ``n`` BC5CDR train + dev abstracts as JSONL (the documents of
    ``benchmark --pipeline``, read by the same function); how many there were."""
    from spacy_genbioel.workflows.benchmark_annotate import benchmark_documents

    documents, _ = benchmark_documents(data, n)
    lines = [json.dumps({"id": doc.pmid, "title": doc.title, "abstract": doc.abstract}) for doc in documents]
    target.write_text("\n".join(lines) + "\n", encoding="utf8")
    return len(lines)


def one_run(name: str, docs: Path, pipeline: Path, out: Path, chunk_size: int, batch_size: int) -> Dict[str, Any]:
    import torch

    from spacy_genbioel.annotate import annotate

    options: Dict[str, Any] = dict(chunk_size=chunk_size, batch_size=batch_size, progress=False)
    threads = torch.get_num_threads()
    if name.startswith("ray-"):
        options.update(engine="ray", n_process=int(name.split("-")[1]))
    elif name == "local-1t":
        torch.set_num_threads(1)
    elif name != "local":
        raise SystemExit(f"unknown run {name!r}: use local, local-1t or ray-N")
    load_before = os.getloadavg()
    began = time.monotonic()
    try:
        summary = annotate([docs], pipeline, out, options, {"device": "cpu"})
    finally:
        torch.set_num_threads(threads)
    wall = time.monotonic() - began
    run = summary["this_run"]
    return {
        "run": name,
        "engine": run.get("engine", "local"),
        "workers": run.get("workers", 1),
        "torch_threads": 1 if name != "local" else threads,
        "documents": run["documents_annotated"],
        "mentions": run["mentions"],
        "documents_per_s": run["documents_per_s"],
        "mentions_per_s": run["mentions_per_s"],
        "seconds": run["seconds"],
        "start_s": run.get("start_seconds"),
        # Ray: the workers' own time on the units; documents / worker_s is the rate of one worker while it works
        "worker_s": run.get("worker_seconds"),
        "documents_per_worker_s": round(run["documents_annotated"] / run["worker_seconds"], 2)
        if run.get("worker_seconds")
        else None,
        "wall_s": round(wall, 2),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def chunks(out: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("part-*"))}


def projection(run: Dict[str, Any], gpu_mentions_s: float, mentions_per_abstract: float) -> Dict[str, Any]:
    """Hours for PubMed's abstracts with N workers at linear scaling, from one worker's run: its
    mentions/s (linking is most of the time), times PubMed's mentions per abstract."""
    mentions = PUBMED_ABSTRACTS * mentions_per_abstract
    cpu_mentions_s = run["mentions"] / run["seconds"]
    cpu = {str(n): round(mentions / (n * cpu_mentions_s) / 3600, 1) for n in (1, 16, 64, 256, 1024)}
    gpu = {str(n): round(mentions / (n * gpu_mentions_s) / 3600, 1) for n in (1, 8, 32, 64)}
    return {
        "abstracts": PUBMED_ABSTRACTS,
        "mentions_per_abstract": mentions_per_abstract,
        "cpu_worker_run": run["run"],
        "cpu_worker_docs_per_s": run["documents_per_s"],
        "cpu_worker_mentions_per_s": round(cpu_mentions_s, 2),
        "cpu_mentions_per_doc_here": round(run["mentions"] / max(run["documents"], 1), 2),
        "cpu_hours_by_workers": cpu,
        "gpu_decoder_only_mentions_per_s": gpu_mentions_s,
        "gpu_hours_by_workers_decoder_only": gpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pipeline", type=Path, help="a spaCy pipeline with NER and genbioel (needed but with --project)"
    )
    parser.add_argument("--data", default="", help="the shared data folder (default: $GENBIOEL_DATA or ../shared/data)")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--runs", default="local,local-1t,ray-1,ray-2")
    parser.add_argument("--chunk-size", type=int, default=50, help="documents per chunk, the Ray engine's unit")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--gpu-mentions-per-s", type=float, default=839.3, help="docs/benchmarks.md, H100, batched, decoder only"
    )
    parser.add_argument(
        "--mentions-per-abstract", type=float, default=10.0, help="PubMed: about 360M mentions in 36M abstracts"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--keep", type=Path, default=None, help="keep the inputs and output folders here")
    parser.add_argument(
        "--project", type=Path, default=None, help="only redo the projection of this report (to --json if given)"
    )
    args = parser.parse_args()
    if args.project is not None:
        report = json.loads(args.project.read_text(encoding="utf8"))
        one = next(r for r in report["runs"] if r["run"] == "ray-1")
        report["pubmed_projection"] = projection(one, args.gpu_mentions_per_s, args.mentions_per_abstract)
        print(json.dumps(report["pubmed_projection"], indent=2))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf8")
        return
    if args.pipeline is None:
        parser.error("--pipeline is needed")

    work = args.keep or Path(tempfile.mkdtemp(prefix="annotate_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        docs = work / "abstracts.jsonl"
        n = write_abstracts(data_dir(args.data), args.docs, docs)
        runs = []
        for name in args.runs.split(","):
            out = work / name
            shutil.rmtree(out, ignore_errors=True)
            runs.append(one_run(name, docs, args.pipeline, out, args.chunk_size, args.batch_size))
            print(json.dumps(runs[-1]), flush=True)
        names = [r["run"] for r in runs]
        if "local-1t" in names:
            reference = chunks(work / "local-1t")
            for run in runs:
                if run["engine"] == "ray":
                    run["chunks_identical_to_local_1t"] = chunks(work / run["run"]) == reference
        one = next((r for r in runs if r["run"] == "ray-1"), None)
        report = {
            "command": "python bench/annotate_scale.py " + " ".join(sys.argv[1:]),
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "note": "shared CPU: other jobs ran at the same time (see the load averages)",
            },
            "pipeline": str(args.pipeline),
            "documents": n,
            "chunk_size": args.chunk_size,
            "batch_size": args.batch_size,
            "runs": runs,
        }
        if one is not None and one["seconds"]:
            report["pubmed_projection"] = projection(one, args.gpu_mentions_per_s, args.mentions_per_abstract)
        text = json.dumps(report, indent=2)
        print(text)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(text + "\n", encoding="utf8")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
