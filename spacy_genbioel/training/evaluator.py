"""Dev evaluation during training: recall@k of the generative linker with
trie-constrained decoding, as a plain ``evaluate(model, tokenizer)`` function
the training engine calls every ``eval_every`` steps and ANGEL after each
round."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Union

from spacy_genbioel.util import PathLike

if TYPE_CHECKING:
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.linking.decoding.candidates import CandidateSettings
    from spacy_genbioel.linking.inputs.builder import InputBuilder
    from spacy_genbioel.linking.settings import DecodingSettings
    from spacy_genbioel.training.settings import AngelConfig, StageConfig

Evaluator = Callable[[Any, Any], Union[float, Dict[str, float]]]


def linking_evaluator(
    kb,
    mentions: Sequence,
    *,
    inputs: Optional[InputBuilder] = None,
    decoding: Optional[DecodingSettings] = None,
    candidates: Optional[CandidateSettings] = None,
    ks: Sequence[int] = (1, 5),
    max_mentions: Optional[int] = None,
) -> Evaluator:
    """``evaluate(model, tokenizer) -> {"recall@1": ..., "recall@5": ...}`` on dev
    mentions, with trie-constrained decoding (GenBioEL's recall rule). The trie
    depends only on the tokenizer and is built once. ``decoding`` (default: 5 beams)
    with ``search = "forced"`` and ``candidates`` scores the retrieved names instead,
    which is what a model trained for the cascade is asked (the retriever is built once)."""
    from spacy_genbioel.evaluation.recall import recall_at_k
    from spacy_genbioel.linking.decoding.candidates import make_candidate_generator
    from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
    from spacy_genbioel.linking.settings import DecodingSettings

    decoding = decoding or DecodingSettings()
    retriever = make_candidate_generator(candidates.retriever, kb, candidates.model) if candidates else None
    forced = decoding.search == "forced"
    chosen = list(mentions)[:max_mentions] if max_mentions else list(mentions)
    cache: Dict[int, Any] = {}

    def evaluate(model, tokenizer) -> Dict[str, float]:
        linker = GenerativeLinker(
            model,
            tokenizer,
            kb,
            cache.get(id(tokenizer)),
            inputs=inputs,
            # recall@k past the beam counts the beam's names only (link's top_k asks for max(ks))
            decoding=replace(decoding, num_beams=max(decoding.num_beams, max(ks)), top_k=max(ks))
            if forced  # forced scores rank every retrieved name: no beam to cap them
            else replace(decoding, top_k=min(max(ks), decoding.num_beams)),
            candidates=candidates,
            retriever=retriever,
        )
        cache[id(tokenizer)] = linker.trie
        if linker.inputs.input_mode == "document":  # a first-N slice still reads whole documents
            linker.sources.documents.register(mentions)
        predictions = linker.link(chosen, top_k=max(ks))
        result = recall_at_k(chosen, predictions, ks=ks)
        return {f"recall@{k}": result.recall[k] for k in result.ks if result.recall[k] is not None}

    return evaluate


def stage_evaluator(stage: StageConfig, kb: KnowledgeBase, dev_jsonl: Optional[PathLike]) -> Optional[Evaluator]:
    """The evaluator of a training stage on the dev mentions of ``dev_jsonl``
    (``corpus`` output), with the stage's inputs and ``[data]`` eval settings;
    ``None`` without a dev file."""
    from spacy_genbioel.linking.settings import DecodingSettings
    from spacy_genbioel.training.examples import read_mentions_jsonl

    if not dev_jsonl:
        return None
    mentions = [m for m, _ in read_mentions_jsonl(dev_jsonl)]
    beams = int(stage.data["eval_beams"])
    decoding = DecodingSettings(
        num_beams=beams,
        top_k=min(5, beams),
        batch_size=int(stage.data["eval_batch_size"]),
        max_source_tokens=stage.training.max_source_tokens,
    )
    candidates = None
    if stage.angel.mining == "forced":  # judged on the question it is trained for
        decoding = replace(decoding, search="forced")
        candidates = mining_candidates(stage.angel)
    return linking_evaluator(
        kb,
        mentions,
        inputs=stage.inputs,
        decoding=decoding,
        candidates=candidates,
        max_mentions=int(stage.data["eval_mentions"]) or None,
    )


def mining_candidates(angel: AngelConfig) -> CandidateSettings:
    """The retrieval that forced mining (and its dev evaluation) reads: ``[angel] mining_retriever``."""
    from spacy_genbioel.linking.decoding.candidates import CandidateSettings

    return CandidateSettings(
        retriever=angel.mining_retriever, model=angel.mining_retriever_model, num_candidates=angel.mining_candidates
    )
