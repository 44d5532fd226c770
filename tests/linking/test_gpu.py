"""GPU checks: skipped without CUDA (see conftest)."""

import pytest
import torch
from conftest import mentions_for

from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.settings import DecodingSettings

pytestmark = pytest.mark.gpu


def test_gpu_decoding_equals_cpu_in_fp32(micro_model, word_tokenizer, small_kb):
    mentions = mentions_for(small_kb, 16)
    cpu = GenerativeLinker(
        micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(num_beams=4, top_k=4, batch_size=8)
    ).link(mentions)
    gpu_model = type(micro_model)(micro_model.config)
    gpu_model.load_state_dict(micro_model.state_dict())
    gpu = GenerativeLinker(
        gpu_model.to("cuda").eval(),
        word_tokenizer,
        small_kb,
        decoding=DecodingSettings(num_beams=4, top_k=4, batch_size=8),
    ).link(mentions)
    assert [[c.name for c in r][:1] for r in gpu] == [[c.name for c in r][:1] for r in cpu]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_half_precision_returns_kb_names(micro_model, word_tokenizer, small_kb, dtype):
    model = type(micro_model)(micro_model.config)
    model.load_state_dict(micro_model.state_dict())
    linker = GenerativeLinker(model.to("cuda", dtype=dtype).eval(), word_tokenizer, small_kb)
    for ranked in linker.link(mentions_for(small_kb, 8)):
        assert ranked and all(c.name in small_kb.names for c in ranked)


def test_gpu_per_document_decoding_equals_cpu_in_fp32(micro_model, word_tokenizer, small_kb):
    """Shared encoder windows and cross-attention caches on the GPU give the CPU's answers."""
    from spacy_genbioel.linking.inputs.builder import InputBuilder
    from spacy_genbioel.ty import Mention

    names = small_kb.names[:6]
    text = " and ".join(names)
    mentions, at = [], 0
    for name in names:
        start = text.index(name, at)
        at = start + len(name)
        mentions.append(Mention(name, left=text[:start], right=text[at:], doc_id="d", start=start, end=at))
    inputs = InputBuilder(input_mode="document")
    config = DecodingSettings(num_beams=4, top_k=4, batch_size=2, max_source_tokens=48)
    cpu = GenerativeLinker(micro_model, word_tokenizer, small_kb, inputs=inputs, decoding=config).link(mentions)
    gpu_model = type(micro_model)(micro_model.config)
    gpu_model.load_state_dict(micro_model.state_dict())
    gpu = GenerativeLinker(gpu_model.to("cuda").eval(), word_tokenizer, small_kb, inputs=inputs, decoding=config)
    assert [[c.name for c in r][:1] for r in gpu.link(mentions)] == [[c.name for c in r][:1] for r in cpu]
    assert gpu.stats["encoder_inputs"] < len(mentions)  # windows shared on the GPU too


def test_gpu_forced_scores_equal_the_gpu_beam_and_the_cpu(micro_model, word_tokenizer, small_kb):
    """Forced scoring on the GPU: the beam's own scores there, and the CPU's scores in fp32."""
    from spacy_genbioel.linking.decoding.forced import forced_scores

    mentions = mentions_for(small_kb, 12)
    settings = DecodingSettings(num_beams=4, top_k=4, batch_size=8)
    gpu_model = type(micro_model)(micro_model.config)
    gpu_model.load_state_dict(micro_model.state_dict())
    gpu = GenerativeLinker(gpu_model.to("cuda").eval(), word_tokenizer, small_kb, decoding=settings)
    beams = gpu.link(mentions)
    names = [[c.name for c in found] for found in beams]
    on_gpu = forced_scores(gpu, mentions, names)
    on_cpu = forced_scores(GenerativeLinker(micro_model, word_tokenizer, small_kb, decoding=settings), mentions, names)
    for found, g, c in zip(beams, on_gpu, on_cpu):
        assert g == pytest.approx([x.score for x in found], abs=1e-4) and g == pytest.approx(c, abs=1e-4)
