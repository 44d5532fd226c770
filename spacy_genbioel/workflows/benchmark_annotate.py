"""Annotation benchmark: a packaged pipeline (NER + ``genbioel``) run over the
same abstracts with several linker input settings side by side in one run:
per-mention input at several context widths and per-document input, on one
or more torch thread counts. Per run: documents/s and mentions/s through
``nlp.pipe``, seconds per pipe, and inside ``genbioel`` seconds per stage
(tokenization, encoder, decoder steps, trie masks; ``spacy_overhead`` is the
rest of the component: building mentions, writing spans), so the bound of each
setting is visible. Top-1 IDs are compared with the first run's.

:func:`time_pipes` (seconds per pipe) and :func:`benchmark_documents` (the
first abstracts of BC5CDR train + dev) are the one copy of those measurements:
``bench/ner_pipelines.py`` and ``bench/annotate_scale.py`` call them.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from spacy.language import Language
    from spacy.tokens import Doc

    from spacy_genbioel.corpus.pubtator import PubTatorDocument

logger = logging.getLogger(__name__)


class InputSetting(NamedTuple):
    """One linker input setting the annotation benchmark runs (a plain tuple compares equal)."""

    name: str
    input_mode: str  # "mention" or "document"
    context_words: int
    dtype: Optional[str] = None  # "int8": the component's ``dtype``; None: the pipeline's own


#: what ``benchmark --pipeline`` compares by default
DEFAULT_SETTINGS: Tuple[InputSetting, ...] = (
    InputSetting("mention-0", "mention", 0),
    InputSetting("mention-16", "mention", 16),
    InputSetting("mention-64", "mention", 64),
    InputSetting("document", "document", 64),
)


def parse_settings(text: str) -> List[InputSetting]:
    """``"mention-0,mention-64,document,document+int8"`` into :class:`InputSetting` tuples
    (name, input_mode, context_words, dtype); ``+int8``: the component's ``dtype = "int8"``."""
    out = []
    for name in (t.strip() for t in text.split(",") if t.strip()):
        base, plus, dtype = name.partition("+")
        mode, _, width = base.partition("-")
        if mode not in ("mention", "document") or (width and not width.isdigit()) or (plus and dtype != "int8"):
            raise ValueError(f"Unknown setting {name!r}: use mention-<words> or document, optionally +int8")
        out.append(InputSetting(name, mode, int(width) if width else 64, dtype or None))
    return out


def benchmark_documents(
    data_dir: Optional[Path], n: int, corpus: Optional[Path] = None
) -> Tuple[List["PubTatorDocument"], str]:
    """The first ``n`` documents of ``corpus`` (PubTator), else of BC5CDR train
    then dev in ``data_dir``; and the files they came from."""
    from spacy_genbioel.corpus import read_pubtator

    files = (
        [corpus]
        if corpus
        else [data_dir / "bc5cdr" / f"CDR_{s}.PubTator.txt" for s in ("TrainingSet", "DevelopmentSet")]
        if data_dir
        else []
    )
    documents: List["PubTatorDocument"] = []
    for path in files:
        if not path.exists():
            continue
        for doc in read_pubtator(path):
            if len(documents) >= n:
                break
            documents.append(doc)
    if not documents:
        raise FileNotFoundError(
            f"No abstracts to annotate: give a PubTator corpus or a data folder with bc5cdr/ (looked in {files})"
        )
    return documents, ", ".join(str(p) for p in files if p.exists())


def benchmark_texts(data_dir: Optional[Path], n: int, corpus: Optional[Path] = None) -> Tuple[List[str], str]:
    """:func:`benchmark_documents` as texts (title and abstract joined)."""
    documents, source = benchmark_documents(data_dir, n, corpus)
    return [f"{doc.title} {doc.abstract}".strip() for doc in documents], source


def time_pipes(nlp: "Language", texts: Sequence[str], batch_size: int = 64) -> Tuple[List["Doc"], Dict[str, float]]:
    """Run ``texts`` through ``nlp`` one pipe at a time (``pipe`` with ``batch_size``);
    the docs and the seconds of the tokenizer and of each pipe, by name."""
    seconds: Dict[str, float] = {}
    began = time.perf_counter()
    docs = [nlp.make_doc(text) for text in texts]
    seconds["tokenizer"] = time.perf_counter() - began
    for pipe_name, proc in nlp.pipeline:
        start = time.perf_counter()
        docs = list(proc.pipe(docs, batch_size=batch_size)) if hasattr(proc, "pipe") else [proc(doc) for doc in docs]
        seconds[pipe_name] = time.perf_counter() - start
    return docs, seconds


