"""The ``package`` step: a spaCy pipeline directory from a trained model and
its KB, for ``spacy.load`` and ``spacy package``.

The pipeline is scispacy's ``abbreviation_detector`` (when installed), an
entity source (an ``entity_ruler`` over the KB names, or a trained NER's
tokenizer, ``tok2vec`` and ``ner``) and the ``genbioel`` component, whose
settings :func:`component_config` writes in one place.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import spacy

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.inputs.abbreviations import abbreviation_detector_available
from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.linking.inputs.released_style import recorded_input_style, recorded_max_source_tokens
from spacy_genbioel.linking.reranking.retrieval_only import build_indexes
from spacy_genbioel.linking.settings import nested_overrides
from spacy_genbioel.models import load_model
from spacy_genbioel.ner import add_kb_entity_ruler, ner_extras, source_ner
from spacy_genbioel.ner.pipes import RulerRules
from spacy_genbioel.training.settings import load_stage_config
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["EntitySource", "PackageError", "PipelineMeta", "component_config", "package", "requirements"]


class PackageError(ValueError):
    """A pipeline cannot be packaged from these paths (the message names the path at fault)."""


@dataclass(frozen=True)
class EntitySource:
    """Where the packaged pipeline's mentions come from (before ``genbioel`` links them)."""

    #: a trained spaCy NER pipeline whose tokenizer, tok2vec and ner replace the entity ruler
    ner: Optional[PathLike] = None
    #: without ``ner``: an entity ruler over the KB names
    entity_ruler: bool = True
    #: label of the ruler's spans (default: the concept's type)
    entity_label: Optional[str] = None
    #: shortest KB name the entity ruler matches
    min_name_chars: int = 3
    #: scispacy's abbreviation detector first, when installed (long forms are linked)
    abbreviations: bool = True
    #: language of the blank pipeline (a trained NER's own wins)
    lang: str = "en"
    #: the entity ruler matches only names of concepts with one of these types, or untyped ones (None: all);
    #: BC5CDR's CTD + MeSH KB with C, D, F: span precision 0.602 -> 0.771 on dev (docs/ner.md)
    entity_types: Optional[Tuple[str, ...]] = None


@dataclass(frozen=True)
class PipelineMeta:
    """What ``meta.json`` records besides the requirements."""

    name: str = "genbioel_pipeline"
    version: str = "0.0.0"
    #: the KB's concept pages for ``visualize``: schemes ("mesh,omim") or a template with {}
    kb_url: Optional[str] = None
    #: where the abstention threshold came from (:func:`~spacy_genbioel.evaluation.calibration.calibrated_threshold`)
    calibration: Optional[Dict[str, Any]] = None


def component_config(
    inputs: InputBuilder, max_source_tokens: int = 256, settings: Optional[Mapping[str, Any]] = None
) -> Dict[str, Any]:
    """The ``genbioel`` component's config in a packaged pipeline: the encoder-input settings
    the model was trained with, then ``settings`` (dotted or bare names, as
    :func:`~spacy_genbioel.linking.settings.nested_overrides` takes them) over them."""
    config: Dict[str, Any] = {
        "device": "auto",
        "inputs": {f.name: getattr(inputs, f.name) for f in fields(inputs)},
        "decoding": {"max_source_tokens": max_source_tokens},
    }
    for key, value in nested_overrides(settings or {}).items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    return config


