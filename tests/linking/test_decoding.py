import pytest
import torch
from conftest import assert_same_links, mentions_for, random_kb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.decoding.reference import ReferenceLinker
from spacy_genbioel.linking.inputs.builder import InputBuilder, PromptTokenizer, SourceEncoder, has_linkable_text
from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.ty import Mention


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
    linker = GenerativeLinker(
        micro_model,
        word_tokenizer,
        small_kb,
        inputs=inputs,
        decoding=DecodingSettings(num_beams=4, top_k=4, batch_size=5),
    )
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
    linker = GenerativeLinker(
        micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(num_beams=4, top_k=4, batch_size=5)
    )
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
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(num_beams=3, top_k=3))
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
    linker = GenerativeLinker(
        micro_model, word_tokenizer, kb, decoding=DecodingSettings(num_beams=3, top_k=3, batch_size=4)
    )
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
    linker = GenerativeLinker(
        micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(num_beams=2, top_k=2, max_source_tokens=64)
    )
    odd = Mention("Σύνδρομο 😷 ßü", left="文字 " * 5000, right="ω " * 5000)
    long_mention = Mention("renal " * 2000)
    results = linker.link([odd, long_mention])
    assert all(results)


def test_top_k_limits_output(micro_model, word_tokenizer, small_kb):
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(num_beams=5, top_k=5))
    mentions = mentions_for(small_kb, 4)
    wide = linker.link(mentions, top_k=5)
    assert all(len(r) > 2 for r in wide)  # so that a limit of 2 cuts every list
    assert linker.link(mentions, top_k=2) == [r[:2] for r in wide]


# -- the encoder input: the mention and its markers always in (issue 16, item 3) ----------------------------------
NORMAL_MENTIONS = [
    Mention("Reiter  Syndrome", left="One two three four", right="five six seven"),
    Mention("renal failure", left="", right=""),
    Mention("cystic fibrosis", left="the patient had acute", right="of the liver and was treated with pain relief"),
    Mention("Σύνδρομο 😷 ßü", left="文字 标题", right="ω"),
    Mention("   ", left="x", right="y"),
]


@pytest.mark.parametrize("context_words,max_tokens", [(64, 256), (8, 64), (0, 16), (2, 512)])
def test_source_ids_of_inputs_that_fit_are_identical_to_one_piece_tokenization(
    word_tokenizer, small_kb, context_words, max_tokens
):
    """Existing models read exactly what they read before: a text that fits is
    tokenized in one piece, padded as the tokenizer pads."""
    inputs = InputBuilder(context_words=context_words)
    mentions = [
        m
        for m in mentions_for(small_kb, 24) + NORMAL_MENTIONS
        if len(word_tokenizer(inputs.source(m))["input_ids"]) <= max_tokens
    ]
    assert len(mentions) >= 10
    new = SourceEncoder(word_tokenizer).encode(mentions, inputs, max_tokens)
    old = word_tokenizer(
        [inputs.source(m) for m in mentions], return_tensors="pt", padding=True, truncation=True, max_length=max_tokens
    )
    assert torch.equal(new["input_ids"], old["input_ids"]) and torch.equal(new["attention_mask"], old["attention_mask"])


def _markers(tokenizer):
    return [tokenizer(" " + m, add_special_tokens=False)["input_ids"] for m in ("START", "END")]


