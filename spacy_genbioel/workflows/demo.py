"""The embedded demo: a tiny linker trained on a small KB of common diseases
and chemicals, packaged as a spaCy pipeline and run on sample texts."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Dict, List, Tuple

import spacy
import torch

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.inputs.abbreviations import abbreviation_detector_available
from spacy_genbioel.models import init_model
from spacy_genbioel.ner import add_kb_entity_ruler
from spacy_genbioel.training import TrainConfig, kb_name_examples, train_seq2seq

logger = logging.getLogger(__name__)


def asset_path(name: str) -> Path:
    return Path(str(resources.files("spacy_genbioel") / "assets" / name))


def demo_kb() -> KnowledgeBase:
    return KnowledgeBase.load(asset_path("demo_kb.jsonl"))


def demo_texts() -> List[str]:
    return [
        line.strip() for line in asset_path("demo_texts.txt").read_text(encoding="utf8").splitlines() if line.strip()
    ]


def demo_gold() -> List[Dict]:
    return [
        json.loads(line)
        for line in asset_path("demo_mentions.jsonl").read_text(encoding="utf8").splitlines()
        if line.strip()
    ]


@dataclass
class DemoResult:
    pipeline_dir: Path
    rows: List[Tuple[str, str, str, str, float]]
    recall_at_1: float
    n_gold: int
    train_seconds: float
    train_steps: int


#: the demo's training: steps, the same on any machine (400: recall@1 0.94 on the demo's texts), and a cap in
#: seconds of all the threads' CPU time, which a busy machine spends faster (OpenMP threads waiting for a core count)
DEMO_STEPS = 400
DEMO_SECONDS = 600.0


def build_demo_pipeline(
    out: Path, train_seconds: float = DEMO_SECONDS, seed: int = 0, device: str = "cpu", train_steps: int = DEMO_STEPS
) -> Tuple[Path, int]:
    """Train a tiny model on the demo KB and save a complete pipeline to ``out``; returns it and the steps trained.

    The untrained starting model only passes through a temporary folder: left beside ``out`` (as
    ``demo_pipeline_model`` once was), a pipeline pointed at it linked every mention to one concept."""
    torch.manual_seed(seed)
    kb = demo_kb()
    with tempfile.TemporaryDirectory(prefix="genbioel_demo_") as tmp:
        model, tokenizer = init_model("tiny", kb.names, Path(tmp) / "model", vocab_size=2000, seed=seed)
    examples = kb_name_examples(kb, synonyms_per_name=1, seed=seed)
    # a number of steps, so that a busy machine trains the same model as a quiet one, only slower: a wall-clock
    # budget left it a few steps and a model linking nothing, and a CPU-time one 233 steps instead of 406 (recall@1
    # 0.61 against 0.94) while OpenMP threads spun waiting for a core; the seconds (CPU time, all threads) only cap it
    # (the learning rate as before: flat after the warm-up, the decay set over 100,000 steps)
    config = TrainConfig(
        max_steps=100_000,
        max_seconds=train_seconds * torch.get_num_threads(),
        budget_clock="cpu",
        batch_size=32,
        learning_rate=1e-3,
        warmup_steps=50,
        seed=seed,
    )
    began = time.monotonic()
    losses = train_seq2seq(model, tokenizer, examples, config, stop_after=max(int(train_steps), 1))
    logger.info("Trained %d steps in %.0fs, final loss %.3f", len(losses), time.monotonic() - began, losses[-1])
    nlp = spacy.blank("en")
    if abbreviation_detector_available():
        nlp.add_pipe("abbreviation_detector")
    add_kb_entity_ruler(nlp, kb, min_chars=0)  # the demo KB's every name
    linker = nlp.add_pipe("genbioel", config={"device": device})
    linker.set_model(model, tokenizer, kb)
    Path(out).parent.mkdir(parents=True, exist_ok=True)  # a nested --out: spaCy makes the last folder only
    nlp.to_disk(out)
    return out, len(losses)


def run_demo(
    out: Path, train_seconds: float = DEMO_SECONDS, seed: int = 0, train_steps: int = DEMO_STEPS
) -> DemoResult:
    began = time.monotonic()
    _, steps = build_demo_pipeline(out, train_seconds=train_seconds, seed=seed, train_steps=train_steps)
    trained = time.monotonic() - began
    nlp = spacy.load(out)
    texts = demo_texts()
    gold = {(g["doc"], g["start"], g["end"]): set(g["ids"]) for g in demo_gold()}
    rows = []
    hits = 0
    for i, doc in enumerate(nlp.pipe(texts)):
        for ent in doc.ents:
            cands = ent._.kb_candidates or []
            name = cands[0][1] if cands else ""
            score = cands[0][2] if cands else float("nan")
            rows.append((ent.text, ent.label_, ent._.kb_id or "-", name, score))
            ids = gold.get((i, ent.start_char, ent.end_char))
            if ids and ent._.kb_id in ids:
                hits += 1
    return DemoResult(out, rows, hits / max(1, len(gold)), len(gold), trained, steps)
