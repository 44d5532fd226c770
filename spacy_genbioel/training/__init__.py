"""Training: examples (TF-IDF targets, KB-guided pre-training templates), the
settings of every stage (:mod:`.settings`), the seq2seq objective and short
loop (:mod:`.seq2seq`), the pieces every loop shares (:mod:`.loop`), the
resumable training engine (:mod:`.engine`, with :mod:`.sources`,
:mod:`.checkpoints`, :mod:`.trainlog`, :mod:`.evaluator`), the project steps
(:mod:`.stages`, :mod:`.package`), ANGEL (:mod:`.angel`) and SapBERT-style
dense-encoder training (:mod:`.sapbert`).

Names are imported on first use (PEP 562), so that importing the package
does not load torch.
"""

from importlib import import_module
from typing import Any, Dict

_EXPORTS: Dict[str, str] = {
    # examples
    "TrainingExample": "examples",
    "kb_name_examples": "examples",
    "iterate_forever": "examples",
    "read_examples_jsonl": "examples",
    "read_mentions_jsonl": "examples",
    "write_examples_jsonl": "examples",
    # settings
    "TrainConfig": "settings",
    "EngineConfig": "settings",
    "StageConfig": "settings",
    "load_stage_config": "settings",
    # the objective and the short loop
    "Seq2SeqLoss": "seq2seq",
    "encode_examples": "seq2seq",
    "sequence_loss": "seq2seq",
    "train_seq2seq": "seq2seq",
    # the engine
    "TrainingEngine": "engine",
    "TrainResult": "engine",
    "FixedExamples": "sources",
    "MixedExamples": "sources",
    "SampledSource": "sources",
    "linking_evaluator": "evaluator",
    "plot_training_curve": "trainlog",
    # KB-guided pre-training
    "Template": "pretraining",
    "DEFINITION_TEMPLATES": "pretraining",
    "SYNONYM_TEMPLATES": "pretraining",
    "SELF_TEMPLATES": "pretraining",
    "PretrainingExamples": "pretraining",
    "pretraining_example": "pretraining",
    "pretraining_examples": "pretraining",
    "iterate_pretraining": "pretraining",
    # synonyms-aware targets
    "select_targets": "targets",
    "agreement_with_reference": "targets",
    "fit_name_vectorizer": "targets",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
