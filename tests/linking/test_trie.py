import numpy as np
import pytest
import spacy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.decoding.reference import DictTrie
from spacy_genbioel.linking.trie.name_trie import NameTrie

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
    from spacy_genbioel.linking.trie.name_trie import TrieFormatError

    with pytest.raises(TrieFormatError, match="bad.safetensors"):
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


# -- a trie knows the tokenizer and model it was built for (issue 16, items 4 and 10) ----------------------------
def _linker_parts(micro_model, word_tokenizer, kb):
    from spacy_genbioel.linking.decoding.decoder import GenerativeLinker

    return GenerativeLinker(micro_model, word_tokenizer, kb)


def _rewrite_metadata(path, change):
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(path), framework="np") as handle:
        meta = dict(handle.metadata())
    save_file(load_file(str(path)), str(path), metadata=change(meta))


def _permuted(tokenizer, folder):
    """The same tokenizer with its ordinary tokens' ids reversed (same size, other ids)."""
    import fuzz_component

    return fuzz_component.permuted_tokenizer(tokenizer, folder)


def test_the_trie_stores_the_tokenizer_fingerprint_and_model_ids(tmp_path, micro_model, word_tokenizer, small_kb):
    from spacy_genbioel.models import tokenizer_fingerprint

    linker = _linker_parts(micro_model, word_tokenizer, small_kb)
    linker.trie.to_disk(tmp_path / "trie.safetensors")
    again = NameTrie.from_disk(tmp_path / "trie.safetensors")
    assert again.tokenizer_fingerprint == tokenizer_fingerprint(word_tokenizer)
    assert (again.vocab_size, again.eos_token_id, again.root_token_id) == (
        linker.vocab_size,
        linker.eos_token_id,
        linker.trie.root_token_id,
    )
    assert (
        again.mismatch(
            word_tokenizer,
            vocab_size=linker.vocab_size,
            eos_token_id=linker.eos_token_id,
            root_token_id=linker.trie.root_token_id,
            names=small_kb.names,
        )
        == []
    )


def test_a_trie_of_another_tokenizer_is_refused_or_rebuilt_with_a_warning(
    tmp_path, micro_model, word_tokenizer, small_kb, caplog
):
    from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
    from spacy_genbioel.linking.trie.name_trie import TrieMismatchError

    other = _permuted(word_tokenizer, tmp_path / "other")
    assert len(other) == len(word_tokenizer)
    trie = _linker_parts(micro_model, word_tokenizer, small_kb).trie
    trie.to_disk(tmp_path / "trie.safetensors")
    stored = NameTrie.from_disk(tmp_path / "trie.safetensors")
    with pytest.raises(TrieMismatchError, match="trie.safetensors.*another tokenizer"):
        GenerativeLinker(micro_model, other, small_kb, stored)
    # the component rebuilds a trie that does not fit, saying why
    component = spacy.blank("en").add_pipe("genbioel")
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        component.set_model(micro_model, other, small_kb, stored)
    linker = component.linker
    assert "another tokenizer" in caplog.text and "rebuilding" in caplog.text
    ids = other(" " + small_kb.names[0], add_special_tokens=False)["input_ids"]
    assert 0 in linker.trie.names_at(linker.trie.walk([*ids, linker.eos_token_id])).tolist()


def test_an_old_trie_without_fingerprint_loads_and_another_tokenizer_behind_it_is_caught(
    tmp_path, micro_model, word_tokenizer, small_kb
):
    from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
    from spacy_genbioel.linking.trie.name_trie import TrieMismatchError

    trie = _linker_parts(micro_model, word_tokenizer, small_kb).trie
    path = tmp_path / "trie.safetensors"
    trie.to_disk(path)
    # the metadata a 0.1 file carries: format 1, no fingerprint
    _rewrite_metadata(
        path, lambda m: {k: v for k, v in {**m, "format_version": "1"}.items() if k != "tokenizer_fingerprint"}
    )
    old = NameTrie.from_disk(path)
    assert old.tokenizer_fingerprint is None and old.sequences() == trie.sequences()
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, old)
    assert linker.trie is old  # it fits: used as it is
    other = _permuted(word_tokenizer, tmp_path / "other")
    with pytest.raises(TrieMismatchError, match="does not fit"):
        GenerativeLinker(micro_model, other, small_kb, NameTrie.from_disk(path))
    # without a fingerprint, re-tokenizing a sample of the KB names is what tells
    reasons = old.mismatch(
        other,
        vocab_size=linker.vocab_size,
        eos_token_id=linker.eos_token_id,
        root_token_id=old.root_token_id,
        names=small_kb.names,
    )
    assert len(reasons) == 1 and "sampled KB names are not paths" in reasons[0]


def test_a_trie_with_another_root_or_eos_is_refused(tmp_path, micro_model, word_tokenizer, small_kb):
    from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
    from spacy_genbioel.linking.trie.name_trie import TrieMismatchError

    trie = _linker_parts(micro_model, word_tokenizer, small_kb).trie
    for key, value, message in [("root_token_id", "5", "rooted at token 5"), ("eos_token_id", "3", "EOS 3")]:
        path = tmp_path / f"{key}.safetensors"
        trie.to_disk(path)
        _rewrite_metadata(path, lambda m, key=key, value=value: {**m, key: value})
        with pytest.raises(TrieMismatchError, match=message):
            GenerativeLinker(micro_model, word_tokenizer, small_kb, NameTrie.from_disk(path))
    assert (
        f"vocabulary of {trie.vocab_size} tokens, the model has 500"
        in trie.mismatch(
            word_tokenizer, vocab_size=500, eos_token_id=trie.eos_token_id, root_token_id=trie.root_token_id
        )[0]
    )


@pytest.mark.parametrize(
    "damage",
    [
        "empty",
        "7 bytes",
        "half",
        "last byte",
        "garbage",
        "version 99",
        "version x",
        "no vocab_size",
        "vocab_size text",
        "edges unsorted",
        "terminal out of range",
    ],
)
def test_a_damaged_trie_file_raises_an_error_naming_it(tmp_path, damage):
    from safetensors.numpy import load_file, save_file

    from spacy_genbioel.linking.trie.name_trie import TrieFormatError

    path = tmp_path / "trie.safetensors"
    build([[5, 6], [5, 7, 8], [9]]).to_disk(path)
    data = path.read_bytes()
    arrays = load_file(str(path))
    if damage in ("empty", "7 bytes", "half", "last byte", "garbage"):
        cut = {"empty": 0, "7 bytes": 7, "half": len(data) // 2, "last byte": len(data) - 1}.get(damage)
        path.write_bytes(b"\xff" * 100 if cut is None else data[:cut])
    elif damage.startswith("version"):
        _rewrite_metadata(path, lambda m: {**m, "format_version": damage.split()[1]})
    elif damage == "no vocab_size":
        _rewrite_metadata(path, lambda m: {k: v for k, v in m.items() if k != "vocab_size"})
    elif damage == "vocab_size text":
        _rewrite_metadata(path, lambda m: {**m, "vocab_size": "twenty"})
    else:
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as handle:
            meta = dict(handle.metadata())
        key = "edge_keys" if damage == "edges unsorted" else "terminal_nodes"
        arrays[key] = arrays[key][::-1].copy() if key == "edge_keys" else arrays[key] + 1000
        save_file(arrays, str(path), metadata=meta)
    with pytest.raises(TrieFormatError, match="trie.safetensors") as err:
        NameTrie.from_disk(path)
    if damage == "version 99":
        assert "newer spacy_genbioel" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_a_missing_trie_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        NameTrie.from_disk(tmp_path / "nothing.safetensors")
