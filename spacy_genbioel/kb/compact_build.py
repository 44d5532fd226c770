"""Building a compact KB's arrays from a stream of concepts, with :class:`KnowledgeBase`'s rules.

:class:`~spacy_genbioel.kb.base.KnowledgeBase` keeps a Python object per
concept, name and index entry: about 6 GB for UMLS's 10M names. This builds
the same index (same names in the same order, same concept IDs per name, same
names per concept, same drops, same checksum) into flat numpy arrays:

1. one pass over the concepts appends IDs, raw names (each normalized once),
   definitions, types and priors to byte blobs and ``array`` buffers, with an
   8-byte BLAKE2b hash of every ID and normalized name;
2. equal strings are grouped by sorting the hashes (every group is checked
   byte for byte, so a hash collision only splits a group, never merges two
   strings); records with the same ID merge as :meth:`KnowledgeBase._add`
   merges them (a Python step for those few concepts only);
3. the rest is sorting: unusable names and concepts dropped and counted,
   GenBioEL's de-duplication (a shared name stays on the concept with the
   fewest names), concepts of a shared name by prior, names numbered in the
   canonical order.

The result is the KB as its JSONL file holds it (:meth:`KnowledgeBase.to_jsonl`:
each concept keeps the raw names whose normalized form stayed with it), which
is what :class:`~spacy_genbioel.kb.compact.CompactKB` serves and saves.
:func:`content_digest` is the SHA-256 of the arrays that a saved compact KB is
checked against when it is opened.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Callable, Dict, Iterable, List, Mapping, Sequence, Tuple

import numpy as np

from spacy_genbioel.arrayfile import release_pages
from spacy_genbioel.kb.base import Concept, KBDrops, clean_concept

__all__ = ["build_arrays", "string_hash", "checksum_of", "content_digest"]


def string_hash(data: bytes) -> int:
    """The signed 64-bit hash the compact KB sorts and looks strings up by."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


class _Blob:
    """Strings as one UTF-8 byte blob, end offsets and hashes, appended one at a time."""

    def __init__(self, hashed: bool) -> None:
        self.data = bytearray()
        self.ends = array("q")
        self.hashes = bytearray() if hashed else None

    def add(self, text: str) -> None:
        raw = text.encode("utf8", "surrogatepass")
        self.data += raw
        self.ends.append(len(self.data))
        if self.hashes is not None:
            self.hashes += hashlib.blake2b(raw, digest_size=8).digest()

    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.frombuffer(self.ends, dtype=np.int64)]).astype(np.int64)

    def hash_array(self) -> np.ndarray:
        return np.frombuffer(self.hashes, dtype="<i8")

    def get(self, i: int) -> bytes:
        start = self.ends[i - 1] if i else 0
        return bytes(self.data[start : self.ends[i]])


class _Records:
    """Stage 1: every concept record as read, names normalized."""

    def __init__(self, normalize: Callable[[str], str]) -> None:
        self.normalize = normalize
        self.ids = _Blob(hashed=True)
        self.raw = _Blob(hashed=False)
        self.norm = _Blob(hashed=True)
        self.raw_count = array("q")
        self.definitions = _Blob(hashed=False)
        self.has_definition = bytearray()
        self.type_codes: Dict[str, int] = {}
        self.type_flat = array("i")
        self.type_count = array("q")
        self.priors = array("d")

    def add(self, concept: Concept) -> None:
        cid, names = clean_concept(concept, f"KB: concept #{len(self.raw_count) + 1}")
        self.ids.add(cid)
        for raw in names:
            self.raw.add(raw)
            self.norm.add(self.normalize(raw))
        self.raw_count.append(len(names))
        self.definitions.add(concept.definition or "")
        self.has_definition.append(1 if concept.definition else 0)
        # verbatim (duplicates too, as KnowledgeBase keeps a concept's first types), as codes
        codes = self.type_codes
        self.type_flat.extend(codes.setdefault(t, len(codes)) for t in concept.types)
        self.type_count.append(len(concept.types))
        self.priors.append(concept.prior)

    def types_of(self, record: int, starts: np.ndarray) -> List[str]:
        names = self.type_names()
        return [names[c] for c in self.type_flat[int(starts[record]) : int(starts[record + 1])]]

    def type_names(self) -> List[str]:
        return list(self.type_codes)

    def __len__(self) -> int:
        return len(self.raw_count)


