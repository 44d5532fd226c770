"""Concept IDs: clean-up, composite ID fields, and old -> new crosswalks.

:func:`normalize_id` makes corpus and KB IDs compare equal (whitespace removed,
``MESH:`` dropped, ``OMIM:123`` -> ``123``: MEDIC and GenBioEL list OMIM IDs
bare; other prefixes such as ``DOID:`` are kept). :func:`split_ids` reads the
composite ID fields of the corpora. A crosswalk (:func:`read_crosswalk`) renames
retired IDs (the BC5CDR legacy chemical IDs); :func:`apply_crosswalk` applies it
to KB concepts and gold IDs alike.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Dict, Mapping, Sequence, Tuple, Union

from spacy_genbioel.kb.base import Concept, KBFormatError
from spacy_genbioel.util import PathLike, iter_lines

logger = logging.getLogger(__name__)

__all__ = ["apply_crosswalk", "normalize_id", "read_crosswalk", "split_ids"]

_WS = re.compile(r"\s+")
_PREFIXES = re.compile(r"^(?:MESH|MeSH|mesh|OMIM|omim|Omim):")


def normalize_id(raw: str) -> str:
    """Clean one concept ID so corpus and KB IDs compare equal.

    Removes all whitespace (the corpora have ``' D015862'``), drops a ``MESH:``
    prefix and turns ``OMIM:123456`` into ``123456`` (MEDIC lists OMIM IDs
    bare). Other prefixes are kept. Idempotent.
    """
    cid = _WS.sub("", raw)
    # a loop, not one pass, so that "MESH:OMIM:1" and "MESH: MESH:D1" are idempotent too
    while True:
        stripped = _PREFIXES.sub("", cid)
        if stripped == cid:
            return cid
        cid = stripped


_ID_SPLIT = re.compile(r"[|+]")


def split_ids(raw: str, separators: str = "|+") -> Tuple[Tuple[str, ...], bool, bool]:
    """Split a possibly composite ID field.

    Returns ``(ids, composite, nil)``: the cleaned IDs (``-1`` parts dropped),
    whether the field had several parts, and whether it had no concept at all.
    """
    pattern = _ID_SPLIT if separators == "|+" else re.compile("[" + re.escape(separators) + "]")
    parts = [normalize_id(p) for p in pattern.split(raw)]
    parts = [p for p in parts if p]
    ids = tuple(dict.fromkeys(p for p in parts if p != "-1"))
    return ids, len(parts) > 1, not ids


_ID_LIKE = re.compile(r"^[A-Za-z]{0,10}:?[A-Z]*\d[\w.:-]*$")


def read_crosswalk(path: PathLike) -> Dict[str, str]:
    """Old -> new ID map from a TSV whose first two columns are old and new ID.

    A header row is recognised by a first line whose columns are not IDs (the
    BC5CDR file starts ``legacy_id<TAB>current_mesh_id_by_name_match...``).
    Rows without a new ID are skipped.
    """
    mapping: Dict[str, str] = {}
    for lineno, line in iter_lines(path, KBFormatError):
        if not line.strip() or line.startswith("#"):
            continue
        row = line.split("\t")
        if len(row) < 2:
            raise KBFormatError.at(path, lineno, "expected 'old_id<TAB>new_id[<TAB>...]'")
        old, new = normalize_id(row[0]), normalize_id(row[1])
        if not mapping and lineno == 1 and not (_ID_LIKE.match(old) and (not new or _ID_LIKE.match(new))):
            continue  # header
        if not old:
            raise KBFormatError.at(path, lineno, "row has no old ID")
        if not new:
            logger.warning("%s:%d: no new ID for %s, skipped", path, lineno, old)
            continue
        if old in mapping and mapping[old] != new:
            raise KBFormatError.at(path, lineno, f"{old} maps to both {mapping[old]} and {new}")
        mapping[old] = new
    return mapping


CrosswalkItem = Union[str, Sequence[str], Concept, Any]


def apply_crosswalk(item: CrosswalkItem, crosswalk: Mapping[str, str]) -> Any:
    """Map IDs through a crosswalk: a string, a sequence of IDs (-> tuple), a
    :class:`Concept` or anything with an ``ids`` tuple (a ``Mention``)."""
    if isinstance(item, str):
        return crosswalk.get(item, item)
    if isinstance(item, Concept):
        return Concept(crosswalk.get(item.id, item.id), list(item.names), item.definition, list(item.types))
    if dataclasses.is_dataclass(item) and hasattr(item, "ids"):
        return dataclasses.replace(item, ids=apply_crosswalk(item.ids, crosswalk))  # type: ignore[arg-type]
    if isinstance(item, (list, tuple)):
        return tuple(dict.fromkeys(crosswalk.get(cid, cid) for cid in item))
    raise TypeError(f"Cannot apply a crosswalk to {type(item).__name__}")
