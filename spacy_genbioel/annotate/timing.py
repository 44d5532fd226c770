"""Where an annotation job's time and memory go: ``summary.json``'s
``this_run.stages`` and ``this_run.memory``.

Every process of a run (the driver, each worker) keeps a
:class:`~spacy_genbioel.linking.decoding.stages.StageClock`: a stage entered
inside another pauses it, so each stage's seconds are its own.

* ``reading``: the driver pulling records from the inputs (reading, parsing,
  checking, de-duplicating);
* ``tokenizer`` and each spaCy component by name (``ner``,
  ``abbreviation_detector``...): :func:`pipe_timed` runs a batch one component at
  a time, as ``nlp.pipe`` does with the batch as its batch size;
* inside a genbioel component: ``retrieval:<source>`` per retriever and the
  generator's ``tokenize``, ``encoder``, ``decoder``, ``trie`` and ``beam``;
  ``linking:<component name>`` is the rest (mentions, the fusion's ranking,
  spans written);
* ``writing``: the chunk file serialized and committed.

:func:`stage_groups` sums them into the shares a reader wants (reading, ner,
retrieval, generator, linking, writing). The seconds are summed over
processes: with workers they add up to more than the run's wall time.

``paths`` counts the mentions by how they were linked (retrieval settled
them, the generator's forced scores judged them, beam search...).

Memory is each process's own report (:func:`memory_now`, from
``/proc/self/smaps_rollup``): ``private_mb`` is what no other process shares,
the cost of one more forked worker; ``rss_mb`` counts the pages it shares with
the driver too; ``gpu_peak_mb`` (a process that ran on a GPU) its peak of GPU
memory allocated by torch.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any, Counter, Dict, Iterable, Iterator, List, Mapping, Optional, TypeVar

from spacy_genbioel.linking.decoding.stages import StageClock

__all__ = [
    "GENERATOR_STAGES",
    "clear_caches",
    "StageClock",
    "memory_now",
    "path_counts",
    "pipe_timed",
    "stage_groups",
    "timed",
    "use_clock",
    "worker_memory",
]

T = TypeVar("T")

#: the generator's own stages (:class:`~spacy_genbioel.linking.decoding.decoder.GenerativeLinker`'s clock)
GENERATOR_STAGES = frozenset({"tokenize", "encoder", "decoder", "trie", "beam"})


def timed(items: Iterable[T], clock: StageClock, name: str) -> Iterator[T]:
    """``items``, the time spent producing each counted as stage ``name`` (not the consumer's time)."""
    iterator = iter(items)
    while True:
        with clock.stage(name):
            try:
                item = next(iterator)
            except StopIteration:
                return
        yield item


def pipe_timed(nlp: Any, texts: List[str], clock: StageClock) -> List[Any]:
    """``list(nlp.pipe(texts, batch_size=len(texts)))``, one component at a time, each timed on ``clock``
    under its name (the tokenizer as ``tokenizer``, a genbioel component as ``linking:<name>``). A
    component's error propagates, as in ``nlp.pipe``."""
    with clock.stage("tokenizer"):
        docs = [nlp.make_doc(text) for text in texts]
    for name, proc in nlp.pipeline:
        with clock.stage(f"linking:{name}" if hasattr(proc, "use_clock") else name):
            if hasattr(proc, "pipe"):
                docs = list(proc.pipe(docs, batch_size=len(texts)))
            else:
                docs = [proc(doc) for doc in docs]
    return docs


def clear_caches(nlp: Any) -> None:
    """Forget what the genbioel components of ``nlp`` keep by mention text, so that what a chunk gets
    never depends on the chunks this process annotated before (the chunk files of workers and of one
    process stay the same bytes)."""
    for _, proc in nlp.pipeline:
        if hasattr(proc, "clear_caches"):
            proc.clear_caches()


def use_clock(nlp: Any, clock: Optional[StageClock]) -> None:
    """Time the stages inside each genbioel component of ``nlp`` on ``clock`` (None: stop)."""
    for _, proc in nlp.pipeline:
        if hasattr(proc, "use_clock"):
            proc.use_clock(clock)


def path_counts(nlp: Any) -> Counter:
    """Mentions linked so far by this process's genbioel components, by path (``retrieval``,
    ``forced``, ``beam``...: :data:`~spacy_genbioel.linking.reranking.cascade.PATHS`), as ``path:<name>``."""
    counts: Counter = Counter()
    for _, proc in nlp.pipeline:
        if hasattr(proc, "use_clock"):
            counts.update({f"path:{k}": v for k, v in getattr(proc, "stats", {}).items()})
    return counts


def stage_groups(seconds: Mapping[str, float]) -> Dict[str, float]:
    """Stage seconds summed into ``reading``, ``ner`` (the tokenizer and every component but genbioel),
    ``retrieval``, ``generator``, ``linking`` (genbioel's own rest) and ``writing``."""
    groups = dict.fromkeys(("reading", "ner", "retrieval", "generator", "linking", "writing"), 0.0)
    for name, value in seconds.items():
        if name in ("reading", "writing"):
            group = name
        elif name.startswith("retrieval:"):
            group = "retrieval"
        elif name in GENERATOR_STAGES:
            group = "generator"
        elif name.startswith("linking:"):
            group = "linking"
        else:
            group = "ner"
        groups[group] += value
    return {k: round(v, 3) for k, v in groups.items()}


def _rollup() -> Dict[str, int]:
    """``/proc/self/smaps_rollup``'s kB fields (empty where there is none: not Linux, an old kernel)."""
    fields: Dict[str, int] = {}
    try:
        with open("/proc/self/smaps_rollup", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    fields[key] = int(parts[0])
    except (OSError, ValueError):
        return {}
    return fields


def memory_now() -> Dict[str, Any]:
    """This process's memory: ``pid``, ``rss_mb`` and ``private_mb`` now (None where
    ``/proc/self/smaps_rollup`` is missing), ``peak_rss_mb`` (``getrusage``)."""
    fields = _rollup()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sys.platform == "darwin":  # bytes there, kB on Linux
        peak_kb //= 1024
    private = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)
    report = {
        "pid": os.getpid(),
        "rss_mb": round(fields["Rss"] / 1024, 1) if "Rss" in fields else None,
        "private_mb": round(private / 1024, 1) if fields else None,
        "peak_rss_mb": round(peak_kb / 1024, 1),
    }
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():  # a process that ran on a GPU: its peak there
        report["gpu_peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return report


def worker_memory(reports: Iterable[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The largest figures each worker process (by pid) reported, in order of pid."""
    best: Dict[Any, Dict[str, Any]] = {}
    for report in reports:
        pid = report.get("pid")
        mine = best.setdefault(pid, {"pid": pid, "rss_mb": None, "private_mb": None, "peak_rss_mb": None})
        for key in ("rss_mb", "private_mb", "peak_rss_mb", "gpu_peak_mb"):
            value = report.get(key)
            if value is not None and (mine.get(key) is None or value > mine[key]):
                mine[key] = value
    return [best[pid] for pid in sorted(best, key=str)]
