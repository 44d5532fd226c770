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
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import spacy

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.abbreviations import abbreviation_detector_available
from spacy_genbioel.linking.settings import linking_overrides
from spacy_genbioel.linking.decoder import GenerativeLinker
from spacy_genbioel.linking.inputs import InputBuilder
from spacy_genbioel.models import load_model
from spacy_genbioel.ner import add_kb_entity_ruler, ner_extras, source_ner
from spacy_genbioel.linking.fusion import FusionModel
from spacy_genbioel.training.settings import load_stage_config
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)


def component_config(
    inputs: InputBuilder,
    max_source_tokens: int = 256,
    *,
    num_beams: int = 5,
    top_k: int = 5,
    exact_match: bool = False,
    candidates: str = "none",
    num_candidates: int = 20,
    restrict_to_candidates: bool = True,
    shortcut_threshold: Optional[float] = None,
    threshold: Optional[float] = None,
) -> Dict[str, Any]:
    """The ``genbioel`` component's config blocks in a packaged pipeline: decoding and
    candidate settings, the abstention threshold, and the encoder-input settings the
    model was trained with."""
    return linking_overrides(
        num_beams=num_beams, top_k=top_k, exact_match=exact_match, retriever=candidates, num_candidates=num_candidates,
        restrict_to_candidates=restrict_to_candidates, shortcut_threshold=shortcut_threshold, threshold=threshold,
        context_words=inputs.context_words, lowercase=inputs.lowercase, decoder_prompt=inputs.decoder_prompt,
        input_mode=inputs.input_mode,
        max_source_tokens=max_source_tokens, device="auto",
    )


def package(
    model_dir: PathLike,
    kb_path: PathLike,
    out_dir: PathLike,
    name: str = "genbioel_pipeline",
    version: str = "0.0.0",
    config_path: Optional[PathLike] = None,
    entity_label: Optional[str] = None,
    entity_ruler: bool = True,
    abbreviations: bool = True,
    num_beams: int = 5,
    top_k: int = 5,
    min_name_chars: int = 3,
    lang: str = "en",
    ner: Optional[PathLike] = None,
    exact_match: bool = False,
    candidates: str = "none",
    num_candidates: int = 20,
    restrict_to_candidates: bool = True,
    shortcut_threshold: Optional[float] = None,
    kb_url: Optional[str] = None,
    threshold: Optional[float] = None,
    calibration: Optional[Dict[str, Any]] = None,
    fusion: Optional[PathLike] = None,
) -> Path:
    """A spaCy pipeline directory: scispacy's ``abbreviation_detector`` (when
    installed), an ``entity_ruler`` over the KB names, and ``genbioel`` with
    the trained model, KB and trie inside. ``spacy.load(out_dir)`` reads it;
    ``spacy package out_dir dist`` makes an installable package of it.
    ``config_path`` (the fine-tuning config) supplies the encoder-input settings
    the model was trained with. ``ner`` (a trained spaCy pipeline directory)
    replaces the entity ruler: its tokenizer, ``tok2vec`` and ``ner`` are
    sourced (:func:`~spacy_genbioel.ner.source_ner`), giving tokenizer,
    abbreviation_detector, tok2vec, ner, genbioel. ``exact_match``,
    ``candidates``, ``num_candidates``, ``restrict_to_candidates`` and
    ``shortcut_threshold`` set the component's settings of those names (a
    retriever is rebuilt from the KB on first use; nothing extra is stored).
    ``kb_url`` (``"mesh,omim"`` or a template with ``{}``, see
    :func:`spacy_genbioel.visualize.urls.resolve_templates`) records the KB's
    concept pages in ``meta.json`` (``kb_url_templates``) for ``visualize``.
    ``threshold`` is the component's abstention threshold (``[output]``; None:
    link every mention); ``calibration`` (where it came from: see
    :func:`~spacy_genbioel.evaluation.calibration.calibrated_threshold`) goes to
    ``meta.json`` as ``genbioel_calibration``. ``fusion`` (a ``fit-fusion`` JSON file)
    reranks the generator's candidates with its retrievers' (:mod:`~spacy_genbioel.linking.fusion`);
    the pipeline carries it as ``genbioel/fusion.json``."""
    inputs = InputBuilder()
    max_source_tokens = 256
    if config_path:
        stage = load_stage_config(config_path)
        inputs, max_source_tokens = stage.inputs, stage.training.max_source_tokens
        if inputs.max_mention_words != InputBuilder().max_mention_words:
            logger.warning("max_mention_words=%d is not a pipeline setting; the pipeline uses %d",
                           inputs.max_mention_words, InputBuilder().max_mention_words)
    kb = KnowledgeBase.load(kb_path)
    model, tokenizer = load_model(model_dir, device="cpu", dtype="fp32")
    ner_nlp = spacy.load(ner) if ner is not None else None
    if ner_nlp is not None and ner_nlp.lang != lang:
        logger.warning("The NER pipeline's language is %r, not %r: the package uses %r", ner_nlp.lang, lang, ner_nlp.lang)
        lang = ner_nlp.lang
    nlp = spacy.blank(lang)
    source = f"the NER trained in {ner}" if ner is not None else "a dictionary entity source"
    nlp.meta.update({
        "name": name,
        "version": version,
        "description": f"Generative biomedical entity linking (GenBioEL) with {source}",
        "requirements": requirements(),
    })
    if threshold is not None or calibration is not None:
        nlp.meta["genbioel_calibration"] = {"threshold": threshold, **(calibration or {})}
    if kb_url:
        from spacy_genbioel.visualize.urls import resolve_templates

        nlp.meta["kb_url_templates"] = resolve_templates(kb_url)
    extras = ner_extras(ner_nlp) if ner_nlp is not None else []
    if abbreviations:
        if abbreviation_detector_available():
            nlp.add_pipe("abbreviation_detector")
            extras.insert(0, "scispacy")  # the detector is scispacy's
        else:
            logger.warning("scispacy is not installed: the pipeline has no abbreviation detector")
    if fusion is not None and "dense" in FusionModel.load(fusion).sources:
        extras.append("minilm")  # the fusion's dense retriever encodes with all-MiniLM-L6-v2 from that extra
    nlp.meta["requirements"] = requirements(extras=extras)
    if ner_nlp is not None:
        logger.info("Sourced %s from %s", source_ner(nlp, ner_nlp), ner)
    elif entity_ruler:
        n_patterns = add_kb_entity_ruler(nlp, kb, entity_label, min_name_chars)
        logger.info("entity_ruler with %d patterns", n_patterns)
    component = nlp.add_pipe("genbioel", config=component_config(
        inputs, max_source_tokens, num_beams=num_beams, top_k=top_k, exact_match=exact_match, candidates=candidates,
        num_candidates=num_candidates, restrict_to_candidates=restrict_to_candidates,
        shortcut_threshold=shortcut_threshold, threshold=threshold,
    ))
    if fusion is not None:
        component.fusion = FusionModel.load(fusion)
        nlp.meta["genbioel_fusion"] = {"sources": component.fusion.sources, "fit": component.fusion.fit.get("recall", {})}
    component.set_linker(GenerativeLinker(model, tokenizer, kb, inputs=component.inputs, config=component.decoding))
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    nlp.to_disk(out)
    return out


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
