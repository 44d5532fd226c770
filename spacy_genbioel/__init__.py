"""Generative biomedical entity linking (GenBioEL, ANGEL) for spaCy."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spacy_genbioel.kb.base import Concept, KnowledgeBase

__version__ = "0.1.0"

__all__ = ["Concept", "KnowledgeBase", "__version__"]


def __getattr__(name: str) -> Any:
    """``Concept`` and ``KnowledgeBase``, imported on first use: importing the package (the command line, spaCy's
    entry points into it) does not read the KB modules and numpy."""
    if name in ("Concept", "KnowledgeBase"):
        from spacy_genbioel.kb import base

        value = getattr(base, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "Concept", "KnowledgeBase"})
