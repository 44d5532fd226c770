"""The TF-IDF index of a large KB is fitted once, then mapped from the cache with the same answers."""

import logging

import numpy as np
import pytest
from conftest import random_kb

from spacy_genbioel.arrayfile import read_arrays
from spacy_genbioel.retrieval.name_cache import write_entry
from spacy_genbioel.retrieval.tfidf import TfidfLinker

MENTIONS = ["renal failure", "cystic fibrosis of the liver", "zzzz", "", "heart"]


@pytest.fixture(autouse=True)
def small_kbs_cached(monkeypatch):
    from spacy_genbioel.retrieval import tfidf

    monkeypatch.setattr(tfidf, "CACHE_MIN_NAMES", 1)


def cached(kb, folder, **kwargs):
    return TfidfLinker(kb, cache=folder, **kwargs)


def answers(linker, kb):
    names = kb.names[:5]
    index = np.arange(10).reshape(5, 2)
    return (
        linker.link(MENTIONS + list(names), 4),
        linker.similarity(MENTIONS, [names[:2]] * len(MENTIONS)).tolist(),
        linker.pair_scores(MENTIONS, index).tolist(),
        linker.scores(MENTIONS).tolist(),
    )


@pytest.fixture()
def kb():
    return random_kb(3, n_concepts=80)


def test_a_cached_index_gives_the_fitted_index_s_answers(kb, tmp_path):
    fitted = cached(kb, tmp_path)
    assert not fitted.from_cache and fitted.cache.path.is_file()
    assert ".tfidf-" in fitted.cache.path.name
    read = cached(kb, tmp_path)
    assert read.from_cache and read.cache.path == fitted.cache.path
    assert answers(read, kb) == answers(fitted, kb) == answers(TfidfLinker(kb, cache=False), kb)
    assert read.vectorizer.vocabulary_ == fitted.vectorizer.vocabulary_


def test_only_large_kbs_are_cached_and_cache_false_writes_nothing(kb, tmp_path, monkeypatch):
    from spacy_genbioel.retrieval import tfidf

    assert TfidfLinker(kb, cache=False).cache is None
    monkeypatch.setattr(tfidf, "CACHE_MIN_NAMES", 100_000)
    assert TfidfLinker(kb, cache=tmp_path).cache is None  # 100,000 names at least
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_other_names_or_settings_are_another_entry(kb, tmp_path):
    first = cached(kb, tmp_path)
    other_kb = random_kb(4, n_concepts=80)
    assert cached(other_kb, tmp_path).cache.path != first.cache.path
    bigrams = cached(kb, tmp_path, ngram_range=(2, 2))
    assert not bigrams.from_cache and bigrams.cache.path != first.cache.path
    assert answers(cached(other_kb, tmp_path), other_kb) == answers(TfidfLinker(other_kb, cache=False), other_kb)


@pytest.mark.parametrize("damage", ["truncate", "offsets", "indices", "nan"])
def test_a_damaged_entry_is_named_and_fitted_again(kb, tmp_path, caplog, damage):
    path = cached(kb, tmp_path).cache.path
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    else:
        arrays, meta = read_arrays(path)
        arrays = {k: np.array(v) for k, v in arrays.items()}
        if damage == "offsets":
            arrays["vocab_offsets"][1] = 10**6
        elif damage == "indices":
            arrays["names_t_indices"][0] = len(kb.names)
        else:
            arrays["vectors_data"][0] = np.nan
        write_entry(path, arrays, meta)
    with caplog.at_level(logging.WARNING):
        again = cached(kb, tmp_path)
    assert not again.from_cache and str(path) in caplog.text
    assert answers(again, kb) == answers(TfidfLinker(kb, cache=False), kb)
    assert cached(kb, tmp_path).from_cache  # written again, sound


def test_a_folder_that_cannot_be_written_only_costs_the_fit(kb, tmp_path, monkeypatch, caplog):
    from spacy_genbioel.retrieval.name_cache import NameCache

    def refuse(self, arrays, meta):
        raise PermissionError(13, "Permission denied", str(self.path))

    monkeypatch.setattr(NameCache, "write", refuse)
    with caplog.at_level(logging.INFO, logger="spacy_genbioel.retrieval.tfidf"):
        linker = cached(kb, tmp_path)
    assert not linker.from_cache and "The TF-IDF index is not cached" in caplog.text
    assert answers(linker, kb) == answers(TfidfLinker(kb, cache=False), kb)
