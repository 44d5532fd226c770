"""Decoding benchmark: batched trie-constrained beam search versus the
GenBioEL/GENRE reference (one mention at a time, ``prefix_allowed_tokens_fn``
over a nested-dict trie), same model, mentions and beams, in one run; plus the
build time and memory of the trie over the full MeSH KB; with a packaged
pipeline, the annotation benchmark of :mod:`.benchmark_annotate` too.
:class:`BenchmarkSettings` says what to measure (``python -m spacy_genbioel
benchmark`` builds it from its flags) and :func:`run_benchmark` measures it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.decoding.reference import ReferenceLinker
from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.models import init_model, load_model
from spacy_genbioel.ty import Mention
from spacy_genbioel.workflows.benchmark_annotate import (
    DEFAULT_SETTINGS,
    InputSetting,
    benchmark_texts,
    run_annotation_benchmark,
)

logger = logging.getLogger(__name__)


def default_data_dir() -> Optional[Path]:
    """``$GENBIOEL_DATA``, else ``../shared/data`` beside the repository, if present."""
    env = os.environ.get("GENBIOEL_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[3] / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path
    return None


def _synthetic_kb(n_concepts: int = 30_000, seed: int = 0) -> KnowledgeBase:
    rng = random.Random(seed)
    syll = [
        "ar",
        "thri",
        "tis",
        "car",
        "ci",
        "no",
        "ma",
        "neu",
        "ro",
        "pa",
        "thy",
        "he",
        "pa",
        "to",
        "my",
        "o",
        "sis",
        "lym",
        "pho",
    ]
    words = ["".join(rng.choices(syll, k=rng.randint(2, 4))) for _ in range(3000)]
    return KnowledgeBase(
        Concept(f"S{i:06d}", [" ".join(rng.choices(words, k=rng.randint(1, 4))) for _ in range(rng.randint(1, 6))])
        for i in range(n_concepts)
    )


def benchmark_kb(data_dir: Optional[Path]) -> Tuple[KnowledgeBase, str]:
    """MEDIC (about 100k names with GenBioEL's normalization) or a synthetic KB of that size."""
    if data_dir and (data_dir / "vocab" / "medic_06Jul2012.txt").exists():
        from spacy_genbioel.kb.sources import read_medic

        return KnowledgeBase(read_medic(data_dir / "vocab" / "medic_06Jul2012.txt"), name="medic"), "MEDIC 2012"
    return _synthetic_kb(), "synthetic"


def benchmark_mentions(data_dir: Optional[Path], kb: KnowledgeBase, n: int, seed: int = 0) -> Tuple[List[Mention], str]:
    if data_dir and (data_dir / "ncbi_disease" / "NCBIdevelopset_corpus.txt").exists():
        from spacy_genbioel.corpus.pubtator import mentions_from_pubtator

        mentions = list(
            mentions_from_pubtator(data_dir / "ncbi_disease" / "NCBIdevelopset_corpus.txt", context_chars=1000)
        )
        return mentions[:n], "NCBI-disease dev"
    rng = random.Random(seed)
    names = kb.names
    return [Mention(rng.choice(names), left="patients with ", right=" were studied") for _ in range(n)], "synthetic"


def _train_quick(kb: KnowledgeBase, out: Path, seconds: float, seed: int = 0):
    from spacy_genbioel.training import TrainConfig, kb_name_examples, train_seq2seq

    model, tokenizer = init_model("tiny", kb.names, out, seed=seed)
    examples = kb_name_examples(kb, seed=seed)
    losses = train_seq2seq(
        model,
        tokenizer,
        examples,
        TrainConfig(max_steps=100_000, max_seconds=seconds, batch_size=64, learning_rate=1e-3, seed=seed),
    )
    logger.info("benchmark model: %d steps, final loss %.3f", len(losses), losses[-1])
    return model, tokenizer


def measure_mesh_trie(data_dir: Path, tokenizer_dir: Path) -> Dict:
    """Build the trie over all MeSH descriptor and supplementary names; report time and RSS growth."""
    import psutil

    from spacy_genbioel.kb.sources import read_mesh_tsv
    from spacy_genbioel.linking.trie.name_trie import NameTrie
    from spacy_genbioel.models import load_tokenizer

    mesh = data_dir / "vocab" / "mesh"
    tokenizer = load_tokenizer(tokenizer_dir)
    began = time.monotonic()
    kb = KnowledgeBase(
        [*read_mesh_tsv(mesh / "mesh_id_label_mappings.tsv"), *read_mesh_tsv(mesh / "mesh_supp_id_label_mappings.tsv")],
        name="mesh",
    )
    kb_seconds = time.monotonic() - began
    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    peak = rss_before
    import threading

    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, proc.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.monotonic()
    trie = NameTrie.from_names(
        kb.names,
        tokenizer,
        eos_token_id=tokenizer.eos_token_id,
        root_token_id=tokenizer(" is", add_special_tokens=False)["input_ids"][-1],
    )
    build_seconds = time.monotonic() - began
    stop.set()
    sampler.join()
    peak = max(peak, proc.memory_info().rss)
    return {
        "mesh_concepts": len(kb),
        "mesh_names": kb.n_names,
        "mesh_kb_load_s": round(kb_seconds, 2),
        "mesh_trie_build_s": round(build_seconds, 2),
        "mesh_trie_nodes": trie.n_nodes,
        "mesh_trie_array_mb": round(trie.nbytes() / 2**20, 1),
        "mesh_trie_peak_extra_rss_mb": round((peak - rss_before) / 2**20, 1),
    }


def compare_decoders(linker: GenerativeLinker, mentions: List[Mention], context_words: int) -> Dict:
    """Both decoders on the same mentions with one context window; the
    encoder pass is the same work for both, so longer contexts bound the ratio."""
    linker.inputs = dataclasses.replace(linker.inputs, context_words=context_words)
    reference = ReferenceLinker(linker)
    linker.link(mentions[:8])  # warm-up (allocator, kernels)
    began = time.monotonic()
    batched = linker.link(mentions)
    batched_s = time.monotonic() - began
    began = time.monotonic()
    slow = reference.link(mentions)
    reference_s = time.monotonic() - began
    comparable = [(b, r) for b, r in zip(batched, slow) if b and r]
    agree = sum(b[0].name == r[0].name for b, r in comparable)
    # a disagreement whose two names score within float noise is a tie, not an error
    ties = sum(1 for b, r in comparable if b[0].name != r[0].name and abs(b[0].score - r[0].score) < 1e-4)
    return {
        "context_words": context_words,
        "batched_mentions_per_s": round(len(mentions) / batched_s, 2),
        "reference_mentions_per_s": round(len(mentions) / reference_s, 2),
        "speedup": round(reference_s / batched_s, 2),
        "top1_agreement": round(agree / max(1, len(comparable)), 4),
        "top1_disagreements_that_are_ties": ties,
        "compared": len(comparable),
    }


@dataclass(frozen=True)
class BenchmarkSettings:
    """What :func:`run_benchmark` measures; each field is a ``benchmark`` flag."""

    #: the shared data folder (MEDIC, NCBI dev, MeSH, BC5CDR); None: :func:`default_data_dir`
    data_dir: Optional[Path] = None
    # -- the decoder comparison
    decoders: bool = True
    #: a saved model; None: a tiny model trained here for ``train_seconds``
    model_dir: Optional[Path] = None
    train_seconds: float = 180.0
    n_mentions: int = 300
    num_beams: int = 5
    #: context windows (words per side) compared, one run each
    context_words: Tuple[int, ...] = (0, 16, 64)
    #: also build the full-MeSH trie (in a fresh process) when the data folder has MeSH
    mesh: bool = True
    # -- both parts
    batch_size: int = 64
    device: str = "cpu"
    # -- the annotation benchmark, with a packaged pipeline (NER + genbioel)
    pipeline: Optional[Path] = None
    #: PubTator abstracts; None: BC5CDR train + dev in the data folder
    corpus: Optional[Path] = None
    n_docs: int = 1000
    input_settings: Tuple[InputSetting, ...] = DEFAULT_SETTINGS
    threads: Tuple[int, ...] = (1,)


def run_benchmark(settings: BenchmarkSettings = BenchmarkSettings()) -> Dict:
    """The decoder comparison (``settings.decoders``) and, with a ``settings.pipeline``,
    the annotation benchmark of :mod:`~spacy_genbioel.workflows.benchmark_annotate`
    on ``n_docs`` abstracts of ``corpus`` (default: BC5CDR train + dev), in one run
    and one JSON object."""
    data_dir = settings.data_dir or default_data_dir()
    num_beams, batch_size, device = settings.num_beams, settings.batch_size, settings.device
    result: Dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cores, "
        f"torch {torch.__version__}, threads {torch.get_num_threads()}",
    }
    if settings.pipeline is not None:
        texts, source = benchmark_texts(data_dir, settings.n_docs, settings.corpus)
        result["annotation"] = {
            "texts": source,
            **run_annotation_benchmark(
                settings.pipeline,
                texts,
                settings.input_settings,
                threads=settings.threads,
                batch_size=batch_size,
                device=device,
            ),
        }
    if not settings.decoders:
        return result
    torch.manual_seed(0)
    kb, kb_name = benchmark_kb(data_dir)
    work = Path(tempfile.mkdtemp(prefix="genbioel_bench_"))
    model_dir = settings.model_dir
    if model_dir is None:
        model, tokenizer = _train_quick(kb, work / "model", settings.train_seconds)
        model_dir = work / "model"
        from spacy_genbioel.models import save_model

        save_model(model, tokenizer, model_dir)
    model, tokenizer = load_model(model_dir, device=device)
    began = time.monotonic()
    linker = GenerativeLinker(
        model, tokenizer, kb, decoding=DecodingSettings(num_beams=num_beams, top_k=num_beams, batch_size=batch_size)
    )
    trie_seconds = time.monotonic() - began
    mentions, mentions_name = benchmark_mentions(data_dir, kb, settings.n_mentions)
    result.update(
        {
            "device": str(linker.device),
            "kb": kb_name,
            "kb_names": kb.n_names,
            "trie_build_s": round(trie_seconds, 2),
            "mentions": len(mentions),
            "mentions_source": mentions_name,
            "num_beams": num_beams,
            "batch_size": batch_size,
            "runs": [compare_decoders(linker, mentions, cw) for cw in settings.context_words],
        }
    )
    if settings.mesh and data_dir and (data_dir / "vocab" / "mesh").is_dir():
        tok_dir = work / "tokenizer"
        tokenizer.save_pretrained(str(tok_dir))
        # a fresh process, so the RSS growth is the trie's alone
        proc = subprocess.run(
            [sys.executable, "-m", "spacy_genbioel", "mesh-trie-memory", str(data_dir), str(tok_dir)],
            capture_output=True,
            text=True,
            check=True,
        )
        result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return result
