import json
import shutil
from importlib.metadata import entry_points

import pytest
import spacy
from conftest import random_kb
from spacy.tokens import Span

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.models import save_model


@pytest.fixture()
def resources(tmp_path, micro_model, word_tokenizer):
    kb = random_kb(1, n_concepts=30)
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    kb.to_jsonl(tmp_path / "kb.jsonl")
    return kb, tmp_path


def make_nlp(tmp_path, **config):
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns(
        [
            {"label": "Disease", "pattern": "renal failure"},
            {"label": "Disease", "pattern": "cystic fibrosis"},
            {"label": "Chemical", "pattern": "liver"},
            {"label": "Disease", "pattern": "!!"},
        ]
    )
    cfg = {
        "model": str(tmp_path / "model"),
        "kb": str(tmp_path / "kb.jsonl"),
        "device": "cpu",
        "decoding": {"num_beams": 3, "top_k": 3},
    }
    for key, value in config.items():  # a block is updated, not replaced
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    nlp.add_pipe("genbioel", config=cfg)
    return nlp


TEXTS = [
    "The patient had renal failure and cystic fibrosis of the liver .",
    "",
    "No entities here at all .",
    "Shouting !! about renal failure",
]


def linked(doc):
    return [(e.text, e.label_, e.kb_id_, e._.kb_id, tuple(e._.kb_candidates or ())) for e in doc.ents]


def test_factory_is_an_entry_point():
    names = {ep.name for ep in entry_points(group="spacy_factories")}
    assert "genbioel" in names


def test_links_entities(resources):
    kb, tmp_path = resources
    nlp = make_nlp(tmp_path)
    doc = nlp(TEXTS[0])
    assert [e.text for e in doc.ents] == ["renal failure", "cystic fibrosis", "liver"]
    for ent in doc.ents:
        assert ent._.kb_id in kb
        assert ent.kb_id_ == ent._.kb_id
        assert 1 <= len(ent._.kb_candidates) <= 3 and all(c[0] in kb for c in ent._.kb_candidates)
        assert ent._.kb_candidates[0][0] == ent._.kb_id


def test_to_device_moves_the_generator_in_its_dtype(resources):
    """What a forked annotate worker does with its GPU, here with the CPU: the generator moves, cast to the
    ``dtype`` setting as resolved on that device; the links are the same ones."""
    import torch

    _, tmp_path = resources
    nlp = make_nlp(tmp_path, dtype="bf16")
    reference = linked(nlp(TEXTS[0]))
    genbioel = nlp.get_pipe("genbioel")
    genbioel.linker.model.float()  # as loaded on another device's dtype
    genbioel.to_device("cpu")
    assert {p.dtype for p in genbioel.linker.model.parameters()} == {torch.bfloat16}
    assert genbioel.settings.resources.device == "cpu" and linked(nlp(TEXTS[0])) == reference
    quantized = make_nlp(tmp_path, dtype="int8").get_pipe("genbioel")
    quantized.to_device("cpu")  # where it is already
    with pytest.raises(ValueError, match="runs on CPU only" if torch.cuda.is_available() else "no CUDA device"):
        quantized.to_device("cuda")


def test_edge_documents_never_crash(resources):
    _, tmp_path = resources
    nlp = make_nlp(tmp_path)
    docs = list(nlp.pipe(TEXTS, batch_size=2))
    assert docs[1].ents == () and docs[2].ents == ()
    punct = [e for e in docs[3].ents if e.text == "!!"][0]
    assert punct._.kb_id is None and punct._.kb_candidates == [] and punct.kb_id_ == ""
    huge = nlp("word " * 5000 + "renal failure " + "word " * 5000)
    assert huge.ents[0]._.kb_id is not None


def test_pipe_equals_call(resources):
    _, tmp_path = resources
    nlp = make_nlp(tmp_path)
    assert [linked(d) for d in nlp.pipe(TEXTS, batch_size=3)] == [linked(nlp(t)) for t in TEXTS]


def test_label_filter_and_spans_key(resources):
    _, tmp_path = resources
    nlp = make_nlp(tmp_path, labels=["Chemical"])
    doc = nlp(TEXTS[0])
    assert [e._.kb_id is not None for e in doc.ents] == [False, False, True]

    nlp2 = spacy.blank("en")
    nlp2.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "spans_key": "mentions",
            "decoding": {"num_beams": 2, "top_k": 2},
        },
    )
    doc = nlp2.make_doc("acute renal failure and lung cancer")
    doc.spans["mentions"] = [Span(doc, 1, 3, "Disease"), Span(doc, 4, 6, "Disease"), Span(doc, 0, 3, "Disease")]
    doc = nlp2(doc)
    assert all(s.kb_id_ and s._.kb_id == s.kb_id_ for s in doc.spans["mentions"])


def test_missing_resources_error_is_clear():
    nlp = spacy.blank("en")
    nlp.add_pipe("genbioel")
    with pytest.raises(ValueError, match="has no KB"):
        nlp("text")


