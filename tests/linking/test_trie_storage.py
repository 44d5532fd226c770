"""The trie file of format 3 (children stored, read memory-mapped, checked in chunks) and
word-by-word tokenization of the KB names: the same tries and answers as before."""

import mmap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.arrayfile import backing_map, read_arrays, release_pages, write_arrays
from spacy_genbioel.linking.trie.name_tokens import tokenize_names, word_splitting
from spacy_genbioel.linking.trie.name_trie import NameTrie, TrieArrays, TrieFormatError

V, EOS, ROOT = 50, 2, 16


def build(seqs):
    return NameTrie.from_sequences(seqs, vocab_size=V, eos_token_id=EOS, root_token_id=ROOT)


SEQS = [[5, 6], [5, 7, 8], [9], [5, 6], [9, 10, 11, 12]]


def test_format_3_stores_the_children_and_maps_them(tmp_path):
    trie = build(SEQS)
    trie.to_disk(tmp_path / "trie.safetensors")
    arrays, meta = read_arrays(tmp_path / "trie.safetensors")
    assert meta["format_version"] == "3" and {"child_tokens", "child_ptr"} <= set(arrays)
    again = NameTrie.from_disk(tmp_path / "trie.safetensors")
    for key in ("edge_keys", "child_tokens", "child_ptr", "terminal_nodes", "terminal_ptr", "terminal_names"):
        array = getattr(again, key)
        assert (array == getattr(trie, key)).all(), key
        assert not array.flags.owndata and isinstance(backing_map(array), mmap.mmap), key
    assert again.sequences() == trie.sequences()
    assert again.walk([5, 6, EOS]) == trie.walk([5, 6, EOS]) and sorted(again.names_at(again.walk([5, 6, EOS]))) == [
        0,
        3,
    ]
    # torch shares the mapped memory rather than copying it
    tensors = again.on_device("cpu")
    assert tensors.edge_keys.data_ptr() == again.edge_keys.__array_interface__["data"][0]


def test_format_2_files_still_load(tmp_path):
    from safetensors.numpy import save_file

    trie = build(SEQS)
    meta = {
        "format_version": "2",
        "vocab_size": str(V),
        "eos_token_id": str(EOS),
        "root_token_id": str(ROOT),
        "max_depth": str(trie.max_depth),
        "tokenizer_fingerprint": "abc",
    }
    save_file(
        {k: getattr(trie, k) for k in ("edge_keys", "terminal_nodes", "terminal_ptr", "terminal_names")},
        str(tmp_path / "old.safetensors"),
        metadata=meta,
    )
    old = NameTrie.from_disk(tmp_path / "old.safetensors")
    assert old.sequences() == trie.sequences() and old.tokenizer_fingerprint == "abc"
    assert (old.child_ptr == trie.child_ptr).all() and (old.child_tokens == trie.child_tokens).all()


@pytest.mark.parametrize(
    "damage", ["child tokens", "child pointers", "pointers short", "pointers unsorted", "children missing"]
)
def test_damaged_children_are_refused_naming_the_file(tmp_path, damage):
    trie = build(SEQS)
    path = tmp_path / "trie.safetensors"
    trie.to_disk(path)
    arrays, meta = read_arrays(path)
    arrays = {k: np.array(v) for k, v in arrays.items()}
    if damage == "child tokens":
        arrays["child_tokens"][0] += 1
    elif damage == "child pointers":
        arrays["child_ptr"][1] += 1
    elif damage == "pointers short":
        arrays["child_ptr"] = arrays["child_ptr"][:-1]
    elif damage == "pointers unsorted":
        arrays["child_ptr"][1:-1] = arrays["child_ptr"][1:-1][::-1]
    else:
        del arrays["child_ptr"]
    write_arrays(path, arrays, meta)
    with pytest.raises(TrieFormatError, match="trie.safetensors"):
        NameTrie.from_disk(path)


def test_released_pages_read_back_the_same(tmp_path):
    data = np.arange(3_000_000, dtype=np.int64)
    write_arrays(tmp_path / "a.safetensors", {"a": data}, {})
    arrays, _ = read_arrays(tmp_path / "a.safetensors")
    total = int(arrays["a"].sum())
    release_pages(arrays["a"])
    release_pages(np.arange(10))  # not mapped: left alone
    assert int(arrays["a"].sum()) == total == int(data.sum())


