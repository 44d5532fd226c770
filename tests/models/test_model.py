import json

import pytest
import torch
from conftest import mentions_for

from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.decoding.reference import ReferenceLinker
from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.models import PRESETS, init_model, load_model, special_ids
from spacy_genbioel.util import resolve_device, resolve_dtype


def test_presets_have_bart_shapes():
    assert PRESETS["tiny"].d_model == 256 and PRESETS["tiny"].encoder_layers == 3
    assert (PRESETS["base"].d_model, PRESETS["base"].encoder_layers) == (768, 6)
    assert (PRESETS["large"].d_model, PRESETS["large"].encoder_layers) == (1024, 12)


def test_init_model_saves_safetensors_and_loads_offline(tmp_path, small_kb):
    model, tokenizer = init_model("tiny", small_kb.names, tmp_path / "m", vocab_size=300)
    assert (tmp_path / "m" / "model.safetensors").exists()
    assert not list((tmp_path / "m").glob("*.bin"))
    assert tokenizer.tokenize(" START x END is")[0] == "ĠSTART"
    loaded, tok = load_model(tmp_path / "m")
    assert special_ids(loaded, tok) == (tokenizer.eos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)


def test_tokenizer_in_another_directory(tmp_path, micro_model, word_tokenizer):
    # dmis-lab/ANGEL_* checkpoints ship without a tokenizer
    micro_model.save_pretrained(tmp_path / "weights")
    word_tokenizer.save_pretrained(tmp_path / "tok")
    with pytest.raises(FileNotFoundError, match="No tokenizer"):
        load_model(tmp_path / "weights")
    model, tok = load_model(tmp_path / "weights", tokenizer_path=tmp_path / "tok")
    assert len(tok) == len(word_tokenizer)


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(tmp_path / "nothing")


def test_device_and_dtype_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type in {"cpu", "cuda"}
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError):
        resolve_dtype("int3", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            resolve_device("cuda:0")


def t5_model(tokenizer):
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=16,
        d_ff=64,
        num_layers=1,
        num_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return T5ForConditionalGeneration(config).eval()


def bert2bert_model(tokenizer):
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    kw = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(**kw), BertConfig(**kw, is_decoder=True, add_cross_attention=True)
    )
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    torch.manual_seed(0)
    model = EncoderDecoderModel(config=config).eval()
    model.generation_config.decoder_start_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


@pytest.mark.parametrize("family", ["bart", "t5", "bert2bert"])
def test_decoding_works_unchanged_for_each_family(family, micro_model, word_tokenizer, small_kb, tmp_path):
    model = {"bart": lambda t: micro_model, "t5": t5_model, "bert2bert": bert2bert_model}[family](word_tokenizer)
    # through a save/load, as users bring them
    model.save_pretrained(tmp_path / family)
    word_tokenizer.save_pretrained(tmp_path / family)
    model, tokenizer = load_model(tmp_path / family)
    assert_links_like_reference(model, tokenizer, small_kb)


def assert_links_like_reference(model, tokenizer, kb):
    """Batched trie-constrained decoding finds what the one-at-a-time reference finds."""
    linker = GenerativeLinker(model, tokenizer, kb, decoding=DecodingSettings(num_beams=3, top_k=3, batch_size=4))
    mentions = mentions_for(kb, 8)
    batched = linker.link(mentions)
    reference = ReferenceLinker(linker).link(mentions)
    assert all(batched)
    assert [[c.name for c in r] for r in batched] == [[c.name for c in r] for r in reference]
    for b, r in zip(batched, reference):
        assert [c.score for c in b] == pytest.approx([c.score for c in r], abs=1e-4)


# -- a model directory that cannot be loaded is refused naming the file (issue 16, items 4, 10, 13) -------------
@pytest.fixture()
def saved(tmp_path, micro_model, word_tokenizer):
    from spacy_genbioel.models import save_model

    save_model(micro_model, word_tokenizer, tmp_path / "m")
    return tmp_path / "m"