def package(
    model_dir: Optional[PathLike],
    kb_path: PathLike,
    out_dir: PathLike,
    *,
    config_path: Optional[PathLike] = None,
    settings: Optional[Mapping[str, Any]] = None,
    entities: EntitySource = EntitySource(),
    meta: PipelineMeta = PipelineMeta(),
) -> Path:
    """A spaCy pipeline directory: scispacy's ``abbreviation_detector`` (when
    installed), an entity source (``entities``: an ``entity_ruler`` over the KB
    names, or a trained NER's tokenizer, ``tok2vec`` and ``ner``) and
    ``genbioel`` with the trained model, KB and trie inside (``model_dir`` None: no generator, the
    retrievers link, fused by ``reranker.fusion`` or the package's default retrieval fusion). ``spacy.load(out_dir)``
    reads it; ``spacy package out_dir dist`` makes an installable package of it.

    ``config_path`` (the fine-tuning config) supplies the encoder-input settings
    the model was trained with; ``settings`` are the component's other settings
    (``{"decoding.num_beams": 10, "candidates.retriever": "tfidf",
    "output.threshold": -1.2, "reranker.fusion": "fusion.json"}``: a retriever is
    rebuilt from the KB on first use; a fusion file travels as ``genbioel/fusion.json``).
    Without ``config_path``, a model that records the released input style it was trained
    on (``import-checkpoint``) is packaged with that style and the ``decoding.max_source_tokens``
    it needs, unless ``settings`` give ``inputs.style`` (and ``decoding.max_source_tokens``)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PackageError(f"{out}: a file, not a folder: the pipeline is written as a folder (give another path)")
    if model_dir is not None and not Path(model_dir).is_dir():
        raise PackageError(f"{model_dir}: model directory not found")
    try:  # before the indexes are built: spaCy's to_disk makes the last folder only
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PackageError(f"{out}: cannot make its folder {out.parent} ({err.strerror})") from None
    inputs, max_source_tokens = InputBuilder(), 256
    if config_path:
        stage = load_stage_config(config_path)
        inputs, max_source_tokens = stage.inputs, stage.training.max_source_tokens
    elif model_dir is not None:
        inputs, max_source_tokens = _recorded_inputs(model_dir, inputs, max_source_tokens, settings)
    config = component_config(inputs, max_source_tokens, settings)
    if "style" in nested_overrides(settings or {}).get("inputs", {}):
        config["recorded_inputs"] = False  # the style asked for, even genbioel.v1, not the one the model records
    if (
        model_dir is not None
        and (Path(model_dir) / "import.json").is_file()
        and config["inputs"].get("style") == InputBuilder().style
    ):
        logger.warning(
            "%s was imported from a released checkpoint, which was trained on GenBioEL's own inputs: package it "
            "with inputs.style genbioel-released-<corpus>.v1 (docs/published.md)",
            model_dir,
        )
    kb = KnowledgeBase.load(kb_path)
    model, tokenizer = load_model(model_dir, device="cpu", dtype="fp32") if model_dir is not None else (None, None)
    ner_nlp = spacy.load(entities.ner) if entities.ner is not None else None
    lang = entities.lang
    if ner_nlp is not None and ner_nlp.lang != lang:
        logger.warning(
            "The NER pipeline's language is %r, not %r: the package uses %r", ner_nlp.lang, lang, ner_nlp.lang
        )
        lang = ner_nlp.lang
    nlp = spacy.blank(lang)
    source = f"the NER trained in {entities.ner}" if ner_nlp is not None else "a dictionary entity source"
    linking = (
        "Generative biomedical entity linking (GenBioEL)"
        if model is not None
        else "Biomedical entity linking (retrievers fused, no generator)"
    )
    nlp.meta.update({"name": meta.name, "version": meta.version, "description": f"{linking} with {source}"})
    threshold = config.get("output", {}).get("threshold")
    if threshold is not None or meta.calibration is not None:
        nlp.meta["genbioel_calibration"] = {"threshold": threshold, **(meta.calibration or {})}
    if meta.kb_url:
        from spacy_genbioel.visualize.urls import resolve_templates

        nlp.meta["kb_url_templates"] = resolve_templates(meta.kb_url)
    extras = ner_extras(ner_nlp) if ner_nlp is not None else []
    if entities.abbreviations:
        if abbreviation_detector_available():
            nlp.add_pipe("abbreviation_detector")
            extras.insert(0, "scispacy")  # the detector is scispacy's
        else:
            logger.warning("scispacy is not installed: the pipeline has no abbreviation detector")
    if ner_nlp is not None:
        logger.info("Sourced %s from %s", source_ner(nlp, ner_nlp), entities.ner)
    elif entities.entity_ruler:
        n_patterns = add_kb_entity_ruler(
            nlp, kb, entities.entity_label, entities.min_name_chars, rules=RulerRules(types=entities.entity_types)
        )
        logger.info("entity_ruler with %d patterns", n_patterns)
    component = nlp.add_pipe("genbioel", config=config)
    if model is not None:
        component.set_model(model, tokenizer, kb)
    else:  # no generator: the retrievers link, fused by reranker.fusion or the package's default
        component.set_kb(kb)
        build_indexes(component.reranker)
    if component.fusion is not None:
        if "dense" in component.fusion.sources:
            extras.append("minilm")  # the fusion's dense retriever encodes with all-MiniLM-L6-v2 from that extra
        nlp.meta["genbioel_fusion"] = {
            "sources": component.fusion.sources,
            "fit": component.fusion.fit.get("recall", {}),
        }
    nlp.meta["requirements"] = requirements(extras=extras)
    if out.exists():
        shutil.rmtree(out)
    nlp.to_disk(out)
    return out


def _recorded_inputs(
    model_dir: PathLike, inputs: InputBuilder, max_source_tokens: int, settings: Optional[Mapping[str, Any]]
) -> Tuple[InputBuilder, int]:
    """The released input style the model records it was trained on (``import-checkpoint`` writes
    it), and the ``max_source_tokens`` it needs, unless ``settings`` give them."""
    style = recorded_input_style(model_dir)
    given = nested_overrides(settings or {})
    if style is None or "style" in given.get("inputs", {}):
        return inputs, max_source_tokens
    logger.info("inputs.style %s: recorded by the model in %s (override with --inputs.style)", style, model_dir)
    if "max_source_tokens" not in given.get("decoding", {}):
        max_source_tokens = recorded_max_source_tokens(model_dir) or max_source_tokens
        logger.info("decoding.max_source_tokens %d: the released inputs are never cut at tokens", max_source_tokens)
    return replace(inputs, style=style), max_source_tokens


def requirements(extras: Sequence[str] = ()) -> List[str]:
    """What ``meta.json`` asks pip for: this package, at least the installed version,
    with ``extras`` (``spacy_genbioel[scispacy]>=0.1.0`` for a pipeline with scispacy's
    abbreviation detector); ``spacy package`` turns it into the wheel's requirement."""
    try:
        from importlib.metadata import version

        installed = version("spacy_genbioel")
    except Exception:  # not installed as a distribution (a source checkout)
        from spacy_genbioel import __version__ as installed
    extra = f"[{','.join(extras)}]" if extras else ""
    return [f"spacy_genbioel{extra}>={installed}"]