@pytest.mark.parametrize(
    "context",
    ["ACGT" * 50, "文字标题" * 60, "C6H12O6-Na2SO4(aq)" * 50, "ACGT" * 1250],
    ids=["primer", "chinese title", "formula", "5000 bases"],
)
def test_long_unspaced_context_is_trimmed_in_tokens_around_the_mention(word_tokenizer, context):
    encoder = SourceEncoder(word_tokenizer)
    inputs = InputBuilder()
    mention_ids = word_tokenizer(" renal failure", add_special_tokens=False)["input_ids"]
    (start,), (end,) = _markers(word_tokenizer)
    for left, right in [(context, context), (context, "and then"), ("", context), (context, "")]:
        ids = encoder.ids([Mention("Renal Failure", left=left, right=right)], inputs, 64)[0]
        assert len(ids) == 64 and ids[0] == word_tokenizer.bos_token_id and ids[-1] == word_tokenizer.eos_token_id
        at = ids.index(start)
        assert ids[at + 1 : at + 1 + len(mention_ids)] == mention_ids and ids[at + 1 + len(mention_ids)] == end
        n_left, n_right = at - 1, len(ids) - 1 - (at + 2 + len(mention_ids))
        if left == right:  # both sides long: half the room each
            assert abs(n_left - n_right) <= 1
        # the side with little context keeps all of it, the other side takes the rest
        if right == "and then":
            assert ids[-1 - n_right : -1] == word_tokenizer(" and then", add_special_tokens=False)["input_ids"]
        if not right:
            assert n_right == 0
        if not left:
            assert n_left == 0
    assert encoder.stats["context_trimmed"] == 4 and encoder.stats["mention_shortened"] == 0


def test_a_mention_longer_than_the_cap_keeps_its_start_and_is_counted(word_tokenizer, caplog):
    encoder = SourceEncoder(word_tokenizer)
    (start,), (end,) = _markers(word_tokenizer)
    long_word = "renal" * 1000  # one unspaced 5,000-character token
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        rows = encoder.ids(
            [Mention(long_word, left="acute " * 10, right="pain " * 10), Mention("chronic renal failure " * 40)],
            InputBuilder(),
            32,
        )
    first = word_tokenizer(" " + long_word, add_special_tokens=False)["input_ids"]
    for ids in rows:
        assert len(ids) == 32 and ids[1] == start and ids[-2] == end  # no room left for context
    assert rows[0][2:-2] == first[:28]
    assert encoder.stats["mention_shortened"] == 2
    assert "2 mention(s) longer than max_source_tokens (32) shortened" in caplog.text


def test_a_cap_without_room_for_the_markers_is_a_clear_error(word_tokenizer):
    with pytest.raises(ValueError, match="no room for a mention"):
        SourceEncoder(word_tokenizer).ids([Mention("renal " * 50)], InputBuilder(), 3)


def test_training_encodes_the_source_exactly_as_inference(micro_model, word_tokenizer, small_kb):
    from spacy_genbioel.training.examples import TrainingExample
    from spacy_genbioel.training.seq2seq import encode_examples

    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(max_source_tokens=48))
    mentions = mentions_for(small_kb, 6) + [
        Mention("renal failure", left="文字" * 2000, right="ACGT" * 1000),
        Mention("renal" * 500, left="acute"),
    ]
    batch = encode_examples(
        [TrainingExample(m, small_kb.names[0]) for m in mentions],
        word_tokenizer,
        linker.prompt_tokens,
        linker.inputs,
        linker.pad_token_id,
        48,
    )
    inference = linker.sources.pad(linker.encode_sources(mentions))
    assert torch.equal(batch["input_ids"], inference["input_ids"])
    assert torch.equal(batch["attention_mask"], inference["attention_mask"])


def test_the_decoder_reads_the_mention_whatever_the_context(micro_model, word_tokenizer, small_kb):
    linker = GenerativeLinker(
        micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(num_beams=2, top_k=2, max_source_tokens=64)
    )
    (start,), (end,) = _markers(word_tokenizer)
    seen = []
    original = linker.encode_windows

    def spy(input_ids, attention_mask, *args, **kwargs):
        seen.extend(input_ids.tolist())
        return original(input_ids, attention_mask, *args, **kwargs)

    linker.encode_windows = spy
    results = linker.link(
        [Mention("renal failure", left="ACGT" * 1250, right="文字" * 2500), Mention("renal failure", left="acute")]
    )
    assert all(results) and len(seen) == 2
    assert all(start in row and end in row[row.index(start) :] for row in seen)


@pytest.mark.parametrize("text", ["\x00\x01\x1f", "😷🦠", "👩\u200d⚕️ ❤️", "\u200b\ufeff", " \u3000 ", "🇺🇳 👍🏽"])
def test_nothing_but_control_characters_whitespace_or_emoji_gives_empty_without_decoding(
    micro_model, word_tokenizer, small_kb, text
):
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb)
    linker.encode_windows = lambda *a, **k: pytest.fail("decoded a mention with nothing to link")
    assert linker.link([Mention(text, left="renal", right="failure")]) == [[]]
    assert has_linkable_text("😷 renal", small_kb.normalize) and not has_linkable_text(text, small_kb.normalize)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(block_batches=st.integers(1, 6))
