"""The ``genbioel`` component's settings, defined once.

The component config is a few top-level resources (model, tokenizer, KB paths,
labels, device) and three registered blocks, each a small versioned function
in spaCy's ``misc`` registry (spacy-transformers' style: a behaviour change
gets a ``.v2`` and the ``.v1`` a saved pipeline names keeps working)::

    [components.genbioel.inputs]
    @misc = "genbioel.inputs.v1"          # left START mention END right / "mention is"
    [components.genbioel.decoding]
    @misc = "genbioel.decoding.v1"        # beam search
    [components.genbioel.candidates]
    @misc = "genbioel.candidates.v1"      # retrieve, then generate
    retriever = "none"                    # or a registered retriever: "genbioel.tfidf_retriever.v1", "tfidf", ...
    [components.genbioel.output]
    @misc = "genbioel.output.v1"          # what the component writes where: abstention threshold, attribute names

:data:`DEFAULT_CONFIG` is the factory's default config; :func:`linking_overrides`
turns command-line settings (``evaluate``, ``package``) into the nested
overrides ``spacy.load(..., config=...)`` takes; :data:`LEGACY_SETTINGS` maps
the flat settings of pipelines saved by spacy_genbioel 0.1 onto the blocks.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from spacy.util import registry
from thinc.api import Config

from spacy_genbioel.linking.inputs import InputBuilder
from spacy_genbioel.models import MARKERS

logger = logging.getLogger(__name__)

__all__ = [
    "DecodingConfig", "CandidateSettings", "OutputSettings", "DEFAULT_CONFIG", "LEGACY_SETTINGS", "NO_RETRIEVER",
    "SCORE_DECIMALS", "written_score",
    "make_inputs", "make_decoding", "make_candidates", "make_output", "apply_legacy", "linking_overrides",
]

NO_RETRIEVER = "none"
#: decimals of the scores the component writes; the threshold compares the written score
SCORE_DECIMALS = 6


def written_score(score: float) -> float:
    """A score as the component writes it (and as its threshold and calibration compare it)."""
    return round(float(score), SCORE_DECIMALS)


@dataclass
class DecodingConfig:
    num_beams: int = 5
    top_k: int = 5
    batch_size: int = 32
    max_source_tokens: int = 256
    length_penalty: float = 1.0
    #: concepts a ``candidate_generator`` proposes per mention (its top names' IDs)
    num_candidates: int = 20
    #: a mention whose normalized text is a KB name takes that name first
    exact_match: bool = False
    #: decode only names of the retrieved concepts (False: the generator serves the shortcut only)
    restrict_to_candidates: bool = True
    #: a mention whose top retrieved candidate scores at least this takes it first (None: off)
    shortcut_threshold: Optional[float] = None


@dataclass(frozen=True)
class CandidateSettings:
    """Retrieve, then generate: which retriever proposes concepts, and how they are used."""

    #: a registered retriever (short or versioned name), or "none"
    retriever: str = NO_RETRIEVER
    #: directory of the retriever's model, for those that need one (dense); not copied by to_disk
    model: Optional[str] = None
    num_candidates: int = 20
    restrict_to_candidates: bool = True
    shortcut_threshold: Optional[float] = None

    @property
    def enabled(self) -> bool:
        return self.retriever != NO_RETRIEVER


@dataclass(frozen=True)
class OutputSettings:
    """What the component writes on each span, and where (so that two linkers can share a pipeline)."""

    #: the top candidate's score must be at least this for the span to get an ID (None: always link)
    threshold: Optional[float] = None
    #: span extension holding the top concept ID (None below ``threshold``)
    kb_id_attr: str = "kb_id"
    #: span extension holding up to ``top_k`` ``(concept_id, name, score)`` tuples
    candidates_attr: str = "kb_candidates"
    #: span extension holding scispacy's ``kb_ents``: up to ``top_k`` ``(concept_id, score)``, best first
    ents_attr: str = "kb_ents"
    #: also write spaCy's own ``span.kb_id_`` (one slot per span: one linker of a pipeline owns it)
    write_kb_id: bool = True

    @property
    def attrs(self) -> Tuple[str, str, str]:
        return (self.kb_id_attr, self.candidates_attr, self.ents_attr)

    def links(self, score: float) -> bool:
        """Whether a top candidate of this score is written as the span's ID: its written
        score (:func:`written_score`, what ``kb_ents`` shows) is at least the threshold."""
        return self.threshold is None or written_score(score) >= self.threshold


@registry.misc("genbioel.inputs.v1")
def make_inputs(
    context_words: int = 64,
    lowercase: bool = True,
    decoder_prompt: bool = True,
    start_marker: str = MARKERS[0],
    end_marker: str = MARKERS[1],
    input_mode: str = "mention",
) -> InputBuilder:
    """GenBioEL's encoder text and decoder prompt. ``decoder_prompt`` and
    ``input_mode`` must match the training config's ``[inputs]``: ``"mention"``
    encodes each mention with ``context_words`` around it, ``"document"`` each
    document (window of ``max_source_tokens``) once with all its mentions marked."""
    if context_words < 0:
        raise ValueError(f"context_words must be >= 0 (got {context_words})")
    return InputBuilder(start_marker, end_marker, context_words=context_words, lowercase=lowercase,
                        decoder_prompt=decoder_prompt, input_mode=input_mode)


@registry.misc("genbioel.decoding.v1")
def make_decoding(
    num_beams: int = 5,
    top_k: int = 5,
    batch_size: int = 32,
    max_source_tokens: int = 256,
    exact_match: bool = False,
) -> DecodingConfig:
    """Trie-constrained beam search; ``exact_match``: a KB name equal to the
    normalized mention is ranked first without generating."""
    if top_k > num_beams:
        raise ValueError(f"top_k ({top_k}) cannot exceed num_beams ({num_beams})")
    if min(num_beams, top_k, batch_size, max_source_tokens) < 1:
        raise ValueError("num_beams, top_k, batch_size and max_source_tokens must be at least 1")
    return DecodingConfig(num_beams=num_beams, top_k=top_k, batch_size=batch_size, max_source_tokens=max_source_tokens,
                          exact_match=exact_match)


@registry.misc("genbioel.candidates.v1")
def make_candidates(
    retriever: str = NO_RETRIEVER,
    model: Optional[str] = None,
    num_candidates: int = 20,
    restrict_to_candidates: bool = True,
    shortcut_threshold: Optional[float] = None,
) -> CandidateSettings:
    """Retrieve, then generate. ``retriever`` names a registered retriever (see
    :mod:`spacy_genbioel.retrieval`), built from the component's KB on first use;
    each mention's beam search is limited to its ``num_candidates`` retrieved
    concepts (``restrict_to_candidates = false``: decode unrestricted, the
    retriever serves ``shortcut_threshold`` only: a mention whose top candidate
    scores at least that takes it without generating)."""
    from spacy_genbioel.linking.candidates import check_candidates

    check_candidates(retriever)
    if num_candidates < 1:
        raise ValueError(f"num_candidates must be at least 1 (got {num_candidates})")
    settings = CandidateSettings(retriever, model, num_candidates, restrict_to_candidates, shortcut_threshold)
    if shortcut_threshold is not None and not settings.enabled:
        logger.warning("shortcut_threshold (%s) has no effect without a candidate generator (retriever = %r)",
                       shortcut_threshold, retriever)
    return settings


@registry.misc("genbioel.output.v1")
def make_output(
    threshold: Optional[float] = None,
    kb_id_attr: str = "kb_id",
    candidates_attr: str = "kb_candidates",
    ents_attr: str = "kb_ents",
    write_kb_id: bool = True,
) -> OutputSettings:
    """Abstention and where the results go. ``threshold``: a span whose top candidate
    scores below it keeps its candidates and ``kb_ents`` but gets no ID (``kb_id``
    None, ``span.kb_id_`` empty); the score is the linker's own (the generator's mean
    log-probability, at most 0; a retriever shortcut or exact match counts as 0), so
    calibrate it on dev (``evaluate --calibration``). ``*_attr``: the span extensions
    written (registered when missing); a second linker in the same pipeline takes
    other names and ``write_kb_id = false``, since ``span.kb_id_`` holds one ID."""
    if threshold is not None and not math.isfinite(threshold):
        raise ValueError(f"threshold must be a finite number or null (got {threshold})")
    attrs = {"kb_id_attr": kb_id_attr, "candidates_attr": candidates_attr, "ents_attr": ents_attr}
    for key, value in attrs.items():
        if not isinstance(value, str) or not value.isidentifier():
            raise ValueError(f"{key} must be a Python identifier, the name of a span extension (got {value!r})")
    if len(set(attrs.values())) < len(attrs):
        raise ValueError(f"kb_id_attr, candidates_attr and ents_attr must differ (got {sorted(attrs.values())})")
    return OutputSettings(threshold, kb_id_attr, candidates_attr, ents_attr, write_kb_id)


def decoding_with_candidates(decoding: DecodingConfig, candidates: CandidateSettings) -> DecodingConfig:
    """The linker's one decoding config: beam settings plus how candidates restrict it."""
    return dataclasses.replace(decoding, num_candidates=candidates.num_candidates,
                               restrict_to_candidates=candidates.restrict_to_candidates,
                               shortcut_threshold=candidates.shortcut_threshold)


