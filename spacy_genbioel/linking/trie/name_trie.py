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
and 3 files store the tokenizer's fingerprint beside the model's vocabulary size,
EOS and root token; :meth:`NameTrie.mismatch` compares them (and, for format 1
files, which have no fingerprint, re-tokenizes a sample of the KB names) so a
stale trie is rebuilt or refused rather than silently used. Files are read
memory-mapped and checked (:mod:`.storage`); a damaged file raises
:class:`TrieFormatError` naming it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from spacy_genbioel.arrayfile import release_pages
from spacy_genbioel.linking.trie.name_tokens import tokenize_names
from spacy_genbioel.linking.trie.storage import TrieFormatError, TrieMismatchError, read_trie, write_trie
from spacy_genbioel.linking.trie.tensors import TrieRestriction, TrieTensors
from spacy_genbioel.models.hf import tokenizer_fingerprint
from spacy_genbioel.progress import LARGE, StepProgress
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["NameTrie", "TrieArrays", "TrieFormatError", "TrieMismatchError", "TrieRestriction", "TrieTensors"]


@dataclass(frozen=True)
class TrieArrays:
    """The arrays of a :class:`NameTrie` (the layout of the module docstring), as built or stored."""

    #: sorted ``parent * vocab_size + token``; edge ``n - 1`` creates node ``n``
    edge_keys: np.ndarray
    #: sorted nodes reached through EOS
    terminal_nodes: np.ndarray
    #: CSR offsets: the names of ``terminal_nodes[i]`` are ``terminal_names[terminal_ptr[i]:terminal_ptr[i + 1]]``
    terminal_ptr: np.ndarray
    #: KB name indices, grouped by terminal node
    terminal_names: np.ndarray
    #: children of node p: ``child_tokens[child_ptr[p]:child_ptr[p + 1]]`` (None: derived from ``edge_keys``)
    child_tokens: Optional[np.ndarray] = None
    #: CSR offsets of ``child_tokens`` per node (None: derived with ``child_tokens``)
    child_ptr: Optional[np.ndarray] = None


