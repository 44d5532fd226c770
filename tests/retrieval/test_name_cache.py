"""The retrievers' name cache (spacy_genbioel.retrieval.name_cache): content-addressed entries, and rows
reused by KBs that share names."""

import hashlib
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dense import tiny_bert_dir  # noqa: F401  (the fixture: a tiny random BERT)

from spacy_genbioel.arrayfile import read_arrays, write_arrays
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.retrieval.dense import DenseEncoder, DenseLinker, DenseSettings
from spacy_genbioel.retrieval.name_cache import HASHES, NameCache, name_hashes

SPEC = json.dumps({"v": 1, "model": "m"}).encode("utf8")


def vector(name: str) -> np.ndarray:
    """A made-up encoder: a name's row depends on the name alone."""
    seed = int.from_bytes(hashlib.sha256(name.encode("utf8")).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(4).astype(np.float16)


class Encoder:
    def __init__(self, names):
        self.names, self.calls = names, []

    def __call__(self, indices):
        self.calls.append([self.names[i] for i in indices])
        return {
            "rows": np.stack([vector(self.names[i]) for i in indices])
            if len(indices)
            else np.empty((0, 4), np.float16),
            "scales": np.array([len(self.names[i]) for i in indices], dtype=np.float32),
        }


def entry(folder, names, spec=SPEC, **kw) -> NameCache:
    return NameCache(folder, spec, names, **kw)


def built(folder, names, spec=SPEC):
    cache = entry(folder, names, spec)
    encoder = Encoder(names)
    arrays = cache.write(cache.build(encoder), {})
    return cache, encoder, arrays


@given(st.lists(st.text(max_size=12), max_size=30))
@settings(max_examples=50, deadline=None)
def test_hashes_are_equal_exactly_for_equal_names(names):
    hashes = name_hashes(names)
    assert hashes.dtype == np.uint64 and len(hashes) == len(names)
    assert len(set(hashes.tolist())) == len(set(names))
    assert np.array_equal(hashes, name_hashes(list(names)))


def test_the_key_is_the_settings_then_every_name(tmp_path):
    names = ["heart attack", "renal failure"]
    digest = hashlib.sha256(SPEC)
    for name in names:
        digest.update(b"\n" + name.encode("utf8"))
    cache = entry(tmp_path, names, kb_name="my kb/1", infix=".rescnn")
    assert cache.key == digest.hexdigest()  # what the retrievers always hashed: existing entries stay valid
    assert cache.path.name == f"my_kb_1.rescnn-{cache.key[:24]}.safetensors"
    assert entry(tmp_path, names[::-1]).key != cache.key


def test_a_miss_encodes_every_name_and_a_hit_reads_the_file(tmp_path):
    names = ["a", "bb", "ccc"]
    cache, encoder, arrays = built(tmp_path, names)
    assert encoder.calls == [names] and cache.reused == 0 and cache.donor is None
    stored, meta = read_arrays(cache.path)
    assert meta["key"] == cache.key and meta["n_names"] == "3" and np.array_equal(stored[HASHES], name_hashes(names))
    again = entry(tmp_path, names, kb_name="another copy")  # content-addressed: another KB name reads it too
    found = again.read(lambda a: a["rows"].shape == (3, 4))
    assert sorted(found) == ["rows", "scales"] and np.array_equal(found["rows"], arrays["rows"])
    assert entry(tmp_path, names).read(lambda a: False) is None  # rows of the wrong shape: a miss


def test_a_kb_sharing_names_encodes_only_its_new_ones(tmp_path):
    names = [f"name {i}" for i in range(50)]
    first, _, arrays = built(tmp_path, names)
    bigger = ["a new name", *names[10:][::-1], "another new one"]  # some dropped, order changed, two added
    cache = entry(tmp_path, bigger)
    encoder = Encoder(bigger)
    got = cache.build(encoder)
    assert encoder.calls == [["a new name", "another new one"]]
    assert cache.reused == 40 and cache.donor == first.path
    for i, name in enumerate(bigger):
        assert np.array_equal(got["rows"][i], vector(name)) and got["scales"][i] == len(name)
    assert np.array_equal(got["rows"][1], arrays["rows"][49])  # the donor's bytes, moved to the name's new row


def test_the_donor_is_the_entry_with_most_names_and_the_same_settings(tmp_path):
    names = [f"n{i}" for i in range(20)]
    built(tmp_path, names[:5])
    most, _, _ = built(tmp_path, names[:15])
    built(tmp_path, names, spec=b"other settings")  # all the names, another encoder: never lends
    cache = entry(tmp_path, names)
    encoder = Encoder(names)
    cache.build(encoder)
    assert cache.donor == most.path and encoder.calls == [names[15:]]


def test_a_donor_with_other_arrays_is_not_used(tmp_path):
    names = ["x", "y"]
    cache = entry(tmp_path, names)
    write_arrays(
        cache.path.with_name("odd-0.safetensors"),
        {"rows": np.zeros((2, 3), np.float32), HASHES: name_hashes(names)},
        {"key": "odd", "spec": cache.spec_digest},
    )
    bigger = entry(tmp_path, ["x", "y", "z"])
    encoder = Encoder(bigger.names)
    got = bigger.build(encoder)
    assert encoder.calls[-1] == ["x", "y", "z"] and got["rows"].shape == (3, 4)


def test_an_entry_without_hashes_gets_them_on_read_and_then_lends(tmp_path):
    names = ["heart attack", "renal failure", "hypertension"]
    cache = entry(tmp_path, names)
    old = Encoder(names)(np.arange(3))
    write_arrays(cache.path, old, {"key": cache.key})  # as written before the hashes
    found = cache.read(lambda a: True)
    assert np.array_equal(found["rows"], old["rows"]) and sorted(found) == ["rows", "scales"]
    stored, meta = read_arrays(cache.path)
    assert meta["spec"] == cache.spec_digest and np.array_equal(stored[HASHES], name_hashes(names))
    bigger = entry(tmp_path, [*names, "lung disease"])
    encoder = Encoder(bigger.names)
    bigger.build(encoder)
    assert encoder.calls == [["lung disease"]] and bigger.reused == 3


def test_a_damaged_entry_is_skipped(tmp_path, caplog):
    cache, _, _ = built(tmp_path, ["a", "b"])
    cache.path.write_bytes(b"not safetensors")
    assert entry(tmp_path, ["a", "b"]).read(lambda a: True) is None
    encoder = Encoder(["a", "b", "c"])
    entry(tmp_path, ["a", "b", "c"]).build(encoder)  # nothing to lend: every name encoded
    assert encoder.calls == [["a", "b", "c"]] and "unreadable" in caplog.text


# -- the retrievers ---------------------------------------------------------------------------------
def test_dense_linker_encodes_only_the_names_a_kb_adds(tiny_bert_dir, tmp_path, monkeypatch):  # noqa: F811
    kb = KnowledgeBase(
        [Concept("D1", ["heart attack", "myocardial infarction"]), Concept("D2", ["renal failure"])], name="kb"
    )
    first = DenseLinker(kb, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path))
    encoded = []
    original = DenseEncoder.encode

    def record(self, texts, *args, **kwargs):
        encoded.append(list(texts))
        return original(self, texts, *args, **kwargs)

    monkeypatch.setattr(DenseEncoder, "encode", record)
    bigger = KnowledgeBase([*kb, Concept("D3", ["lung disease"])], name="kb+train")
    second = DenseLinker(bigger, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path))
    assert encoded == [["lung disease"]]
    assert not second.from_cache and second.cache.reused == 3 and second.cache.donor == first.cache_path
    fresh = DenseLinker(bigger, tiny_bert_dir, DenseSettings(pooling="cls", cache=False))
    assert torch.allclose(second.name_vectors, fresh.name_vectors, atol=2e-3)
    assert second.link(["lung", "heart attack"], 2) == fresh.link(["lung", "heart attack"], 2)
    third = DenseLinker(bigger, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path))
    assert third.from_cache and torch.equal(third.name_vectors, second.name_vectors)


