"""Training: examples (TF-IDF targets, KB-guided pre-training templates), the
seq2seq loop and the resumable training engine; the project steps built on
them are in :mod:`spacy_genbioel.training.cli_steps`.

Names are imported on first use (PEP 562), so that the command-line app can
import :mod:`~spacy_genbioel.training.cli_steps` without loading torch.
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
    # the short loop
    "TrainConfig": "seq2seq",
    "encode_examples": "seq2seq",
    "sequence_loss": "seq2seq",
    "train_seq2seq": "seq2seq",
    # the engine
    "EngineConfig": "engine",
    "TrainingEngine": "engine",
    "TrainResult": "engine",
    "FixedExamples": "engine",
    "MixedExamples": "engine",
    "linking_evaluator": "engine",
    "plot_training_curve": "engine",
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