DEFAULT_CONFIG_STR = """
[genbioel]
model = null
tokenizer = null
kb = null
fusion = null
kb_normalizer = "genbioel.normalizer.v1"
kb_dedup = false
labels = []
spans_key = null
device = "auto"
dtype = "auto"
resolve_abbreviations = true

[genbioel.inputs]
@misc = "genbioel.inputs.v1"
context_words = 64
lowercase = true
decoder_prompt = true
start_marker = "START"
end_marker = "END"
input_mode = "mention"

[genbioel.decoding]
@misc = "genbioel.decoding.v1"
num_beams = 5
top_k = 5
batch_size = 32
max_source_tokens = 256
exact_match = false

[genbioel.candidates]
@misc = "genbioel.candidates.v1"
retriever = "none"
model = null
num_candidates = 20
restrict_to_candidates = true
shortcut_threshold = null

[genbioel.output]
@misc = "genbioel.output.v1"
threshold = null
kb_id_attr = "kb_id"
candidates_attr = "kb_candidates"
ents_attr = "kb_ents"
write_kb_id = true
"""
DEFAULT_CONFIG: Dict[str, Any] = Config().from_str(DEFAULT_CONFIG_STR)["genbioel"]

# block of each setting (None: top level); the one table the CLI and package read.
# A top-level name wins over a block key of the same name ("model"); "block.key" reaches either.
SETTING_BLOCKS: Dict[str, Optional[str]] = {
    key: block
    for block, section in DEFAULT_CONFIG.items() if isinstance(section, dict)
    for key in section if not key.startswith("@")
}
SETTING_BLOCKS.update({key: None for key, value in DEFAULT_CONFIG.items() if not isinstance(value, dict)})

