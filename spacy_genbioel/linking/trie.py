"""Token-id prefix trie over every KB name, as flat arrays.

Each name becomes the token ids of ``" " + name`` followed by EOS. The trie is
rooted at the last token of the decoder prompt (`` is`` for ``"mention is"``),
so node 0 is "nothing generated yet".

Layout: nodes are numbered level by level, and within a level in the order of
their ``(parent, token)`` key. Hence the edge that creates node ``n`` is edge
``n - 1``, the sorted int64 array ``edge_keys = parent * vocab_size + token``
answers "child of node p by token t" with one binary search, and the children of
a node are one contiguous slice ``child_ptr[p]:child_ptr[p + 1]``. Both queries
run for a whole batch of beams at once (``allowed_mask``, ``advance``) with no
Python loop per beam. A million MeSH names fit in a few tens of MB.

Terminal nodes (reached through EOS) map to name indices of the KB through a
small CSR table, so two names that tokenize alike both stay reachable.

Candidate-restricted decoding (``restrict``) narrows each mention to the names of
a few allowed concepts: the nodes on those names' paths become sorted int64 keys
``row * n_nodes + parent`` with their tokens, one sub-trie per mention of a
batch, answered by the same kind of binary search (``TrieRestriction``). Name
-> terminal node and node -> parent are derived from the stored arrays.

A trie only holds for the tokenizer and model it was built with. Format 2
files store the tokenizer's fingerprint beside the model's vocabulary size,
EOS and root token; :meth:`NameTrie.mismatch` compares them (and, for format 1
files, which have no fingerprint, re-tokenizes a sample of the KB names) so a
stale trie is rebuilt or refused rather than silently used. A damaged file
raises :class:`TrieFormatError` naming it.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from spacy_genbioel.models.hf import ModelFileNotFoundError, ModelFormatError, tokenizer_fingerprint
from spacy_genbioel.linking.trie_tensors import TrieRestriction, TrieTensors
from spacy_genbioel.util import PathLike

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["NameTrie", "TrieFormatError", "TrieMismatchError", "TrieRestriction", "TrieTensors"]

_FORMAT_VERSION = 2
#: format 1 (spacy_genbioel 0.1): the same arrays, no tokenizer fingerprint
_READABLE_VERSIONS = ("1", "2")
_ARRAYS = ("edge_keys", "terminal_nodes", "terminal_ptr", "terminal_names")
_META_INTS = ("vocab_size", "eos_token_id", "root_token_id", "max_depth")


class TrieFormatError(ModelFormatError):
    """A trie file that is truncated, not a trie, or of an unknown format; names the file."""


class TrieMismatchError(ModelFormatError):
    """A trie built for another tokenizer, model or KB than the one it is used with."""


class NameTrie:
    def __init__(
        self,
        edge_keys: np.ndarray,
        terminal_nodes: np.ndarray,
        terminal_ptr: np.ndarray,
        terminal_names: np.ndarray,
        *,
        vocab_size: int,
        eos_token_id: int,
        root_token_id: int,
        max_depth: int,
        tokenizer_fingerprint: Optional[str] = None,
    ) -> None:
        #: :func:`~spacy_genbioel.models.hf.tokenizer_fingerprint` of the tokenizer the names were split with
        self.tokenizer_fingerprint = tokenizer_fingerprint
        #: the file it was read from (for messages)
        self.source: Optional[str] = None
        self.edge_keys = np.ascontiguousarray(edge_keys, dtype=np.int64)
        self.terminal_nodes = np.ascontiguousarray(terminal_nodes, dtype=np.int64)
        self.terminal_ptr = np.ascontiguousarray(terminal_ptr, dtype=np.int64)
        self.terminal_names = np.ascontiguousarray(terminal_names, dtype=np.int64)
        self.vocab_size = int(vocab_size)
        self.eos_token_id = int(eos_token_id)
        self.root_token_id = int(root_token_id)
        self.max_depth = int(max_depth)
        self.n_nodes = len(self.edge_keys) + 1
        # children of node p: child_tokens[child_ptr[p]:child_ptr[p + 1]]
        self.child_tokens = (self.edge_keys % self.vocab_size).astype(np.int32)
        counts = np.bincount(self.edge_keys // self.vocab_size, minlength=self.n_nodes)
        self.child_ptr = np.zeros(self.n_nodes + 1, dtype=np.int64)
        np.cumsum(counts, out=self.child_ptr[1:])
        del counts
        self._device_cache: dict = {}
        self._name_terminals: Optional[np.ndarray] = None

    # -- construction -------------------------------------------------------
    @classmethod
    def from_sequences(
        cls,
        sequences: Iterable[Sequence[int]],
        *,
        vocab_size: int,
        eos_token_id: int,
        root_token_id: int,
    ) -> "NameTrie":
        """Build from token-id sequences (without EOS; it is appended). Name
        index ``i`` is the ``i``-th sequence."""
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
        return cls.from_flat(flat, lengths, vocab_size=vocab_size, eos_token_id=eos_token_id, root_token_id=root_token_id)

    @classmethod
    def from_flat(
        cls,
        flat: np.ndarray,
        lengths: np.ndarray,
        *,
        vocab_size: int,
        eos_token_id: int,
        root_token_id: int,
        name_indices: Optional[np.ndarray] = None,
    ) -> "NameTrie":
        """Build from concatenated token ids and per-name lengths (EOS appended here)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        flat = np.asarray(flat)
        if len(lengths) and lengths.min() < 1:
            raise ValueError("Every name needs at least one token")
        if len(flat) and (flat.max() >= vocab_size or flat.min() < 0):
            raise ValueError("Token id outside the vocabulary")
        ends = np.cumsum(lengths)
        with_eos = np.insert(flat.astype(np.int32, copy=False), ends, eos_token_id)
        return cls._build(with_eos, lengths + 1, vocab_size, eos_token_id, root_token_id, name_indices)

    @classmethod
    def _build(
        cls,
        tokens: np.ndarray,
        full_len: np.ndarray,
        vocab_size: int,
        eos_token_id: int,
        root_token_id: int,
        name_indices: Optional[np.ndarray],
    ) -> "NameTrie":
        """Level-by-level construction over names laid end to end (EOS included).

        At depth ``d`` every live name has a node id; the keys ``node * V +
        token_d`` of all names are made unique with one sort, which both
        creates the next level's nodes and keeps edges globally sorted by
        (parent, token). Memory stays at a few arrays of one entry per name.
        """
        n = len(full_len)
        if name_indices is None:
            name_indices = np.arange(n, dtype=np.int64)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(full_len[:-1], out=starts[1:])
        node = np.zeros(n, dtype=np.int64)
        levels: List[np.ndarray] = []
        next_id = 1
        max_depth = int(full_len.max()) if n else 0
        alive = np.arange(n, dtype=np.int64)
        for depth in range(max_depth):
            alive = alive[full_len[alive] > depth]
            keys = node[alive] * vocab_size + tokens[starts[alive] + depth]
            unique, inverse = np.unique(keys, return_inverse=True)
            node[alive] = next_id + inverse
            next_id += len(unique)
            levels.append(unique)
            del keys, inverse
        edge_keys = np.concatenate(levels) if levels else np.zeros(0, dtype=np.int64)
        del levels
        # `node` now holds each name's terminal (post-EOS) node
        order = np.argsort(node, kind="stable")
        term_sorted = node[order]
        terminal_nodes, first = np.unique(term_sorted, return_index=True)
        terminal_ptr = np.append(first, n).astype(np.int64)
        collisions = n - len(terminal_nodes)
        if collisions:
            logger.info("%d names share their token sequence with another name", collisions)
        return cls(
            edge_keys,
            terminal_nodes,
            terminal_ptr,
            np.asarray(name_indices, dtype=np.int64)[order],
            vocab_size=vocab_size,
            eos_token_id=eos_token_id,
            root_token_id=root_token_id,
            max_depth=max_depth,
        )

    @classmethod
    def from_names(
        cls,
        names: Sequence[str],
        tokenizer,
        *,
        eos_token_id: int,
        root_token_id: int,
        vocab_size: Optional[int] = None,
        chunk_size: int = 20_000,
        max_name_tokens: int = 128,
    ) -> "NameTrie":
        """Tokenize ``" " + name`` for every name (in chunks, so a million names
        never sit in memory as Python lists) and build the trie. Names longer
        than ``max_name_tokens`` tokens cannot be generated and are left out."""
        vocab_size = vocab_size or len(tokenizer)
        chunks: List[np.ndarray] = []
        lens: List[np.ndarray] = []
        kept: List[np.ndarray] = []
        skipped = 0
        for begin in range(0, len(names), chunk_size):
            ids = tokenizer([" " + name for name in names[begin : begin + chunk_size]], add_special_tokens=False)["input_ids"]
            ok = [0 < len(x) <= max_name_tokens for x in ids]
            good = [x + [eos_token_id] for x, keep in zip(ids, ok) if keep]
            skipped += len(ids) - len(good)
            chunks.append(np.fromiter((t for x in good for t in x), dtype=np.int32))
            lens.append(np.fromiter((len(x) for x in good), dtype=np.int64, count=len(good)))
            kept.append(np.flatnonzero(ok) + begin)
            del ids, good
        if skipped:
            logger.warning("%d names left out of the trie (empty or longer than %d tokens)", skipped, max_name_tokens)
        tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
        del chunks
        if len(tokens) and (int(tokens.max()) >= vocab_size or int(tokens.min()) < 0):
            raise ValueError("Token id outside the vocabulary")
        trie = cls._build(
            tokens,
            np.concatenate(lens) if lens else np.zeros(0, dtype=np.int64),
            vocab_size,
            eos_token_id,
            root_token_id,
            np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64),
        )
        trie.tokenizer_fingerprint = tokenizer_fingerprint(tokenizer)
        return trie

    # -- does it fit? ----------------------------------------------------------
    def mismatch(
        self,
        tokenizer,
        *,
        vocab_size: int,
        eos_token_id: int,
        root_token_id: int,
        names: Optional[Sequence[str]] = None,
        sample: int = 32,
    ) -> List[str]:
        """Why this trie does not fit a model (its vocabulary size and special
        ids), its tokenizer and the KB ``names`` it should hold (empty: it fits).

        The tokenizer is compared by fingerprint when the file has one; a
        sample of the names is re-tokenized and walked either way, which is
        what catches another tokenizer behind a format 1 file."""
        reasons = []
        if self.vocab_size != vocab_size:
            reasons.append(f"built for a vocabulary of {self.vocab_size} tokens, the model has {vocab_size}")
        if self.eos_token_id != eos_token_id:
            reasons.append(f"built with EOS {self.eos_token_id}, the model uses {eos_token_id}")
        if self.root_token_id != root_token_id:
            reasons.append(f"rooted at token {self.root_token_id}, the decoder prompt ends with token {root_token_id}")
        if self.tokenizer_fingerprint is not None:
            current = tokenizer_fingerprint(tokenizer)
            if current != self.tokenizer_fingerprint:
                reasons.append(f"built with another tokenizer (fingerprint {self.tokenizer_fingerprint[:12]}, "
                               f"this tokenizer's {current[:12]})")
        if reasons or names is None:
            return reasons
        if len(self.terminal_names) and int(self.terminal_names.max()) >= len(names):
            return [f"holds name {int(self.terminal_names.max())} of a KB with {len(names)} names"]
        in_trie = np.flatnonzero(self.name_terminals >= 0)
        if not len(in_trie):
            return reasons
        picked = in_trie[np.unique(np.linspace(0, len(in_trie) - 1, min(sample, len(in_trie))).astype(np.int64))]
        encoded = tokenizer([" " + names[int(i)] for i in picked], add_special_tokens=False)["input_ids"]
        lost = sum(int(i) not in self.names_at(self.walk([*ids, eos_token_id])).tolist() for i, ids in zip(picked, encoded))
        if lost:
            reasons.append(f"{lost} of {len(picked)} sampled KB names are not paths in it as this tokenizer splits them")
        return reasons

    # -- queries (numpy, single sequences; used by tests and tooling) -------
    def children(self, node: int) -> np.ndarray:
        """Token ids that may follow ``node``."""
        return self.child_tokens[self.child_ptr[node] : self.child_ptr[node + 1]]

    def walk(self, tokens: Sequence[int], node: int = 0) -> int:
        """Node reached from ``node`` through ``tokens``; -1 if it leaves the trie."""
        for token in tokens:
            if node < 0:
                return -1
            key = node * self.vocab_size + int(token)
            pos = int(np.searchsorted(self.edge_keys, key))
            node = pos + 1 if pos < len(self.edge_keys) and self.edge_keys[pos] == key else -1
        return node

    def names_at(self, node: int) -> np.ndarray:
        """Name indices that end at terminal ``node`` (empty if not terminal)."""
        pos = int(np.searchsorted(self.terminal_nodes, node))
        if pos < len(self.terminal_nodes) and self.terminal_nodes[pos] == node:
            return self.terminal_names[self.terminal_ptr[pos] : self.terminal_ptr[pos + 1]]
        return self.terminal_names[:0]

    @property
    def parents(self) -> np.ndarray:
        """Parent of node ``n`` is ``parents[n - 1]`` (node 0, the root, has none)."""
        return self.edge_keys // self.vocab_size

    @property
    def name_terminals(self) -> np.ndarray:
        """Terminal node of every name index (-1 for a name left out of the trie)."""
        if self._name_terminals is None:
            size = int(self.terminal_names.max()) + 1 if len(self.terminal_names) else 0
            out = np.full(size, -1, dtype=np.int64)
            out[self.terminal_names] = np.repeat(self.terminal_nodes, np.diff(self.terminal_ptr))
            self._name_terminals = out
        return self._name_terminals

    def terminals_of(self, name_indices: np.ndarray) -> np.ndarray:
        """Terminal nodes of the given name indices that are in the trie."""
        name_indices = np.asarray(name_indices, dtype=np.int64)
        table = self.name_terminals
        ok = (name_indices >= 0) & (name_indices < len(table))
        nodes = table[name_indices[ok]]
        return nodes[nodes >= 0]

    def path_keys(self, rows: np.ndarray, terminals: np.ndarray) -> np.ndarray:
        """Sorted unique ``row * n_nodes + node`` of every node (root excluded) on the
        path from the root to each ``(row, terminal)``: one vectorized step per level."""
        rows = np.asarray(rows, dtype=np.int64)
        cur = np.asarray(terminals, dtype=np.int64)
        parents = self.parents
        keys: List[np.ndarray] = []
        while len(cur):
            keys.append(rows * self.n_nodes + cur)
            cur = parents[cur - 1]
            live = cur > 0
            rows, cur = rows[live], cur[live]
        return np.unique(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.int64)

    def restrict(
        self, name_sets: Sequence[Optional[np.ndarray]], device: Union[str, torch.device] = "cpu"
    ) -> Optional["TrieRestriction"]:
        """Per-row sub-tries over the names in ``name_sets`` (KB name indices).

        Row ``r`` of a batch may only generate names in ``name_sets[r]``; a row
        whose set is None, empty, or has no name in the trie stays unrestricted.
        Returns None when no row is restricted (decoding then does no extra work).
        """
        rows_list: List[np.ndarray] = []
        terms_list: List[np.ndarray] = []
        restricted = np.zeros(len(name_sets), dtype=bool)
        for row, names in enumerate(name_sets):
            if names is None:
                continue
            terms = np.unique(self.terminals_of(names))
            if len(terms):
                restricted[row] = True
                rows_list.append(np.full(len(terms), row, dtype=np.int64))
                terms_list.append(terms)
        if not restricted.any():
            return None
        keys = self.path_keys(np.concatenate(rows_list), np.concatenate(terms_list))
        rows, nodes = np.divmod(keys, self.n_nodes)
        # Node ids grow with (level, parent, token), so keys sorted by node are
        # also sorted by (row, parent, token): no second sort is needed.
        edge_keys = rows * self.n_nodes + self.parents[nodes - 1]
        return TrieRestriction(edge_keys, self.child_tokens[nodes - 1], restricted, self.n_nodes, torch.device(device))

    def sequences(self) -> List[Tuple[int, List[int]]]:
        """(name index, tokens including EOS) for every name: the inverse of construction."""
        parents = self.edge_keys // self.vocab_size
        out = []
        for pos, node in enumerate(self.terminal_nodes):
            path = []
            cur = int(node)
            while cur > 0:
                path.append(int(self.child_tokens[cur - 1]))
                cur = int(parents[cur - 1])
            path.reverse()
            for name_idx in self.terminal_names[self.terminal_ptr[pos] : self.terminal_ptr[pos + 1]]:
                out.append((int(name_idx), path))
        return out

    @property
    def n_names(self) -> int:
        return len(self.terminal_names)

    # -- batched queries (torch, for decoding) ------------------------------
    def on_device(self, device: Union[str, torch.device]) -> "TrieTensors":
        key = str(device)
        if key not in self._device_cache:
            self._device_cache[key] = TrieTensors(self, torch.device(device))
        return self._device_cache[key]

    # -- persistence (safetensors, no pickle) --------------------------------
    def to_disk(self, path: PathLike) -> None:
        from safetensors.numpy import save_file

        meta = {
            "format_version": str(_FORMAT_VERSION),
            "vocab_size": str(self.vocab_size),
            "eos_token_id": str(self.eos_token_id),
            "root_token_id": str(self.root_token_id),
            "max_depth": str(self.max_depth),
        }
        if self.tokenizer_fingerprint is not None:
            meta["tokenizer_fingerprint"] = self.tokenizer_fingerprint
        arrays = {
            "edge_keys": self.edge_keys,
            "terminal_nodes": self.terminal_nodes,
            "terminal_ptr": self.terminal_ptr,
            "terminal_names": self.terminal_names,
        }
        save_file(arrays, str(path), metadata=meta)

    @classmethod
    def from_disk(cls, path: PathLike) -> "NameTrie":
        """Read a trie file of format 1 or 2; a missing, truncated, foreign or
        inconsistent file raises :class:`TrieFormatError` naming it."""
        from safetensors import safe_open

        path = Path(path)
        if not path.exists():
            raise ModelFileNotFoundError(f"Trie file not found: {path}")
        try:
            with safe_open(str(path), framework="np") as handle:
                meta = handle.metadata() or {}
                arrays = {k: handle.get_tensor(k) for k in handle.keys() if k in _ARRAYS}
        except Exception as err:  # safetensors' own error type: truncated, not safetensors
            raise TrieFormatError(f"{path}: not a complete safetensors file ({err})") from err
        version = meta.get("format_version")
        if version not in _READABLE_VERSIONS:
            newer = version is not None and version.isdigit() and int(version) > _FORMAT_VERSION
            raise TrieFormatError(f"{path}: not a NameTrie file of format {' or '.join(_READABLE_VERSIONS)} "
                                  f"(format_version {version!r}{', written by a newer spacy_genbioel' if newer else ''})")
        missing = [k for k in _ARRAYS if k not in arrays] + [k for k in _META_INTS if k not in meta]
        if missing:
            raise TrieFormatError(f"{path}: the trie lacks {', '.join(missing)}")
        try:
            ints = {k: int(meta[k]) for k in _META_INTS}
        except ValueError as err:
            raise TrieFormatError(f"{path}: metadata that is not an integer ({err})") from err
        problem = _inconsistency(arrays, **ints)
        if problem:
            raise TrieFormatError(f"{path}: not a consistent trie ({problem})")
        trie = cls(*(arrays[k] for k in _ARRAYS), **ints, tokenizer_fingerprint=meta.get("tokenizer_fingerprint"))
        trie.source = str(path)
        return trie

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.edge_keys, self.child_tokens, self.child_ptr, self.terminal_nodes, self.terminal_ptr, self.terminal_names))

    def __repr__(self) -> str:
        return f"NameTrie({self.n_names} names, {self.n_nodes} nodes, depth {self.max_depth}, {self.nbytes() / 1e6:.1f} MB)"


