"""The name trie's batched queries in torch, for decoding: :class:`TrieTensors`
(the whole trie on one device: the children of many nodes at once as a token
mask, one step for many beams) and :class:`TrieRestriction` (per-mention
sub-tries of candidate-restricted decoding). Built by
:meth:`~spacy_genbioel.linking.trie.name_trie.NameTrie.on_device` and
:meth:`~spacy_genbioel.linking.trie.name_trie.NameTrie.restrict`."""

from __future__ import annotations

from typing import Optional, Protocol, Tuple

import numpy as np
import torch


def _ragged(starts: torch.Tensor, counts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Flatten the ranges ``starts[i] : starts[i] + counts[i]``: (owner i, position) per element."""
    rows = torch.repeat_interleave(torch.arange(len(counts), device=counts.device), counts)
    first = torch.cumsum(counts, 0) - counts
    offsets = torch.arange(int(counts.sum()), device=counts.device) - first[rows] + starts[rows]
    return rows, offsets


class HostTrie(Protocol):
    """What :class:`TrieTensors` copies from a :class:`~spacy_genbioel.linking.trie.name_trie.NameTrie` (not
    imported here: the trie imports this module)."""

    vocab_size: int
    eos_token_id: int
    edge_keys: np.ndarray
    child_tokens: np.ndarray
    child_ptr: np.ndarray
    terminal_nodes: np.ndarray


class TrieTensors:
    """The trie's arrays as torch tensors on one device, with batched queries."""

    def __init__(self, trie: HostTrie, device: torch.device) -> None:
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
        # clamped to the arrays: a damaged file (checked at a sample of positions) cannot index outside them
        n_edges = len(self.child_tokens)
        starts = self.child_ptr[safe].clamp(0, n_edges)
        ends = torch.maximum(self.child_ptr[safe + 1].clamp(0, n_edges), starts)
        counts = torch.where(unique >= 0, ends - starts, torch.zeros_like(starts))
        rows, offsets = _ragged(starts, counts)
        mask = torch.zeros((len(unique), vocab_size), dtype=torch.bool, device=nodes.device)
        mask[rows, self.child_tokens[offsets].long().clamp_(0, vocab_size - 1)] = True
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

    def allowed_mask(
        self, trie: TrieTensors, nodes: torch.Tensor, rows: torch.Tensor, vocab_size: Optional[int] = None
    ) -> torch.Tensor:
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
