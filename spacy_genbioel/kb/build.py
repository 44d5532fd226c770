"""Building a KB: the reader of each format, merging sources (with a crosswalk)
into one :class:`~spacy_genbioel.kb.base.KnowledgeBase`, what ``build-kb`` does
to it afterwards (training mentions as names, gold-ID priors, one name per
concept), and the check against GenBioEL's ``target_kb.json``.

Every name is kept by default (``dedup=False``), as the component
(``kb_dedup = false``) and the workflows build and load KBs. GenBioEL's
de-duplication (a name shared by several concepts stays only on the one with
the fewest names) is asked for with ``dedup=True`` (``build-kb --dedup``), and
what it took is counted and logged as a warning (:func:`dedup_losses`): on
MEDIC it leaves thousands of concepts without a name, which nothing can link to.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from spacy_genbioel.kb.base import Concept, EmptyKBError, KnowledgeBase
from spacy_genbioel.kb.compact import CompactKB
from spacy_genbioel.kb.crosswalk import apply_crosswalk, normalize_id, read_crosswalk
from spacy_genbioel.kb.normalizers import Normalizer, get_normalizer
from spacy_genbioel.kb.obo import read_obo
from spacy_genbioel.kb.sources import (
    load_target_kb_json,
    read_askapatient_kb,
    read_ctd,
    read_genbioel_target_kb,
    read_jsonl,
    read_medic,
    read_mesh_tsv,
    read_mesh_xml,
    read_scispacy_jsonl,
)
from spacy_genbioel.kb.umls import read_rxnorm, read_umls
from spacy_genbioel.progress import InputProgress
from spacy_genbioel.ty import Mention
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

Reader = Callable[..., Iterator[Concept]]

__all__ = [
    "FORMATS",
    "Source",
    "KBAugmentation",
    "augment_kb",
    "build_kb",
    "compare_with_target_kb",
    "dedup_losses",
    "get_reader",
    "iter_concepts",
    "parse_source",
]


FORMATS: Dict[str, Reader] = {
    "medic": read_medic,
    "ctd": read_ctd,
    "mesh-tsv": read_mesh_tsv,
    "mesh-xml": read_mesh_xml,
    "umls": read_umls,
    "rxnorm": read_rxnorm,
    "obo": read_obo,
    "genbioel": read_genbioel_target_kb,
    "jsonl": read_jsonl,
    "scispacy": read_scispacy_jsonl,
    "askapatient": read_askapatient_kb,
}

Source = Union[PathLike, Tuple[str, PathLike]]


def parse_source(spec: str) -> Source:
    """A command-line source: ``FORMAT:PATH`` (a known format) reads PATH with
    that format's reader; anything else is a path."""
    prefix, _, rest = spec.partition(":")
    return (prefix, rest) if rest and prefix in FORMATS else spec


def get_reader(fmt: str) -> Reader:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"Unknown KB format {fmt!r}; known: {', '.join(sorted(FORMATS))}") from None


def iter_concepts(fmt: str, sources: Union[Source, Sequence[Source]], **reader_kwargs: Any) -> Iterator[Concept]:
    """Concepts from one or more sources; a source may be ``(format, path)`` to mix formats."""
    for source in _source_list(sources):
        if isinstance(source, tuple):
            src_fmt, src_path = source
            yield from get_reader(src_fmt)(src_path)
        else:
            yield from get_reader(fmt)(source, **reader_kwargs)


def build_kb(
    format: str,
    sources: Union[Source, Sequence[Source]],
    dedup: bool = False,
    normalizer: Union[str, Normalizer] = "genbioel",
    crosswalk: Optional[Union[Mapping[str, str], PathLike]] = None,
    name: Optional[str] = None,
    progress: Optional[bool] = None,
    compact: bool = False,
    **reader_kwargs: Any,
) -> KnowledgeBase:
    """Read ``sources`` with the ``format`` reader and merge them into one KB.

    Concepts with the same (normalized) ID merge; every name is kept unless ``dedup``
    (GenBioEL's rule; what it removes is logged as a warning). ``crosswalk`` (a dict or a
    crosswalk TSV) renames concept IDs old -> new before merging; apply the same
    crosswalk to gold IDs. Unusable names are dropped and counted (``kb.drops``);
    sources without a single usable name raise
    :class:`~spacy_genbioel.kb.base.EmptyKBError` naming them. ``reader_kwargs`` go to the reader (e.g. ``mrdef=``
    for UMLS); sources given as ``(format, path)`` use that format's defaults.
    ``progress`` (None: on a terminal) shows the bytes of the sources read and the concepts found.
    ``compact``: build a :class:`~spacy_genbioel.kb.compact.CompactKB` (the same KB as flat
    arrays, a fraction of the memory: for KBs of UMLS's size; save it as ``.safetensors``).
    """
    get_reader(format)
    get_normalizer(normalizer)  # fail fast on a bad name, before reading GBs
    walk: Optional[Mapping[str, str]] = None
    if crosswalk is not None:
        walk = crosswalk if isinstance(crosswalk, Mapping) else read_crosswalk(crosswalk)
    bar = InputProgress("build-kb", _source_paths(sources), counts=("concepts",), enabled=progress)
    concepts: Iterable[Concept] = bar.read(iter_concepts(format, sources, **reader_kwargs), count="concepts")
    if walk:
        concepts = (apply_crosswalk(c, walk) for c in concepts)
    if name is None:
        first = sources if isinstance(sources, (str, Path)) else None
        name = Path(first).stem if first is not None else format
    try:
        kind = CompactKB.build if compact else KnowledgeBase
        kb = kind(concepts, normalizer=normalizer, dedup=dedup, name=name)
    except EmptyKBError as err:
        raise EmptyKBError(f"{', '.join(_source_paths(sources))}: {err}") from None
    finally:
        bar.close()
    if dedup:
        names, nameless = dedup_losses(kb)
        if names:
            logger.warning(
                "KB %r: de-duplication (GenBioEL's rule) took %d name entries from their concepts and left %d of "
                "%d concepts without a name, which nothing can link to (keep every name: dedup=False, "
                "build-kb --no-dedup)",
                kb.name,
                names,
                nameless,
                len(kb),
            )
    logger.info("Built %r", kb)
    return kb