def annotate_run(
    pipeline: Path, texts: Sequence[str], setting: InputSetting, threads: int, batch_size: int = 64, device: str = "cpu"
) -> Dict[str, Any]:
    """One setting on ``threads`` torch threads: throughput, seconds per pipe and per linker stage, top-1 IDs."""
    import spacy
    import torch

    from spacy_genbioel.linking.decoding.stages import StageClock
    from spacy_genbioel.linking.settings import load_overrides, nested_overrides

    name, input_mode, context_words, dtype = setting
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        overrides = nested_overrides(
            {"input_mode": input_mode, "context_words": context_words, "device": device, "dtype": dtype}
        )
        nlp = spacy.load(pipeline, config={"components": {"genbioel": load_overrides(overrides)}})
        linker = nlp.get_pipe("genbioel").linker
        nlp(texts[0])  # warm-up: allocator, lazy resources
        linker.clock = StageClock(linker.device)
        linker.stats.clear()
        load = os.getloadavg()
        docs, pipes = time_pipes(nlp, texts, batch_size)
        total = sum(pipes.values())
    finally:
        torch.set_num_threads(before)
    stages = {k: v["seconds"] for k, v in linker.clock.report().items()}
    stages["spacy_overhead"] = round(pipes["genbioel"] - sum(stages.values()), 4)
    mentions = sum(len(doc.ents) for doc in docs)
    return {
        "name": name,
        "input_mode": input_mode,
        "dtype": dtype or "pipeline's",
        "context_words": context_words if input_mode == "mention" else None,
        "threads": threads,
        "documents": len(docs),
        "mentions": mentions,
        "docs_per_s": round(len(docs) / total, 2),
        "mentions_per_s": round(mentions / total, 1),
        "linker_mentions_per_s": round(mentions / pipes["genbioel"], 1),
        "seconds": round(total, 2),
        "pipe_seconds": {k: round(v, 3) for k, v in pipes.items()},
        "linker_stage_seconds": stages,
        "searches": int(linker.stats["searches"]),
        "mentions_decoded": int(linker.stats["mentions_decoded"]),
        "encoder_inputs": int(linker.stats["encoder_inputs"]),
        "encoder_tokens": int(linker.stats["encoder_tokens"]),
        "loadavg_before": [round(x, 2) for x in load],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "top1": [e.kb_id_ for doc in docs for e in doc.ents],
    }


def run_annotation_benchmark(
    pipeline: Path,
    texts: Sequence[str],
    settings: Sequence[InputSetting] = DEFAULT_SETTINGS,
    threads: Sequence[int] = (1,),
    batch_size: int = 64,
    device: str = "cpu",
) -> Dict[str, Any]:
    """Every setting on every thread count over the same ``texts``; the headline
    ``per_mention_docs_per_s`` (the widest per-mention context) and
    ``per_document_docs_per_s`` are those of the first thread count."""
    runs: List[Dict[str, Any]] = []
    for n_threads in threads:
        for setting in (InputSetting(*s) for s in settings):
            logger.info("annotate benchmark: %s on %d thread(s)", setting.name, n_threads)
            runs.append(annotate_run(pipeline, texts, setting, n_threads, batch_size, device))
    reference = runs[0]["top1"]
    for run in runs:
        top1 = run.pop("top1")
        run["top1_agreement_with_first"] = round(
            sum(a == b for a, b in zip(top1, reference)) / max(1, len(reference)), 4
        )
    result: Dict[str, Any] = {"pipeline": str(pipeline), "documents": len(texts), "runs": runs}
    first = [r for r in runs if r["threads"] == threads[0]]
    plain = [r for r in first if r["dtype"] != "int8"]
    per_mention = [r for r in plain if r["input_mode"] == "mention"]
    per_document = [r for r in plain if r["input_mode"] == "document"]
    if per_mention:
        widest = max(per_mention, key=lambda r: r["context_words"])
        result["per_mention_docs_per_s"] = widest["docs_per_s"]
    if per_document:
        result["per_document_docs_per_s"] = per_document[0]["docs_per_s"]
    if per_mention and per_document:
        result["per_document_speedup"] = round(result["per_document_docs_per_s"] / result["per_mention_docs_per_s"], 2)
    return result
