"""Where the UMLS and OBO readers used to live; kept so that imports from here still work.

The readers are in :mod:`~spacy_genbioel.kb.umls` (UMLS Metathesaurus and
RxNorm RRF files) and :mod:`~spacy_genbioel.kb.obo` (OBO ontologies).
"""

from spacy_genbioel.kb.obo import read_obo
from spacy_genbioel.kb.umls import read_rxnorm, read_umls

__all__ = ["read_obo", "read_rxnorm", "read_umls"]
