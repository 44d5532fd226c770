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


# -- a bfloat16 pass, then float32 where it is needed ----------------------------------------------------------
def _unit_rows(n, dim, generator, clusters=0):
    """``n`` unit vectors; with ``clusters``, near-copies of a few (scores close together: the bfloat16 pass
    cannot tell them apart, and its answer must be checked)."""
    if clusters:
        centers = torch.randn(clusters, dim, generator=generator)
        rows = centers[torch.randint(0, clusters, (n,), generator=generator)] + 1e-3 * torch.randn(
            n, dim, generator=generator
        )
    else:
        rows = torch.randn(n, dim, generator=generator)
    return rows / rows.norm(dim=1, keepdim=True)


@settings(max_examples=40, deadline=None)
@given(
    n_names=st.integers(1, 300),
    n_queries=st.integers(1, 6),
    k=st.integers(1, 12),
    coarse_k=st.integers(1, 40),
    clusters=st.sampled_from([0, 2, 5]),
    seed=st.integers(0, 10**6),
)
def test_coarse_then_exact_finds_the_float32_answer(n_names, n_queries, k, coarse_k, clusters, seed):
    from spacy_genbioel.retrieval.search import coarse_then_exact

    generator = torch.Generator().manual_seed(seed)
    names = _unit_rows(n_names, 16, generator, clusters)
    queries = _unit_rows(n_queries, 16, generator, 0)
    coarse = names.to(torch.bfloat16)
    scores, index, again = coarse_then_exact(
        queries, lambda a, b: coarse[a:b], lambda rows: names[rows], n_names, k, coarse_k, 1.0
    )
    expected_scores, expected_index = nearest_rows(queries, lambda a, b: names[a:b], n_names, min(k, n_names))
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-6)
    full = (queries @ names.T).numpy()
    # the same names up to exact ties: each one holds the score of its rank
    np.testing.assert_allclose(np.take_along_axis(full, index, axis=1), expected_scores, rtol=1e-5, atol=1e-6)
    assert 0 <= again <= n_queries


def test_coarse_then_exact_searches_again_what_it_cannot_prove():
    from spacy_genbioel.retrieval.search import coarse_then_exact

    generator = torch.Generator().manual_seed(0)
    names = _unit_rows(500, 16, generator, clusters=1)  # one tight cluster: every score within bfloat16's rounding
    queries = _unit_rows(3, 16, generator)
    coarse = names.to(torch.bfloat16)
    scores, index, again = coarse_then_exact(
        queries, lambda a, b: coarse[a:b], lambda rows: names[rows], 500, 5, 20, 1.0
    )
    assert again == 3  # none could be proven from 20 of 500 near-equal names: all searched in float32
    expected, _ = nearest_rows(queries, lambda a, b: names[a:b], 500, 5)
    np.testing.assert_allclose(scores, expected, rtol=1e-6)
    spread = _unit_rows(500, 16, generator)
    coarse = spread.to(torch.bfloat16)
    _, _, again = coarse_then_exact(queries, lambda a, b: coarse[a:b], lambda rows: spread[rows], 500, 5, 100, 1.0)
    assert again == 0  # scores spread out: the 5th of 100 rescored names is clear of the 100th
