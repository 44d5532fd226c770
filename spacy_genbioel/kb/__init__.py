"""The knowledge base the linker decodes into, and how one is built.

* :mod:`.base` -- :class:`Concept`, :class:`KnowledgeBase` (names, the
  normalized-name index, JSONL / ``target_kb.json`` files, what was dropped:
  :class:`KBDrops`), :class:`KBFormatError` and :class:`EmptyKBError`;
* :mod:`.compact` -- :class:`CompactKB`: the same KB as flat arrays, saved as
  ``kb.safetensors`` and read memory-mapped (UMLS-sized KBs), built by
  :mod:`.compact_build`;
* :mod:`.normalizers` -- name normalizers, in spaCy's ``registry.misc``;
* :mod:`.sources` -- MEDIC, CTD, MeSH and JSON vocabulary readers;
* :mod:`.umls` -- UMLS Metathesaurus and RxNorm RRF readers (filters, semantic types, definitions);
* :mod:`.obo` -- the OBO reader (own-prefix, obsolete and synonym-scope filters);
* :mod:`.crosswalk` -- concept ID clean-up and old -> new ID crosswalks;
* :mod:`.build` -- reader by format, :func:`build_kb`, ``build-kb``'s
  augmentation steps, the check against GenBioEL's ``target_kb.json``.
"""

from spacy_genbioel.kb.base import Concept, EmptyKBError, KBDrops, KBFormatError, KnowledgeBase
from spacy_genbioel.kb.build import (
    FORMATS,
    KBAugmentation,
    augment_kb,
    build_kb,
    compare_with_target_kb,
    dedup_losses,
    get_reader,
    iter_concepts,
    parse_source,
)
from spacy_genbioel.kb.compact import CompactKB
from spacy_genbioel.kb.crosswalk import apply_crosswalk, normalize_id, read_crosswalk, split_ids
from spacy_genbioel.kb.normalizers import NORMALIZER_ALIASES, Normalizer, genbioel_normalize, get_normalizer
from spacy_genbioel.kb.obo import read_obo
from spacy_genbioel.kb.sources import (
    read_ctd,
    read_genbioel_target_kb,
    read_jsonl,
    read_medic,
    read_mesh_tsv,
    read_mesh_xml,
    read_scispacy_jsonl,
)
from spacy_genbioel.kb.umls import RRFFilters, read_rxnorm, read_umls

__all__ = [
    "FORMATS",
    "NORMALIZER_ALIASES",
    "CompactKB",
    "Concept",
    "EmptyKBError",
    "KBAugmentation",
    "KBDrops",
    "KBFormatError",
    "KnowledgeBase",
    "Normalizer",
    "RRFFilters",
    "apply_crosswalk",
    "augment_kb",
    "build_kb",
    "compare_with_target_kb",
    "dedup_losses",
    "genbioel_normalize",
    "get_normalizer",
    "get_reader",
    "iter_concepts",
    "normalize_id",
    "parse_source",
    "read_crosswalk",
    "read_ctd",
    "read_genbioel_target_kb",
    "read_jsonl",
    "read_medic",
    "read_mesh_tsv",
    "read_mesh_xml",
    "read_obo",
    "read_rxnorm",
    "read_scispacy_jsonl",
    "read_umls",
    "split_ids",
]
