"""The ``genbioel`` spaCy component: links the spans an NER pipe found.

    nlp.add_pipe("genbioel", config={"model": "model_dir", "kb": "kb.jsonl"})

writes ``span._.kb_id`` (top concept ID or None), spaCy's ``span.kb_id_``,
``span._.kb_candidates`` (up to ``top_k`` ``(id, name, score)`` tuples) and
scispacy's ``span._.kb_ents`` (up to ``top_k`` ``(id, score)`` pairs, one per
concept, best first); a span with nothing to link (only control characters,
whitespace or emoji) gets None without being decoded. The ``output`` block
(:class:`~spacy_genbioel.linking.settings.OutputSettings`) sets an abstention
``threshold`` (below it the span keeps its candidates but gets no ID) and the
extension names, so that two linkers (a MeSH and a UMLS one, say) share a
pipeline without overwriting each other; ``component.kb`` is scispacy's
``linker.kb`` (``cui_to_entity``, ``alias_to_cuis``; :mod:`.kb_view`).

Model, tokenizer, KB and trie load lazily on first use (or ``initialize``) and
travel inside the pipeline directory (``to_disk`` copies a model not loaded yet
rather than load it; ``exclude`` leaves parts out, :data:`~.paths.SAVED_PARTS`),
so ``spacy.load(dir)`` works once the original files are gone; a damaged saved
file is refused naming it.

Every setting is defined once, in :mod:`.settings` (one dataclass per config
block); the generator (:class:`~.decoding.decoder.GenerativeLinker`) is built once with
its settings and retriever (``candidates.retriever``: retrieve, then generate),
and ``link`` applies the reranker (``reranker.fusion``) to its candidates.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import srsly  # type: ignore[import-untyped]  # (spaCy's serializer, no stubs)
from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span, SpanGroup
from spacy.util import minibatch

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.kb.compact import CompactKB
from spacy_genbioel.linking.decoding.candidates import make_candidate_generator
from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.inputs.abbreviations import LongForms, doc_long_forms
from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.linking.inputs.released_style import expand_short_forms
from spacy_genbioel.linking.inputs.short_forms import find_short_forms
from spacy_genbioel.linking.kb_view import LinkerKB
from spacy_genbioel.linking.model_inputs import recorded_inputs, warn_on_input_style
from spacy_genbioel.linking.paths import (
    SAVED_PARTS,
    check_resource_paths,
    copy_model_folder,
    copyable_model,
    read_component_cfg,
)
from spacy_genbioel.linking.reranking.beam_width import generator_decoding
from spacy_genbioel.linking.reranking.cascade import LinkPaths, link_with_paths, make_reranker
from spacy_genbioel.linking.reranking.fusion import SHIPPED, FusionFormatError, FusionModel
from spacy_genbioel.linking.reranking.retrieval_only import (
    DEFAULT_RETRIEVAL_FUSION,
    RetrievalOnly,
    build_indexes,
    default_retrieval_fusion,
    retrieval_reranker,
)
from spacy_genbioel.linking.reranking.settings import NO_FUSION, RerankerSettings
from spacy_genbioel.linking.scispacy_compat import warn_on_scispacy_habits, written_candidates
from spacy_genbioel.linking.scorer import ASSIGNS, REQUIRES, SCORE_WEIGHTS, SCORER_CONFIG, bind_scorer
from spacy_genbioel.linking.settings import (
    DEFAULT_CONFIG,
    CandidateSettings,
    ComponentResources,
    DecodingSettings,
    LinkerSettings,
    OutputSettings,
    keep_null_legacy_names_out,
    with_legacy_names,
    written_score,
)
from spacy_genbioel.linking.span_outputs import concept_scores, register_extensions
from spacy_genbioel.linking.trie.name_trie import NameTrie, TrieMismatchError
from spacy_genbioel.models import ModelFileNotFoundError, ModelFormatError, load_model, save_model
from spacy_genbioel.ty import Candidate, Linker, Mention, Reranker
from spacy_genbioel.util import resolve_device, resolve_dtype

logger = logging.getLogger(__name__)

#: the format of :meth:`GenBioELLinker.to_bytes`
BYTES_FORMAT = "genbioel.files.v1"


register_extensions(OutputSettings())  # the default names exist once the package is imported


@Language.factory(
    "genbioel",
    default_config={**DEFAULT_CONFIG, "scorer": SCORER_CONFIG},
    assigns=ASSIGNS,
    requires=REQUIRES,
    default_score_weights=SCORE_WEIGHTS,
)
def make_genbioel(
    nlp: Language,
    name: str,
    *,
    model: Optional[str],
    tokenizer: Optional[str],
    kb: Optional[str],
    kb_normalizer: str,
    kb_dedup: bool,
    labels: List[str],
    spans_key: Optional[str],
    device: str,
    dtype: str,
    resolve_abbreviations: bool,
    recorded_inputs: bool,
    inputs: InputBuilder,
    decoding: DecodingSettings,
    candidates: Union[CandidateSettings, str],
    output: OutputSettings,
    reranker: RerankerSettings,
    scorer: Optional[Callable] = None,
    **legacy: Any,
) -> "GenBioELLinker":
    """The ``genbioel`` factory, in spaCy's manner: one keyword per top-level setting and one per
    config block; their defaults are the factory's ``default_config`` (:data:`~.settings.DEFAULT_CONFIG`).

    The top level names the resources (:class:`~.settings.ComponentResources`: ``model``,
    ``tokenizer``, ``kb``, ``kb_normalizer``, ``kb_dedup``, ``labels``, ``spans_key``, ``device``,
    ``dtype``, ``resolve_abbreviations``, ``recorded_inputs``); the behaviour is in the blocks
    ``inputs`` (:class:`~.inputs.builder.InputBuilder`), ``decoding``
    (:class:`~.decoding.decoder.DecodingSettings`), ``candidates``
    (:class:`~.decoding.candidates.CandidateSettings`), ``output`` (:class:`~.settings.OutputSettings`)
    and ``reranker`` (:class:`~.reranking.settings.RerankerSettings`), where each setting is defined once.

    ``legacy``: the flat settings of pipelines saved by spacy_genbioel 0.1 (``num_beams = 4``,
    ``candidates = "tfidf"``) and 0.2 (``fusion``), mapped onto their block where the block holds its
    default (:data:`~.settings.LEGACY_SETTINGS`), and scispacy's ``EntityLinker`` arguments, answered
    with where their meaning lives here; None: not given. spaCy accepts only parameters, so these
    names are keyword parameters of the signature it validates against (:func:`~.settings.with_legacy_names`)."""
    resources = ComponentResources(
        model=model,
        tokenizer=tokenizer,
        kb=kb,
        kb_normalizer=kb_normalizer,
        kb_dedup=kb_dedup,
        labels=labels,
        spans_key=spans_key,
        device=device,
        dtype=dtype,
        resolve_abbreviations=resolve_abbreviations,
        recorded_inputs=recorded_inputs,
    )
    blocks = {"inputs": inputs, "decoding": decoding, "candidates": candidates, "output": output, "reranker": reranker}
    settings = LinkerSettings.from_config({**dataclasses.asdict(resources), **blocks, **legacy})
    keep_null_legacy_names_out(nlp)  # the saved config.cfg holds no `num_beams = null` lines
    check_resource_paths(nlp, name, settings.resources)  # at add_pipe, not on the first document
    warn_on_shared_outputs(nlp, name, settings.output)
    warn_on_scispacy_habits(name, settings)
    component = GenBioELLinker(nlp.vocab, name, settings)
    component.scorer = bind_scorer(scorer, settings.output, settings.resources.spans_key)  # nlp.evaluate (.scorer)
    return component


def warn_on_shared_outputs(nlp: Language, name: str, output: OutputSettings) -> None:
    """Warn when another ``genbioel`` component of ``nlp`` writes the same span extensions or
    ``span.kb_id_``: the later one would overwrite the earlier one's results."""
    for other_name, other in nlp.components:
        if not isinstance(other, GenBioELLinker) or other_name == name:
            continue
        shared = sorted(set(output.attrs) & set(other.output.attrs))
        if output.write_kb_id and other.output.write_kb_id:
            shared.append("span.kb_id_")
        if shared:
            logger.warning(
                "Components %r and %r both write %s: the later overwrites the earlier. Give one of them other "
                "names and write_kb_id = false in its [output] block (docs/scispacy.md, 'Several linkers')",
                other_name,
                name,
                ", ".join(shared),
            )


