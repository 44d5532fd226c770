"""Seq2seq models: Hugging Face directories (:mod:`.hf`), from-scratch BART
presets and tokenizers (:mod:`.bart`), BERT2BERT warm starts
(:mod:`.bert2bert`), the preset dispatch (:mod:`.presets`) and the one-time
import of released pickled checkpoints (:mod:`.checkpoint_import`, reading
them through :mod:`.checkpoint_pickle`)."""

from spacy_genbioel.models.bart import PRESETS, Preset, build_model, train_tokenizer
from spacy_genbioel.models.bert2bert import WARM_START_PRESETS, init_warm_start, is_warm_start
from spacy_genbioel.models.checkpoint_import import CheckpointError, ImportOptions, import_checkpoint
from spacy_genbioel.models.hf import (
    MARKERS,
    ModelFileNotFoundError,
    ModelFormatError,
    check_vocabulary,
    load_model,
    load_tokenizer,
    save_model,
    special_ids,
    tokenizer_fingerprint,
)
from spacy_genbioel.models.presets import init_model

__all__ = [
    "MARKERS",
    "PRESETS",
    "Preset",
    "WARM_START_PRESETS",
    "build_model",
    "init_model",
    "init_warm_start",
    "is_warm_start",
    "load_model",
    "load_tokenizer",
    "save_model",
    "special_ids",
    "train_tokenizer",
    "ModelFormatError",
    "ModelFileNotFoundError",
    "check_vocabulary",
    "tokenizer_fingerprint",
    "CheckpointError",
    "ImportOptions",
    "import_checkpoint",
]