def dedup_losses(kb: KnowledgeBase) -> Tuple[int, int]:
    """(name entries, concepts left without a name): what GenBioEL's de-duplication took from
    ``kb``'s concepts (both 0 for a KB that keeps every name). Concepts listed without names are
    not counted."""
    if not kb.dedup:
        return 0, 0
    names = nameless = 0
    for concept in kb:
        own = {norm for norm in map(kb.normalize, concept.names) if norm}
        kept = len(kb.names_of(concept.id))
        names += len(own) - kept
        nameless += bool(own) and not kept
    return names, nameless


def _source_list(sources: Union[Source, Sequence[Source]]) -> List[Source]:
    """One source (a path or ``(format, path)``) or several, as a list."""
    if isinstance(sources, (str, Path)) or (
        isinstance(sources, tuple) and len(sources) == 2 and isinstance(sources[0], str) and sources[0] in FORMATS
    ):
        return [sources]  # type: ignore[list-item]
    return list(sources)  # type: ignore[arg-type]


def _source_paths(sources: Union[Source, Sequence[Source]]) -> List[str]:
    return [str(s[1]) if isinstance(s, tuple) else str(s) for s in _source_list(sources)]


# -- after building: training mentions, priors, one name per concept ---------------------------
@dataclass
class KBAugmentation:
    """What :func:`augment_kb` did; ``None`` marks a step that was not asked for."""

    mentions_added: Optional[int] = None
    new_names: int = 0
    prior_ids: Optional[int] = None
    prior_concepts: int = 0
    names_before_first_only: Optional[int] = None


def augment_kb(
    kb: KnowledgeBase,
    *,
    augment_mentions: Optional[Iterable[Mention]] = None,
    prior_mentions: Optional[Iterable[Mention]] = None,
    first_names_only: bool = False,
) -> Tuple[KnowledgeBase, KBAugmentation]:
    """``build-kb``'s steps after reading the sources, in this order:

    * ``augment_mentions`` (training splits only): each non-composite mention's
      text becomes a name of its gold concepts (the BioSyn/GenBioEL dictionary
      augmentation);
    * ``prior_mentions`` (training splits only): gold IDs are counted as concept
      priors, so a name shared by several concepts lists the most frequent
      answer first;
    * ``first_names_only``: one name per concept (the N-to-1 trie ablation).
    """
    report = KBAugmentation()
    if augment_mentions is not None:
        pairs = [(cid, m.text) for m in augment_mentions if not m.is_composite for cid in m.ids]
        n_names = kb.n_names
        kb = kb.with_extra_names(pairs)
        report.mentions_added, report.new_names = len(pairs), kb.n_names - n_names
    if prior_mentions is not None:
        counts = Counter(cid for m in prior_mentions for cid in m.ids)
        kb = kb.with_priors(counts)
        report.prior_ids, report.prior_concepts = sum(counts.values()), len(counts)
    if first_names_only:
        report.names_before_first_only = kb.n_names
        kb = kb.with_first_names_only()
    return kb, report


# -- checking against GenBioEL ---------------------------------------------------------------
def compare_with_target_kb(kb: KnowledgeBase, target_kb_path: PathLike, n_examples: int = 20) -> Dict[str, Any]:
    """Compare a KB's (ID, normalized name) pairs with GenBioEL's ``target_kb.json``.

    Target IDs are cleaned with :func:`~spacy_genbioel.kb.crosswalk.normalize_id` and its names only have
    their whitespace collapsed (they are GenBioEL-normalized already). Returns
    counts both ways, fractions, IDs missing on either side, the target IDs the
    clean-up changed, and a few example pairs missing each way.
    """
    data = load_target_kb_json(target_kb_path)
    target: Set[Tuple[str, str]] = set()
    target_ids: Set[str] = set()
    cleaned: Dict[str, str] = {}
    for raw_id, names in data.items():
        cid = normalize_id(raw_id)
        if cid != raw_id:
            cleaned[raw_id] = cid
        target_ids.add(cid)
        for name in [names] if isinstance(names, str) else names:
            collapsed = " ".join(name.split())
            if collapsed:
                target.add((cid, collapsed))
    ours: Set[Tuple[str, str]] = {(cid, name) for cid in kb.concept_ids for name in kb.names_of(cid)}
    ours_ids = set(kb.concept_ids)
    in_target = ours & target
    only_ours = sorted(ours - target)
    only_target = sorted(target - ours)
    return {
        "ours_pairs": len(ours),
        "target_pairs": len(target),
        "ours_in_target": len(in_target),
        "target_in_ours": len(in_target),
        "ours_in_target_frac": len(in_target) / len(ours) if ours else 0.0,
        "target_in_ours_frac": len(in_target) / len(target) if target else 0.0,
        "ours_ids": len(ours_ids),
        "target_ids": len(target_ids),
        "target_raw_ids": len(data),
        "missing_ids": sorted(target_ids - ours_ids),
        "extra_ids": sorted(ours_ids - target_ids),
        "cleaned_target_ids": cleaned,
        "ours_not_in_target_examples": only_ours[:n_examples],
        "target_not_in_ours_examples": only_target[:n_examples],
        "ours_not_in_target": len(only_ours),
        "target_not_in_ours": len(only_target),
    }