# what spaCy validates a config against: the parameters above and the legacy names ``**legacy`` takes
make_genbioel.__signature__ = with_legacy_names(inspect.signature(make_genbioel))


class GenBioELLinker(Pipe):
    """Links the spans of a doc; its settings are one :class:`~.settings.LinkerSettings`."""

    scorer: Optional[Callable[..., Dict[str, Any]]]  # spaCy's Pipe.score calls it (set by the factory)

    def __init__(self, vocab, name: str = "genbioel", settings: Optional[LinkerSettings] = None) -> None:
        self.vocab = vocab
        self.name = name
        self.settings = settings or LinkerSettings()
        #: score fusion (:mod:`.reranking.fusion`): read from ``reranker.fusion`` now; a saved pipeline
        #: carries its own as fusion.json (read by from_disk unless the setting names another)
        self.fusion: Optional[FusionModel] = None
        # a configured fusion file that is gone: a saved pipeline's from_disk uses its own fusion.json
        # instead (as it does for the model and KB); anything else raises this on first use
        self._fusion_missing: Optional[FusionFormatError] = None
        fusion_path = self.settings.reranker.fusion
        if self.settings.reranker.enabled and fusion_path:  # "none": no fusion, not even a saved one
            try:
                self.fusion = FusionModel.load(fusion_path)
            except FusionFormatError as err:
                if str(fusion_path).startswith(SHIPPED) or Path(fusion_path).exists():
                    raise
                self._fusion_missing = err
        register_extensions(self.output)
        self._linker: Optional[GenerativeLinker] = None
        self._reranker: Optional[Reranker] = None
        #: mentions linked per path (:data:`~.reranking.cascade.PATHS`: ``early``, ``retrieval``, ``forced``,
        #: ``beam``, ``none``)
        self.stats: Counter = Counter()
        self._kb_view: Optional[LinkerKB] = None

    # -- settings (read-only views of self.settings) ------------------------------
    @property
    def inputs(self) -> InputBuilder:
        return self.settings.inputs

    @property
    def decoding(self) -> DecodingSettings:
        return self.settings.decoding

    @property
    def candidates(self) -> CandidateSettings:
        return self.settings.candidates

    @property
    def output(self) -> OutputSettings:
        return self.settings.output

    @property
    def spans_key(self) -> Optional[str]:
        return self.settings.resources.spans_key

    # -- resources -------------------------------------------------------------
    @property
    def linker(self) -> GenerativeLinker:
        """The generator (model, tokenizer, KB, trie and retriever), loaded on first use."""
        if self._linker is None:
            self.initialize()
        assert self._linker is not None
        return self._linker

    @property
    def reranker(self) -> Optional[Reranker]:
        """The fusion (:class:`~.reranking.fusion.FusionReranker`) or the cascade
        (:class:`~.reranking.cascade.CascadeReranker`); None: neither."""
        self.linker  # noqa: B018  (built with the linker)
        return self._reranker

    def build_indexes(self) -> None:
        """Build every retriever's index now (the fusion's or cascade's, and the generator's candidate
        retriever), not at the first document: a process that forks workers after this shares them."""
        from spacy_genbioel.ty import Mention

        linker = self.linker
        if self._reranker is not None:
            build_indexes(self._reranker)
        retriever = getattr(linker, "retriever", None)
        if retriever is not None:
            retriever.link([Mention(text="index")], 1)

    def to_device(self, device: str) -> None:
        """Move the generator to ``device`` (``cpu``, ``cuda``, ``cuda:N``), in the ``dtype`` setting as
        resolved there (``auto``: bfloat16 on a GPU that has it): a forked annotate worker takes its GPU
        so, from a pipeline its parent loaded on the CPU without touching CUDA. The retrievers stay on
        their own devices (their settings')."""
        model = getattr(self.linker, "model", None)
        if model is None:  # retrieval alone: nothing runs on the device
            return
        dev = resolve_device(device)
        dtype = self.settings.resources.dtype
        if dtype == "int8":  # quantized for the CPU, where it is
            if dev.type != "cpu":
                raise ValueError(
                    f"dtype 'int8' (dynamic quantization) runs on CPU only, not on {dev}; use bf16 on a GPU"
                )
        else:
            model.to(device=dev, dtype=resolve_dtype(dtype, dev))
        self.settings = self.settings.replace(resources=dataclasses.replace(self.settings.resources, device=device))

    def clear_caches(self) -> None:
        """Forget the retrieved candidates kept by mention text (``reranker.retrieval_cache``)."""
        fusion = getattr(self._reranker, "fusion", self._reranker)
        if fusion is not None and hasattr(fusion, "clear_cache"):
            fusion.clear_cache()

    def use_clock(self, clock: Any) -> None:
        """Time the generator's stages (``tokenize``, ``encoder``, ``decoder``, ``trie``, ``beam``) and
        each retriever (``retrieval:<source>``) on ``clock``, a
        :class:`~.decoding.stages.StageClock` (None: stop timing). The annotate job's accounting."""
        linker = self.linker
        if hasattr(linker, "clock"):
            linker.clock = clock
        fusion = getattr(self._reranker, "fusion", self._reranker)
        if fusion is not None and hasattr(fusion, "clock"):
            fusion.clock = clock

    @property
    def kb(self) -> LinkerKB:
        """scispacy's ``linker.kb``: ``cui_to_entity[cui]`` (an :class:`~spacy_genbioel.linking.kb_view.Entity`),
        ``alias_to_cuis[alias]``, and the KB itself as ``knowledge_base``; views, nothing copied."""
        kb = self.linker.kb
        if self._kb_view is None or self._kb_view.knowledge_base is not kb:
            self._kb_view = LinkerKB(kb)
        return self._kb_view

    def initialize(
        self,
        get_examples: Optional[Callable[[], Iterable]] = None,
        *,
        nlp: Optional[Language] = None,
        model: Optional[str] = None,
        kb: Optional[str] = None,
    ) -> None:
        """Load model, tokenizer and KB from the configured (or given) paths and build the trie."""
        res = self.settings.resources
        model_path = model or res.model
        kb_path = kb or res.kb
        if not kb_path:
            raise ValueError(
                f"The '{self.name}' component has no KB: set config 'kb' (a path; 'model' too for the "
                "generator, without it the retrievers link), or load a saved pipeline with spacy.load"
            )
        kb_obj = KnowledgeBase.load(kb_path, normalizer=res.kb_normalizer, dedup=res.kb_dedup)
        if not model_path:
            self.set_kb(kb_obj)
            return
        hf_model, tokenizer = load_model(model_path, res.tokenizer, device=resolve_device(res.device), dtype=res.dtype)
        self.set_model(hf_model, tokenizer, kb_obj)

    def set_model(self, model: Any, tokenizer: Any, kb: KnowledgeBase, trie: Optional[NameTrie] = None) -> None:
        """Link with an already loaded model, tokenizer and KB (a model fresh from training, say): the
        generator is built once, with this component's settings, retriever and reranker. A ``trie``
        that no longer fits them is rebuilt from the KB with a warning saying why."""
        if self._fusion_missing is not None:
            raise self._fusion_missing
        self.settings = recorded_inputs(self.name, model, self.settings)
        warn_on_input_style(self.name, model, self.inputs)
        candidates = self.candidates
        retriever = make_candidate_generator(candidates.retriever, kb, model=candidates.model)
        # the one place the beam width is decided (decoding.num_beams, reranker.generator_beams, the fusion file)
        decoding = generator_decoding(self.decoding, self.settings.reranker, self.fusion, self.name)
        parts: Dict[str, Any] = dict(inputs=self.inputs, decoding=decoding, candidates=candidates, retriever=retriever)
        try:
            linker = GenerativeLinker(model, tokenizer, kb, trie, **parts)
        except TrieMismatchError as err:
            logger.warning("%s; rebuilding it from the KB with this tokenizer", err)
            linker = GenerativeLinker(model, tokenizer, kb, None, **parts)
        self._linker, self._reranker = linker, self._make_reranker(kb, linker)

    def set_kb(self, kb: KnowledgeBase) -> None:
        """Link with no generator: the retrievers over ``kb``, fused by ``reranker.fusion`` (a
        retrieval-only one) or the package's default (:mod:`.reranking.retrieval_only`), which a saved
        pipeline then carries as its own fusion.json."""
        if self._fusion_missing is not None:
            raise self._fusion_missing
        if self.settings.reranker.fusion == NO_FUSION:
            raise ValueError(
                f"The '{self.name}' component has no model: its retrievers link through a fusion, so "
                f"reranker.fusion = {NO_FUSION!r} leaves nothing to link with (give a fusion file, or null for "
                "the pipeline's own)"
            )
        if self.fusion is None:
            self.fusion = default_retrieval_fusion()
            logger.info(
                "The '%s' component has no model: linking with the retrievers, fused by %s",
                self.name,
                DEFAULT_RETRIEVAL_FUSION,
            )
        reranker = retrieval_reranker(
            self.fusion,
            kb,
            lambda source, model: make_candidate_generator(source, kb, model=model),
            self.settings.reranker,
            self.name,
        )
        self._linker, self._reranker = RetrievalOnly(kb), reranker  # type: ignore[assignment]

    @property
    def has_model(self) -> bool:
        """Whether a generator links (False: the retrievers alone, :meth:`set_kb`)."""
        return not isinstance(self.linker, RetrievalOnly)

    def set_linker(self, linker: Linker) -> None:
        """Link with ``linker`` as it is: any :class:`~spacy_genbioel.ty.Linker` (a retriever, for
        end-to-end comparisons); this component's retriever and reranker are not added to it."""
        self._linker, self._reranker = linker, None  # type: ignore[assignment]

    def _make_reranker(self, kb: KnowledgeBase, linker: GenerativeLinker) -> Optional[Reranker]:
        """The fusion (or the cascade) over this KB with its retrievers (built lazily)."""
        if (
            self.fusion is not None
            and (self.decoding.exact_match or self.candidates.shortcut_threshold is not None or self.candidates.enabled)
            and self.settings.reranker.cascade == "off"
        ):
            logger.warning(
                "The '%s' fusion was fitted on free decoding; exact_match, shortcut_threshold and "
                "candidates change the generator's lists it reads",
                self.name,
            )
        return make_reranker(
            self.fusion,
            kb,
            linker,
            self.settings.reranker,
            lambda source, model: make_candidate_generator(source, kb, model=model),
        )

    def link(self, mentions: Sequence[Mention], top_k: Optional[int] = None) -> List[List[Candidate]]:
        """Ranked candidates per mention, as the component writes them: the generator's, reranked by
        the fusion, or the cascade's (a :class:`~spacy_genbioel.ty.Linker`)."""
        return self.link_paths(mentions, top_k)[0]

    def link_paths(self, mentions: Sequence[Mention], top_k: Optional[int] = None) -> LinkPaths:
        """:meth:`link`, with each mention's path (:data:`~.reranking.cascade.PATHS`), counted in ``stats``."""
        results, paths = link_with_paths(self.linker, self._reranker, mentions, top_k or self.decoding.top_k)
        # [output] probability and filter_for_definitions (scispacy's meaning: .scispacy_compat)
        results = written_candidates(results, self.output, getattr(self.linker, "kb", None), self._reranker is not None)
        self.stats.update(paths)
        return results, paths

    # -- processing -------------------------------------------------------------
    def __call__(self, doc: Doc) -> Doc:
        self._process([doc])
        return doc

    def pipe(self, stream: Iterable[Doc], *, batch_size: int = 128) -> Iterator[Doc]:
        for docs in minibatch(stream, size=batch_size):
            self._process(docs)
            yield from docs

    def _spans(self, doc: Doc) -> List[Span]:
        spans = list(doc.ents) if self.spans_key is None else list(doc.spans.get(self.spans_key, []))
        labels = self.settings.resources.labels
        return [s for s in spans if not labels or s.label_ in labels]

    def _mention(self, text_of_doc: str, span: Span, forms: "LongForms", doc_key: str = "") -> Mention:
        # ``text_of_doc``: ``doc.text``, read once per document (spaCy joins every token's text each time)
        # enough characters for the context window without copying huge documents; in
        # document mode, for a window of the document (the linker pieces the contexts together)
        if self.inputs.input_mode == "document":
            window = self.decoding.max_source_tokens * 16
        else:
            window = max(self.inputs.window_words, 1) * 30
        if forms.inside:
            text = expand_short_forms(span.text, forms.inside)
        else:
            text = forms.by_span.get((span.start_char, span.end_char)) or forms.by_text.get(span.text) or span.text
        return Mention(
            text=text,
            left=text_of_doc[max(0, span.start_char - window) : span.start_char],
            right=text_of_doc[span.end_char : span.end_char + window],
            doc_id=doc_key,
            start=span.start_char,
            end=span.end_char,
            label=span.label_,
        )

    def _abbreviations(self, doc: Doc) -> "LongForms":
        """Long forms from scispacy's abbreviation_detector, when it ran; for the ncbi released
        style, the document's short forms, expanded word by word inside each mention as BioSyn's
        preprocessing did (:func:`~.inputs.released_style.expand_short_forms`)."""
        if not self.settings.resources.resolve_abbreviations:
            return LongForms()
        rules = self.inputs.released
        if rules is not None and rules.biosyn:
            return LongForms(inside=find_short_forms(doc.text))
        if not Doc.has_extension("abbreviations"):
            return LongForms()
        return LongForms(*doc_long_forms(doc))

    def _process(self, docs: Sequence[Doc]) -> None:
        self.linker  # noqa: B018  (fail on the first call, not on the first entity)
        spans_per_doc = [self._spans(doc) for doc in docs]
        mentions: List[Mention] = []
        for k, (doc, spans) in enumerate(zip(docs, spans_per_doc)):
            forms = self._abbreviations(doc)
            # which document a mention is in: what per-document input groups by
            key = f"<doc {k} of batch>"
            text_of_doc = doc.text if spans else ""
            mentions.extend(self._mention(text_of_doc, s, forms, key) for s in spans)
        results, paths = self.link_paths(mentions) if mentions else ([], [])
        cursor = 0
        for doc, spans in zip(docs, spans_per_doc):
            for span, path in zip(spans, paths[cursor : cursor + len(spans)]):
                span._.link_path = path
            self._write(doc, spans, results[cursor : cursor + len(spans)])
            cursor += len(spans)

    def _write(self, doc: Doc, spans: List[Span], results: List[List[Candidate]]) -> None:
        if not spans:
            return
        out, top_k = self.output, self.decoding.top_k
        linked: Dict[Tuple[int, int, str], str] = {}
        for span, candidates in zip(spans, results):
            top = candidates[0] if candidates and candidates[0].ids else None
            kb_id = top.ids[0] if top is not None and out.links(top.score) else None
            span._.set(out.kb_id_attr, kb_id)
            # one tuple per concept ID (a name may map to several), at most top_k
            span._.set(
                out.candidates_attr,
                [(cid, c.name, written_score(c.score)) for c in candidates for cid in c.ids][:top_k],
            )
            span._.set(out.ents_attr, concept_scores(candidates, top_k))
            linked[(span.start, span.end, span.label_)] = kb_id or ""
        if not out.write_kb_id:
            return
        # spaCy's own kb_id lives on the stored spans, so rebuild them with it
        if self.spans_key is None:
            doc.ents = [
                Span(doc, e.start, e.end, label=e.label, kb_id=linked.get((e.start, e.end, e.label_), e.kb_id_))
                for e in doc.ents
            ]
        else:
            group = doc.spans[self.spans_key]
            doc.spans[self.spans_key] = SpanGroup(
                doc,
                name=self.spans_key,
                attrs=group.attrs,
                spans=[
                    Span(doc, s.start, s.end, label=s.label, kb_id=linked.get((s.start, s.end, s.label_), s.kb_id_))
                    for s in group
                ],
            )

    # -- serialization ---------------------------------------------------------------
    def to_disk(self, path, *, exclude: Iterable[str] = tuple()) -> None:
        """Write cfg.json and the parts of :data:`SAVED_PARTS` the component has, but those in
        ``exclude`` (spaCy's convention: ``exclude=["model"]`` writes no model). Nothing is loaded
        to be saved: a component not used yet copies its configured model folder (one
        :func:`~spacy_genbioel.models.save_model` wrote) and writes its KB, and its trie is built
        when the pipeline is loaded (``nlp.initialize()`` first saves the trie too); a model folder
        of another kind (a released checkpoint, a separate tokenizer) is loaded once to be written
        in the package's format."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        skip = set(exclude)
        res = self.settings.resources
        if self._linker is None and res.model and "model" not in skip and not copyable_model(res.model, res.tokenizer):
            logger.info("Loading %s to save it as safetensors with its tokenizer", res.model)
            self.initialize()
        meta: Dict[str, Any] = {"kb_normalizer": res.kb_normalizer, "kb_dedup": res.kb_dedup, "has_linker": False}
        parts: List[str] = []
        kb: Optional[KnowledgeBase] = None
        if self._linker is not None:
            lk = self._linker
            meta.update(has_linker=True, has_model=not isinstance(lk, RetrievalOnly))
            if meta["has_model"] and "model" not in skip:
                save_model(lk.model, lk.tokenizer, path / "model")
                parts.append("model")
            if meta["has_model"] and "trie" not in skip:
                lk.trie.to_disk(path / "trie.safetensors")
                parts.append("trie")
            kb = lk.kb
        elif res.kb:  # not used yet: its configured files, the model copied, not loaded
            meta.update(has_linker=True, has_model=bool(res.model))
            if res.model and "model" not in skip:
                copy_model_folder(res.model, path / "model")
                parts.append("model")
            if "kb" not in skip:
                kb = KnowledgeBase.load(res.kb, normalizer=res.kb_normalizer, dedup=res.kb_dedup)
        if kb is not None and "kb" not in skip:
            kb.to_jsonl(path / "kb.jsonl")
            # the same KB as arrays, which from_disk maps instead of parsing kb.jsonl
            CompactKB.from_kb(kb).save(path / "kb.safetensors", jsonl=path / "kb.jsonl")
            meta["kb_checksum"] = kb.checksum()
            parts.append("kb")
        if self.fusion is not None and "fusion" not in skip:
            self.fusion.bundled(path).save(path / "fusion.json")  # with its retrievers' trained models, if any
            # the configured path the copy came from: from_disk then reads the copy, not that path again
            meta["fusion_config"] = self.settings.reranker.fusion
            parts.append("fusion")
        elif self.fusion is None and (path / "fusion.json").exists():
            (path / "fusion.json").unlink()
        meta["parts"] = parts
        (path / "cfg.json").write_text(json.dumps(meta, indent=2), encoding="utf8")

    def to_bytes(self, *, exclude: Iterable[str] = tuple()) -> bytes:
        """:meth:`to_disk`'s files (but the parts in ``exclude``) as one msgpack map, file name -> bytes: no
        archive, and one format read by one set of checks (the model's weights are its safetensors file,
        the tokenizer's fingerprint, the KB's checksum). The whole model is held in memory, twice while it
        is packed: for a GB-size model, :meth:`to_disk` is the way."""
        with tempfile.TemporaryDirectory() as tmp:
            self.to_disk(tmp, exclude=exclude)
            root = Path(tmp)
            files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        return srsly.msgpack_dumps({"format": BYTES_FORMAT, "files": files})

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = tuple()) -> "GenBioELLinker":
        """Load what :meth:`to_bytes` wrote (but the parts in ``exclude``), as :meth:`from_disk` loads a folder."""
        data = srsly.msgpack_loads(bytes_data)
        if not isinstance(data, dict) or data.get("format") != BYTES_FORMAT or not isinstance(data.get("files"), dict):
            raise ModelFormatError(f"not a serialized genbioel component (format {BYTES_FORMAT} expected)")
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp).resolve()
            for name, content in data["files"].items():
                target = (root / name).resolve()
                if root not in target.parents or not isinstance(content, bytes):
                    raise ModelFormatError(f"serialized genbioel component: bad file entry {name!r}")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            return self.from_disk(root, exclude=exclude)

    def from_disk(self, path, *, exclude: Iterable[str] = tuple()) -> "GenBioELLinker":
        """Load what :meth:`to_disk` wrote, but the parts in ``exclude``. A missing or damaged file raises
        :class:`~spacy_genbioel.models.hf.ModelFormatError` (or, for the KB,
        :class:`~spacy_genbioel.kb.base.KBFormatError`) naming it; a trie that no longer fits the KB or
        tokenizer beside it is rebuilt with a warning, one saved without a trie gets it built. The KB
        and the trie are memory-mapped, not read (``kb.safetensors``; a pipeline saved before it existed
        has only ``kb.jsonl``, read as before). Without its model or KB (excluded, or not saved), the
        component keeps its configured paths and loads from them on first use."""
        path = Path(path)
        skip = set(exclude)
        meta = read_component_cfg(path / "cfg.json")
        if not meta.get("has_linker"):
            return self
        # the parts it was saved with (a pipeline saved before parts were named holds all); a file of one is
        # read whenever it is there and not excluded, so a damaged one is named
        parts = set(meta.get("parts", SAVED_PARTS))
        files = {"model": ("model",), "kb": ("kb.jsonl", "kb.safetensors")}
        kept = {
            part
            for part, names in files.items()
            if part not in skip and (part in parts or any((path / name).exists() for name in names))
        }
        res = dataclasses.replace(
            self.settings.resources, kb_normalizer=meta["kb_normalizer"], kb_dedup=meta["kb_dedup"]
        )
        self.settings = self.settings.replace(resources=res)
        if "fusion" not in skip:
            self._read_saved_fusion(path, meta)
        has_model = meta.get("has_model", True)
        if "kb" not in kept or (has_model and "model" not in kept):
            logger.info("%s: no saved model or KB read; the component loads its configured ones on first use", path)
            return self
        kb_file = "kb.jsonl" if not (path / "kb.safetensors").exists() else "kb.safetensors"
        for name in (kb_file, "model") if has_model else (kb_file,):
            if not (path / name).exists():
                raise ModelFileNotFoundError(f"{path / name} not found: the saved component is incomplete")
        kb = self._saved_kb(path)
        if not has_model:
            self.set_kb(kb)
            return self
        hf_model, tokenizer = load_model(path / "model", device=resolve_device(res.device), dtype=res.dtype)
        self.set_model(hf_model, tokenizer, kb, self._saved_trie(path, kb, meta, "trie" not in skip))
        return self

    def _read_saved_fusion(self, path: Path, meta: Dict[str, Any]) -> None:
        """The pipeline's own fusion.json, unless ``reranker.fusion`` names another file (or ``none``)."""
        configured = self.settings.reranker.fusion
        own = configured is None or configured == meta.get("fusion_config") or self._fusion_missing is not None
        if own and (path / "fusion.json").exists():
            if self._fusion_missing is not None:
                logger.warning(
                    "%s not found: using the fusion saved with the pipeline, %s", configured, path / "fusion.json"
                )
            self.fusion = FusionModel.load(path / "fusion.json")
            self._fusion_missing = None

    def _saved_trie(self, path: Path, kb: KnowledgeBase, meta: Dict[str, Any], wanted: bool) -> Optional[NameTrie]:
        """``trie.safetensors`` when it is there and was built on this KB; None: built from the KB."""
        trie_file = path / "trie.safetensors"
        if not wanted or not trie_file.exists():
            if wanted and "trie" in meta.get("parts", SAVED_PARTS):
                logger.warning("%s not found; building the trie from the KB", trie_file)
            return None
        if kb.checksum() != meta.get("kb_checksum"):
            logger.warning("KB in %s changed since the trie was built; rebuilding the trie", path)
            return None
        return NameTrie.from_disk(trie_file)

    def _saved_kb(self, path: Path) -> KnowledgeBase:
        """``kb.safetensors`` memory-mapped when it is there and ``kb.jsonl`` beside it is the
        file it was written with; else ``kb.jsonl`` parsed (pipelines saved before 0.2)."""
        compact, jsonl = path / "kb.safetensors", path / "kb.jsonl"
        res = self.settings.resources
        kwargs: Dict[str, Any] = {"normalizer": res.kb_normalizer, "dedup": res.kb_dedup}
        if compact.exists():
            kb = CompactKB.open(compact, **kwargs)
            if not jsonl.exists():
                logger.warning("%s not found; using %s", jsonl, compact)
                return kb
            if kb.matches_jsonl(jsonl):
                return kb
            logger.warning("%s changed since %s was written; reading %s", jsonl, compact, jsonl)
        return KnowledgeBase.load(jsonl, **kwargs)
