"""The ``genbioel`` spaCy component: links the spans an NER pipe found.

    nlp.add_pipe("genbioel", config={"model": "model_dir", "kb": "kb.jsonl"})

writes ``span._.kb_id`` (top concept ID or None), spaCy's ``span.kb_id_``,
``span._.kb_candidates`` (up to ``top_k`` ``(id, name, score)`` tuples) and
scispacy's ``span._.kb_ents`` (up to ``top_k`` ``(id, score)`` pairs, one per
concept, best first); a span with nothing to link (only control characters,
whitespace or emoji) gets None without being decoded. The ``output`` block
(:func:`~spacy_genbioel.linking.settings.make_output`) sets an abstention
``threshold`` (below it the span keeps its candidates but gets no ID) and the
extension names, so that two linkers (a MeSH and a UMLS one, say) share a
pipeline without overwriting each other; ``component.kb`` is scispacy's
``linker.kb`` (``cui_to_entity``, ``alias_to_cuis``; :mod:`.kb_view`).

Model, tokenizer, KB and trie load lazily on first use
(or ``initialize``, or ``to_disk``), and travel inside the pipeline directory,
so ``spacy.load(dir)`` works once the original files are gone; a damaged saved
file is refused naming it.

Retrieve, then generate: ``candidates`` names a registered candidate generator
(``"none"``, ``"tfidf"``, ``"dense"``; see :mod:`spacy_genbioel.linking.candidates`),
built from the component's KB on first use; each mention's beam search is then
limited to the names of the concepts among its ``num_candidates`` retrieved
candidates. ``exact_match`` puts a KB name equal to the normalized mention first;
``shortcut_threshold`` does the same for a retrieved candidate scoring at least
that much, and ``restrict_to_candidates = false`` keeps the generator for that
shortcut only (retrieve the easy mentions, generate the hard ones).
"""
from __future__ import annotations

import inspect
import io
import json
import logging
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from spacy.language import Language
from spacy.pipeline import Pipe
from spacy.tokens import Doc, Span, SpanGroup
from spacy.util import minibatch

from spacy_genbioel.linking.abbreviations import doc_long_forms
from spacy_genbioel.linking.candidates import make_candidate_generator
from spacy_genbioel.linking.decoder import GenerativeLinker
from spacy_genbioel.linking.fusion import FusionFormatError, FusionModel, FusionReranker
from spacy_genbioel.linking.inputs import InputBuilder
from spacy_genbioel.linking.settings import (
    DEFAULT_CONFIG,
    LEGACY_SETTINGS,
    CandidateSettings,
    DecodingConfig,
    OutputSettings,
    apply_legacy,
    decoding_with_candidates,
    make_candidates,
    written_score,
)
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.kb.compact import CompactKB
from spacy_genbioel.linking.kb_view import LinkerKB
from spacy_genbioel.ty import Candidate, Mention
from spacy_genbioel.kb.normalizers import get_normalizer
from spacy_genbioel.models import ModelFileNotFoundError, ModelFormatError, load_model, save_model
from spacy_genbioel.util import parse_json, read_text, resolve_device
from spacy_genbioel.linking.trie import NameTrie

logger = logging.getLogger(__name__)


def register_extensions(output: OutputSettings) -> None:
    """The span extensions ``output`` names (kept when they exist: scispacy registers ``kb_ents`` too)."""
    for attr, default in zip(output.attrs, (None, None, [])):
        if not Span.has_extension(attr):
            Span.set_extension(attr, default=default)


register_extensions(OutputSettings())  # the default names exist once the package is imported


def make_genbioel(
    nlp: Language,
    name: str,
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
    inputs: InputBuilder,
    decoding: DecodingConfig,
    candidates: Union[CandidateSettings, str],
    output: OutputSettings = OutputSettings(),
    fusion: Optional[str] = None,
    **legacy: Any,
) -> "GenBioELLinker":
    """The ``genbioel`` factory: resources at the top level, behaviour in the
    ``inputs``, ``decoding`` and ``candidates`` blocks (:mod:`.settings`).

    A pipeline saved by spacy_genbioel 0.1 names flat settings (``num_beams``,
    ``candidates = "tfidf"``, ...): they are accepted and mapped onto the blocks,
    so it loads and links as it did. A pipeline saved before the ``output`` block
    existed gets its defaults (no threshold, the usual attribute names)."""
    warn_on_shared_outputs(nlp, name, output)
    if isinstance(candidates, str):  # 0.1: the retriever's name at the top level
        candidates = make_candidates(retriever=candidates)
    inputs, decoding, candidates = apply_legacy(legacy, inputs, decoding, candidates)
    return GenBioELLinker(
        nlp.vocab,
        name=name,
        model_path=model,
        tokenizer_path=tokenizer,
        kb_path=kb,
        kb_normalizer=kb_normalizer,
        kb_dedup=kb_dedup,
        inputs=inputs,
        decoding=decoding_with_candidates(decoding, candidates),
        labels=labels,
        spans_key=spans_key,
        device=device,
        dtype=dtype,
        resolve_abbreviations=resolve_abbreviations,
        candidates=candidates.retriever,
        candidates_model=candidates.model,
        output=output,
        fusion_path=fusion,
    )


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
                other_name, name, ", ".join(shared))