def group_strings(hashes: np.ndarray, blob: _Blob) -> Tuple[np.ndarray, np.ndarray]:
    """(label per element, first element of each label): equal strings share a
    label, labels numbered by first occurrence. Hash groups are checked byte by
    byte; a collision splits its group."""
    n = len(hashes)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.argsort(hashes, kind="stable")
    sorted_h = hashes[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_h[1:] != sorted_h[:-1])))
    rep = np.repeat(order[starts], np.diff(np.append(starts, n)))
    data, ends = blob.data, blob.ends
    view = memoryview(data)
    for pos in np.flatnonzero(rep != order).tolist():
        a, b = int(order[pos]), int(rep[pos])
        if view[(ends[a - 1] if a else 0) : ends[a]] != view[(ends[b - 1] if b else 0) : ends[b]]:
            _split_collisions(order, rep, starts, sorted_h, pos, blob)
    del view
    first_of = np.empty(n, dtype=np.int64)
    first_of[order] = rep
    firsts = np.unique(first_of)
    return np.searchsorted(firsts, first_of), firsts


def _split_collisions(
    order: np.ndarray, rep: np.ndarray, starts: np.ndarray, sorted_h: np.ndarray, pos: int, blob: _Blob
) -> None:
    """Relabel the hash group around ``pos`` by the actual strings (a 64-bit collision)."""
    g = int(np.searchsorted(starts, pos, side="right")) - 1
    lo = int(starts[g])
    hi = int(starts[g + 1]) if g + 1 < len(starts) else len(order)
    seen: Dict[bytes, int] = {}
    for p in range(lo, hi):
        rep[p] = seen.setdefault(blob.get(int(order[p])), int(order[p]))


def _merge(
    records: _Records, members: Sequence[int], raw_start: np.ndarray, type_start: np.ndarray
) -> Tuple[List[int], List[str], int, float]:
    """Raw-name entries, types, definition record and prior of records that share
    an ID, merged as :meth:`KnowledgeBase._add` merges them."""
    entries: Dict[bytes, int] = {}
    types = records.types_of(members[0], type_start)
    definition = members[0]
    prior = records.priors[members[0]]
    for k, r in enumerate(members):
        for e in range(int(raw_start[r]), int(raw_start[r + 1])):
            entries.setdefault(records.raw.get(e), e)
        if k:
            prior = max(prior, records.priors[r])
            if not records.has_definition[definition] and records.has_definition[r]:
                definition = r
            types.extend(t for t in records.types_of(r, type_start) if t not in types)
    return list(entries.values()), types, definition, prior


def _per_concept(
    counts: np.ndarray, values: np.ndarray, concept_of_rec: np.ndarray, merged: Dict[int, List[int]], n_concepts: int
) -> Tuple[np.ndarray, np.ndarray]:
    """(values, count per concept) of a per-record list (raw names, types) for concepts:
    an unmerged concept's is its record's, a merged one's is given in ``merged``."""
    if not merged:
        return values, counts
    owner = concept_of_rec[np.repeat(np.arange(len(counts)), counts)]
    keep = np.ones(len(owner), dtype=bool)
    merged_ids = np.fromiter(merged, dtype=np.int64, count=len(merged))
    keep[np.isin(owner, merged_ids)] = False
    parts, keys = [values[keep]], [owner[keep]]
    for c, found in merged.items():
        parts.append(np.asarray(found, dtype=values.dtype))
        keys.append(np.full(len(found), c, dtype=np.int64))
    all_keys = np.concatenate(keys)
    perm = np.argsort(all_keys, kind="stable")
    return np.concatenate(parts)[perm], np.bincount(all_keys, minlength=n_concepts)


