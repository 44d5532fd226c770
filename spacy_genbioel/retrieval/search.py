"""Exact nearest-name search: the top ``k`` names per query by inner product, a chunk of names at a time.

A score block holds at most ``max_block`` entries (query rows x names of a chunk). The names are the
outer loop: each chunk is read once per block of queries and the running top ``k`` merged, so a large
matrix streams from memory a few times rather than once per handful of queries. For MiniLM's
788k x 384 float32 BC5CDR matrix, one block per 21 queries meant reading 1.2 GB per 21 queries; chunks
of 131,072 names take 128 queries a block (1.8x less CPU for 534 queries on one thread,
docs/benchmarks.md). Used by the dense and ResCNN linkers.

:func:`coarse_then_exact` is the same answer for less: a bfloat16 pass over every name (AMX or
AVX512-BF16 matrix products), the best ``coarse_k`` per query rescored in float32, and a proof per
query that no name left out can beat the ``k``-th (else that query is searched in float32).
"""

from __future__ import annotations

from typing import Callable, Tuple

import numpy as np
import torch

__all__ = ["BF16_ERROR", "CHUNK_NAMES", "coarse_then_exact", "nearest_rows"]

#: the most a bfloat16 inner product (both sides and the result rounded to 8 significant bits, float32
#: accumulation) can differ from the float32 one, relative to ``|query| * |name|``
BF16_ERROR = 2.0**-7 + 2.0**-8 + 2.0**-12

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
                if block.dtype != torch.bfloat16:  # bfloat16: its top k first, a few values to widen
                    block = block.float()
                scores, index = block.topk(min(k, block.shape[1]), dim=1)
                scores = scores.float()
                merged = torch.cat([best_scores[q : q + step], scores], dim=1)
                merged_index = torch.cat([best_index[q : q + step], index + lo], dim=1)
                top, pick = merged.topk(k, dim=1)
                best_scores[q : q + step], best_index[q : q + step] = top, merged_index.gather(1, pick)
    scores = best_scores.cpu().numpy()
    return scores, np.where(np.isfinite(scores), best_index.cpu().numpy(), -1)


def coarse_then_exact(
    queries: torch.Tensor,
    coarse: Callable[[int, int], torch.Tensor],
    exact: Callable[[torch.Tensor], torch.Tensor],
    n_names: int,
    k: int,
    coarse_k: int,
    name_norm: float,
) -> Tuple[np.ndarray, np.ndarray, int]:
    """:func:`nearest_rows` 's answer (float32 scores, up to float rounding) from a cheap pass:
    ``coarse(start, stop)`` gives bfloat16 rows of those names, ``exact(indices)`` float32 rows of the
    names at ``indices`` (any shape + (dim,)), ``name_norm`` bounds every name's norm. Per query the
    best ``coarse_k`` coarse names are rescored in float32; the ``k`` best of those are the answer when
    the ``k``-th beats the ``coarse_k``-th coarse score by more than the rounding can move a score
    (:data:`BF16_ERROR`), otherwise the query is searched again in float32. Also returns how many were."""
    n_queries = queries.shape[0]
    k = min(k, n_names)
    coarse_k = max(k, min(coarse_k, n_names))
    if n_queries == 0 or n_names == 0 or coarse_k >= n_names:
        scores, index = nearest_rows(queries, lambda a, b: exact(torch.arange(a, b)), n_names, k)
        return scores, index, n_queries
    queries = queries.float()
    c_scores, c_index = nearest_rows(queries.to(torch.bfloat16), coarse, n_names, coarse_k)
    with torch.inference_mode():
        found = torch.from_numpy(np.maximum(c_index, 0))
        rescored = torch.einsum("qkd,qd->qk", exact(found), queries)
        rescored[torch.from_numpy(c_index < 0)] = float("-inf")
        top, pick = rescored.topk(k, dim=1)
    index = np.take_along_axis(c_index, pick.numpy(), axis=1)
    scores = top.numpy().astype(np.float32)
    bound = c_scores[:, -1] + BF16_ERROR * queries.norm(dim=1).numpy() * name_norm
    doubtful = np.flatnonzero(~(scores[:, -1] > bound))
    if len(doubtful):
        again, again_index = nearest_rows(
            queries[torch.from_numpy(doubtful)], lambda a, b: exact(torch.arange(a, b)), n_names, k
        )
        scores[doubtful], index[doubtful] = again, again_index
    return scores, np.where(np.isfinite(scores), index, -1), len(doubtful)
