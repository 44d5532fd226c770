"""The mention record shared by corpus readers, training-data builders and evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Mapping, NamedTuple, Protocol, Sequence, Tuple, Union


@dataclass(frozen=True)
class Mention:
    """One gold or predicted mention with its context.

    ``ids`` holds every concept ID of the mention (a composite mention such as
    ``D001|D002`` has several; an evaluation counts a hit on any of them).
    ``left`` and ``right`` are the document text before and after the mention.
    """

    text: str
    ids: Tuple[str, ...] = ()
    left: str = ""
    right: str = ""
    doc_id: str = ""
    start: int = -1
    end: int = -1
    label: str = ""
    composite: bool = field(default=False)

    @property
    def is_composite(self) -> bool:
        return self.composite or len(self.ids) > 1


#: What retrievers accept: a mention or its bare text.
MentionLike = Union[Mention, str]


def mention_text(mention: MentionLike) -> str:
    """The text of a mention, or the string itself."""
    return mention if isinstance(mention, str) else mention.text


class Candidate(NamedTuple):
    """A ranked linking result: the concept IDs a KB name maps to, the name, its score."""

    ids: Tuple[str, ...]
    name: str
    score: float


class Linker(Protocol):
    """Anything that ranks KB names for mentions: the generative linker and its peers."""

    def link(self, mentions: Sequence[Mention], top_k: int = 5) -> List[List[Candidate]]: ...


#: Ranked candidates per mention, and the path that linked each: ``early``, ``retrieval``, ``forced`` or
#: ``beam`` (``none``: no candidates; :data:`~spacy_genbioel.linking.reranking.cascade.PATHS`).
LinkPaths = Tuple[List[List[Candidate]], List[str]]


class Reranker(Protocol):
    """The ``genbioel`` component's linking stage after the generator (a :class:`Linker`): score fusion of its
    and the retrievers' candidates (:class:`~spacy_genbioel.linking.reranking.fusion.FusionReranker`), or the
    cascade that decides per mention which of them run
    (:class:`~spacy_genbioel.linking.reranking.cascade.CascadeReranker`)."""

    @property
    def retrievers(self) -> Mapping[str, Linker]:
        """The retrievers it reads, by fusion source name."""
        ...

    def link_paths(self, linker: Linker, mentions: Sequence[Mention], top_k: int) -> LinkPaths:
        """At most ``top_k`` candidates per mention, with its path; ``linker`` is the generator (the
        cascade asks the one it was built with, the same one in the component)."""
        ...