def build_arrays(
    concepts: Iterable[Concept], normalize: Callable[[str], str], dedup: bool
) -> Tuple[Dict[str, np.ndarray], KBDrops]:
    """The compact KB's arrays (see :class:`~spacy_genbioel.kb.compact.CompactKB`) and what was dropped."""
    records = _Records(normalize)
    for concept in concepts:
        records.add(concept)
    raw_count = np.frombuffer(records.raw_count, dtype=np.int64)
    rec_ptr = np.concatenate([[0], np.cumsum(raw_count)]).astype(np.int64)

    # -- concepts: records with one ID merge -----------------------------------------------------------
    concept_of_rec, primary = group_strings(records.ids.hash_array(), records.ids)
    n_concepts = len(primary)
    per_concept = np.bincount(concept_of_rec, minlength=n_concepts)
    def_rec = primary.copy()
    priors = np.frombuffer(records.priors, dtype=np.float64)[primary].copy()
    type_count = np.frombuffer(records.type_count, dtype=np.int64)
    type_start = np.concatenate([[0], np.cumsum(type_count)]).astype(np.int64)
    merged_raw: Dict[int, List[int]] = {}
    merged_types: Dict[int, List[int]] = {}
    merged = np.flatnonzero(per_concept > 1)
    if len(merged):
        members: Dict[int, List[int]] = {int(c): [] for c in merged}
        for r in np.flatnonzero(per_concept[concept_of_rec] > 1).tolist():
            members[int(concept_of_rec[r])].append(r)
        for c, recs in members.items():
            merged_raw[c], types, def_rec[c], priors[c] = _merge(records, recs, rec_ptr, type_start)
            merged_types[c] = [records.type_codes[t] for t in types]
    craw, craw_count = _per_concept(
        raw_count, np.arange(rec_ptr[-1], dtype=np.int64), concept_of_rec, merged_raw, n_concepts
    )
    ctype, ctype_count = _per_concept(
        type_count, np.frombuffer(records.type_flat, dtype=np.int32), concept_of_rec, merged_types, n_concepts
    )
    del rec_ptr, type_start
    craw_concept = np.repeat(np.arange(n_concepts, dtype=np.int32), craw_count)

    # -- unusable names and concepts -------------------------------------------------------------------
    norm_off = records.norm.offsets()
    usable = (norm_off[craw + 1] - norm_off[craw]) > 0
    del norm_off
    drops = KBDrops()
    bad = np.flatnonzero(~usable)
    drops.names = len(bad)
    for e in bad[:5].tolist():
        drops.examples.append(
            f"{records.ids.get(int(primary[craw_concept[e]])).decode('utf8', 'surrogatepass')}: "
            f"{records.raw.get(int(craw[e])).decode('utf8', 'surrogatepass')!r}"
        )
    n_usable = np.bincount(craw_concept[usable], minlength=n_concepts)
    dropped = (craw_count > 0) & (n_usable == 0)
    drops.concepts = int(dropped.sum())
    drops.nameless = int((craw_count == 0).sum())
    kept_concept = ~dropped
    new_index = np.cumsum(kept_concept) - 1  # concept -> index among the kept ones

    # -- normalized names per concept, shared names, canonical order ------------------------------------------
    # (int32 numbers and early deletes: these arrays have one entry per name, 10M for UMLS)
    norm_label, norm_first = group_strings(records.norm.hash_array(), records.norm)
    entry_raw = craw[usable]
    entry_c = craw_concept[usable]
    entry_g = norm_label[entry_raw].astype(np.int32)
    del norm_label, craw_concept, usable, craw
    n_groups = max(1, len(norm_first))
    entry_keys = entry_c.astype(np.int64) * n_groups + entry_g
    _, first_pos = np.unique(entry_keys, return_index=True)
    first_pos.sort()  # pairs (concept, name) in concept-major order, each once
    pair_c, pair_g = entry_c[first_pos], entry_g[first_pos]
    del first_pos
    n_norm = np.bincount(pair_c, minlength=n_concepts)
    if dedup and len(pair_g):
        by_size = np.lexsort((pair_c, n_norm[pair_c], pair_g))
        heads = by_size[np.concatenate(([True], pair_g[by_size][1:] != pair_g[by_size][:-1]))]
        del by_size
        kept_pairs = np.sort(heads)
    else:
        kept_pairs = np.arange(len(pair_c))
    kc, kg = pair_c[kept_pairs], pair_g[kept_pairs]
    del pair_c, pair_g, kept_pairs
    # a name's number: its first kept (concept, name) pair in concept-major order
    group_first = np.full(n_groups, len(kg), dtype=np.int64)
    np.minimum.at(group_first, kg, np.arange(len(kg)))
    present = np.flatnonzero(group_first < len(kg))
    name_groups = present[np.argsort(group_first[present], kind="stable")]
    del group_first, present
    name_of_group = np.full(n_groups, -1, dtype=np.int32)
    name_of_group[name_groups] = np.arange(len(name_groups), dtype=np.int32)
    kn = name_of_group[kg]
    del name_of_group

    # -- the saved form: raw names whose normalized form stayed with the concept ------------------------------------
    kept_keys = np.sort(kc.astype(np.int64) * n_groups + kg)
    at = np.searchsorted(kept_keys, entry_keys).clip(max=max(0, len(kept_keys) - 1))
    stays = (kept_keys[at] == entry_keys) if len(kept_keys) else np.zeros(len(entry_keys), dtype=bool)
    del kept_keys, at, entry_keys, kg
    saved_raw, saved_c = entry_raw[stays], entry_c[stays]
    del entry_raw, entry_c, stays
    by_name = np.lexsort((kc, -priors[kc], kn))
    by_concept = np.lexsort((kn, kc))

    keep_ids = np.flatnonzero(kept_concept)
    arrays = {
        **_strings("name", records.norm, norm_first[name_groups], hashed=True),
        "name_concepts_ptr": _ptr(np.bincount(kn, minlength=len(name_groups))),
        "name_concepts": new_index[kc[by_name]].astype(np.int32),
        **_strings("concept", records.ids, primary[keep_ids], hashed=True),
        "concept_names_ptr": _ptr(np.bincount(new_index[kc], minlength=len(keep_ids))),
        "concept_names": kn[by_concept].astype(np.int32),
        **_strings("raw", records.raw, saved_raw, hashed=False),
        "concept_raw_ptr": _ptr(np.bincount(new_index[saved_c], minlength=len(keep_ids))),
        "priors": priors[keep_ids] if priors[keep_ids].any() else np.zeros(0, dtype=np.float64),
        **_definitions(records, def_rec[keep_ids]),
        **_types(records.type_names(), ctype, ctype_count, keep_ids),
    }
    return arrays, drops