class NameTrie:
    def __init__(
        self,
        arrays: TrieArrays,
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
        self.edge_keys = np.ascontiguousarray(arrays.edge_keys, dtype=np.int64)
        self.terminal_nodes = np.ascontiguousarray(arrays.terminal_nodes, dtype=np.int64)
        self.terminal_ptr = np.ascontiguousarray(arrays.terminal_ptr, dtype=np.int64)
        self.terminal_names = np.ascontiguousarray(arrays.terminal_names, dtype=np.int64)
        self.vocab_size = int(vocab_size)
        self.eos_token_id = int(eos_token_id)
        self.root_token_id = int(root_token_id)
        self.max_depth = int(max_depth)
        self.n_nodes = len(self.edge_keys) + 1
        # children of node p: child_tokens[child_ptr[p]:child_ptr[p + 1]] (stored in format 3 files)
        child_tokens, child_ptr = arrays.child_tokens, arrays.child_ptr
        if child_tokens is None or child_ptr is None:
            child_tokens, child_ptr = _children(self.edge_keys, self.vocab_size)
        self.child_tokens = np.ascontiguousarray(child_tokens, dtype=np.int32)
        self.child_ptr = np.ascontiguousarray(child_ptr, dtype=np.int64)
        self._device_cache: dict = {}
        self._name_terminals: Optional[np.ndarray] = None

    # -- construction -------------------------------------------------------
    @classmethod
    def from_sequences(
        cls, sequences: Iterable[Sequence[int]], *, vocab_size: int, eos_token_id: int, root_token_id: int
    ) -> "NameTrie":
        """Build from token-id sequences (without EOS; it is appended). Name
        index ``i`` is the ``i``-th sequence."""
        seqs = [np.asarray(s, dtype=np.int64) for s in sequences]
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
        return cls.from_flat(
            flat, lengths, vocab_size=vocab_size, eos_token_id=eos_token_id, root_token_id=root_token_id
        )

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
        # children per level too (counts of the previous level's nodes, tokens): no pass over all edges later
        child_counts: List[np.ndarray] = []
        child_tokens: List[np.ndarray] = []
        next_id, level_start = 1, 0
        max_depth = int(full_len.max()) if n else 0
        alive = np.arange(n, dtype=np.int64)
        for depth in range(max_depth):
            alive = alive[full_len[alive] > depth]
            keys = node[alive] * vocab_size + tokens[starts[alive] + depth]
            unique, inverse = np.unique(keys, return_inverse=True)
            node[alive] = next_id + inverse
            child_counts.append(np.bincount(unique // vocab_size - level_start, minlength=next_id - level_start))
            child_tokens.append((unique % vocab_size).astype(np.int32))
            level_start, next_id = next_id, next_id + len(unique)
            levels.append(unique)
            del keys, inverse
        child_counts.append(np.zeros(next_id - level_start, dtype=np.int64))  # the deepest nodes have no children
        edge_keys = np.concatenate(levels) if levels else np.zeros(0, dtype=np.int64)
        del levels
        child_ptr = np.zeros(next_id + 1, dtype=np.int64)
        np.cumsum(np.concatenate(child_counts), out=child_ptr[1:])
        del child_counts
        # `node` now holds each name's terminal (post-EOS) node
        order = np.argsort(node, kind="stable")
        term_sorted = node[order]
        terminal_nodes, first = np.unique(term_sorted, return_index=True)
        terminal_ptr = np.append(first, n).astype(np.int64)
        collisions = n - len(terminal_nodes)
        if collisions:
            logger.info("%d names share their token sequence with another name", collisions)
        arrays = TrieArrays(
            edge_keys,
            terminal_nodes,
            terminal_ptr,
            np.asarray(name_indices, dtype=np.int64)[order],
            child_tokens=np.concatenate(child_tokens) if child_tokens else np.zeros(0, dtype=np.int32),
            child_ptr=child_ptr,
        )
        return cls(
            arrays, vocab_size=vocab_size, eos_token_id=eos_token_id, root_token_id=root_token_id, max_depth=max_depth
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
        progress: Optional[bool] = None,
    ) -> "NameTrie":
        """Tokenize ``" " + name`` for every name (in chunks, so a million names
        never sit in memory as Python lists; each distinct word once where the
        tokenizer allows it: :mod:`.name_tokens`) and build the trie. Names longer
        than ``max_name_tokens`` tokens cannot be generated and are left out.
        ``progress`` (None: from 100,000 names on, on a terminal) counts the names tokenized."""
        vocab_size = vocab_size or len(tokenizer)
        bar = StepProgress.start(
            "trie", len(names), unit="name", enabled=progress if progress is not None else len(names) >= LARGE
        )
        found = tokenize_names(
            names,
            tokenizer,
            eos_token_id=eos_token_id,
            max_name_tokens=max_name_tokens,
            chunk_size=chunk_size,
            on_chunk=bar.update,
        )
        bar.close()
        if found.skipped:
            logger.warning(
                "%d names left out of the trie (empty or longer than %d tokens)", found.skipped, max_name_tokens
            )
        tokens = found.tokens
        if len(tokens) and (int(tokens.max()) >= vocab_size or int(tokens.min()) < 0):
            raise ValueError("Token id outside the vocabulary")
        trie = cls._build(tokens, found.lengths, vocab_size, eos_token_id, root_token_id, found.kept)
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
                reasons.append(
                    f"built with another tokenizer (fingerprint {self.tokenizer_fingerprint[:12]}, "
                    f"this tokenizer's {current[:12]})"
                )
        if reasons or names is None:
            return reasons
        if len(self.terminal_names) and int(self.terminal_names.max()) >= len(names):
            return [f"holds name {int(self.terminal_names.max())} of a KB with {len(names)} names"]
        in_trie = np.flatnonzero(self.name_terminals >= 0)
        if not len(in_trie):
            return reasons
        picked = in_trie[np.unique(np.linspace(0, len(in_trie) - 1, min(sample, len(in_trie))).astype(np.int64))]
        encoded = tokenizer([" " + names[int(i)] for i in picked], add_special_tokens=False)["input_ids"]
        lost = sum(
            int(i) not in self.names_at(self.walk([*ids, eos_token_id])).tolist() for i, ids in zip(picked, encoded)
        )
        if lost:
            reasons.append(
                f"{lost} of {len(picked)} sampled KB names are not paths in it as this tokenizer splits them"
            )
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
            for array in (self.terminal_names, self.terminal_nodes, self.terminal_ptr):
                release_pages(array)  # read once whole (memory-mapped files): not kept resident
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
        keys: List[np.ndarray] = []
        while len(cur):
            keys.append(rows * self.n_nodes + cur)
            # parents of these nodes only; a parent precedes its child (clamped: a damaged file cannot loop or overrun)
            cur = np.minimum(self.edge_keys[cur - 1] // self.vocab_size, cur - 1)
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
        edge_keys = rows * self.n_nodes + self.edge_keys[nodes - 1] // self.vocab_size
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

    # -- persistence (safetensors, no pickle; :mod:`.storage`) ----------------------------
    def to_disk(self, path: PathLike) -> None:
        """Write a format 3 file (children stored, so loading computes nothing)."""
        meta = {k: str(getattr(self, k)) for k in ("vocab_size", "eos_token_id", "root_token_id", "max_depth")}
        if self.tokenizer_fingerprint is not None:
            meta["tokenizer_fingerprint"] = self.tokenizer_fingerprint
        arrays = {
            k: getattr(self, k)
            for k in ("edge_keys", "terminal_nodes", "terminal_ptr", "terminal_names", "child_tokens", "child_ptr")
        }
        write_trie(path, arrays, meta)

    @classmethod
    def from_disk(cls, path: PathLike, full_check: bool = False) -> "NameTrie":
        """Read a trie file of format 1, 2 or 3, memory-mapped; a missing, truncated,
        foreign or inconsistent file raises :class:`TrieFormatError` naming it (the
        per-node arrays are checked at a sample of positions unless ``full_check``)."""
        arrays, meta, ints = read_trie(path, full_check)
        trie = cls(TrieArrays(**arrays), **ints, tokenizer_fingerprint=meta.get("tokenizer_fingerprint"))
        trie.source = str(path)
        return trie

    def nbytes(self) -> int:
        return sum(
            a.nbytes
            for a in (
                self.edge_keys,
                self.child_tokens,
                self.child_ptr,
                self.terminal_nodes,
                self.terminal_ptr,
                self.terminal_names,
            )
        )

    def __repr__(self) -> str:
        size = f"{self.nbytes() / 1e6:.1f} MB"
        return f"NameTrie({self.n_names} names, {self.n_nodes} nodes, depth {self.max_depth}, {size})"


def _children(edge_keys: np.ndarray, vocab_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """(child_tokens, child_ptr) of sorted edge keys: each node's children as one slice."""
    tokens = (edge_keys % vocab_size).astype(np.int32)
    counts = np.bincount(edge_keys // vocab_size, minlength=len(edge_keys) + 1)
    ptr = np.zeros(len(edge_keys) + 2, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return tokens, ptr
