import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.reference import DictTrie
from spacy_genbioel.linking.trie import NameTrie

V, EOS, ROOT = 20, 2, 3
sequences_strategy = st.lists(st.lists(st.integers(4, V - 1), min_size=1, max_size=6), min_size=1, max_size=40)


def build(seqs):
    return NameTrie.from_sequences(seqs, vocab_size=V, eos_token_id=EOS, root_token_id=ROOT)


@given(sequences_strategy)
@settings(max_examples=60, deadline=None)
def test_trie_matches_dict_trie(seqs):
    trie = build(seqs)
    ref = DictTrie([[ROOT, *s, EOS] for s in seqs])
    tensors = trie.on_device("cpu")
    for seq in seqs:
        full = [*seq, EOS]
        node = 0
        for depth, token in enumerate(full):
            assert sorted(trie.children(node).tolist()) == sorted(ref.get([ROOT, *full[:depth]]))
            nxt = tensors.advance(torch.tensor([node]), torch.tensor([token]))
            node = trie.walk([token], node)
            assert int(nxt[0]) == node
        # every name is reachable and maps back to a name with exactly these tokens
        assert any(seqs[i] == seq for i in trie.names_at(node).tolist())
    assert {tuple(s) for s in seqs} == {tuple(t[:-1]) for _, t in trie.sequences()}


@given(sequences_strategy, st.lists(st.integers(-1, 30), min_size=1, max_size=20))
@settings(max_examples=40, deadline=None)
def test_batched_mask_equals_per_node_children(seqs, raw_nodes):
    trie = build(seqs)
    nodes = [n if n < trie.n_nodes else -1 for n in raw_nodes]
    mask = trie.on_device("cpu").allowed_mask(torch.tensor(nodes))
    for row, node in enumerate(nodes):
        expected = set(trie.children(node).tolist()) if node >= 0 else set()
        assert set(torch.nonzero(mask[row]).view(-1).tolist()) == expected


def test_leaving_the_trie_gives_minus_one():
    trie = build([[5, 6], [5, 7]])
    tensors = trie.on_device("cpu")
    out = tensors.advance(torch.tensor([0, 0, -1]), torch.tensor([5, 9, 5]))
    assert out.tolist()[1:] == [-1, -1]
    assert trie.walk([5, 9, 2]) == -1


def test_names_sharing_tokens_stay_reachable():
    trie = build([[5, 6], [5, 6], [7]])
    assert sorted(trie.names_at(trie.walk([5, 6, EOS])).tolist()) == [0, 1]
    assert trie.names_at(trie.walk([5])).tolist() == []


def test_round_trip_without_pickle(tmp_path):
    trie = build([[5, 6], [5, 7, 8], [9]])
    trie.to_disk(tmp_path / "trie.safetensors")
    again = NameTrie.from_disk(tmp_path / "trie.safetensors")
    assert again.sequences() == trie.sequences()
    assert (again.vocab_size, again.eos_token_id, again.root_token_id, again.max_depth) == (V, EOS, ROOT, 4)
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(Exception):
        NameTrie.from_disk(tmp_path / "bad.safetensors")


def test_rejects_out_of_vocabulary_tokens():
    with pytest.raises(ValueError):
        build([[5, V + 3]])


def test_from_names_uses_the_tokenizer_and_skips_overlong(word_tokenizer):
    names = ["renal failure", "acute renal failure", "x " * 200]
    eos = word_tokenizer.eos_token_id
    root = word_tokenizer("x is", add_special_tokens=False)["input_ids"][-1]
    trie = NameTrie.from_names(names, word_tokenizer, eos_token_id=eos, root_token_id=root, max_name_tokens=50)
    assert trie.n_names == 2
    ids = word_tokenizer(" renal failure", add_special_tokens=False)["input_ids"]
    assert trie.names_at(trie.walk([*ids, eos])).tolist() == [0]
    assert trie.root_token_id == root != eos


def test_memory_is_a_few_arrays():
    rng = np.random.default_rng(0)
    seqs = [rng.integers(4, V, size=rng.integers(1, 8)).tolist() for _ in range(5000)]
    trie = build(seqs)
    assert trie.nbytes() < 40 * (trie.n_nodes + 1) + 40 * trie.n_names