def test_writers_of_one_entry_at_once_leave_one_whole_file(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    names = [f"name {i}" for i in range(200)]
    arrays = Encoder(names)(np.arange(len(names)))

    def write(_):
        return entry(tmp_path, names).write(arrays, {})

    with ThreadPoolExecutor(4) as pool:  # as cross-fitting folds whose KBs share every name
        written = list(pool.map(write, range(8)))
    assert all(np.array_equal(w["rows"], arrays["rows"]) for w in written)
    assert [p.name for p in tmp_path.iterdir()] == [entry(tmp_path, names).path.name]  # no partial files left
    assert np.array_equal(entry(tmp_path, names).read(lambda a: True)["scales"], arrays["scales"])


# -- damaged entries and donors (reliability audit) -----------------------------------------------------------------
def rows_layout(n):
    from spacy_genbioel.arrayfile import ArraySpec

    return {
        "rows": ArraySpec(("<f2",), (n, 4), finite=True),
        "scales": ArraySpec(("<f4",), (n,), finite=True, positive=True),
    }


@pytest.mark.parametrize(
    "damage, words",
    [
        # a hash more than rows, of a name the new KB has: was an IndexError
        (lambda a: {**a, HASHES: np.append(a[HASHES], name_hashes(["new"]))}, "rows"),
        (lambda a: {**a, HASHES: a[HASHES].astype(np.int64)}, HASHES),
        (lambda a: {**a, "scales": np.full(len(a["scales"]), np.nan, np.float32)}, "scales"),
        (lambda a: {**a, "rows": a["rows"].astype(np.float32)}, "rows"),
    ],
)
def test_a_damaged_donor_lends_nothing_and_is_named(tmp_path, caplog, damage, words):
    names = [f"n{i}" for i in range(6)]
    first = entry(tmp_path, names, layout=rows_layout)
    first.write(first.build(Encoder(names)), {})
    stored, meta = read_arrays(first.path)
    write_arrays(first.path, damage({k: np.array(v) for k, v in stored.items()}), meta)
    bigger = entry(tmp_path, [*names, "new"], layout=rows_layout)
    encoder = Encoder(bigger.names)
    got = bigger.build(encoder)
    assert encoder.calls == [bigger.names] and bigger.reused == 0  # every name encoded afresh
    assert all(np.array_equal(got["rows"][i], vector(n)) for i, n in enumerate(bigger.names))
    assert first.path.name in caplog.text and repr(words) in caplog.text


def test_an_entry_with_nan_or_short_scales_is_encoded_again(tmp_path, caplog):
    names = ["a", "bb", "ccc"]
    cache = entry(tmp_path, names, layout=rows_layout)
    cache.write(cache.build(Encoder(names)), {})
    stored, meta = read_arrays(cache.path)
    for scales in (np.array([1, np.nan, 3], np.float32), np.array([1, 2], np.float32)):
        write_arrays(cache.path, {**{k: np.array(v) for k, v in stored.items()}, "scales": scales}, meta)
        caplog.clear()
        assert entry(tmp_path, names, layout=rows_layout).read() is None
        assert cache.path.name in caplog.text and "'scales'" in caplog.text
