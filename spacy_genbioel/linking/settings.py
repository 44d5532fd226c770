"""The ``genbioel`` component's settings, each defined once.

Every setting is a field of one frozen dataclass, defined beside the code that
reads it (the decoding block in :mod:`.decoding.decoder`, the candidates block in
:mod:`.decoding.candidates`, the inputs block in :mod:`.inputs.builder`, the reranker block in
:mod:`.reranking.settings`): its default, type and
doc live there and nowhere else. The top-level settings (the resources: model,
tokenizer, KB, device...) are :class:`ComponentResources`; the behaviour is in
blocks, each a dataclass registered in spaCy's ``misc`` registry under a
versioned name (spacy-transformers' style: a behaviour change gets a ``.v2``
and the ``.v1`` a saved pipeline names keeps working)::

    [components.genbioel.inputs]
    @misc = "genbioel.inputs.v1"          # left START mention END right / "mention is"  (InputBuilder)
    [components.genbioel.decoding]
    @misc = "genbioel.decoding.v1"        # beam search               (.decoding.decoder.DecodingSettings)
    [components.genbioel.candidates]
    @misc = "genbioel.candidates.v1"      # retrieve, then generate   (.decoding.candidates.CandidateSettings)
    [components.genbioel.output]
    @misc = "genbioel.output.v1"          # abstention threshold, attribute names         (OutputSettings)
    [components.genbioel.reranker]
    @misc = "genbioel.reranker.v1"        # score fusion over the candidates  (.reranking.settings.RerankerSettings)

Everything else derives from these classes: :data:`DEFAULT_CONFIG` (the
factory's default config), the legacy names the factory takes (:func:`with_legacy_names`),
:data:`SETTING_BLOCKS` and :func:`nested_overrides` (what ``evaluate``,
``package`` and ``annotate`` take as ``--decoding.top_k 10``), and
:class:`LinkerSettings.from_config`, which also maps the flat settings of
pipelines saved by spacy_genbioel 0.1 and 0.2 (:data:`LEGACY_SETTINGS`) onto
the blocks. Adding a setting is adding a field.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from spacy.util import registry

from spacy_genbioel.linking.decoding.candidates import NO_CANDIDATES, CandidateSettings
from spacy_genbioel.linking.decoding.decoder import DecodingSettings
from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.linking.numbers import Bound, bounded, check_numbers, numeric_bounds
from spacy_genbioel.linking.reranking.settings import RerankerSettings
from spacy_genbioel.linking.scispacy_compat import SCISPACY_SETTINGS, scispacy_setting_hint

logger = logging.getLogger(__name__)

__all__ = [
    "DecodingSettings",
    "CandidateSettings",
    "OutputSettings",
    "RerankerSettings",
    "ComponentResources",
    "LinkerSettings",
    "BLOCKS",
    "DEFAULT_CONFIG",
    "SETTING_BLOCKS",
    "LEGACY_SETTINGS",
    "NO_RETRIEVER",
    "SCORE_DECIMALS",
    "UnknownSettingError",
    "written_score",
    "nested_overrides",
    "load_overrides",
    "LEGACY_NAMES",
    "FACTORY",
    "PipeConfigs",
    "keep_null_legacy_names_out",
    "with_legacy_names",
]

NO_RETRIEVER = NO_CANDIDATES
#: decimals of the scores the component writes; the threshold compares the written score
SCORE_DECIMALS = 6


class UnknownSettingError(ValueError):
    """A setting name that no block of the ``genbioel`` component has."""


def written_score(score: float) -> float:
    """A score as the component writes it (and as its threshold and calibration compare it)."""
    return round(float(score), SCORE_DECIMALS)


@dataclass(frozen=True)
class OutputSettings:
    """What the component writes on each span, and where (so that two linkers can share a pipeline).

    A span whose top candidate scores below ``threshold`` keeps its candidates and
    ``kb_ents`` but gets no ID; the score is the linker's own (the generator's mean
    log-probability, at most 0; a retriever shortcut or exact match counts as 0), so
    calibrate it on dev (``evaluate --calibration``). ``probability`` and ``filter_for_definitions``
    give scispacy's meaning (:mod:`.scispacy_compat`, where the two are set side by side)."""

    #: the top candidate's score must be at least this for the span to get an ID (null: always link)
    threshold: Optional[float] = bounded(None, Bound(float, optional=True))
    #: span extension holding the top concept ID (None below ``threshold``)
    kb_id_attr: str = "kb_id"
    #: span extension holding up to ``top_k`` ``(concept_id, name, score)`` tuples
    candidates_attr: str = "kb_candidates"
    #: span extension holding scispacy's ``kb_ents``: up to ``top_k`` ``(concept_id, score)``, best first
    ents_attr: str = "kb_ents"
    #: also write spaCy's own ``span.kb_id_`` (one slot per span: one linker of a pipeline owns it)
    write_kb_id: bool = True
    #: scores as probabilities in [0, 1] over each mention's candidates (the fused one, else a softmax of
    #: the linker's scores), everywhere: kb_ents, kb_candidates, threshold, calibration (scispacy's scale)
    probability: bool = False
    #: scispacy's filter_for_definitions: keep only concepts with a definition in the KB
    filter_for_definitions: bool = False
    #: with filter_for_definitions, a concept without a definition stays when its score is at least this
    no_definition_threshold: Optional[float] = bounded(None, Bound(float, optional=True))

    def __post_init__(self) -> None:
        check_numbers(self, "output")
        attrs = {"kb_id_attr": self.kb_id_attr, "candidates_attr": self.candidates_attr, "ents_attr": self.ents_attr}
        for key, value in attrs.items():
            if not isinstance(value, str) or not value.isidentifier():
                raise ValueError(f"{key} must be a Python identifier, the name of a span extension (got {value!r})")
        if len(set(attrs.values())) < len(attrs):
            raise ValueError(f"kb_id_attr, candidates_attr and ents_attr must differ (got {sorted(attrs.values())})")

    @property
    def attrs(self) -> Tuple[str, str, str]:
        return (self.kb_id_attr, self.candidates_attr, self.ents_attr)

    def links(self, score: float) -> bool:
        """Whether a top candidate of this score is written as the span's ID: its written
        score (:func:`written_score`, what ``kb_ents`` shows) is at least the threshold."""
        return self.threshold is None or written_score(score) >= self.threshold

    def keeps_undefined(self, score: float) -> bool:
        """Whether ``filter_for_definitions`` keeps a concept without a definition of this (written) score."""
        return self.no_definition_threshold is not None and written_score(score) >= self.no_definition_threshold


