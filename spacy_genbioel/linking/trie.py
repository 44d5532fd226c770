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
-> terminal node and node -> parent are derived from the stored arrays, so the
file format did not change.
"""
from __future__ import annotations

import logging
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from spacy_genbioel.util import PathLike

import numpy as np
import torch

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1


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
    ) -> None:
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
        return cls._build(
            tokens,
            np.concatenate(lens) if lens else np.zeros(0, dtype=np.int64),
            vocab_size,
            eos_token_id,
            root_token_id,
            np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64),
        )

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
        arrays = {
            "edge_keys": self.edge_keys,
            "terminal_nodes": self.terminal_nodes,
            "terminal_ptr": self.terminal_ptr,
            "terminal_names": self.terminal_names,
        }
        save_file(arrays, str(path), metadata=meta)

    @classmethod
    def from_disk(cls, path: PathLike) -> "NameTrie":
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as handle:
            meta = handle.metadata() or {}
            if meta.get("format_version") != str(_FORMAT_VERSION):
                raise ValueError(f"{path}: not a NameTrie file of format {_FORMAT_VERSION} (metadata {meta})")
            arrays = {k: handle.get_tensor(k) for k in handle.keys()}
        return cls(
            arrays["edge_keys"],
            arrays["terminal_nodes"],
            arrays["terminal_ptr"],
            arrays["terminal_names"],
            vocab_size=int(meta["vocab_size"]),
            eos_token_id=int(meta["eos_token_id"]),
            root_token_id=int(meta["root_token_id"]),
            max_depth=int(meta["max_depth"]),
        )

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.edge_keys, self.child_tokens, self.child_ptr, self.terminal_nodes, self.terminal_ptr, self.terminal_names))

    def __repr__(self) -> str:
        return f"NameTrie({self.n_names} names, {self.n_nodes} nodes, depth {self.max_depth}, {self.nbytes() / 1e6:.1f} MB)"


def _ragged(starts: torch.Tensor, counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Flatten the ranges ``starts[i] : starts[i] + counts[i]``: (owner i, position) per element."""
    rows = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    first = torch.cumsum(counts, 0) - counts
    offsets = torch.arange(int(counts.sum()), device=counts.device) - first[rows] + starts[rows]
    return rows, offsets


class TrieTensors:
    """The trie's arrays as torch tensors on one device, with batched queries."""

    def __init__(self, trie: NameTrie, device: torch.device) -> None:
        self.device = device
        self.vocab_size = trie.vocab_size
        self.eos_token_id = trie.eos_token_id
        self.edge_keys = torch.from_numpy(trie.edge_keys).to(device)
        self.child_tokens = torch.from_numpy(trie.child_tokens).to(device)
        self.child_ptr = torch.from_numpy(trie.child_ptr).to(device)
        self.terminal_nodes = torch.from_numpy(trie.terminal_nodes).to(device)

    def advance(self, nodes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Child of each node by each token; -1 where the step leaves the trie."""
        keys = nodes.clamp(min=0) * self.vocab_size + tokens
        pos = torch.searchsorted(self.edge_keys, keys)
        pos_c = pos.clamp(max=max(len(self.edge_keys) - 1, 0))
        found = (pos < len(self.edge_keys)) & (self.edge_keys[pos_c] == keys) & (nodes >= 0)
        return torch.where(found, pos + 1, torch.full_like(pos, -1))

    def allowed_mask(self, nodes: torch.Tensor, vocab_size: Optional[int] = None) -> torch.Tensor:
        """Boolean ``(len(nodes), vocab)`` mask of the tokens each node allows.

        Beams usually share nodes (all start at the root), so the mask is built
        for the distinct nodes and then gathered.
        """
        vocab_size = vocab_size or self.vocab_size
        unique, inverse = torch.unique(nodes, return_inverse=True)
        safe = unique.clamp(min=0)
        starts = self.child_ptr[safe]
        counts = torch.where(unique >= 0, self.child_ptr[safe + 1] - starts, torch.zeros_like(starts))
        rows, offsets = _ragged(starts, counts)
        mask = torch.zeros((len(unique), vocab_size), dtype=torch.bool, device=nodes.device)
        mask[rows, self.child_tokens[offsets].long()] = True
        return mask[inverse]


class TrieRestriction:
    """One sub-trie per row of a batch: the trie edges on the paths of the row's
    allowed names, as sorted keys ``row * n_nodes + parent`` and their tokens.

    Rows are positions in the batch given to :meth:`NameTrie.restrict`; rows not
    marked ``restricted`` fall through to the full trie. Child node ids are the
    full trie's, so ``TrieTensors.advance`` is unchanged.
    """

    def __init__(
        self, edge_keys: np.ndarray, tokens: np.ndarray, restricted: np.ndarray, n_nodes: int, device: torch.device
    ) -> None:
        self.n_nodes = int(n_nodes)
        self.edge_keys = torch.from_numpy(np.ascontiguousarray(edge_keys, dtype=np.int64)).to(device)
        self.tokens = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64)).to(device)
        self.restricted = torch.from_numpy(restricted).to(device)

    def allowed_mask(self, trie: TrieTensors, nodes: torch.Tensor, rows: torch.Tensor, vocab_size: Optional[int] = None) -> torch.Tensor:
        """Like ``trie.allowed_mask(nodes)``, with each restricted row's beams
        limited to its sub-trie (a subset of the trie's children by construction)."""
        vocab_size = vocab_size or trie.vocab_size
        limited = self.restricted[rows]
        free = torch.nonzero(~limited).view(-1)
        if len(free) == len(nodes):
            return trie.allowed_mask(nodes, vocab_size)
        mask = torch.zeros((len(nodes), vocab_size), dtype=torch.bool, device=nodes.device)
        if len(free):
            mask[free] = trie.allowed_mask(nodes[free], vocab_size)
        beams = torch.nonzero(limited).view(-1)
        sub = nodes[beams]
        keys = rows[beams] * self.n_nodes + sub.clamp(min=0)
        lo = torch.searchsorted(self.edge_keys, keys)
        hi = torch.searchsorted(self.edge_keys, keys, right=True)
        counts = torch.where(sub >= 0, hi - lo, torch.zeros_like(lo))
        owner, offsets = _ragged(lo, counts)
        mask[beams[owner], self.tokens[offsets]] = True
        return mask
