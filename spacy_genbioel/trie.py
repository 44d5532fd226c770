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
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

logger = logging.getLogger(__name__)

PathLike = Union[str, Path]
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
        rows = torch.repeat_interleave(torch.arange(len(unique), device=nodes.device), counts)
        first = torch.cumsum(counts, 0) - counts
        offsets = torch.arange(int(counts.sum()), device=nodes.device) - first[rows] + starts[rows]
        mask = torch.zeros((len(unique), vocab_size), dtype=torch.bool, device=nodes.device)
        mask[rows, self.child_tokens[offsets].long()] = True
        return mask[inverse]
