"""Exact nearest-name search a chunk of names at a time (retrieval/search.py)."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.retrieval.search import nearest_rows


@settings(max_examples=60, deadline=None)
@given(
    n_names=st.integers(1, 60),
    n_queries=st.integers(1, 9),
    k=st.integers(1, 70),
    chunk=st.integers(1, 70),
    max_block=st.integers(1, 400),
    seed=st.integers(0, 10**6),
)
def test_chunked_search_finds_the_top_k_of_one_product(n_names, n_queries, k, chunk, max_block, seed):
    generator = torch.Generator().manual_seed(seed)
    names = torch.randn(n_names, 8, generator=generator)
    queries = torch.randn(n_queries, 8, generator=generator)
    calls = []

    def rows(start, stop):
        calls.append((start, stop))
        return names[start:stop]

    scores, index = nearest_rows(queries, rows, n_names, k, chunk_names=chunk, max_block=max_block)
    full = (queries @ names.T).numpy()
    found = min(k, n_names)
    expected = -np.sort(-full, axis=1)[:, :found]
    assert scores.shape == index.shape == (n_queries, k)
    np.testing.assert_allclose(scores[:, :found], expected, rtol=1e-5, atol=1e-5)
    assert (index[:, found:] == -1).all() and np.isinf(scores[:, found:]).all()
    picked = np.take_along_axis(full, index[:, :found], axis=1)  # each index is the name its score belongs to
    np.testing.assert_allclose(picked, scores[:, :found], rtol=1e-5, atol=1e-5)
    assert all(len(set(row)) == found for row in index[:, :found].tolist())
    # the names are the outer loop: each chunk is read once, whatever the number of query blocks
    size = max(1, min(chunk, n_names))
    assert calls == [(lo, min(n_names, lo + size)) for lo in range(0, n_names, size)]


def test_no_names_gives_no_candidates():
    scores, index = nearest_rows(torch.ones(2, 3), lambda a, b: torch.zeros(0, 3), 0, 4)
    assert (index == -1).all() and np.isinf(scores).all()