# 0.1's flat settings stay accepted (None: not given), without showing in the factory's code
make_genbioel.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    list(inspect.signature(make_genbioel).parameters.values())[:-1]
    + [inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Optional[Any]) for key in LEGACY_SETTINGS]
)
Language.factory("genbioel", default_config=DEFAULT_CONFIG)(make_genbioel)


class GenBioELLinker(Pipe):
    def __init__(
        self,
        vocab,
        name: str = "genbioel",
        *,
        model_path: Optional[str] = None,
        tokenizer_path: Optional[str] = None,
        kb_path: Optional[str] = None,
        kb_normalizer: str = "genbioel",
        kb_dedup: bool = False,
        inputs: Optional[InputBuilder] = None,
        decoding: Optional[DecodingConfig] = None,
        labels: Sequence[str] = (),
        spans_key: Optional[str] = None,
        device: str = "auto",
        dtype: str = "auto",
        resolve_abbreviations: bool = True,
        candidates: str = "none",
        candidates_model: Optional[str] = None,
        output: Optional[OutputSettings] = None,
        fusion_path: Optional[str] = None,
    ) -> None:
        self.vocab = vocab
        self.name = name
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.kb_path = kb_path
        self.kb_normalizer = kb_normalizer
        self.kb_dedup = kb_dedup
        self.inputs = inputs or InputBuilder()
        self.decoding = decoding or DecodingConfig()
        self.link_labels = set(labels)
        self.spans_key = spans_key
        self.device = device
        self.dtype = dtype
        self.resolve_abbreviations = resolve_abbreviations
        self.candidates = candidates
        self.candidates_model = candidates_model
        self.output = output or OutputSettings()
        #: score fusion (:mod:`.fusion`): a fusion JSON file to read on initialize; a saved
        #: pipeline carries its own as fusion.json (read by from_disk unless this names another)
        self.fusion_path = fusion_path
        self.fusion: Optional[FusionModel] = None
        # a configured fusion file that is gone: a saved pipeline's from_disk uses its own fusion.json
        # instead (as it does for the model and KB); anything else raises this on first use
        self._fusion_missing: Optional[FusionFormatError] = None
        if fusion_path:
            try:
                self.fusion = FusionModel.load(fusion_path)
            except FusionFormatError as err:
                if Path(fusion_path).exists():
                    raise
                self._fusion_missing = err
        register_extensions(self.output)
        self._linker: Optional[GenerativeLinker] = None
        self._kb_view: Optional[LinkerKB] = None

    # -- resources -------------------------------------------------------------
    @property
    def linker(self) -> GenerativeLinker:
        if self._linker is None:
            self.initialize()
        assert self._linker is not None
        return self._linker

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
        model_path = model or self.model_path
        kb_path = kb or self.kb_path
        if not model_path or not kb_path:
            raise ValueError(
                f"The '{self.name}' component has no model or KB: set config 'model' and 'kb' "
                "(paths), or load a saved pipeline with spacy.load"
            )
        kb_obj = KnowledgeBase.load(kb_path, normalizer=self.kb_normalizer, dedup=self.kb_dedup)
        hf_model, tokenizer = load_model(model_path, self.tokenizer_path, device=resolve_device(self.device), dtype=self.dtype)
        self._linker = self._with_candidates(GenerativeLinker(hf_model, tokenizer, kb_obj, inputs=self.inputs, config=self.decoding))

    def set_linker(self, linker: GenerativeLinker) -> None:
        """Use an already built linker (for example one fresh from training)."""
        self._linker = self._with_candidates(linker)

    def _with_candidates(self, linker: GenerativeLinker) -> GenerativeLinker:
        """Give the linker the configured candidate generator and fusion retrievers (lazy: fitted on first use)."""
        if self._fusion_missing is not None:
            raise self._fusion_missing
        generator = make_candidate_generator(self.candidates, linker.kb, model=self.candidates_model)
        if generator is not None:
            linker.candidate_generator = generator
        linker.reranker = None
        if self.fusion is not None:
            linker.reranker = FusionReranker(self.fusion, linker.kb, {
                source: make_candidate_generator(source, linker.kb, model=self.fusion.retrievers.get(source, {}).get("model"))
                for source in self.fusion.retriever_sources})
            if self.decoding.exact_match or self.decoding.shortcut_threshold is not None or self.candidates != "none":
                logger.warning("The '%s' fusion was fitted on free decoding; exact_match, shortcut_threshold and "
                               "candidates change the generator's lists it reads", self.name)
        return linker

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
        return [s for s in spans if not self.link_labels or s.label_ in self.link_labels]

    def _mention(self, doc: Doc, span: Span, long_forms: Dict[Tuple[int, int], str], by_text: Dict[str, str],
                 doc_key: str = "") -> Mention:
        # enough characters for the context window without copying huge documents; in
        # document mode, for a window of the document (the linker pieces the contexts together)
        if self.inputs.input_mode == "document":
            window = self.decoding.max_source_tokens * 16
        else:
            window = max(self.inputs.context_words, 1) * 30
        text = long_forms.get((span.start_char, span.end_char)) or by_text.get(span.text) or span.text
        return Mention(
            text=text,
            left=doc.text[max(0, span.start_char - window) : span.start_char],
            right=doc.text[span.end_char : span.end_char + window],
            doc_id=doc_key,
            start=span.start_char,
            end=span.end_char,
            label=span.label_,
        )

    def _abbreviations(self, doc: Doc) -> Tuple[Dict[Tuple[int, int], str], Dict[str, str]]:
        """Long forms from scispacy's abbreviation_detector, when it ran."""
        if not self.resolve_abbreviations or not Doc.has_extension("abbreviations"):
            return {}, {}
        return doc_long_forms(doc)

    def _process(self, docs: Sequence[Doc]) -> None:
        linker = self.linker  # fail on the first call, not on the first entity
        spans_per_doc = [self._spans(doc) for doc in docs]
        mentions: List[Mention] = []
        for k, (doc, spans) in enumerate(zip(docs, spans_per_doc)):
            long_forms, by_text = self._abbreviations(doc)
            # which document a mention is in: what per-document input groups by
            key = f"<doc {k} of batch>"
            mentions.extend(self._mention(doc, s, long_forms, by_text, key) for s in spans)
        results = linker.link(mentions) if mentions else []
        cursor = 0
        for doc, spans in zip(docs, spans_per_doc):
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
            span._.set(out.candidates_attr, [(cid, c.name, written_score(c.score)) for c in candidates for cid in c.ids][:top_k])
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
        """Write cfg.json and, once the component has (or can load) its model and
        KB, the model, tokenizer, KB and trie: a component never used yet is
        initialized from its configured paths first, so the folder travels whole."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self._linker is None and self.model_path and self.kb_path:
            self.initialize()
        meta = {"kb_normalizer": self.kb_normalizer, "kb_dedup": self.kb_dedup, "has_linker": self._linker is not None}
        if self._linker is not None:
            lk = self._linker
            save_model(lk.model, lk.tokenizer, path / "model")
            lk.kb.to_jsonl(path / "kb.jsonl")
            # the same KB as arrays, which from_disk maps instead of parsing kb.jsonl
            CompactKB.from_kb(lk.kb).save(path / "kb.safetensors", jsonl=path / "kb.jsonl")
            lk.trie.to_disk(path / "trie.safetensors")
            meta["kb_checksum"] = lk.kb.checksum()
        if self.fusion is not None:
            self.fusion.save(path / "fusion.json")
        elif (path / "fusion.json").exists():
            (path / "fusion.json").unlink()
        (path / "cfg.json").write_text(json.dumps(meta, indent=2), encoding="utf8")

    def to_bytes(self, *, exclude: Iterable[str] = tuple()) -> bytes:
        """The ``to_disk`` directory as an in-memory tar archive."""
        with tempfile.TemporaryDirectory() as tmp:
            self.to_disk(Path(tmp) / "component")
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as tar:
                tar.add(Path(tmp) / "component", arcname="component")
            return buffer.getvalue()

    def from_bytes(self, bytes_data: bytes, *, exclude: Iterable[str] = tuple()) -> "GenBioELLinker":
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(fileobj=io.BytesIO(bytes_data), mode="r") as tar:
                tar.extractall(tmp, filter="data")
            return self.from_disk(Path(tmp) / "component")

    def from_disk(self, path, *, exclude: Iterable[str] = tuple()) -> "GenBioELLinker":
        """Load what :meth:`to_disk` wrote. A missing or damaged file raises
        :class:`~spacy_genbioel.models.hf.ModelFormatError` (or, for the KB,
        :class:`~spacy_genbioel.kb.base.KBFormatError`) naming it; a trie that
        no longer fits the KB or tokenizer beside it is rebuilt with a warning.
        The KB and the trie are memory-mapped, not read (``kb.safetensors``;
        a pipeline saved before it existed has only ``kb.jsonl``, read as before)."""
        path = Path(path)
        meta = read_component_cfg(path / "cfg.json")
        if not meta.get("has_linker"):
            return self
        self.kb_normalizer, self.kb_dedup = meta["kb_normalizer"], meta["kb_dedup"]
        kb_file = "kb.jsonl" if not (path / "kb.safetensors").exists() else "kb.safetensors"
        for name in (kb_file, "model"):
            if not (path / name).exists():
                raise ModelFileNotFoundError(f"{path / name} not found: the saved component is incomplete")
        if (self.fusion_path is None or self._fusion_missing is not None) and (path / "fusion.json").exists():
            if self._fusion_missing is not None:
                logger.warning("%s not found: using the fusion saved with the pipeline, %s", self.fusion_path, path / "fusion.json")
            self.fusion = FusionModel.load(path / "fusion.json")
            self._fusion_missing = None
        kb = self._saved_kb(path)
        trie: Optional[NameTrie] = None
        if not (path / "trie.safetensors").exists():
            logger.warning("%s not found; building the trie from the KB", path / "trie.safetensors")
        else:
            trie = NameTrie.from_disk(path / "trie.safetensors")
            if kb.checksum() != meta.get("kb_checksum"):
                logger.warning("KB in %s changed since the trie was built; rebuilding the trie", path)
                trie = None
        hf_model, tokenizer = load_model(path / "model", device=resolve_device(self.device), dtype=self.dtype)
        self._linker = self._with_candidates(GenerativeLinker(hf_model, tokenizer, kb, trie, inputs=self.inputs,
                                                              config=self.decoding, stale_trie="rebuild"))
        return self


    def _saved_kb(self, path: Path) -> KnowledgeBase:
        """``kb.safetensors`` memory-mapped when it is there and ``kb.jsonl`` beside it is the
        file it was written with; else ``kb.jsonl`` parsed (pipelines saved before 0.2)."""
        compact, jsonl = path / "kb.safetensors", path / "kb.jsonl"
        kwargs = {"normalizer": self.kb_normalizer, "dedup": self.kb_dedup}
        if compact.exists():
            kb = CompactKB.open(compact, **kwargs)
            if not jsonl.exists():
                logger.warning("%s not found; using %s", jsonl, compact)
                return kb
            if kb.matches_jsonl(jsonl):
                return kb
            logger.warning("%s changed since %s was written; reading %s", jsonl, compact, jsonl)
        return KnowledgeBase.load(jsonl, **kwargs)


def concept_scores(candidates: Sequence[Candidate], limit: int) -> List[Tuple[str, float]]:
    """scispacy's ``kb_ents``: ``(concept_id, score)`` once per concept (its best name's
    score), best first (ties keep the linker's rank), at most ``limit``."""
    best: Dict[str, float] = {}
    for candidate in candidates:
        for cid in candidate.ids:
            best.setdefault(cid, written_score(candidate.score))
    return sorted(best.items(), key=lambda item: -item[1])[:limit]


def read_component_cfg(path: Path) -> Dict[str, Any]:
    """The component's ``cfg.json``, checked: a missing, unreadable or malformed
    file raises :class:`~spacy_genbioel.models.hf.ModelFormatError` naming it."""
    if not path.exists():
        raise ModelFileNotFoundError(f"{path} not found: not a saved genbioel component")
    meta = parse_json(read_text(path, ModelFormatError), path, ModelFormatError)
    if not isinstance(meta, dict) or not isinstance(meta.get("has_linker"), bool):
        raise ModelFormatError(f"{path}: expected a JSON object with has_linker true or false")
    if meta["has_linker"]:
        if not isinstance(meta.get("kb_normalizer"), str) or not isinstance(meta.get("kb_dedup"), bool):
            raise ModelFormatError(f"{path}: expected kb_normalizer (a name) and kb_dedup (true or false)")
        if not isinstance(meta.get("kb_checksum", ""), str):
            raise ModelFormatError(f"{path}: kb_checksum must be a string")
        try:
            get_normalizer(meta["kb_normalizer"])
        except ValueError as err:
            raise ModelFormatError(f"{path}: {err}") from err
    return meta
