"""The whole ``annotate`` job, as a user runs it, over thousands of abstracts:
one process, forked workers and Ray workers side by side on the same inputs,
and what that means for PubMed.

    python bench/annotate_scale.py --pipeline packages/bc5cdr_tiny_ner_cnn --docs 5000 --runs local-1t,fork-2,ray-2 \\
        --json metrics/annotate_scale.json
    python bench/annotate_scale.py --project metrics/annotate_scale.json --gpu-mentions-per-s 489.4

**Inputs.** The training and development abstracts of BC5CDR and
NCBI-disease (``$GENBIOEL_DATA`` or ``../shared/data``), each PMID once, in
that order; past the 1,692 distinct abstracts they repeat under new numeric
IDs (``--docs 5000``: each about three times). The first half is written as a
PubTator file, the second as gzipped PubMed XML (baseline style), so every run
reads both formats, as one job.

**Runs**, one after the other, each ``python -m spacy_genbioel annotate`` in a
fresh process (its import and pipeline load are in ``wall_s``), into a fresh
folder:

* ``local``: one process, torch's default threads;
* ``local-1t``: one process on one thread (``OMP_NUM_THREADS=1``): one core;
* ``fork-N``: ``--n-process N`` (forked workers, one thread each);
* ``ray-N``: ``--engine ray --n-process N`` on a local Ray started by the run;
* ``gpu``: one process on one thread with ``--device cuda``: the generator on
  the GPU, the rest of the pipeline on one core;
* ``gpufork-N``: ``--n-process N --device cuda``: N forked workers, one core
  each, their generators sharing the machine's GPUs.

GPU runs also sample ``nvidia-smi`` each second (utilization and memory used),
and their chunk files are compared with the ``gpu`` run's (a GPU's bfloat16
kernels round otherwise than a CPU's, so not with ``local-1t``'s).

Per run, from ``summary.json``: documents/s and mentions/s (from the pipeline
loaded to the last chunk committed), per core, the seconds and share of each
stage (``reading``, ``ner``, ``retrieval``, ``generator``, ``linking``,
``writing``: ``spacy_genbioel/annotate/timing.py``), the driver's peak RSS and
each worker's private and resident memory. Chunk files of the worker runs are
compared byte for byte with ``local-1t``'s.

**Projection.** PubMed's 36M abstracts over N cores at the per-core rate of
``--project-run`` (default: the first worker run, else ``local-1t``), assuming
linear scaling; the GPU line divides PubMed's mentions by
``--gpu-mentions-per-s``. ``--project REPORT.json`` redoes only that.

Measure on a quiet machine: workers sharing cores get no more CPU than one.
The JSON records the load average before and after each run.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

PUBMED_ABSTRACTS = 36_000_000
SPLITS = (
    ("bc5cdr", "CDR_TrainingSet.PubTator.txt"),
    ("bc5cdr", "CDR_DevelopmentSet.PubTator.txt"),
    ("ncbi_disease", "NCBItrainset_corpus.txt"),
    ("ncbi_disease", "NCBIdevelopset_corpus.txt"),
)
REPEAT_IDS = 90_000_000  # repeated abstracts get IDs from here up


def data_dir(given: str = "") -> Path:
    path = Path(given or os.environ.get("GENBIOEL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    if not (path / "bc5cdr").is_dir():
        raise SystemExit(f"no bc5cdr/ under {path}: give --data or set GENBIOEL_DATA")
    return path


def abstracts(data: Path, n: int) -> List[Tuple[str, str, str]]:
    """``n`` (id, title, abstract): the splits' abstracts in order, each PMID once, then again
    under new IDs until there are ``n``."""
    from spacy_genbioel.corpus import read_pubtator

    distinct: Dict[str, Tuple[str, str]] = {}
    for folder, name in SPLITS:
        path = data / folder / name
        if path.exists():
            for doc in read_pubtator(path):
                distinct.setdefault(str(doc.pmid), (doc.title, doc.abstract))
    if not distinct:
        raise SystemExit(f"no abstracts in {data} ({', '.join(f'{f}/{n}' for f, n in SPLITS)})")
    items = list(distinct.items())
    out = [(pmid, title, text) for pmid, (title, text) in items[:n]]
    while len(out) < n:
        _, (title, text) = items[len(out) % len(items)]
        out.append((str(REPEAT_IDS + len(out)), title, text))
    return out


def write_inputs(docs: List[Tuple[str, str, str]], folder: Path) -> List[Path]:
    """The first half of ``docs`` as ``abstracts.pubtator``, the rest as ``pubmed.xml.gz``."""
    folder.mkdir(parents=True, exist_ok=True)
    half = (len(docs) + 1) // 2
    pubtator = folder / "abstracts.pubtator"
    pubtator.write_text("".join(f"{i}|t|{t}\n{i}|a|{a}\n\n" for i, t, a in docs[:half]), encoding="utf8")
    paths = [pubtator]
    if docs[half:]:
        articles = "".join(
            f"<PubmedArticle><MedlineCitation><PMID>{i}</PMID><Article><ArticleTitle>{escape(t)}</ArticleTitle>"
            f"<Abstract><AbstractText>{escape(a)}</AbstractText></Abstract></Article></MedlineCitation>"
            "</PubmedArticle>\n"
            for i, t, a in docs[half:]
        )
        xml = folder / "pubmed.xml.gz"
        with gzip.open(xml, "wt", encoding="utf8") as handle:
            handle.write(f'<?xml version="1.0" encoding="utf-8"?>\n<PubmedArticleSet>\n{articles}</PubmedArticleSet>\n')
        paths.append(xml)
    return paths


def run_command(
    name: str, inputs: List[Path], pipeline: Path, out: Path, chunk: int, batch: int, extra: Sequence[str] = ()
) -> List[str]:
    """The annotate command of run ``name`` (local, local-1t, fork-N, ray-N, gpu, gpufork-N), ``extra``
    options at the end."""
    command = [sys.executable, "-m", "spacy_genbioel", "annotate", *map(str, inputs), "--pipeline", str(pipeline)]
    command += ["--out", str(out), "--chunk-size", str(chunk), "--batch-size", str(batch), "--no-progress"]
    kind, _, workers = name.partition("-")
    command += ["--device", "cuda" if kind in ("gpu", "gpufork") else "cpu"]
    if kind in ("fork", "gpufork") and workers.isdigit():
        command += ["--n-process", workers]
    elif kind == "ray" and workers.isdigit():
        command += ["--engine", "ray", "--n-process", workers]
    elif name not in ("local", "local-1t", "gpu"):
        raise SystemExit(f"unknown run {name!r}: use local, local-1t, fork-N, ray-N, gpu or gpufork-N")
    return command + list(extra)


def cores(name: str) -> int:
    kind, _, workers = name.partition("-")
    if kind in ("fork", "ray", "gpufork"):
        return int(workers)
    return 1 if name in ("local-1t", "gpu") else os.cpu_count() or 1


class GpuSampler:
    """``nvidia-smi``'s utilization and memory used, sampled each second while a run lasts."""

    def __init__(self) -> None:
        self.samples: List[Tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        query = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        while not self.stop.wait(1.0):
            try:
                line = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.splitlines()[0]
                util, used = (float(x) for x in line.split(","))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                continue
            self.samples.append((util, used))

    def __enter__(self) -> "GpuSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()

    def report(self) -> Dict[str, Any]:
        """Mean and peak utilization (%) over the samples of nonzero use, peak memory used (MiB)."""
        busy = [u for u, _ in self.samples]
        return {
            "samples": len(self.samples),
            "utilization_mean": round(sum(busy) / len(busy), 1) if busy else None,
            "utilization_max": max(busy) if busy else None,
            "memory_used_max_mib": max((m for _, m in self.samples), default=None),
        }


def one_run(
    name: str, inputs: List[Path], pipeline: Path, out: Path, chunk: int, batch: int, extra: Sequence[str] = ()
) -> Dict[str, Any]:
    env = dict(os.environ)
    if name != "local":
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    load_before = os.getloadavg()
    began = time.monotonic()
    command = run_command(name, inputs, pipeline, out, chunk, batch, extra)
    sampler = GpuSampler() if name.startswith("gpu") else None
    with sampler or contextlib.nullcontext():
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"run {name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text(encoding="utf8"))
    run = summary["this_run"]
    stages = run.get("stages", {})
    total = sum(stages.values()) or 1.0
    n_cores = cores(name)
    return {
        "run": name,
        "cores": n_cores,
        "documents": run["documents_annotated"],
        "mentions": run["mentions"],
        "documents_per_s": run["documents_per_s"],
        "documents_per_s_per_core": round(run["documents_per_s"] / n_cores, 2),
        "mentions_per_s": run["mentions_per_s"],
        "seconds": run["seconds"],
        "wall_s": round(wall, 2),  # the whole command: imports, pipeline load (Ray: its start), the job
        "start_s": round(wall - run["seconds"], 2),
        "stage_seconds": stages,
        "stage_shares": {k: round(v / total, 3) for k, v in stages.items()},
        "stage_detail": run.get("stage_seconds", {}),
        "paths": run.get("paths", {}),  # mentions by how they were linked (retrieval, forced, beam...)
        "driver_peak_rss_mb": run.get("memory", {}).get("driver", {}).get("peak_rss_mb"),
        "workers": run.get("memory", {}).get("workers", []),
        "errors": summary["errors"],
        **({"gpu": sampler.report()} if sampler is not None else {}),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def chunks(out: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("part-*"))}


def projection(run: Dict[str, Any], gpu_mentions_s: float, mentions_per_abstract: float) -> Dict[str, Any]:
    """Hours for PubMed's abstracts over N cores at ``run``'s documents/s per core (linear scaling); the
    GPU line: PubMed's mentions (``mentions_per_abstract`` each) at ``gpu_mentions_s`` per GPU."""
    per_core = run["documents"] / run["seconds"] / run.get("cores", 1)
    cpu = {str(n): round(PUBMED_ABSTRACTS / (n * per_core) / 3600, 1) for n in (1, 16, 64, 256, 1024)}
    mentions = PUBMED_ABSTRACTS * mentions_per_abstract
    gpu = {str(n): round(mentions / (n * gpu_mentions_s) / 3600, 1) for n in (1, 8, 32, 64)}
    return {
        "abstracts": PUBMED_ABSTRACTS,
        "from_run": run["run"],
        "documents_per_s_per_core": round(per_core, 2),
        "mentions_per_document_here": round(run["mentions"] / max(run["documents"], 1), 2),
        "cpu_hours_by_cores": cpu,
        "mentions_per_abstract": mentions_per_abstract,
        "gpu_mentions_per_s": gpu_mentions_s,
        "gpu_hours_by_gpus_linker_only": gpu,
    }


def table(runs: List[Dict[str, Any]]) -> str:
    head = (
        "| run | docs/s | docs/s/core | mentions/s | wall s | reading | ner | retrieval | generator | linking | writing"
        " | driver peak RSS MB | workers private / RSS MB | GPU util mean % / memory MiB |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        s = r["stage_shares"]
        workers = ", ".join(f"{w['private_mb']} / {w['rss_mb']}" for w in r["workers"]) or "-"
        shares = " | ".join(
            f"{100 * s.get(k, 0):.0f}%" for k in ("reading", "ner", "retrieval", "generator", "linking", "writing")
        )
        gpu = r.get("gpu")
        on_gpu = f"{gpu['utilization_mean']} / {gpu['memory_used_max_mib']}" if gpu else "-"
        lines.append(
            f"| {r['run']} | {r['documents_per_s']} | {r['documents_per_s_per_core']} | {r['mentions_per_s']} | "
            f"{r['wall_s']} | {shares} | {r['driver_peak_rss_mb']} | {workers} | {on_gpu} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pipeline", type=Path, help="a spaCy pipeline with NER and genbioel (needed but with --project)"
    )
    parser.add_argument("--data", default="", help="the shared data folder (default: $GENBIOEL_DATA or ../shared/data)")
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--runs", default="local-1t,fork-2,ray-2")
    parser.add_argument("--chunk-size", type=int, default=250, help="documents per chunk: a worker's unit")
    parser.add_argument("--batch-size", type=int, default=64, help="documents per nlp.pipe batch")
    parser.add_argument("--project-run", default="", help="the run the projection is made from")
    parser.add_argument(
        "--settings",
        default="",
        help='more annotate options for every run, e.g. "--dtype bf16 --reranker.retrieval_cache 0"',
    )
    parser.add_argument(
        "--inputs", type=Path, default=None, help="annotate these (a folder of PubTator / PubMed XML files) instead"
    )
    parser.add_argument("--gpu-mentions-per-s", type=float, default=839.3, help="H100, batched, linker only")
    parser.add_argument("--mentions-per-abstract", type=float, default=10.0, help="PubMed: about 360M in 36M")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    parser.add_argument("--keep", type=Path, default=None, help="keep the inputs and output folders here")
    parser.add_argument("--project", type=Path, default=None, help="only redo the projection of this report")
    args = parser.parse_args()
    if args.project is not None:
        report = json.loads(args.project.read_text(encoding="utf8"))
        one = pick(report["runs"], args.project_run)
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
        if args.inputs is not None:
            inputs = sorted(p for p in args.inputs.iterdir() if p.is_file())
        else:
            inputs = write_inputs(abstracts(data_dir(args.data), args.docs), work / "inputs")
        runs = []
        for name in args.runs.split(","):
            out = work / name
            shutil.rmtree(out, ignore_errors=True)
            runs.append(
                one_run(name, inputs, args.pipeline, out, args.chunk_size, args.batch_size, shlex.split(args.settings))
            )
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "stage_detail"}), flush=True)
        compare(runs, work)
        report = {
            "command": "python bench/annotate_scale.py " + " ".join(sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "pipeline": str(args.pipeline),
            "inputs": [str(p.name) for p in inputs],
            "settings": args.settings,
            "documents": args.docs,
            "chunk_size": args.chunk_size,
            "batch_size": args.batch_size,
            "runs": runs,
            "pubmed_projection": projection(
                pick(runs, args.project_run), args.gpu_mentions_per_s, args.mentions_per_abstract
            ),
        }
        print(table(runs))
        print(json.dumps(report["pubmed_projection"], indent=2))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf8")
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def compare(runs: List[Dict[str, Any]], work: Path) -> None:
    """Each run's speed over ``local-1t``'s, and its chunk files against ``local-1t``'s (CPU runs) or the
    ``gpu`` run's (GPU runs): byte-identical, else the share of documents whose output lines are equal."""
    by_name = {r["run"]: r for r in runs}
    base = by_name.get("local-1t")
    for run in runs:
        name = run["run"]
        if base is not None and name != "local-1t":
            run["speedup_over_local_1t"] = round(run["documents_per_s"] / base["documents_per_s"], 2)
        reference = "gpu" if name.startswith("gpu") else "local-1t"
        if reference in by_name and name != reference:
            mine, theirs = chunks(work / name), chunks(work / reference)
            run[f"chunks_identical_to_{reference.replace('-', '_')}"] = mine == theirs
            if mine != theirs:
                run[f"documents_equal_to_{reference.replace('-', '_')}"] = equal_share(mine, theirs)
        if name.startswith("gpu") and base is not None:  # bfloat16 on the GPU against the CPU's links
            run["documents_equal_to_local_1t"] = equal_share(chunks(work / name), chunks(work / "local-1t"))


def equal_share(a: Dict[str, bytes], b: Dict[str, bytes]) -> Optional[float]:
    """The share of output lines (one document each in JSONL) equal in two runs' chunk files."""
    lines_a = [line for name in sorted(a) for line in a[name].splitlines()]
    lines_b = [line for name in sorted(b) for line in b[name].splitlines()]
    if not lines_a or len(lines_a) != len(lines_b):
        return None
    return round(sum(x == y for x, y in zip(lines_a, lines_b)) / len(lines_a), 4)


def pick(runs: List[Dict[str, Any]], name: str) -> Dict[str, Any]:
    """The run the projection uses: ``name``, else the first worker run, else the first run."""
    if name:
        found: Optional[Dict[str, Any]] = next((r for r in runs if r["run"] == name), None)
        if found is None:
            raise SystemExit(f"no run {name!r} in {[r['run'] for r in runs]}")
        return found
    return next((r for r in runs if r["run"].split("-")[0] in ("fork", "ray", "gpufork")), runs[0])


if __name__ == "__main__":
    main()
