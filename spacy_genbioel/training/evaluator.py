"""Dev evaluation during training: recall@k of the generative linker with
trie-constrained decoding, as a plain ``evaluate(model, tokenizer)`` function
the training engine calls every ``eval_every`` steps and ANGEL after each
round."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Union

from spacy_genbioel.util import PathLike

if TYPE_CHECKING:
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.linking.inputs import InputBuilder
    from spacy_genbioel.training.settings import StageConfig

Evaluator = Callable[[Any, Any], Union[float, Dict[str, float]]]


def linking_evaluator(
    kb,
    mentions: Sequence,
    *,
    inputs: Optional[InputBuilder] = None,
    num_beams: int = 5,
    batch_size: int = 64,
    ks: Sequence[int] = (1, 5),
    max_mentions: Optional[int] = None,
    max_source_tokens: int = 256,
) -> Evaluator:
    """``evaluate(model, tokenizer) -> {"recall@1": ..., "recall@5": ...}`` on dev
    mentions, with trie-constrained decoding (GenBioEL's recall rule). The trie
    depends only on the tokenizer and is built once."""
    from spacy_genbioel.evaluation.recall import recall_at_k
    from spacy_genbioel.linking.decoder import GenerativeLinker
    from spacy_genbioel.linking.settings import DecodingSettings

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
            decoding=DecodingSettings(
                num_beams=num_beams,
                top_k=min(max(ks), num_beams),
                batch_size=batch_size,
                max_source_tokens=max_source_tokens,
            ),
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
    from spacy_genbioel.training.examples import read_mentions_jsonl

    if not dev_jsonl:
        return None
    mentions = [m for m, _ in read_mentions_jsonl(dev_jsonl)]
    return linking_evaluator(
        kb,
        mentions,
        inputs=stage.inputs,
        num_beams=int(stage.data["eval_beams"]),
        batch_size=int(stage.data["eval_batch_size"]),
        max_mentions=int(stage.data["eval_mentions"]) or None,
        max_source_tokens=stage.training.max_source_tokens,
    )