_words = st.sampled_from(
    ["renal", "failure", "acute", "lung", "cancer", "α-synuclein", "c6h12o6", "it's", "x1", "文字", "ab"]
)
_names = st.lists(st.lists(_words, min_size=1, max_size=4).map(" ".join), min_size=1, max_size=30)


@given(_names)
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_word_by_word_tokenization_equals_the_tokenizer(word_tokenizer, names):
    assert word_splitting(word_tokenizer)
    found = tokenize_names(names, word_tokenizer, eos_token_id=EOS, max_name_tokens=6, chunk_size=1)
    direct = word_tokenizer([" " + n for n in names], add_special_tokens=False)["input_ids"]
    kept = [i for i, ids in enumerate(direct) if 0 < len(ids) <= 6]
    assert found.kept.tolist() == kept and found.skipped == len(names) - len(kept)
    expected = [t for i in kept for t in direct[i] + [EOS]]
    assert found.tokens.tolist() == expected and found.lengths.tolist() == [len(direct[i]) + 1 for i in kept]


def test_names_that_are_not_single_spaced_words_are_tokenized_whole(word_tokenizer):
    names = ["renal failure", "renal  failure", " lung", "cancer "]
    found = tokenize_names(names, word_tokenizer, eos_token_id=EOS, max_name_tokens=64)
    direct = word_tokenizer([" " + n for n in names], add_special_tokens=False)["input_ids"]
    assert found.tokens.tolist() == [t for ids in direct for t in ids + [EOS]]


def test_tokenizers_that_do_not_split_at_spaces_are_not_taken_word_by_word(word_tokenizer):
    from tokenizers import pre_tokenizers

    other = word_tokenizer.__class__(
        tokenizer_object=word_tokenizer.backend_tokenizer.__class__.from_str(word_tokenizer.backend_tokenizer.to_str())
    )
    other.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    assert not word_splitting(other)
    names = ["renal failure", "acute lung cancer"]
    found = tokenize_names(names, other, eos_token_id=EOS, max_name_tokens=64)
    direct = other([" " + n for n in names], add_special_tokens=False)["input_ids"]
    assert found.tokens.tolist() == [t for ids in direct for t in ids + [EOS]]


def test_a_trie_from_names_is_the_trie_of_their_token_ids(word_tokenizer, small_kb):
    names = list(small_kb.names)
    trie = NameTrie.from_names(names, word_tokenizer, eos_token_id=EOS, root_token_id=ROOT)
    ids = word_tokenizer([" " + n for n in names], add_special_tokens=False)["input_ids"]
    same = NameTrie.from_sequences(ids, vocab_size=len(word_tokenizer), eos_token_id=EOS, root_token_id=ROOT)
    assert trie.sequences() == same.sequences() and (trie.edge_keys == same.edge_keys).all()


def test_large_tries_are_sampled_on_loading_and_checked_fully_on_request(tmp_path):
    rng = np.random.default_rng(0)
    trie = build([rng.integers(3, V, rng.integers(1, 8)).tolist() for _ in range(8000)])
    assert len(trie.edge_keys) > 2 * 512  # sampled on loading
    path = tmp_path / "trie.safetensors"
    trie.to_disk(path)
    arrays, meta = read_arrays(path)
    arrays = {k: np.array(v) for k, v in arrays.items()}
    arrays["child_tokens"][len(arrays["child_tokens"]) // 2 + 1] += 1  # one entry: a sample may miss it
    write_arrays(path, arrays, meta)
    with pytest.raises(TrieFormatError, match="trie.safetensors"):
        NameTrie.from_disk(path, full_check=True)


def test_decoding_never_indexes_outside_damaged_children():
    import torch

    trie = build(SEQS)
    ptr = trie.child_ptr.copy()
    ptr[1:-1] = [10_000, -5, 3, 99][: len(ptr) - 2] + [0] * max(0, len(ptr) - 6)
    tokens = trie.child_tokens.copy()
    tokens[0] = 10_000
    arrays = TrieArrays(
        trie.edge_keys, trie.terminal_nodes, trie.terminal_ptr, trie.terminal_names, child_tokens=tokens, child_ptr=ptr
    )
    damaged = NameTrie(arrays, vocab_size=V, eos_token_id=EOS, root_token_id=ROOT, max_depth=trie.max_depth)
    mask = damaged.on_device("cpu").allowed_mask(torch.arange(-1, damaged.n_nodes))
    assert mask.shape == (damaged.n_nodes + 1, V)
