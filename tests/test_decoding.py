import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.decoder import GenerativeLinker

from spacy_genbioel.linking.inputs import InputBuilder, PromptTokenizer

from spacy_genbioel.linking.settings import DecodingConfig
from spacy_genbioel.ty import Mention
from spacy_genbioel.linking.reference import ReferenceLinker

from conftest import WORDS, random_kb


def mentions_for(kb, n=12):
    names = kb.names
    out = []
    for i in range(n):
        text = names[(i * 7) % len(names)] if i % 3 else f"{WORDS[i % len(WORDS)]} {WORDS[(i * 3) % len(WORDS)]}"
        out.append(Mention(text, left="the patient had " * (i % 4), right=" and was treated"))
    return out


def test_input_builder_marks_mention_and_cuts_context():
    builder = InputBuilder(context_words=2)
    m = Mention("Reiter  Syndrome", left="One two three four", right="five six seven")
    assert builder.source(m) == "three four START reiter syndrome END five six"
    assert builder.prompt(m) == "reiter syndrome is"
    assert InputBuilder(context_words=0).source(m) == "START reiter syndrome END"
    assert InputBuilder(lowercase=False).prompt(m) == "Reiter Syndrome is"


def test_prompt_keeps_prompt_end_for_long_mentions(word_tokenizer):
    tokens = PromptTokenizer(word_tokenizer, 2, 2, max_prompt_tokens=10)
    ids = tokens.prompts(["renal " * 50 + "is"])[0]
    assert len(ids) == 10 and ids[-1] == tokens.root_token_id()
    # BART style: decoder start, then <s>
    assert ids[:2] == [2, word_tokenizer.bos_token_id]


def test_without_decoder_prompt_the_name_follows_the_start_tokens(micro_model, word_tokenizer, small_kb):
    inputs = InputBuilder(decoder_prompt=False)
    m = Mention("renal failure", left="acute", right="")
    assert inputs.prompt(m) == "" and inputs.source(m) == InputBuilder().source(m)
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, inputs=inputs,
                              config=DecodingConfig(num_beams=4, top_k=4, batch_size=5))
    prefix = linker.prompt_tokens.prefix
    assert linker.prompt_tokens.prompts(["", ""]) == [prefix, prefix]
    assert linker.trie.root_token_id == prefix[-1]
    mentions = mentions_for(small_kb)
    batched = linker.link(mentions)
    reference = ReferenceLinker(linker).link(mentions)
    assert any(batched)
    for b, r in zip(batched, reference):
        assert [c.name for c in b] == [c.name for c in r]
        assert all(c.name in small_kb.names for c in b)


def test_batched_equals_one_at_a_time_and_reference(micro_model, word_tokenizer, small_kb):
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, config=DecodingConfig(num_beams=4, top_k=4, batch_size=5))
    mentions = mentions_for(small_kb)
    batched = linker.link(mentions)
    singles = [linker.link([m])[0] for m in mentions]
    reference = ReferenceLinker(linker).link(mentions)
    for b, s, r in zip(batched, singles, reference):
        assert [c.name for c in b] == [c.name for c in s] == [c.name for c in r]
        for x, y in zip(b, r):
            assert x.score == pytest.approx(y.score, abs=1e-4)
            assert x.ids == y.ids


def test_scores_are_mean_log_probabilities(micro_model, word_tokenizer, small_kb):
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, config=DecodingConfig(num_beams=3, top_k=3))
    mention = Mention("renal failure", left="acute", right="")
    best = linker.link([mention])[0][0]
    enc = word_tokenizer([linker.inputs.source(mention)], return_tensors="pt")
    prompt = linker.prompt_tokens.prompts([linker.inputs.prompt(mention)])[0]
    target = linker.prompt_tokens.targets([best.name])[0]
    with torch.no_grad():
        logits = micro_model(**enc, decoder_input_ids=torch.tensor([prompt + target[:-1]])).logits[0].float()
    logp = torch.log_softmax(logits, -1)[len(prompt) - 1 :]
    mean = logp.gather(1, torch.tensor(target)[:, None]).mean().item()
    assert best.score == pytest.approx(mean, abs=1e-4)


@given(st.integers(0, 10_000))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_outputs_are_kb_names_and_concepts(micro_model, word_tokenizer, seed):
    kb = random_kb(seed, n_concepts=25)
    linker = GenerativeLinker(micro_model, word_tokenizer, kb, config=DecodingConfig(num_beams=3, top_k=3, batch_size=4))
    for ranked in linker.link(mentions_for(kb, n=6)):
        assert ranked, "every non-empty mention gets candidates"
        scores = [c.score for c in ranked]
        assert scores == sorted(scores, reverse=True)
        assert len({c.name for c in ranked}) == len(ranked)
        for cand in ranked:
            assert cand.ids == kb.ids_for_name(cand.name, normalize=False) and cand.ids
            assert all(cid in kb for cid in cand.ids)


@pytest.mark.parametrize("text", ["", "   ", "!!! ...", "()"])
def test_nothing_to_link_gives_empty(micro_model, word_tokenizer, small_kb, text):
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb)
    assert linker.link([Mention(text)]) == [[]]


def test_unseen_characters_and_huge_inputs(micro_model, word_tokenizer, small_kb):
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, config=DecodingConfig(num_beams=2, top_k=2, max_source_tokens=64))
    odd = Mention("Σύνδρομο 😷 ßü", left="文字 " * 5000, right="ω " * 5000)
    long_mention = Mention("renal " * 2000)
    results = linker.link([odd, long_mention])
    assert all(results)


def test_top_k_limits_output(micro_model, word_tokenizer, small_kb):
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, config=DecodingConfig(num_beams=5, top_k=5))
    assert all(len(r) <= 2 for r in linker.link(mentions_for(small_kb, 4), top_k=2))
