"""scispacy's view of a knowledge base, over the component's own KB.

Code written for scispacy's ``EntityLinker`` reads ``linker.kb.cui_to_entity[cui]``
(an ``Entity`` with ``concept_id``, ``canonical_name``, ``aliases``, ``types``,
``definition``) and ``linker.kb.alias_to_cuis[alias]`` (a set of IDs).
:class:`LinkerKB` offers both over a :class:`~spacy_genbioel.kb.base.KnowledgeBase`
without copying it: ``cui_to_entity`` builds each :class:`Entity` when it is
asked for, and ``alias_to_cuis`` is indexed on first use only (one dict entry
per distinct name: the cost scispacy pays up front, paid here only by those who
ask). It uses the KB's public API alone (iteration, ``[]``, ``in``, ``len``,
``preferred_name`` and the :class:`~spacy_genbioel.kb.base.Concept` fields).
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Mapping, NamedTuple, Optional, Set

from spacy_genbioel.kb.base import KnowledgeBase

__all__ = ["Entity", "EntityView", "AliasView", "LinkerKB"]


class Entity(NamedTuple):
    """scispacy's ``linking_utils.Entity``: same fields, defaults and printout."""

    concept_id: str
    canonical_name: str
    aliases: List[str]
    types: List[str] = []
    definition: Optional[str] = None

    def __repr__(self) -> str:  # scispacy's layout, so printed entities read the same
        n = len(self.aliases)
        aliases = (
            f"Aliases (abbreviated, total: {n}): \n\t {', '.join(self.aliases[:10])}"
            if n > 10
            else f"Aliases: (total: {n}): \n\t {', '.join(self.aliases)}"
        )
        return (
            f"CUI: {self.concept_id}, Name: {self.canonical_name}\n"
            f"Definition: {self.definition}\n"
            f"TUI(s): {', '.join(self.types)}\n" + aliases
        )


class EntityView(Mapping[str, Entity]):
    """``concept_id -> Entity``, built on access from the KB (nothing is copied)."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self._kb = kb

    def __getitem__(self, concept_id: str) -> Entity:
        concept = self._kb[concept_id]  # KeyError for an unknown ID, as a dict
        canonical = self._kb.preferred_name(concept_id)
        return Entity(
            concept.id, canonical, [n for n in concept.names if n != canonical], list(concept.types), concept.definition
        )

    def __contains__(self, concept_id: object) -> bool:
        return concept_id in self._kb

    def __iter__(self) -> Iterator[str]:
        return (concept.id for concept in self._kb)

    def __len__(self) -> int:
        return len(self._kb)


class AliasView(Mapping[str, Set[str]]):
    """``alias -> {concept_id}`` over the concepts' names as written in the KB
    (scispacy's ``alias_to_cuis``: exact strings, canonical names included),
    indexed on first access."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self._kb = kb
        self._index: Optional[Dict[str, Set[str]]] = None

    @property
    def built(self) -> bool:
        return self._index is not None

    def _table(self) -> Dict[str, Set[str]]:
        if self._index is None:
            index: Dict[str, Set[str]] = {}
            for concept in self._kb:
                for name in concept.names:
                    index.setdefault(name, set()).add(concept.id)
            self._index = index
        return self._index

    def __getitem__(self, alias: str) -> Set[str]:
        return set(self._table()[alias])

    def __contains__(self, alias: object) -> bool:
        return alias in self._table()

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


class LinkerKB:
    """What ``nlp.get_pipe("genbioel").kb`` returns: scispacy's ``linker.kb``
    (``cui_to_entity``, ``alias_to_cuis``) and the KB itself as ``knowledge_base``."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self.knowledge_base = kb
        self.cui_to_entity = EntityView(kb)
        self.alias_to_cuis = AliasView(kb)

    def __len__(self) -> int:
        return len(self.knowledge_base)

    def __repr__(self) -> str:
        return f"LinkerKB({self.knowledge_base!r})"