def _inconsistency(arrays, *, vocab_size: int, eos_token_id: int, root_token_id: int, max_depth: int) -> Optional[str]:
    """What makes stored arrays unusable as a trie (None: they are usable), so a
    damaged file fails on loading and never as an IndexError while decoding."""
    if any(a.ndim != 1 or a.dtype.kind not in "iu" for a in arrays.values()):
        return "arrays must be one-dimensional integers"
    edges, nodes, ptr, names = (arrays[k].astype(np.int64) for k in _ARRAYS)
    n_nodes = len(edges) + 1
    if vocab_size < 1 or not (0 <= eos_token_id < vocab_size and 0 <= root_token_id < vocab_size) or max_depth < 0:
        return f"vocab_size {vocab_size}, EOS {eos_token_id}, root {root_token_id}, depth {max_depth}"
    if len(edges) and (edges.min() < 0 or (np.diff(edges) <= 0).any() or (edges // vocab_size >= np.arange(1, n_nodes)).any()):
        return "edges out of order"
    if len(nodes) and (nodes.min() < 1 or nodes.max() >= n_nodes or (np.diff(nodes) <= 0).any()):
        return "terminal nodes out of range"
    if len(ptr) != len(nodes) + 1 or ptr[0] != 0 or ptr[-1] != len(names) or (np.diff(ptr) < 0).any():
        return "terminal pointers out of range"
    if len(names) and names.min() < 0:
        return "negative name index"
    return None