def test_top_k_cannot_exceed_beams():
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="top_k"):
        nlp.add_pipe("genbioel", config={"decoding": {"num_beams": 2, "top_k": 5}})


def test_to_disk_from_disk_round_trip_after_originals_are_gone(resources, tmp_path_factory):
    _, tmp_path = resources
    nlp = make_nlp(tmp_path)
    before = [linked(d) for d in nlp.pipe(TEXTS)]
    out = tmp_path_factory.mktemp("pipeline") / "nlp"
    nlp.to_disk(out)
    shutil.rmtree(tmp_path / "model")
    (tmp_path / "kb.jsonl").unlink()
    loaded = spacy.load(out)
    assert loaded.pipe_names == ["entity_ruler", "genbioel"]
    assert [linked(d) for d in loaded.pipe(TEXTS)] == before
    assert (out / "genbioel" / "trie.safetensors").exists()
    assert not list((out / "genbioel").rglob("*.bin")) and not list(out.rglob("*.pkl"))


def test_abbreviation_long_form_is_linked(resources):
    pytest.importorskip("scispacy")
    import scispacy.abbreviation  # noqa: F401

    _, tmp_path = resources
    nlp = spacy.blank("en")
    nlp.add_pipe("abbreviation_detector")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "Disease", "pattern": "CF"}])
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "decoding": {"num_beams": 2, "top_k": 2},
        },
    )
    linker = nlp.get_pipe("genbioel")
    seen = []
    original = linker.linker.link

    def spy(mentions, top_k=None):
        seen.extend(m.text for m in mentions)
        return original(mentions, top_k)

    linker.linker.link = spy
    nlp("Patients with cystic fibrosis (CF) were seen. CF is common.")
    assert seen and all(t == "cystic fibrosis" for t in seen)


def test_to_bytes_round_trip(resources):
    _, tmp_path = resources
    nlp = make_nlp(tmp_path)
    before = [linked(d) for d in nlp.pipe(TEXTS)]
    clone = make_nlp(tmp_path, model=None, kb=None)
    clone.get_pipe("genbioel").from_bytes(nlp.get_pipe("genbioel").to_bytes())
    assert [linked(d) for d in clone.pipe(TEXTS)] == before


# -- issue 16: a saved pipeline always travels whole, damaged files are named ----------------------------------
def test_to_disk_before_first_use_writes_the_whole_folder(resources, tmp_path_factory, monkeypatch):
    import spacy_genbioel.linking.component as component_module

    _, tmp_path = resources
    used = make_nlp(tmp_path)
    expected = [linked(d) for d in used.pipe(TEXTS)]
    unused = make_nlp(tmp_path)
    out = tmp_path_factory.mktemp("pipeline") / "nlp"
    with monkeypatch.context() as patch:  # never run: saving copies the model folder, it does not load the model
        patch.setattr(component_module, "load_model", lambda *a, **k: pytest.fail("to_disk loaded the model"))
        unused.to_disk(out)
    assert unused.get_pipe("genbioel")._linker is None
    assert {"cfg.json", "kb.jsonl", "kb.safetensors", "model"} <= {p.name for p in (out / "genbioel").iterdir()}
    assert not (out / "genbioel" / "trie.safetensors").exists()  # built when the pipeline is loaded
    shutil.rmtree(tmp_path / "model")
    (tmp_path / "kb.jsonl").unlink()
    assert [linked(d) for d in spacy.load(out).pipe(TEXTS)] == expected


def test_an_empty_component_saves_and_loads_with_the_clear_error(tmp_path):
    nlp = spacy.blank("en")
    nlp.add_pipe("genbioel")
    nlp.to_disk(tmp_path / "empty")
    assert [p.name for p in (tmp_path / "empty" / "genbioel").iterdir()] == ["cfg.json"]
    loaded = spacy.load(tmp_path / "empty")
    with pytest.raises(ValueError, match="has no KB"):
        loaded("text")


def test_spans_with_nothing_to_link_get_none_without_decoding(resources):
    _, tmp_path = resources
    nlp = spacy.blank("en")
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "spans_key": "m",
            "decoding": {"num_beams": 2, "top_k": 2},
        },
    )
    linker = nlp.get_pipe("genbioel").linker
    calls = []
    original = linker.encode_windows
    linker.encode_windows = lambda ids, *a, **k: calls.append(ids.shape[0]) or original(ids, *a, **k)
    doc = nlp.make_doc("renal failure 😷 \x00\x01 👩\u200d⚕️ ❤️")
    doc.spans["m"] = [Span(doc, 0, 2, "D"), Span(doc, 2, 3, "D"), Span(doc, 3, 4, "D"), Span(doc, 4, len(doc), "D")]
    doc = nlp(doc)
    assert [s._.kb_id is None for s in doc.spans["m"]] == [False, True, True, True]
    assert all(s._.kb_candidates == [] and s.kb_id_ == "" for s in list(doc.spans["m"])[1:])
    assert calls == [1]  # only "renal failure" was decoded