def test_block_batches_sets_the_encoder_batch_not_the_links(micro_model, word_tokenizer, small_kb, block_batches):
    mentions = mentions_for(small_kb)

    def linker(n):
        return GenerativeLinker(
            micro_model,
            word_tokenizer,
            small_kb,
            decoding=DecodingSettings(num_beams=3, top_k=3, batch_size=2, block_batches=n),
        )

    one, many = linker(1), linker(block_batches)
    calls = []
    original = many.encode_windows
    many.encode_windows = lambda ids, mask: calls.append(ids.shape[0]) or original(ids, mask)
    assert [[c.name for c in r] for r in many.link(mentions)] == [[c.name for c in r] for r in one.link(mentions)]
    inputs = many.stats["encoder_inputs"]
    assert max(calls) <= 2 * block_batches and len(calls) == -(-inputs // (2 * block_batches))


def test_block_batches_is_a_config_setting():
    import spacy

    pipe = spacy.blank("en").add_pipe("genbioel", config={"decoding": {"block_batches": 2}})
    assert pipe.decoding.block_batches == 2
    with pytest.raises(ValueError, match="block_batches"):
        DecodingSettings(block_batches=0)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60), rows=st.integers(1, 20))
def test_length_chunks_cover_every_row_once_at_its_own_width(lengths, rows):
    from spacy_genbioel.linking.decoding.stages import length_chunks

    width = max(lengths)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    chunks = length_chunks(mask, rows)
    order = sorted(lengths)
    padded = sum(len(order[s : s + rows]) * max(order[s : s + rows]) for s in range(0, len(order), rows))
    if chunks is None:  # a small batch, or chunks that would save little: one batch pays as well
        assert len(lengths) <= rows or padded > 0.9 * len(lengths) * width
        return
    assert sum(len(r) * w for r, w in chunks) == padded
    covered = torch.cat([r for r, _ in chunks]).tolist()
    assert sorted(covered) == list(range(len(lengths)))
    assert all(len(r) <= rows and w == max(lengths[i] for i in r.tolist()) for r, w in chunks)
    assert sum(len(r) * w for r, w in chunks) <= 0.9 * len(lengths) * width


def test_length_chunks_leave_left_padding_alone():
    from spacy_genbioel.linking.decoding.stages import length_chunks

    right = torch.tensor([[1] * n + [0] * (30 - n) for n in [2, 30] * 20])
    assert length_chunks(right, 4) is not None
    assert length_chunks(right.flip(1), 4) is None  # BART's positions would move with the width
    assert length_chunks(right[:4], 4) is None


def test_chunked_encoding_links_as_one_batch(micro_model, word_tokenizer, small_kb, monkeypatch):
    """Contexts of very different lengths in one block: the encoder runs in chunks of similar length
    and pads the cross-attention keys and values back, with the same links as one padded batch."""
    import spacy_genbioel.linking.decoding.decoder as decoder

    names = small_kb.names
    mentions = [
        Mention(names[(i * 5) % len(names)], left="the patient had " * (i % 9), right=" and was treated" * (i % 4))
        for i in range(40)
    ]

    def linker():
        return GenerativeLinker(
            micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(num_beams=3, top_k=3, block_batches=4)
        )

    chunked = linker()
    widths = []
    real = decoder.length_chunks
    monkeypatch.setattr(decoder, "length_chunks", lambda mask: widths.append(real(mask)) or widths[-1])
    links = chunked.link(mentions)
    assert any(w is not None and len(w) > 1 for w in widths)  # the chunked path ran
    monkeypatch.setattr(decoder, "length_chunks", lambda mask: None)
    assert_same_links(
        [[(c.ids, c.name, c.score) for c in r] for r in links],
        [[(c.ids, c.name, c.score) for c in r] for r in linker().link(mentions)],
        tol=1e-5,
    )
