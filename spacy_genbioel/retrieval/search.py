"""Exact nearest-name search: the top ``k`` names per query by inner product, a chunk of names at a time.

A score block holds at most ``max_block`` entries (query rows x names of a chunk). The names are the
outer loop: each chunk is read once per block of queries and the running top ``k`` merged, so a large
matrix streams from memory a few times rather than once per handful of queries. For MiniLM's
788k x 384 float32 BC5CDR matrix, one block per 21 queries meant reading 1.2 GB per 21 queries; chunks
of 131,072 names take 128 queries a block (1.8x less CPU for 534 queries on one thread,
docs/benchmarks.md). Used by the dense and ResCNN linkers.
"""

from __future__ import annotations

from typing import Callable, Tuple

import numpy as np
import torch

__all__ = ["CHUNK_NAMES", "nearest_rows"]

#: names scored per chunk by default
CHUNK_NAMES = 131072


def nearest_rows(
    queries: torch.Tensor,
    rows: Callable[[int, int], torch.Tensor],
    n_names: int,
    k: int,
    chunk_names: int = CHUNK_NAMES,
    max_block: int = 1 << 24,
) -> Tuple[np.ndarray, np.ndarray]:
    """``(scores, name indices)`` of the ``k`` best names per query row, best first; an index is -1
    where fewer than ``k`` names exist. ``rows(start, stop)``: the float rows of those names (on the
    device the product should run on)."""
    n_queries = queries.shape[0]
    if n_names == 0:
        return np.full((n_queries, k), -np.inf, dtype=np.float32), np.full((n_queries, k), -1, dtype=np.int64)
    chunk = max(1, min(chunk_names, n_names))
    step = max(1, max_block // chunk)
    best_scores = best_index = None
    with torch.inference_mode():
        for lo in range(0, n_names, chunk):
            names = rows(lo, min(n_names, lo + chunk))
            if best_scores is None:  # the product runs where the names are
                queries = queries.to(names.device)
                best_scores = torch.full((n_queries, k), float("-inf"), device=names.device)
                best_index = torch.zeros((n_queries, k), dtype=torch.long, device=names.device)
            for q in range(0, n_queries, step):
                block = queries[q : q + step].to(names.dtype) @ names.T
                scores, index = block.float().topk(min(k, block.shape[1]), dim=1)
                merged = torch.cat([best_scores[q : q + step], scores], dim=1)
                merged_index = torch.cat([best_index[q : q + step], index + lo], dim=1)
                top, pick = merged.topk(k, dim=1)
                best_scores[q : q + step], best_index[q : q + step] = top, merged_index.gather(1, pick)
    scores = best_scores.cpu().numpy()
    return scores, np.where(np.isfinite(scores), best_index.cpu().numpy(), -1)