# spacy_genbioel 0.1 saved flat settings: old name -> (block, new name)
LEGACY_SETTINGS: Dict[str, Tuple[str, str]] = {
    "batch_size": ("decoding", "batch_size"),
    "num_beams": ("decoding", "num_beams"),
    "top_k": ("decoding", "top_k"),
    "max_source_tokens": ("decoding", "max_source_tokens"),
    "exact_match": ("decoding", "exact_match"),
    "context_words": ("inputs", "context_words"),
    "lowercase": ("inputs", "lowercase"),
    "decoder_prompt": ("inputs", "decoder_prompt"),
    "start_marker": ("inputs", "start_marker"),
    "end_marker": ("inputs", "end_marker"),
    "num_candidates": ("candidates", "num_candidates"),
    "candidates_model": ("candidates", "model"),
    "restrict_to_candidates": ("candidates", "restrict_to_candidates"),
    "shortcut_threshold": ("candidates", "shortcut_threshold"),
}


def apply_legacy(
    legacy: Mapping[str, Any],
    inputs: InputBuilder,
    decoding: DecodingConfig,
    candidates: CandidateSettings,
) -> Tuple[InputBuilder, DecodingConfig, CandidateSettings]:
    """Blocks with a 0.1 pipeline's flat settings applied (``None``: not given)."""
    given = {name: value for name, value in legacy.items() if value is not None}
    if not given:
        return inputs, decoding, candidates
    logger.info("Flat settings of a spacy_genbioel 0.1 pipeline (%s) mapped onto the config blocks; "
                "re-save the pipeline to write the current config", ", ".join(sorted(given)))
    blocks: Dict[str, Dict[str, Any]] = {
        "inputs": {**_fields(inputs, DEFAULT_CONFIG["inputs"])},
        "decoding": {**_fields(decoding, DEFAULT_CONFIG["decoding"])},
        "candidates": {**_fields(candidates, DEFAULT_CONFIG["candidates"])},
    }
    for name, value in given.items():
        block, key = LEGACY_SETTINGS[name]
        blocks[block][key] = value
    return make_inputs(**blocks["inputs"]), make_decoding(**blocks["decoding"]), make_candidates(**blocks["candidates"])


def _fields(obj: Any, section: Mapping[str, Any]) -> Dict[str, Any]:
    """The registered function's arguments, read back from the object it built (same names)."""
    return {key: getattr(obj, key) for key in section if not key.startswith("@")}


def linking_overrides(**settings: Any) -> Dict[str, Any]:
    """Component settings by name (``num_beams=3``, ``retriever="tfidf"``; None: keep the
    pipeline's) as the nested overrides of ``spacy.load(path, config={"components": {name: ...}})``."""
    nested: Dict[str, Any] = {}
    for name, value in settings.items():
        if value is None:
            continue
        block, _, key = name.rpartition(".")
        if not block:
            if key not in SETTING_BLOCKS:
                raise ValueError(f"Unknown genbioel setting {key!r}; known: {', '.join(sorted(SETTING_BLOCKS))}")
            block = SETTING_BLOCKS[key] or ""
        elif not isinstance(DEFAULT_CONFIG.get(block), dict) or key not in DEFAULT_CONFIG[block]:
            raise ValueError(f"Unknown genbioel setting {name!r}")
        (nested.setdefault(block, {}) if block else nested)[key] = value
    return nested