def _ptr(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _strings(prefix: str, blob: _Blob, which: np.ndarray, hashed: bool) -> Dict[str, np.ndarray]:
    """Blob and offsets of the strings ``which`` of ``blob`` (in that order); with
    ``hashed``, their hashes sorted and the string number of each."""
    offsets = blob.offsets()
    starts, stops = offsets[which], offsets[which + 1]
    new_offsets = _ptr(stops - starts)
    data = np.empty(int(new_offsets[-1]), dtype=np.uint8)
    source = blob.data
    step = 1 << 17  # strings joined per chunk: bounds the temporary slice objects
    for begin in range(0, len(which), step):
        joined = b"".join(
            [source[a:b] for a, b in zip(starts[begin : begin + step].tolist(), stops[begin : begin + step].tolist())]
        )
        data[new_offsets[begin] : new_offsets[begin] + len(joined)] = np.frombuffer(joined, dtype=np.uint8)
    out = {f"{prefix}_bytes": data, f"{prefix}_offsets": new_offsets}
    if hashed:
        hashes = blob.hash_array()[which]
        order = np.argsort(hashes, kind="stable")
        out[f"{prefix}_hashes"] = hashes[order].astype(np.int64)
        out[f"{prefix}_order"] = order.astype(np.int32)
    return out


def _definitions(records: _Records, rec: np.ndarray) -> Dict[str, np.ndarray]:
    has = np.frombuffer(bytes(records.has_definition), dtype=np.uint8)[rec].astype(bool)
    if not has.any():
        return {"definition_bytes": np.zeros(0, dtype=np.uint8), "definition_offsets": np.zeros(0, dtype=np.int64)}
    arrays = _strings("definition", records.definitions, rec, hashed=False)
    return arrays


def _types(names: List[str], codes: np.ndarray, counts: np.ndarray, keep: np.ndarray) -> Dict[str, np.ndarray]:
    """The type names as a blob, and each kept concept's type codes (CSR; empty arrays: no types at all)."""
    table = _Blob(hashed=False)
    for t in names:
        table.add(t)
    start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    kept_counts = counts[keep]
    if not kept_counts.any():
        return {
            "type_bytes": np.zeros(0, dtype=np.uint8),
            "type_offsets": np.zeros(1, dtype=np.int64),
            "concept_types_ptr": np.zeros(0, dtype=np.int64),
            "concept_types": np.zeros(0, dtype=np.int32),
        }
    take = np.repeat(start[keep], kept_counts) + (
        np.arange(int(kept_counts.sum())) - np.repeat(_ptr(kept_counts)[:-1], kept_counts)
    )
    return {
        "type_bytes": np.frombuffer(bytes(table.data), dtype=np.uint8),
        "type_offsets": table.offsets(),
        "concept_types_ptr": _ptr(kept_counts),
        "concept_types": codes[take].astype(np.int32),
    }


def checksum_of(pairs: Iterable[Tuple[str, Sequence[str]]]) -> str:
    """:meth:`KnowledgeBase.checksum` over (name, concept IDs) pairs in name order."""
    digest = hashlib.sha256()
    chunk: List[bytes] = []
    for name, cids in pairs:
        chunk.append(f"{name}\t{'|'.join(cids)}\n".encode("utf8"))
        if len(chunk) >= 65536:
            digest.update(b"".join(chunk))
            chunk.clear()
    digest.update(b"".join(chunk))
    return digest.hexdigest()


def content_digest(arrays: Mapping[str, np.ndarray], chunk: int = 1 << 24) -> str:
    """SHA-256 over every array (its name, dtype, length and bytes, in name order): what
    :meth:`CompactKB.save` records as ``content_sha256``. Read ``chunk`` bytes at a time,
    each chunk's pages handed back to the OS once hashed (memory-mapped arrays)."""
    digest = hashlib.sha256()
    for key in sorted(arrays):
        array = np.ascontiguousarray(arrays[key])
        digest.update(f"{key}:{array.dtype.str}:{array.size};".encode("utf8"))
        flat = array.reshape(-1).view(np.uint8)
        for start in range(0, len(flat), chunk):
            part = flat[start : start + chunk]
            digest.update(memoryview(part))
            release_pages(part)
    return digest.hexdigest()