@dataclass(frozen=True)
class ComponentResources:
    """The component's top-level settings: what it loads and which spans it links."""

    #: Hugging Face model directory (safetensors); a saved pipeline carries its own
    model: Optional[str] = None
    #: tokenizer directory (default: the model's)
    tokenizer: Optional[str] = None
    #: KB file (JSONL, or any format ``build-kb`` reads into one)
    kb: Optional[str] = None
    #: how KB names and mentions are normalized for matching (a registered normalizer)
    kb_normalizer: str = "genbioel.normalizer.v1"
    #: drop names shared by several concepts (false keeps every concept reachable)
    kb_dedup: bool = False
    #: link only spans with these labels (empty: all)
    labels: List[str] = field(default_factory=list)
    #: link the spans of ``doc.spans[spans_key]`` instead of ``doc.ents``
    spans_key: Optional[str] = None
    #: auto | cpu | cuda | cuda:N
    device: str = "auto"
    #: auto | fp32 | bf16 | fp16 | int8 (CPU dynamic quantization)
    dtype: str = "auto"
    #: link the long form of an abbreviation scispacy's abbreviation_detector found
    resolve_abbreviations: bool = True
    #: feed a model imported from a released checkpoint the ``inputs.style`` it records (``import-checkpoint``)
    #: while ``inputs.style`` is left at ``genbioel.v1``; false: the inputs as configured
    recorded_inputs: bool = True


#: block name -> (registered name, settings class)
BLOCKS: Dict[str, Tuple[str, type]] = {
    "inputs": ("genbioel.inputs.v1", InputBuilder),
    "decoding": ("genbioel.decoding.v1", DecodingSettings),
    "candidates": ("genbioel.candidates.v1", CandidateSettings),
    "output": ("genbioel.output.v1", OutputSettings),
    "reranker": ("genbioel.reranker.v1", RerankerSettings),
}


def _typed_signature(cls: type) -> inspect.Signature:
    """``cls``'s signature with its annotations resolved (they are strings under ``from
    __future__ import annotations``), so that spaCy validates and coerces config values. A numeric
    field also takes text (``threshold = .5`` in a config, ``+1`` on the command line), which the class
    reads as the number it spells or refuses naming the setting (:mod:`.numbers`); confection would
    pass ``"nan"`` as a float and refuse ``"+1"`` as an int."""
    hints = typing.get_type_hints(cls)
    numeric = numeric_bounds(cls)
    params = inspect.signature(cls).parameters.values()
    return inspect.Signature(
        [
            p.replace(annotation=Union[hints[p.name], str] if p.name in numeric else hints.get(p.name, p.annotation))
            for p in params
        ]
    )


