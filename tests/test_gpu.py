"""GPU checks: skipped without CUDA (see conftest)."""
import pytest
import torch

from spacy_genbioel.linking.decoder import GenerativeLinker

from spacy_genbioel.linking.settings import DecodingConfig

from test_decoding import mentions_for

pytestmark = pytest.mark.gpu


def test_gpu_decoding_equals_cpu_in_fp32(micro_model, word_tokenizer, small_kb):
    mentions = mentions_for(small_kb, 16)
    cpu = GenerativeLinker(micro_model, word_tokenizer, small_kb, config=DecodingConfig(num_beams=4, top_k=4, batch_size=8)).link(mentions)
    gpu_model = type(micro_model)(micro_model.config)
    gpu_model.load_state_dict(micro_model.state_dict())
    gpu = GenerativeLinker(gpu_model.to("cuda").eval(), word_tokenizer, small_kb, config=DecodingConfig(num_beams=4, top_k=4, batch_size=8)).link(mentions)
    assert [[c.name for c in r][:1] for r in gpu] == [[c.name for c in r][:1] for r in cpu]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_half_precision_returns_kb_names(micro_model, word_tokenizer, small_kb, dtype):
    model = type(micro_model)(micro_model.config)
    model.load_state_dict(micro_model.state_dict())
    linker = GenerativeLinker(model.to("cuda", dtype=dtype).eval(), word_tokenizer, small_kb)
    for ranked in linker.link(mentions_for(small_kb, 8)):
        assert ranked and all(c.name in small_kb.names for c in ranked)
