"""Prompts of different lengths in one decoder batch (linking/decoding/prompt_batch.py)."""

import pytest
import torch
from conftest import mentions_for
from hypothesis import given
from hypothesis import strategies as st

from spacy_genbioel.linking.decoding.decoder import DecodingSettings, GenerativeLinker
from spacy_genbioel.linking.decoding.forced import forced_scores
from spacy_genbioel.linking.decoding.prompt_batch import decoder_inputs, padded_prompts, prompt_batches, shiftable
from spacy_genbioel.ty import Mention


def _linker(model, tokenizer, kb, **decoding):
    return GenerativeLinker(
        model, tokenizer, kb, decoding=DecodingSettings(**{"num_beams": 4, "top_k": 4, "batch_size": 32, **decoding})
    )


def _varied(kb):
    """Mentions whose prompts have many lengths (one word to several names' worth)."""
    mentions = mentions_for(kb, n=12)
    return mentions + [Mention(" ".join(kb.names[i : i + 3]), right="was seen") for i in range(4)]


@given(st.lists(st.integers(1, 40), max_size=30))
def test_prompt_batches_hold_every_position_once(prompt_lengths):
    groups = {}
    for position, length in enumerate(prompt_lengths):
        groups.setdefault(length, []).append(position)
    groups = dict(sorted(groups.items()))
    for mixed in (True, False):
        batches = prompt_batches(groups, mixed)
        flat = [p for b in batches for p in b]
        assert sorted(flat) == sorted(p for members in groups.values() for p in members)
        assert len(batches) == (min(1, len(groups)) if mixed else len(groups))
    if groups:  # mixed: shortest prompts first, so that a chunk pads little
        lengths = {p: length for length, members in groups.items() for p in members}
        order = [lengths[p] for p in prompt_batches(groups, True)[0]]
        assert order == sorted(order)


def test_padded_prompts_pad_on_the_left_and_say_so_only_when_needed():
    ids, pads = padded_prompts([[5, 6, 7], [8]], 1, torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [1, 1, 8]] and pads.tolist() == [0, 2]
    ids, pads = padded_prompts([[5, 6], [8, 9]], 1, torch.device("cpu"))
    assert ids.tolist() == [[5, 6], [8, 9]] and pads is None
    assert decoder_inputs(None, ids, None, 3) == {"decoder_input_ids": ids}


def test_shifted_positions_give_each_prompt_its_own_log_probabilities(micro_model, word_tokenizer, small_kb):
    """A left-padded batch, positions shifted back: the next-token log-probabilities of every row, and
    of a step after it, equal those of the row decoded alone."""
    linker = _linker(micro_model, word_tokenizer, small_kb)
    prompts = linker.prompt_tokens.prompts([linker.inputs.prompt(m) for m in _varied(small_kb)])
    assert len({len(p) for p in prompts}) >= 3
    source = linker.sources.pad([linker.encode_sources([Mention("renal failure")])[0]] * len(prompts))
    with torch.inference_mode():
        enc = micro_model.get_encoder()(input_ids=source["input_ids"], attention_mask=source["attention_mask"])

        def run(ids, pads, past=0, cache=None, rows=None):
            rows = list(range(len(prompts))) if rows is None else rows
            out = micro_model(
                encoder_outputs=(enc.last_hidden_state[rows],),
                attention_mask=source["attention_mask"][rows],
                use_cache=True,
                cache=cache,
                **decoder_inputs(micro_model, ids, pads, past),
            )
            return out.logits[:, -1].float().log_softmax(-1), out.cache

        ids, pads = padded_prompts(prompts, linker.pad_token_id, torch.device("cpu"))
        batch, cache = run(ids, pads)
        token = batch.argmax(-1, keepdim=True)
        step, _ = run(token, pads, past=ids.shape[1], cache=cache)
        for r, prompt in enumerate(prompts):
            alone, own = run(torch.tensor([prompt]), None, rows=[r])
            assert torch.allclose(batch[r], alone[0], atol=1e-5)
            after, _ = run(token[r : r + 1], None, past=len(prompt), cache=own, rows=[r])
            assert torch.allclose(step[r], after[0], atol=1e-5)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_mixed_batches_link_as_batches_per_prompt_length(micro_model, word_tokenizer, small_kb, monkeypatch, num_beams):
    mentions = _varied(small_kb)
    mixed = _linker(micro_model, word_tokenizer, small_kb, num_beams=num_beams, top_k=num_beams)
    grouped = _linker(micro_model, word_tokenizer, small_kb, num_beams=num_beams, top_k=num_beams, mixed_prompts=False)
    assert mixed.mixes_prompts and not grouped.mixes_prompts
    calls = []
    for linker in (mixed, grouped):
        search = linker._search
        monkeypatch.setattr(linker, "_search", lambda *a, _s=search, _l=linker, **k: calls.append(_l) or _s(*a, **k))
    a, b = mixed.link(mentions), grouped.link(mentions)
    for x, y in zip(a, b):
        assert [c.name for c in x] == [c.name for c in y]
        assert [c.score for c in x] == pytest.approx([c.score for c in y], abs=1e-4)
    assert calls.count(mixed) == 1 < calls.count(grouped)
    names = [[c.name for c in cands] or list(small_kb.names[:2]) for cands in b]
    for x, y in zip(forced_scores(mixed, mentions, names), forced_scores(grouped, mentions, names)):
        assert x == pytest.approx(y, abs=1e-5)


def test_a_decoder_without_a_position_table_keeps_a_batch_per_prompt_length(
    micro_model, word_tokenizer, small_kb, monkeypatch
):
    from types import SimpleNamespace

    import spacy_genbioel.linking.decoding.decoder as decoder_module

    assert shiftable(micro_model)
    # a decoder whose positions are not a learned table (the shared micro model is left alone)
    other = SimpleNamespace(
        get_decoder=lambda: SimpleNamespace(
            embed_positions=torch.nn.Embedding(4, 2), embed_tokens=torch.nn.Embedding(4, 2)
        )
    )
    assert not shiftable(other) and not shiftable(object()) and not shiftable(torch.nn.Linear(2, 2))
    monkeypatch.setattr(decoder_module, "shiftable", lambda model: False)
    linker = _linker(micro_model, word_tokenizer, small_kb)
    assert not linker.mixes_prompts
    grouped = _linker(micro_model, word_tokenizer, small_kb, mixed_prompts=False)
    mentions = _varied(small_kb)
    assert [[c.name for c in r] for r in linker.link(mentions)] == [[c.name for c in r] for r in grouped.link(mentions)]


def test_mixed_prompts_is_a_config_setting():
    import spacy

    pipe = spacy.blank("en").add_pipe("genbioel", config={"decoding": {"mixed_prompts": False}})
    assert pipe.decoding.mixed_prompts is False