def test_a_tokenizer_copied_into_a_saved_pipeline_is_caught(resources, tmp_path_factory, caplog):
    import fuzz_component

    _, tmp_path = resources
    nlp = make_nlp(tmp_path)
    tokenizer = nlp.get_pipe("genbioel").linker.tokenizer  # loaded: to_disk writes the trie too
    out = tmp_path_factory.mktemp("pipeline") / "nlp"
    nlp.to_disk(out)
    other = fuzz_component.permuted_tokenizer(tokenizer, tmp_path / "other")
    other.save_pretrained(out / "genbioel" / "model")  # same vocabulary size, other ids
    from spacy_genbioel.models import ModelFormatError

    with pytest.raises(ModelFormatError, match="tokenizer"):  # the model records the tokenizer it was trained with
        spacy.load(out)
    config_path = out / "genbioel" / "model" / "config.json"
    config = json.loads(config_path.read_text())
    del config["genbioel_tokenizer_fingerprint"]  # a model saved before fingerprints: the trie check still catches it
    config_path.write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        loaded = spacy.load(out)
    assert "trie.safetensors does not fit" in caplog.text and "another tokenizer" in caplog.text
    trie = loaded.get_pipe("genbioel").linker.trie
    ids = other(" " + loaded.get_pipe("genbioel").linker.kb.names[0], add_special_tokens=False)["input_ids"]
    assert 0 in trie.names_at(trie.walk([*ids, other.eos_token_id])).tolist()  # rebuilt for the tokenizer in the folder


@pytest.mark.parametrize(
    "name,content",
    [
        ("cfg.json", b"{{{"),
        ("cfg.json", b"[]"),
        ("trie.safetensors", b"\x00" * 9),
        ("model/model.safetensors", b"\x08" + b"\x00" * 9),
    ],
)
def test_damaged_files_of_a_saved_pipeline_are_named(resources, tmp_path_factory, name, content):
    from spacy_genbioel.models import ModelFormatError

    _, tmp_path = resources
    out = tmp_path_factory.mktemp("pipeline") / "nlp"
    make_nlp(tmp_path).to_disk(out)
    (out / "genbioel" / name).write_bytes(content)
    with pytest.raises(ModelFormatError, match=name.split("/")[-1]):
        spacy.load(out)


# -- serialization honours exclude; bytes without an archive ------------------------------------------------------
def test_to_disk_and_from_disk_skip_the_excluded_parts(resources, tmp_path_factory):
    _, tmp_path = resources
    nlp = make_nlp(tmp_path)
    expected = [linked(d) for d in nlp.pipe(TEXTS)]
    component = nlp.get_pipe("genbioel")
    out = tmp_path_factory.mktemp("parts") / "genbioel"
    component.to_disk(out, exclude=["model", "trie"])
    assert sorted(p.name for p in out.iterdir()) == ["cfg.json", "kb.jsonl", "kb.safetensors"]
    assert json.loads((out / "cfg.json").read_text())["parts"] == ["kb"]
    # without its saved model, a component keeps its configured one and loads it on first use
    fresh = make_nlp(tmp_path)
    fresh.get_pipe("genbioel").from_disk(out)
    assert fresh.get_pipe("genbioel")._linker is None
    assert [linked(d) for d in fresh.pipe(TEXTS)] == expected
    whole = tmp_path_factory.mktemp("whole") / "genbioel"
    component.to_disk(whole)
    skipped = make_nlp(tmp_path).get_pipe("genbioel").from_disk(whole, exclude=["trie"])
    assert skipped.linker.trie is not None  # built from the KB, not read
    assert make_nlp(tmp_path).get_pipe("genbioel").from_disk(whole, exclude=["model"])._linker is None


def test_to_bytes_is_a_map_of_files_that_honours_exclude(resources):
    import srsly

    from spacy_genbioel.models import ModelFormatError

    _, tmp_path = resources
    nlp = make_nlp(tmp_path)
    component = nlp.get_pipe("genbioel")
    component.linker  # noqa: B018  (loaded: the bytes carry model, trie and KB)
    data = srsly.msgpack_loads(component.to_bytes(exclude=["model"]))
    assert data["format"] == "genbioel.files.v1" and "cfg.json" in data["files"] and "trie.safetensors" in data["files"]
    assert not any(name.startswith("model/") for name in data["files"])
    full = srsly.msgpack_loads(component.to_bytes())
    assert "model/model.safetensors" in full["files"]  # the weights as their safetensors file
    for bad in (b"not msgpack", srsly.msgpack_dumps({"format": "other"})):
        with pytest.raises((ModelFormatError, ValueError)):
            make_nlp(tmp_path).get_pipe("genbioel").from_bytes(bad)
    escape = srsly.msgpack_dumps({"format": "genbioel.files.v1", "files": {"../x": b""}})
    with pytest.raises(ModelFormatError, match="bad file entry"):
        make_nlp(tmp_path).get_pipe("genbioel").from_bytes(escape)
