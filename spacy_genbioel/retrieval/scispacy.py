"""scispacy's candidate generator (TF-IDF + nmslib HNSW) built in memory on our KB.

:class:`ScispacyLinker` is the natural peer to measure the generative linker
against on the same KB; :func:`kb_to_scispacy_entities` and
:func:`write_scispacy_jsonl` give our KB in scispacy's own record / file format.
scispacy and nmslib are imported only when a linker is built.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.retrieval.settings import ScispacySettings
from spacy_genbioel.ty import Candidate, MentionLike, mention_text

logger = logging.getLogger(__name__)

__all__ = ["ScispacyLinker", "ScispacySettings", "kb_to_scispacy_entities", "write_scispacy_jsonl"]


def kb_to_scispacy_entities(kb: KnowledgeBase) -> List[Any]:
    """Our KB as scispacy ``Entity`` records over the *normalized* names.

    ``canonical_name`` is the concept's first normalized name, ``aliases`` the
    rest; concepts whose names all normalize to nothing are left out (scispacy
    needs a canonical name, and they could never be predicted anyway).
    """
    from scispacy.linking_utils import Entity

    entities = []
    for concept in kb:
        names = kb.names_of(concept.id)
        if not names:
            continue
        entities.append(
            Entity(
                concept_id=concept.id,
                canonical_name=names[0],
                aliases=list(names[1:]),
                types=list(concept.types),
                definition=concept.definition,
            )
        )
    return entities


def write_scispacy_jsonl(kb: KnowledgeBase, path: Union[str, Path]) -> Path:
    """Write the KB in scispacy's JSONL KB format
    (``{concept_id, canonical_name, aliases, types, definition}``), normalized names."""
    path = Path(path)
    with path.open("w", encoding="utf8") as out:
        for entity in kb_to_scispacy_entities(kb):
            out.write(json.dumps(entity._asdict(), ensure_ascii=False) + "\n")
    return path


class ScispacyLinker:
    """scispacy's ``CandidateGenerator`` built on our KB, in memory.

    Construction follows ``scispacy.candidate_generation.create_tfidf_ann_index``
    (scispacy 0.6): a ``TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 3),
    min_df=min_df, dtype=float32)`` fit on the KB aliases, aliases with an
    all-zero vector dropped, and an nmslib HNSW index over the sparse vectors
    (``space="cosinesimil_sparse"``). ``create_tfidf_ann_index`` itself is *not*
    called: in scispacy 0.6 it raises ``RuntimeError`` unless scipy < 1.11
    (it checks ``scispacy.util.scipy_supports_sparse_float16`` even when nothing
    is saved), and scipy 1.17 is installed here. The replication builds the
    same vectorizer and index directly with nmslib and keeps them in memory;
    they are then handed to scispacy's own ``CandidateGenerator``, so candidate
    generation (the k-NN query, the alias -> concept canonicalization) is
    scispacy's code.

    Differences from scispacy's defaults, all configurable (``settings``, a
    :class:`~spacy_genbioel.retrieval.settings.ScispacySettings`):

    * The scispacy KB (``scispacy.linking_utils.KnowledgeBase``) is built from
      our concepts with their *normalized* names as aliases (the same
      normalization as every other linker), from an in-memory list of
      ``Entity`` records rather than a JSONL file (``write_scispacy_jsonl``
      writes that file if wanted). Mention texts are normalized the same way.
    * ``min_df`` defaults to scispacy's 10, but falls back to 1 (with a
      warning) when that leaves no n-gram, as on tiny KBs.
    * HNSW build parameters default to nmslib's own ``M=16,
      efConstruction=200`` rather than scispacy's ``M=100, efConstruction=2000``
      (``SCISPACY_INDEX_PARAMS``; pass ``m_parameter``/``ef_construction`` to
      use them): scispacy's values took over 5 minutes for MEDIC's 72k names
      on 2 cores, nmslib's about 30 s. ``index_threads`` defaults to 2
      (scispacy uses 60); ``ef_search=200`` as in scispacy.
    * Ranking is ``EntityLinker``'s: for each candidate concept, the score is
      the max similarity over its retrieved aliases; concepts with score
      ``> threshold`` are sorted by score. ``threshold`` defaults to 0.0 (not
      scispacy's 0.7) so that recall@k sees every retrieved concept, and the
      definition filter (``filter_for_definitions``, scispacy default on) is
      off by default because most of our KBs have no definitions.
    * ``k`` (neighbours retrieved before canonicalization) defaults to
      scispacy's 30 and is raised to ``top_k`` when that is larger.

    With ``group_by_name=False`` each returned :class:`Candidate` is one
    concept, exactly as scispacy ranks them: ``ids=(concept_id,)``, ``name``
    the alias with the best similarity, ``score`` that similarity. By default
    (``group_by_name=True``) concepts whose best alias is the same name are
    merged into one candidate (``ids`` in scispacy's order), matching the
    :class:`Candidate` contract of the other linkers (a name and the concepts
    it stands for), so ``top_k`` counts names for every peer alike. This
    matters when concepts share all their names (MEDIC's MeSH and OMIM IDs
    of one disease): per concept, only one of them can be ranked first.
    """

    SCISPACY_INDEX_PARAMS = {"M": 100, "efConstruction": 2000, "indexThreadQty": 60, "post": 0}

    name = "scispacy"

    def __init__(self, kb: KnowledgeBase, settings: Optional[ScispacySettings] = None) -> None:
        import nmslib
        from scispacy.candidate_generation import CandidateGenerator
        from scispacy.linking_utils import KnowledgeBase as ScispacyKB
        from sklearn.feature_extraction.text import TfidfVectorizer

        s = settings or ScispacySettings()
        self.kb = kb
        self.settings = s
        self.k = int(s.k)
        self.threshold = float(s.threshold)
        self.no_definition_threshold = float(s.no_definition_threshold)
        self.filter_for_definitions = bool(s.filter_for_definitions)
        self.group_by_name = bool(s.group_by_name)
        min_df = s.min_df

        entities = kb_to_scispacy_entities(kb)
        if not entities:
            raise ValueError("ScispacyLinker: the knowledge base has no names")
        self.scispacy_kb = ScispacyKB(entities)
        aliases = list(self.scispacy_kb.alias_to_cuis.keys())

        def fit(df: int):
            vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 3), min_df=df, dtype=np.float32)
            return vectorizer, vectorizer.fit_transform(aliases)

        try:
            vectorizer, vectors = fit(min_df)
        except ValueError:
            if min_df == 1:
                raise
            logger.warning(
                "ScispacyLinker: min_df=%s leaves no character 3-gram on %d aliases; using min_df=1",
                min_df,
                len(aliases),
            )
            vectorizer, vectors = fit(1)
        vectors = vectors.tocsr()
        keep = np.asarray(vectors.sum(axis=1)).ravel() != 0
        n_dropped = int((~keep).sum())
        if n_dropped:
            # scispacy drops them too (nmslib cannot index all-zero vectors)
            level = logging.WARNING if n_dropped > 0.01 * len(aliases) else logging.INFO
            logger.log(
                level, "ScispacyLinker: dropping %d/%d aliases with an empty TF-IDF vector", n_dropped, len(aliases)
            )
        aliases = [a for a, flag in zip(aliases, keep) if flag]
        vectors = vectors[keep]
        if not aliases:
            raise ValueError("ScispacyLinker: no alias has a non-empty TF-IDF vector")

        index = nmslib.init(method="hnsw", space="cosinesimil_sparse", data_type=nmslib.DataType.SPARSE_VECTOR)
        index.addDataPointBatch(vectors)
        index.createIndex(
            {
                "M": int(s.m_parameter),
                "indexThreadQty": int(s.index_threads),
                "efConstruction": int(s.ef_construction),
                "post": 0,
            },
            print_progress=False,
        )
        index.setQueryTimeParams({"efSearch": int(s.ef_search)})
        self.aliases = aliases
        self.vectorizer = vectorizer
        self.ann_index = index
        self.candidate_generator = CandidateGenerator(
            ann_index=index,
            tfidf_vectorizer=vectorizer,
            ann_concept_aliases_list=aliases,
            kb=self.scispacy_kb,
            verbose=False,
        )
        logger.debug("ScispacyLinker: %d aliases indexed, %d concepts", len(aliases), len(entities))

    def _kb_order(self, alias: str, ids: List[str]) -> List[str]:
        rank = {cid: i for i, cid in enumerate(self.kb.ids_for_name(alias))}
        return sorted(ids, key=lambda cid: rank.get(cid, len(rank)))

    def link(self, mentions: Sequence[MentionLike], top_k: int = 5) -> List[List[Candidate]]:
        n = len(mentions)
        if n == 0:
            return []
        if top_k <= 0:
            return [[] for _ in range(n)]
        texts = [self.kb.normalize(mention_text(m)) for m in mentions]
        k = min(max(self.k, top_k), len(self.aliases))
        batch = self.candidate_generator(texts, k)
        results: List[List[Candidate]] = []
        for candidates in batch:
            predicted: List[Tuple[str, str, float]] = []
            for cand in candidates:
                best = int(np.argmax(cand.similarities))
                score = float(cand.similarities[best])
                if (
                    self.filter_for_definitions
                    and self.scispacy_kb.cui_to_entity[cand.concept_id].definition is None
                    and score < self.no_definition_threshold
                ):
                    continue
                if score > self.threshold:
                    predicted.append((cand.concept_id, cand.aliases[best], score))
            # scispacy: candidates come sorted by concept id; stable sort by score
            predicted.sort(key=lambda x: x[2], reverse=True)
            if self.group_by_name:
                grouped: Dict[str, List[Any]] = {}
                for cid, alias, score in predicted:
                    entry = grouped.setdefault(alias, [[], score])
                    entry[0].append(cid)
                # concepts of a shared name in the KB's order (priors first), not scispacy's ID order
                ranked = [
                    Candidate(tuple(self._kb_order(alias, ids)), alias, min(score, 1.0))
                    for alias, (ids, score) in grouped.items()
                ]
            else:
                ranked = [Candidate((cid,), alias, min(score, 1.0)) for cid, alias, score in predicted]
            results.append(ranked[:top_k])
        return results
