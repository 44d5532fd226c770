"""Generative biomedical entity linking (GenBioEL, ANGEL) for spaCy."""

from spacy_genbioel.kb.base import Concept, KnowledgeBase

__version__ = "0.1.0"

__all__ = ["Concept", "KnowledgeBase", "__version__"]
