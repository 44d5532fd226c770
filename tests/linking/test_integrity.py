"""Pipeline-folder and settings integrity (issue 31 items 6, 11, 13): a fusion file with
non-finite, out-of-range or boolean weights, a fractional depth, deep nesting, an unknown
retriever or a folder in its place; a compact KB with one changed byte; a trie whose
``max_depth`` lies; a ``cfg.json`` naming a registered function that is not a normalizer;
a model given another tokenizer than the one it was saved with. Each is refused with the
project's error naming the file; what is intact loads as before."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.arrayfile import read_arrays, write_arrays
from spacy_genbioel.kb.base import Concept, KBFormatError, KnowledgeBase
from spacy_genbioel.kb.compact import CompactKB
from spacy_genbioel.kb.normalizers import get_normalizer
from spacy_genbioel.linking.reranking.fusion import FusionFormatError, FusionModel, feature_names
from spacy_genbioel.linking.trie.name_trie import NameTrie, TrieFormatError
from spacy_genbioel.models import ModelFormatError, load_model, save_model, tokenizer_fingerprint

SOURCES = ["genbioel", "tfidf"]


def fusion_dict(**weights):
    return FusionModel(SOURCES, [float(weights.get(f, 0.0)) for f in feature_names(SOURCES)]).to_dict()


# -- fusion.json (item 6, item 10) -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, reason",
    [
        ('"exact": NaN', "NaN"),
        ('"exact": Infinity', "Infinity"),
        ('"exact": -Infinity', "-Infinity"),
        ('"exact": 1e400', "1e400"),
        ('"exact": true', "'weights' must map feature names to numbers"),
        ('"exact": 1' + "0" * 400, "too large"),
    ],
)
def test_fusion_weights_must_be_finite_numbers(tmp_path, text, reason):
    path = tmp_path / "fusion.json"
    path.write_text(json.dumps(fusion_dict()).replace('"exact": 0.0', text), encoding="utf8")
    with pytest.raises(FusionFormatError, match=f"fusion.json.*{reason}"):
        FusionModel.load(path)


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -float("inf"), True, np.bool_(True)])
def test_a_fusion_model_refuses_weights_that_are_not_finite_numbers(weight):
    weights = [0.0] * len(feature_names(SOURCES))
    weights[-2] = weight
    with pytest.raises(ValueError, match="exact"):
        FusionModel(SOURCES, weights)


@pytest.mark.parametrize("depth", [2.9, True, "3", 0, None])
def test_fusion_depth_must_be_a_whole_number(tmp_path, depth):
    path = tmp_path / "fusion.json"
    path.write_text(json.dumps({**fusion_dict(), "depth": depth}), encoding="utf8")
    with pytest.raises(FusionFormatError, match="fusion.json: depth must be a whole number"):
        FusionModel.load(path)


def test_fusion_depth_and_weights_that_are_fine_still_load(tmp_path):
    path = tmp_path / "fusion.json"
    path.write_text(json.dumps({**fusion_dict(exact=2, tfidf_score=-1.5), "depth": 3}), encoding="utf8")
    model = FusionModel.load(path)
    assert model.depth == 3 and model.weights[-2] == 2.0 and isinstance(model.weights[-2], float)


@pytest.mark.parametrize("levels", [65, 200, 100_000])
def test_deeply_nested_fusion_files_are_refused(tmp_path, levels):
    path = tmp_path / "fusion.json"
    head = json.dumps({**fusion_dict(), "fit": "HOLE"})
    path.write_text(head.replace('"HOLE"', '{"a": ' * levels + "1" + "}" * levels), encoding="utf8")
    with pytest.raises(FusionFormatError, match="fusion.json: nested deeper than"):
        FusionModel.load(path)


def test_a_fit_report_nested_within_bounds_loads(tmp_path):
    path = tmp_path / "fusion.json"
    head = json.dumps({**fusion_dict(), "fit": "HOLE"})
    path.write_text(head.replace('"HOLE"', '{"a": ' * 20 + "1" + "}" * 20), encoding="utf8")
    assert FusionModel.load(path).fit["a"]["a"]


def test_an_unknown_fusion_retriever_is_named_with_the_file(tmp_path):
    path = tmp_path / "fusion.json"
    data = {
        **fusion_dict(),
        "sources": ["genbioel", "bogus"],
        "weights": dict.fromkeys(feature_names(["genbioel", "bogus"]), 0.0),
    }
    path.write_text(json.dumps(data), encoding="utf8")
    with pytest.raises(FusionFormatError, match="fusion.json: unknown retriever source 'bogus'"):
        FusionModel.load(path)


def test_a_fusion_file_that_is_a_folder_is_named(tmp_path):
    (tmp_path / "fusion.json").mkdir()
    with pytest.raises(FusionFormatError, match="fusion.json: a folder"):
        FusionModel.load(tmp_path / "fusion.json")


def test_a_fit_report_that_is_not_an_object_is_refused(tmp_path):
    path = tmp_path / "fusion.json"
    path.write_text(json.dumps({**fusion_dict(), "fit": [1, 2]}), encoding="utf8")
    with pytest.raises(FusionFormatError, match="fusion.json: 'fit' must be an object"):
        FusionModel.load(path)


# -- kb.safetensors against its checksum (item 11) -------------------------------------------------------------------
def _saved_kb(tmp_path):
    kb = KnowledgeBase([Concept("C0000123", ["renal failure", "kidney failure"]), Concept("C0000456", ["lung cancer"])])
    path = tmp_path / "kb.safetensors"
    CompactKB.from_kb(kb).save(path)
    return kb, path


def test_a_changed_concept_id_byte_is_refused_naming_the_file(tmp_path):
    kb, path = _saved_kb(tmp_path)
    data = path.read_bytes()
    at = data.index(b"C0000123") + 7
    path.write_bytes(data[:at] + b"9" + data[at + 1 :])  # C0000129: still a well-formed KB
    with pytest.raises(KBFormatError, match="kb.safetensors: damaged compact KB.*checksum"):
        CompactKB.open(path)
    with pytest.raises(KBFormatError, match="kb.safetensors"):
        KnowledgeBase.load(path)
    unverified = CompactKB.open(path, verify=False)  # what the check prevents: a wrong ID, silently
    assert unverified.ids_for_name("renal failure") == ("C0000129",)


def test_an_intact_kb_opens_and_a_file_without_the_digest_opens_unchecked(tmp_path):
    kb, path = _saved_kb(tmp_path)
    assert CompactKB.open(path).ids_for_name("kidney failure") == ("C0000123",)
    arrays, meta = read_arrays(path)
    write_arrays(
        path, {k: np.array(v) for k, v in arrays.items()}, {k: v for k, v in meta.items() if k != "content_sha256"}
    )
    assert CompactKB.open(path).checksum() == kb.checksum()  # written before the digest existed


def test_the_content_digest_survives_a_save_and_reopen(tmp_path):
    kb, path = _saved_kb(tmp_path)
    again = tmp_path / "again.safetensors"
    CompactKB.open(path).save(again)
    assert read_arrays(again)[1]["content_sha256"] == read_arrays(path)[1]["content_sha256"]


# -- the trie's max_depth (item 11) ----------------------------------------------------------------------------------
V, EOS, ROOT = 50, 2, 16


def _trie_with_depth(tmp_path, seqs, depth):
    trie = NameTrie.from_sequences(seqs, vocab_size=V, eos_token_id=EOS, root_token_id=ROOT)
    path = tmp_path / "trie.safetensors"
    trie.to_disk(path)
    arrays, meta = read_arrays(path)
    write_arrays(path, {k: np.array(v) for k, v in arrays.items()}, {**meta, "max_depth": str(depth)})
    return trie, path


@pytest.mark.parametrize("delta", [-4, -1, 1])
def test_a_trie_whose_max_depth_lies_is_refused(tmp_path, delta):
    trie = NameTrie.from_sequences([[5, 6], [5, 7, 8, 9], [9]], vocab_size=V, eos_token_id=EOS, root_token_id=ROOT)
    assert trie.max_depth == 5  # 4 tokens and EOS
    _, path = _trie_with_depth(tmp_path, [[5, 6], [5, 7, 8, 9], [9]], trie.max_depth + delta)
    with pytest.raises(TrieFormatError, match="trie.safetensors.*max_depth"):
        NameTrie.from_disk(path)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(3, V - 1), min_size=1, max_size=9), min_size=1, max_size=40))
def test_every_trie_built_here_states_its_true_depth(tmp_path_factory, seqs):
    tmp = tmp_path_factory.mktemp("trie")
    trie = NameTrie.from_sequences(seqs, vocab_size=V, eos_token_id=EOS, root_token_id=ROOT)
    trie.to_disk(tmp / "trie.safetensors")
    assert NameTrie.from_disk(tmp / "trie.safetensors", full_check=True).max_depth == max(map(len, seqs)) + 1


# -- cfg.json's kb_normalizer (item 11) ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["spacy.first_longest_spans_filter.v1", "genbioel.exact_retriever.v1", "spacy.Tokenizer.v1"]
)
def test_only_normalizers_are_called(name):
    with pytest.raises(ValueError, match="Unknown normalizer"):
        get_normalizer(name)


@pytest.fixture()
def test_normalizers():
    """Three registered normalizer names for one test (removed after it, so other tests' lists stay as they were)."""
    import catalogue
    from spacy.util import registry

    made = {
        "genbioel_test.broken_normalizer.v1": lambda: 42,
        "genbioel_test.bytes_normalizer.v1": lambda: lambda text: text.encode(),
        "genbioel_test.upper_normalizer.v1": lambda: str.upper,
    }
    for name, func in made.items():
        registry.misc.register(name, func=func)
    yield
    for name in made:
        catalogue._remove(("spacy", "misc", name))


def test_a_registered_normalizer_that_does_not_make_one_is_refused(test_normalizers):
    with pytest.raises(ValueError, match="does not make a normalizer"):
        get_normalizer("genbioel_test.broken_normalizer.v1")
    with pytest.raises(ValueError, match="does not make a normalizer"):
        get_normalizer("genbioel_test.bytes_normalizer.v1")
    assert get_normalizer("genbioel_test.upper_normalizer.v1")("abc") == "ABC"


def test_cfg_json_naming_another_registered_function_is_refused(tmp_path):
    from spacy_genbioel.linking.paths import read_component_cfg

    path = tmp_path / "cfg.json"
    path.write_text(
        json.dumps({"has_linker": True, "kb_normalizer": "spacy.first_longest_spans_filter.v1", "kb_dedup": False})
    )
    with pytest.raises(ModelFormatError, match="cfg.json: Unknown normalizer"):
        read_component_cfg(path)


# -- the model's tokenizer (item 13) ---------------------------------------------------------------------------------
@pytest.fixture()
def saved_model(tmp_path, micro_model, word_tokenizer):
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    return tmp_path / "model"


def _permuted(tokenizer, folder):
    from fuzz_component import permuted_tokenizer

    return permuted_tokenizer(tokenizer, folder)


def test_saving_records_the_tokenizer_fingerprint(saved_model, word_tokenizer):
    config = json.loads((saved_model / "config.json").read_text(encoding="utf8"))
    assert config["genbioel_tokenizer_fingerprint"] == tokenizer_fingerprint(word_tokenizer)
    model, tokenizer = load_model(saved_model)
    assert tokenizer_fingerprint(tokenizer) == config["genbioel_tokenizer_fingerprint"]


def test_a_permuted_tokenizer_of_the_same_size_is_refused(tmp_path, saved_model, word_tokenizer):
    other = _permuted(word_tokenizer, tmp_path / "permuted")
    assert len(other) == len(word_tokenizer)
    with pytest.raises(ModelFormatError, match="permuted is not the tokenizer the model was trained with.*config.json"):
        load_model(saved_model, tokenizer_path=tmp_path / "permuted")
    other.save_pretrained(str(saved_model))  # swapped inside the model folder
    with pytest.raises(ModelFormatError, match="model is not the tokenizer the model was trained with"):
        load_model(saved_model)


def test_a_model_without_a_recorded_fingerprint_loads_as_before(tmp_path, saved_model, word_tokenizer, caplog):
    config_file = saved_model / "config.json"
    config = json.loads(config_file.read_text(encoding="utf8"))
    del config["genbioel_tokenizer_fingerprint"]
    config_file.write_text(json.dumps(config), encoding="utf8")
    _permuted(word_tokenizer, tmp_path / "permuted").save_pretrained(str(saved_model))
    with caplog.at_level("INFO", logger="spacy_genbioel"):
        model, tokenizer = load_model(saved_model)
    assert len(tokenizer) == len(word_tokenizer) and "records no tokenizer fingerprint" in caplog.text


def test_a_saved_pipeline_records_its_tokenizer(tmp_path, micro_model, word_tokenizer, small_kb):
    import spacy

    import spacy_genbioel  # noqa: F401

    nlp = spacy.blank("en")
    nlp.add_pipe("genbioel", config={"device": "cpu"}).set_model(micro_model, word_tokenizer, small_kb)
    nlp.to_disk(tmp_path / "nlp")
    config = json.loads((tmp_path / "nlp" / "genbioel" / "model" / "config.json").read_text(encoding="utf8"))
    assert config["genbioel_tokenizer_fingerprint"] == tokenizer_fingerprint(word_tokenizer)
    _permuted(word_tokenizer, tmp_path / "permuted").save_pretrained(str(tmp_path / "nlp" / "genbioel" / "model"))
    with pytest.raises(ModelFormatError, match="genbioel/model is not the tokenizer"):
        spacy.load(tmp_path / "nlp")