for _registered, _cls in BLOCKS.values():
    _cls.__signature__ = _typed_signature(_cls)  # type: ignore[attr-defined]
    registry.misc(_registered)(_cls)


def _defaults(cls: type) -> Dict[str, Any]:
    return {
        f.name: f.default_factory() if callable(f.default_factory) else f.default
        for f in dataclasses.fields(cls)
        if f.init
    }


DEFAULT_CONFIG: Dict[str, Any] = {
    **_defaults(ComponentResources),
    **{block: {"@misc": registered, **_defaults(cls)} for block, (registered, cls) in BLOCKS.items()},
}

# block of each setting (None: top level); the one table overrides are checked against.
# A top-level name wins over a block key of the same name ("model"); "block.key" reaches either.
SETTING_BLOCKS: Dict[str, Optional[str]] = {key: block for block, (_, cls) in BLOCKS.items() for key in _defaults(cls)}
SETTING_BLOCKS.update({key: None for key in _defaults(ComponentResources)})

# flat settings of earlier versions: old name -> (block, new name). 0.1 wrote every setting at
# the top level; 0.2 kept ``fusion`` there.
LEGACY_SETTINGS: Dict[str, Tuple[str, str]] = {
    **{name: ("decoding", name) for name in ("batch_size", "num_beams", "top_k", "max_source_tokens", "exact_match")},
    **{
        name: ("inputs", name)
        for name in ("context_words", "lowercase", "decoder_prompt", "start_marker", "end_marker")
    },
    **{name: ("candidates", name) for name in ("num_candidates", "restrict_to_candidates", "shortcut_threshold")},
    "candidates_model": ("candidates", "model"),
    "fusion": ("reranker", "fusion"),
}


@dataclass(frozen=True)
class LinkerSettings:
    """Every setting of one ``genbioel`` component: its resources and its blocks."""

    resources: ComponentResources = field(default_factory=ComponentResources)
    inputs: InputBuilder = field(default_factory=InputBuilder)
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    candidates: CandidateSettings = field(default_factory=CandidateSettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    reranker: RerankerSettings = field(default_factory=RerankerSettings)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "LinkerSettings":
        """Settings from the factory's arguments: top-level resources, built blocks (or their
        settings as dicts), and the flat names of 0.1/0.2 pipelines (None: not given), which
        are mapped onto the blocks."""
        resources = {key: config[key] for key in _defaults(ComponentResources) if key in config}
        blocks: Dict[str, Any] = {block: config.get(block) for block in BLOCKS}
        if isinstance(blocks["candidates"], str):  # 0.1: the retriever's name at the top level
            blocks["candidates"] = {"retriever": blocks["candidates"]}
        legacy = {name: config[name] for name in LEGACY_SETTINGS if config.get(name) is not None}
        scispacy = sorted(name for name in SCISPACY_SETTINGS if config.get(name) is not None)
        if scispacy:  # scispacy's EntityLinker arguments: said where they live here
            raise UnknownSettingError(scispacy_setting_hint(scispacy[0]))
        unknown = set(config) - set(resources) - set(BLOCKS) - set(LEGACY_SETTINGS) - set(SCISPACY_SETTINGS)
        if unknown and SETTING_BLOCKS.get(min(unknown)):  # a block's setting given at the top level
            name, block = min(unknown), SETTING_BLOCKS[min(unknown)]
            raise UnknownSettingError(
                f"{name!r} is a setting of the [{block}] block: config={{'{block}': {{'{name}': ...}}}}"
            )
        if unknown:
            raise UnknownSettingError(
                f"Unknown genbioel setting {sorted(unknown)[0]!r}; known: "
                f"{', '.join(sorted(SETTING_BLOCKS))}; block settings go in their block "
                "([inputs], [decoding], [candidates], [output], [reranker])"
            )
        if legacy:
            logger.info(
                "Flat settings of an earlier spacy_genbioel pipeline (%s) mapped onto the config blocks "
                "(where a block keeps its default value)",
                ", ".join(sorted(legacy)),
            )
            for name, value in legacy.items():
                block, key = LEGACY_SETTINGS[name]
                current = _as_dict(blocks[block])
                if current.get(key, _defaults(BLOCKS[block][1])[key]) == _defaults(BLOCKS[block][1])[key]:
                    blocks[block] = {**current, key: value}  # a block value set on purpose wins
        built = {block: _build(BLOCKS[block][1], value) for block, value in blocks.items()}
        candidates = built["candidates"]
        if candidates.shortcut_threshold is not None and not candidates.enabled:
            logger.warning(
                "shortcut_threshold (%s) has no effect without a retriever (candidates.retriever = %r)",
                candidates.shortcut_threshold,
                candidates.retriever,
            )
        return cls(resources=ComponentResources(**resources), **built)

    def replace(self, **blocks: Any) -> "LinkerSettings":
        """A copy with some blocks (or ``resources``) replaced."""
        return dataclasses.replace(self, **blocks)


def _as_dict(block: Any) -> Dict[str, Any]:
    if block is None:
        return {}
    if isinstance(block, Mapping):
        return {key: value for key, value in block.items() if not key.startswith("@")}
    return {f.name: getattr(block, f.name) for f in dataclasses.fields(block) if f.init}


def _build(cls: type, value: Any) -> Any:
    return value if isinstance(value, cls) else cls(**_as_dict(value))


#: the component's factory name
FACTORY = "genbioel"
#: the names the factory accepts besides its own parameters: the flat settings of 0.1/0.2 pipelines and
#: scispacy's ``EntityLinker`` arguments (answered with where they live here, not confection's
#: "unexpected argument"); None: not given
LEGACY_NAMES: Tuple[str, ...] = tuple(
    dict.fromkeys(
        [name for name in LEGACY_SETTINGS if SETTING_BLOCKS.get(name, "flat") is not None] + list(SCISPACY_SETTINGS)
    )
)


def with_legacy_names(signature: inspect.Signature) -> inspect.Signature:
    """The factory's ``signature`` with its ``**legacy`` replaced by one keyword per name of
    :data:`LEGACY_NAMES` (default None). confection validates a config against its factory's
    signature and refuses names a ``**kwargs`` would take, so a saved config that holds them
    loads only if they are parameters."""
    params = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params += [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Optional[Any])
        for name in LEGACY_NAMES
    ]
    return signature.replace(parameters=params)


