import pytest
import torch

from spacy_genbioel.linking.decoder import GenerativeLinker

from spacy_genbioel.linking.settings import DecodingConfig
from spacy_genbioel.models import PRESETS, build_model, init_model, load_model, special_ids
from spacy_genbioel.util import resolve_device, resolve_dtype
from spacy_genbioel.linking.reference import ReferenceLinker

from test_decoding import mentions_for


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

    config = T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    return T5ForConditionalGeneration(config).eval()


def bert2bert_model(tokenizer):
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    kw = dict(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
              intermediate_size=64, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(**kw), BertConfig(**kw, is_decoder=True, add_cross_attention=True))
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
    linker = GenerativeLinker(model, tokenizer, kb, config=DecodingConfig(num_beams=3, top_k=3, batch_size=4))
    mentions = mentions_for(kb, 8)
    batched = linker.link(mentions)
    reference = ReferenceLinker(linker).link(mentions)
    assert all(batched)
    assert [[c.name for c in r] for r in batched] == [[c.name for c in r] for r in reference]
    for b, r in zip(batched, reference):
        assert [c.score for c in b] == pytest.approx([c.score for c in r], abs=1e-4)
