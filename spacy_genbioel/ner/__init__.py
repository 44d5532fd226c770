"""The upstream NER the linker needs.

* :mod:`.convert` -- PubTator corpora as spaCy training data (``ner-corpus``),
  label maps, and the tokenizer they are cut with;
* :mod:`.pipes` -- a trained NER's pipes sourced into a package
  (``package --ner DIR``), the extras they need, and the KB dictionary NER
  (``entity_ruler``) of the demo and of packages built without a trained NER.
"""

from spacy_genbioel.ner.convert import (
    LABEL_MAPS,
    NCBI_LABEL_MAP,
    TOKENIZERS,
    NerCorpusStats,
    convert_pubtator,
    label_mapper,
    make_tokenizer_nlp,
    ner_docs,
    parse_label_map,
)
from spacy_genbioel.ner.pipes import HF_TOK2VEC, add_kb_entity_ruler, ner_extras, source_ner

__all__ = [
    "HF_TOK2VEC",
    "LABEL_MAPS",
    "NCBI_LABEL_MAP",
    "TOKENIZERS",
    "NerCorpusStats",
    "add_kb_entity_ruler",
    "convert_pubtator",
    "label_mapper",
    "make_tokenizer_nlp",
    "ner_docs",
    "parse_label_map",
    "ner_extras",
    "source_ner",
]