@pytest.mark.parametrize("keep", [0, 7, 100, "half", "last"])
def test_a_truncated_model_safetensors_is_named(saved, keep):
    from spacy_genbioel.models import ModelFormatError

    weights = saved / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: {"half": len(data) // 2, "last": len(data) - 1}.get(keep, keep)])
    with pytest.raises(ModelFormatError, match="model.safetensors"):
        load_model(saved)


def test_pickled_weights_are_never_loaded(saved, micro_model):
    from spacy_genbioel.models import ModelFormatError

    (saved / "model.safetensors").unlink()
    torch.save(micro_model.state_dict(), saved / "pytorch_model.bin")
    with pytest.raises(ModelFormatError, match="pickled weights are never loaded") as err:
        load_model(saved)
    assert isinstance(err.value, FileNotFoundError)


@pytest.mark.parametrize(
    "name,content",
    [
        ("config.json", b"{not json"),
        ("config.json", b"[1, 2]"),
        ("tokenizer.json", b'{"model": 5'),
        ("tokenizer_config.json", b"\xff\xfe"),
    ],
)
def test_garbage_config_or_tokenizer_files_are_named(saved, name, content):
    from spacy_genbioel.models import ModelFormatError

    (saved / name).write_bytes(content)
    with pytest.raises(ModelFormatError, match="config.json" if name == "config.json" else "tokenizer"):
        load_model(saved)


def test_a_tokenizer_larger_than_the_model_is_refused(saved, tmp_path):
    from conftest import WORDS

    from spacy_genbioel.models import ModelFormatError, train_tokenizer

    larger = train_tokenizer(
        WORDS * 5 + [w + s for w in WORDS for s in ("osis", "itis", "emia")] * 5, vocab_size=1200, min_frequency=1
    )
    larger.save_pretrained(tmp_path / "larger")
    with pytest.raises(ModelFormatError, match=r"tokens but the model has embeddings for \d+"):
        load_model(saved, tokenizer_path=tmp_path / "larger")
    model, _ = load_model(saved)
    with pytest.raises(ModelFormatError, match="does not belong to this model"):
        GenerativeLinker(model, larger, None)


def test_tokenizer_fingerprint_is_stable_and_tells_tokenizers_apart(saved, tmp_path, word_tokenizer, caplog):
    import fuzz_component

    from spacy_genbioel.models import load_tokenizer, tokenizer_fingerprint

    assert tokenizer_fingerprint(load_tokenizer(saved)) == tokenizer_fingerprint(word_tokenizer)
    word_tokenizer(["a b"], truncation=True, max_length=3, padding=True)  # call state does not count
    assert tokenizer_fingerprint(word_tokenizer) == tokenizer_fingerprint(load_tokenizer(saved))
    other = fuzz_component.permuted_tokenizer(word_tokenizer, tmp_path / "other")
    assert len(other) == len(word_tokenizer) and tokenizer_fingerprint(other) != tokenizer_fingerprint(word_tokenizer)
    # a tokenizer unlike the one the model records (issue 31 item 13): refused naming the model's config.json
    from spacy_genbioel.models import ModelFormatError

    with pytest.raises(ModelFormatError, match="not the tokenizer the model was trained with.*config.json"):
        load_model(saved, tokenizer_path=tmp_path / "other")
    # a model saved without the record (before 0.3): loaded, with a warning
    config = json.loads((saved / "config.json").read_text(encoding="utf8"))
    del config["genbioel_tokenizer_fingerprint"]
    (saved / "config.json").write_text(json.dumps(config), encoding="utf8")
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        load_model(saved, tokenizer_path=tmp_path / "other")
    assert "differs from the tokenizer saved with the model" in caplog.text


def test_every_weight_load_is_explicitly_pickle_free():
    """Safety does not rest on library defaults: every ``from_pretrained`` of a model
    passes ``use_safetensors=True`` and every ``torch.load`` ``weights_only=True``."""
    import ast
    from pathlib import Path

    offenders = []
    for path in (Path(__file__).resolve().parents[2] / "spacy_genbioel").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf8"))):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = ast.unparse(node.func.value)
            keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
            if node.func.attr == "from_pretrained" and not owner.endswith(("Tokenizer", "Config")):
                ok = keywords.get("use_safetensors") == "True"
            elif node.func.attr == "from_encoder_decoder_pretrained":
                ok = keywords.get("encoder_use_safetensors") == keywords.get("decoder_use_safetensors") == "True"
            elif node.func.attr == "load" and owner == "torch":
                ok = keywords.get("weights_only") == "True"
            else:
                continue
            if not ok:
                offenders.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}")
    assert not offenders, offenders


def test_int8_dtype_quantizes_the_linear_layers_but_keeps_the_output_projection_and_saves_float(
    saved, tmp_path, small_kb
):
    from spacy_genbioel.models import save_model
    from spacy_genbioel.ty import Mention

    model, tokenizer = load_model(saved, dtype="int8")
    quantized = [
        name
        for name, module in model.named_modules()
        if type(module).__name__ == "Linear" and type(module).__module__.startswith("torch.ao.nn.quantized")
    ]
    assert quantized, "no linear layer was quantized"
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear)  # float: scores keep their normalization
    float_model, _ = load_model(saved)
    mentions = [Mention(name, left="patients with", right="were studied") for name in small_kb.names[:6]]
    fp32 = GenerativeLinker(float_model, tokenizer, small_kb).link(mentions)
    int8 = GenerativeLinker(model, tokenizer, small_kb).link(mentions)
    assert [len(r) for r in int8] == [len(r) for r in fp32]
    assert all(abs(a[0].score - b[0].score) < 0.5 for a, b in zip(int8, fp32))  # close, not equal: weights rounded
    # saving writes the float weights the model was loaded with, which load back as plain linear layers
    save_model(model, tokenizer, tmp_path / "again")
    again, _ = load_model(tmp_path / "again")
    for (name, a), (_, b) in zip(again.state_dict().items(), float_model.state_dict().items()):
        assert torch.equal(a, b), name


def test_int8_dtype_is_cpu_only(saved):
    with pytest.raises(ValueError, match="CPU only"):
        load_model(saved, device=torch.device("meta"), dtype="int8")