class PipeConfigs(dict):
    """spaCy's per-component configs (``nlp._pipe_configs``), which ``nlp.config`` and the saved
    ``config.cfg`` are built from, keeping a ``genbioel`` component's :data:`LEGACY_NAMES` out where they
    are null. spaCy writes every parameter of a factory into a component's config, and the legacy names
    must be parameters for old configs to load (:func:`with_legacy_names`), so without this every saved
    config held some twenty ``name = null`` lines; a legacy name given a value (a 0.1 pipeline's
    ``num_beams = 4``) is kept, so the config means what it meant."""

    def __setitem__(self, name: str, config: Any) -> None:
        if isinstance(config, dict) and config.get("factory") == FACTORY:
            for key in LEGACY_NAMES:
                if key in config and config[key] is None:
                    del config[key]
        super().__setitem__(name, config)


def keep_null_legacy_names_out(nlp: Any) -> None:
    """Make ``nlp`` keep null legacy names out of its ``genbioel`` components' configs (:class:`PipeConfigs`).
    spaCy stores a component's config after its factory returns, so the factory calls this first; a
    spaCy that no longer has ``_pipe_configs`` writes the null lines, as before."""
    configs = getattr(nlp, "_pipe_configs", None)
    if type(configs) is dict:  # noqa: E721  (a subclass someone else installed stays)
        nlp._pipe_configs = PipeConfigs(configs)


def nested_overrides(settings: Mapping[str, Any]) -> Dict[str, Any]:
    """Component settings by name (``{"decoding.top_k": 10, "retriever": "tfidf", "device": "cpu"}``;
    None: keep the pipeline's) as the nested overrides of ``spacy.load(path, config={"components": {name: ...}})``.
    An unknown setting raises :class:`UnknownSettingError` naming it."""
    nested: Dict[str, Any] = {}
    for name, value in settings.items():
        if value is None:
            continue
        block, _, key = name.rpartition(".")
        if not block:
            if key not in SETTING_BLOCKS:
                raise UnknownSettingError(
                    f"Unknown genbioel setting {key!r}; known: {', '.join(sorted(SETTING_BLOCKS))}"
                )
            block = SETTING_BLOCKS[key] or ""
        elif not isinstance(DEFAULT_CONFIG.get(block), dict) or key not in DEFAULT_CONFIG[block]:
            raise UnknownSettingError(f"Unknown genbioel setting {name!r}")
        (nested.setdefault(block, {}) if block else nested)[key] = value
    return nested


def load_overrides(nested: Mapping[str, Any]) -> Dict[str, Any]:
    """``nested`` (:func:`nested_overrides`) as ``spacy.load(path, config={"components": {name: ...}})``
    takes it: the flat name a 0.1 or 0.2 pipeline may hold for each block setting it sets is
    cleared, else the pipeline would read that setting from its flat name."""
    cleared = {
        old: None
        for old, (block, key) in LEGACY_SETTINGS.items()
        if isinstance(nested.get(block), Mapping) and key in nested[block]
    }
    return {**cleared, **nested}
