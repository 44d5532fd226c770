"""The name trie's file: ``trie.safetensors``, written and read memory-mapped, and checked.

Format 3 (this version) stores every array decoding reads: ``edge_keys``,
``child_tokens`` and ``child_ptr`` (the children of a node as one slice) and
the terminal table, so loading computes nothing and copies nothing: the arrays
are views of the file (:func:`~spacy_genbioel.arrayfile.read_arrays`), and a
10M-name trie opens in well under a second. Formats 1 and 2 (no
``child_tokens``/``child_ptr``; 1 has no tokenizer fingerprint) are read too;
the two arrays are then derived on loading as before.

Every file is checked before use, so a damaged one raises
:class:`TrieFormatError` naming it: edges strictly sorted with each parent
before its child, children slices consistent with the edges, terminals in
range, ``max_depth`` the depth of the deepest node (decoding stops after
``max_depth`` tokens: a smaller one would cut names short; the levels are
found by binary search, the nodes being numbered level by level). The
per-name arrays are checked whole and the per-node arrays (several
times larger) at a fixed sample of positions, so a 10M-name trie opens in
milliseconds; ``full_check`` checks every entry. Whole-array checks run in
chunks and hand each chunk's pages back to the OS (``MADV_DONTNEED``) once
read, so they do not make a 1 GB trie resident. Decoding clamps what it reads
from the per-node arrays (:mod:`.tensors`), so damage a sample misses
gives wrong answers, never an IndexError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import numpy as np

from spacy_genbioel.arrayfile import read_arrays, release_pages, write_arrays
from spacy_genbioel.models.hf import ModelFileNotFoundError, ModelFormatError
from spacy_genbioel.util import PathLike

__all__ = ["TrieFormatError", "TrieMismatchError", "FORMAT_VERSION", "ARRAYS", "META_INTS", "write_trie", "read_trie"]

FORMAT_VERSION = 3
#: 1: spacy_genbioel 0.1 (no tokenizer fingerprint); 2: with the fingerprint; 3: children stored too
READABLE_VERSIONS = ("1", "2", "3")
ARRAYS = ("edge_keys", "terminal_nodes", "terminal_ptr", "terminal_names")
CHILD_ARRAYS = ("child_tokens", "child_ptr")
META_INTS = ("vocab_size", "eos_token_id", "root_token_id", "max_depth")
_CHUNK = 1 << 22
_SAMPLE = 512  # positions of the per-node arrays checked on loading (twice: spread and scattered)


class TrieFormatError(ModelFormatError):
    """A trie file that is truncated, not a trie, or of an unknown format; names the file."""


class TrieMismatchError(ModelFormatError):
    """A trie built for another tokenizer, model or KB than the one it is used with."""


def write_trie(path: PathLike, arrays: Dict[str, np.ndarray], meta: Dict[str, str]) -> None:
    """Write the arrays (format 3: ``ARRAYS`` and ``CHILD_ARRAYS``) and metadata."""
    write_arrays(path, arrays, {"format_version": str(FORMAT_VERSION), **meta})


def read_trie(path: PathLike, full_check: bool = False) -> Tuple[Dict[str, np.ndarray], Dict[str, str], Dict[str, int]]:
    """(arrays, metadata, integer metadata) of a checked trie file of format 1, 2 or 3
    (:func:`inconsistency`; ``full_check``: every entry of every array)."""
    path = Path(path)
    if not path.exists():
        raise ModelFileNotFoundError(f"Trie file not found: {path}")
    arrays, meta = read_arrays(path, lambda reason: TrieFormatError(f"{reason}"))
    version = meta.get("format_version")
    if version not in READABLE_VERSIONS:
        newer = version is not None and version.isdigit() and int(version) > FORMAT_VERSION
        raise TrieFormatError(
            f"{path}: not a NameTrie file of format {' or '.join(READABLE_VERSIONS)} "
            f"(format_version {version!r}{', written by a newer spacy_genbioel' if newer else ''})"
        )
    wanted = ARRAYS + (CHILD_ARRAYS if version == "3" else ())
    missing = [k for k in wanted if k not in arrays] + [k for k in META_INTS if k not in meta]
    if missing:
        raise TrieFormatError(f"{path}: the trie lacks {', '.join(missing)}")
    try:
        ints = {k: int(meta[k]) for k in META_INTS}
    except ValueError as err:
        raise TrieFormatError(f"{path}: metadata that is not an integer ({err})") from err
    kept = {k: arrays[k] for k in wanted}
    problem = inconsistency(kept, **ints, full=full_check)
    for array in kept.values():  # sampled reads map whole runs of pages (the kernel's fault-around): hand them back
        release_pages(array)
    if problem:
        raise TrieFormatError(f"{path}: not a consistent trie ({problem})")
    return kept, meta, ints


def _chunks(n: int) -> Iterator[Tuple[int, int]]:
    for start in range(0, n, _CHUNK):
        yield start, min(n, start + _CHUNK)


def _increasing(array: np.ndarray, strict: bool, positions: Optional[np.ndarray] = None) -> bool:
    """Whether ``array`` is (strictly) increasing: everywhere, a chunk at a time, or at ``positions`` only."""
    if positions is not None:
        here, there = array[positions], array[positions + 1]
        return not bool((there <= here).any() if strict else (there < here).any())
    previous: Optional[int] = None
    for a, b in _chunks(len(array)):
        part = array[a:b]
        if (part[1:] <= part[:-1]).any() if strict else (part[1:] < part[:-1]).any():
            return False
        if previous is not None and (part[0] <= previous if strict else part[0] < previous):
            return False
        previous = int(part[-1])
        release_pages(part)
    return True


def _sample(n: int, full: bool) -> Optional[np.ndarray]:
    """Positions ``0..n-2`` to check (None: all of them): evenly spaced and scattered, fixed."""
    if full or n - 1 <= 2 * _SAMPLE:
        return None
    spread = np.linspace(0, n - 2, _SAMPLE).astype(np.int64)
    scattered = np.random.default_rng(n).integers(0, n - 1, _SAMPLE)
    return np.unique(np.concatenate([spread, scattered]))


def inconsistency(
    arrays: Dict[str, np.ndarray],
    *,
    vocab_size: int,
    eos_token_id: int,
    root_token_id: int,
    max_depth: int,
    full: bool = False,
) -> Optional[str]:
    """What makes stored arrays unusable as a trie (None: they are usable), so a
    damaged file fails on loading rather than while decoding.

    The per-name arrays (terminals) are checked whole; the per-node arrays
    (edges, children: several times larger) at their ends and at a fixed sample
    of positions unless ``full`` (a 10M-name trie is checked in milliseconds;
    decoding clamps what it reads from them, so damage the sample misses gives
    wrong answers, never an IndexError)."""
    if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays.values()):
        return "arrays must be one-dimensional integers"
    edges, nodes, ptr, names = (arrays[k] for k in ARRAYS)
    n_edges = len(edges)
    n_nodes = n_edges + 1
    if vocab_size < 1 or not (0 <= eos_token_id < vocab_size and 0 <= root_token_id < vocab_size) or max_depth < 0:
        return f"vocab_size {vocab_size}, EOS {eos_token_id}, root {root_token_id}, depth {max_depth}"
    at = _sample(n_edges, full)
    if n_edges and (int(edges[0]) < 0 or int(edges[-1]) // vocab_size >= n_edges or not _increasing(edges, True, at)):
        return "edges out of order"
    for a, b in _chunks(n_edges) if at is None else [(0, 0)]:
        if (edges[a:b] // vocab_size >= np.arange(a + 1, b + 1)).any():
            return "edges out of order"
        release_pages(edges[a:b])
    if at is not None and (edges[at] // vocab_size > at).any():
        return "edges out of order"
    depth = _depth(edges, vocab_size)
    release_pages(edges)  # each sampled read maps a run of pages (the kernel's fault-around)
    if depth is None:
        return "edges out of order"
    if depth != max_depth:
        return f"max_depth {max_depth} in its metadata, but its deepest name is {depth} tokens long"
    if len(nodes) and (int(nodes[0]) < 1 or int(nodes[-1]) >= n_nodes or not _increasing(nodes, strict=True)):
        return "terminal nodes out of range"
    if (
        len(ptr) != len(nodes) + 1
        or int(ptr[0]) != 0
        or int(ptr[-1]) != len(names)
        or not _increasing(ptr, strict=False)
    ):
        return "terminal pointers out of range"
    for a, b in _chunks(len(names)):
        if len(names) and int(names[a:b].min()) < 0:
            return "negative name index"
        release_pages(names[a:b])
    if "child_ptr" in arrays:
        return _children_inconsistency(edges, arrays["child_tokens"], arrays["child_ptr"], vocab_size, at)
    return None


def _depth(edges: np.ndarray, vocab_size: int) -> Optional[int]:
    """The depth of the deepest node (None: the edges do not number nodes level by level).

    Edges sorted by ``parent * vocab_size + token``, each parent before its child,
    number the nodes level by level: the children of the nodes ``lo..hi-1`` are the
    edges ``a..b-1`` whose keys lie in ``[lo * V, hi * V)``, that is nodes ``a+1..b``.
    Two binary searches per level."""
    lo, hi, depth = 0, 1, 0
    while True:
        a = int(np.searchsorted(edges, lo * vocab_size, side="left"))
        b = int(np.searchsorted(edges, hi * vocab_size, side="left"))
        if b <= a:
            return depth
        if a + 1 != hi or depth >= len(edges):  # the next level starts right after this one
            return None
        lo, hi, depth = a + 1, b + 1, depth + 1


def _children_inconsistency(
    edges: np.ndarray, tokens: np.ndarray, ptr: np.ndarray, vocab_size: int, at: Optional[np.ndarray]
) -> Optional[str]:
    """``child_tokens`` are the edges' tokens and ``child_ptr[p]:child_ptr[p + 1]`` holds
    exactly the edges of parent ``p`` (each edge inside its parent's slice, slices in
    order), everywhere or at the positions ``at``."""
    n_edges = len(edges)
    if len(tokens) != n_edges or len(ptr) != n_edges + 2 or int(ptr[0]) != 0 or int(ptr[-1]) != n_edges:
        return "child arrays of the wrong length"
    if not _increasing(ptr, False, at):
        return "child pointers out of order"
    for a, b in _chunks(n_edges) if at is None else [(0, 0)]:
        index = np.arange(a, b)
        if _children_differ(edges[a:b], tokens[a:b], ptr, index, vocab_size):
            return "child pointers or tokens differ from the edges"
        release_pages(edges[a:b])
        release_pages(tokens[a:b])
    if at is not None and _children_differ(edges[at], tokens[at], ptr, at, vocab_size):
        return "child pointers or tokens differ from the edges"
    release_pages(ptr)
    return None


def _children_differ(keys: np.ndarray, tokens: np.ndarray, ptr: np.ndarray, index: np.ndarray, vocab_size: int) -> bool:
    parents = keys // vocab_size
    return bool((tokens != keys % vocab_size).any() or ((ptr[parents] > index) | (ptr[parents + 1] <= index)).any())
