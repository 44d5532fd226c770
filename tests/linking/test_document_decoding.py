"""Decoding per-document inputs: every distinct encoder input is encoded once,
mentions decode from shared cross-attention caches, identical searches run once;
none of it changes what a mention gets. Also the spaCy component, the stage
clock and the annotation benchmark in document mode."""

import copy
import random

import pytest
import spacy
import test_documents
import torch
from conftest import WORDS, assert_same_links, random_kb

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.linking.decoding.candidates import allowed_name_sets
from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.decoding.stages import StageClock
from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.models import save_model
from spacy_genbioel.ty import Mention

#: scores of one mention decoded in batches of other shapes: equal up to float noise (conftest.assert_same_links)
TOL = 1e-5
#: what another encoder input must change in a score (ten times the noise allowed)
DIFFERENT = 1e-4


@pytest.fixture(scope="module")
def sharp_model(micro_model):
    """The micro model with peaked attention and louder positions: its near-uniform
    attention otherwise averages positions away, so that moving a marker changes
    scores by no more than float noise, and a wrong window would go unseen."""
    model = copy.deepcopy(micro_model)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                weight.mul_(16)
            elif "embed_positions" in name:
                weight.mul_(10)
    return model.eval()


def marked_document(segments, doc_id="doc"):
    """``segments``: (text, marked) pieces joined by single spaces; a Mention per marked piece."""
    return test_documents.marked_document(segments, doc_id)[1]


def random_document(seed, n_mentions, doc_id):
    rng = random.Random(seed)
    segments = []
    for _ in range(n_mentions):
        segments += [
            (" ".join(rng.choices(WORDS, k=rng.randint(1, 3))), False),
            (" ".join(rng.choices(WORDS, k=rng.randint(1, 3))), True),
        ]
    return marked_document(segments, doc_id)


def document_linker(model, tokenizer, kb, max_source_tokens=40, **decoding):
    config = DecodingSettings(
        **{"num_beams": 4, "top_k": 4, "batch_size": 3, "max_source_tokens": max_source_tokens, **decoding}
    )
    return GenerativeLinker(model, tokenizer, kb, inputs=InputBuilder(input_mode="document"), decoding=config)


def one_at_a_time(linker, mention, source_ids, top_k=None, allowed=None):
    """The mention decoded alone from its own encoder input (no sharing of any kind),
    restricted to the names of the ``allowed`` concepts when given."""
    prompt = linker.prompt_tokens.prompts([linker.inputs.prompt(mention)])
    ids = torch.tensor([source_ids])
    restriction = None
    if allowed is not None:
        restriction = linker.trie.restrict(allowed_name_sets(linker.kb, [allowed]), linker.device)
    hyps = linker.beam_search(ids, torch.ones_like(ids), torch.tensor(prompt), restriction=restriction)[0]
    return linker._to_candidates(hyps, top_k or linker.decoding.top_k)


def as_tuples(candidates):
    return [(c.ids, c.name, c.score) for c in candidates]


def spy_encoder(linker):
    rows = []
    original = linker.encode_windows

    def spy(input_ids, attention_mask, *args, **kwargs):
        rows.extend(tuple(r[m.bool()].tolist()) for r, m in zip(input_ids, attention_mask))
        return original(input_ids, attention_mask, *args, **kwargs)

    linker.encode_windows = spy
    return rows


@pytest.fixture()
def documents():
    """Three documents: a long one (several windows), a short one, one with a repeated mention."""
    return (
        random_document(1, 14, "long")
        + random_document(2, 3, "short")
        + marked_document(
            [
                ("acute", False),
                ("renal failure", True),
                ("and then", False),
                ("renal failure", True),
                ("with", False),
                ("lung cancer", True),
            ],
            "repeats",
        )
    )


# -- the contract: sharing changes nothing -----------------------------------------------------------------------------
def test_per_document_linking_equals_each_mention_decoded_alone(sharp_model, word_tokenizer, small_kb, documents):
    linker = document_linker(sharp_model, word_tokenizer, small_kb)
    sources = linker.encode_sources(documents)
    assert len({tuple(s) for s in sources}) < len(documents)  # inputs are shared
    linked = linker.link(documents)
    assert all(linked)
    for m, src, got in zip(documents, sources, linked):
        alone = one_at_a_time(linker, m, src)
        assert [c.name for c in got] == [c.name for c in alone]
        assert_same_links(as_tuples(got), as_tuples(alone), tol=TOL)
    # the check has teeth: a mention decoded from another window of its document scores otherwise
    windows = list(dict.fromkeys(tuple(s) for s in sources[:14]))  # the long document's
    assert len(windows) > 1
    m, own = documents[0], sources[0]
    other = next(list(w) for w in windows if list(w) != own)
    wrong = one_at_a_time(linker, m, other)
    right = {c.name: c.score for c in linked[0]}
    assert any(c.name not in right or abs(c.score - right[c.name]) > DIFFERENT for c in wrong)
    # and batching mentions of several documents together is the same as one document at a time
    by_doc = []
    for key in ("long", "short", "repeats"):
        by_doc += linker.link([m for m in documents if m.doc_id == key])
    assert_same_links([as_tuples(r) for r in linked], [as_tuples(r) for r in by_doc], tol=TOL)


def test_restricted_per_document_linking_equals_decoding_alone(sharp_model, word_tokenizer, small_kb, documents):
    linker = document_linker(sharp_model, word_tokenizer, small_kb)
    concepts = [c.id for c in small_kb]
    rng = random.Random(5)
    allowed = [rng.sample(concepts, 3) if i % 3 else None for i in range(len(documents))]
    linked = linker.link(documents, allowed=allowed)
    sources = linker.encode_sources(documents)
    for m, src, ids, got in zip(documents, sources, allowed, linked):
        if ids is not None:
            assert all(set(c.ids) & set(ids) for c in got)
        alone = one_at_a_time(linker, m, src, allowed=ids)
        assert_same_links(as_tuples(got), as_tuples(alone), tol=TOL)


def test_identical_mentions_of_one_document_are_decoded_once(sharp_model, word_tokenizer, small_kb):
    mentions = marked_document(
        [
            ("acute", False),
            ("renal failure", True),
            ("and", False),
            ("renal failure", True),
            ("then", False),
            ("Renal  Failure", True),
            ("lung cancer", True),
        ]
    )
    linker = document_linker(sharp_model, word_tokenizer, small_kb, max_source_tokens=64)
    linked = linker.link(mentions)
    assert linker.stats["mentions_decoded"] == 4 and linker.stats["searches"] == 2
    assert linked[0] == linked[1] == linked[2] and linked[0] != linked[3]
    # another document holding the same text reads another input: its own search
    other = marked_document([("chronic", False), ("renal failure", True)], "other")
    linker.stats.clear()
    linker.link(mentions + other)
    assert linker.stats["mentions_decoded"] == 5 and linker.stats["searches"] == 3


def test_mention_mode_dedupes_identical_inputs_and_ignores_documents(sharp_model, word_tokenizer, small_kb):
    with_docs = marked_document([("acute", False), ("renal failure", True), ("acute", False), ("renal failure", True)])
    bare = [Mention(m.text, left=m.left, right=m.right) for m in with_docs]
    # one word of context: "acute START renal failure END acute" and "acute START renal failure END"
    linker = GenerativeLinker(
        sharp_model,
        word_tokenizer,
        small_kb,
        inputs=InputBuilder(context_words=1),
        decoding=DecodingSettings(num_beams=3, top_k=3),
    )
    assert linker.encode_sources(with_docs) == linker.encode_sources(bare)
    assert linker.link(with_docs) == linker.link(bare)
    assert linker.stats["mentions_decoded"] == linker.stats["searches"] == 4
    linker.stats.clear()
    same = [Mention("renal failure", left="acute ")] * 3
    assert linker.link(same)[0] == linker.link(same[:1])[0]
    assert linker.stats["mentions_decoded"] == 4 and linker.stats["searches"] == 2


# -- the encoder runs once per distinct window -------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_the_encoder_reads_each_distinct_input_once(sharp_model, word_tokenizer, small_kb, documents, batch_size):
    linker = document_linker(sharp_model, word_tokenizer, small_kb, batch_size=batch_size)
    encoded = spy_encoder(linker)
    linker.link(documents)
    distinct = {tuple(s) for s in linker.encode_sources(documents)}
    assert len(encoded) == len(distinct) and set(encoded) == distinct
    assert len(distinct) < len(documents)


# -- the mention's place reaches the decoder ---------------------------------------------------------------------------
def test_where_a_mention_is_marked_changes_what_it_reads(sharp_model, word_tokenizer, small_kb):
    segments = [
        ("acute", False),
        ("liver cancer", False),
        ("and then", False),
        ("liver cancer", False),
        ("with pain", False),
    ]

    def marking(*which):
        return marked_document([(t, k in which) for k, (t, _) in enumerate(segments)], doc_id="-".join(map(str, which)))

    (first,), (second,), both, (_, after_another) = marking(1), marking(3), marking(1, 3), marking(0, 1)
    linker = document_linker(sharp_model, word_tokenizer, small_kb, max_source_tokens=64, num_beams=3, top_k=3)
    sources = [
        linker.encode_sources([first])[0],
        linker.encode_sources([second])[0],
        *linker.encode_sources(both),
        linker.encode_sources(marking(0, 1))[1],
    ]
    assert sources[2] is sources[3] and len({tuple(s) for s in sources}) == 4
    # D0009 has the one name "liver cancer": the same candidate, scored from each input
    concept = "D0009"
    assert small_kb.names_of(concept) == ["liver cancer"]
    (at_1,), (at_3,) = linker.link([first], allowed=[[concept]]), linker.link([second], allowed=[[concept]])
    both_1, both_3 = linker.link(both, allowed=[[concept]] * 2)
    _, marked_after = linker.link(marking(0, 1), allowed=[None, [concept]])
    assert [c.name for r in (at_1, at_3, both_1, both_3, marked_after) for c in r] == ["liver cancer"] * 5
    # marked at position 1 vs at position 3; alone vs after another marked mention: other inputs, other scores
    assert abs(at_1[0].score - at_3[0].score) > DIFFERENT
    assert abs(at_1[0].score - marked_after[0].score) > DIFFERENT
    # the scores are those of the inputs: each equals its mention decoded alone from its input
    for got, m, src in [
        (at_1, first, sources[0]),
        (at_3, second, sources[1]),
        (both_1, both[0], sources[2]),
        (marked_after, after_another, sources[4]),
    ]:
        assert_same_links(as_tuples(got), as_tuples(one_at_a_time(linker, m, src, allowed=[concept])), tol=TOL)
    # same text, same input: one search, one score
    assert both_1 == both_3
    # unrestricted too, the scores of a name both inputs rank differ
    free_1, free_3 = linker.link([first])[0], linker.link([second])[0]
    scores_3 = {c.name: c.score for c in free_3}
    shared = [c for c in free_1 if c.name in scores_3]
    assert shared and all(abs(c.score - scores_3[c.name]) > DIFFERENT for c in shared)


def test_two_mentions_of_one_input_decode_from_their_own_prompts(sharp_model, word_tokenizer, small_kb):
    mentions = marked_document([("acute", False), ("renal failure", True), ("and", False), ("lung cancer", True)])
    linker = document_linker(sharp_model, word_tokenizer, small_kb, max_source_tokens=64)
    sources = linker.encode_sources(mentions)
    assert sources[0] is sources[1]
    linked = linker.link(mentions)
    alone = [one_at_a_time(linker, m, sources[0]) for m in mentions]
    for got, ref in zip(linked, alone):
        assert_same_links(as_tuples(got), as_tuples(ref), tol=TOL)
    # the prompts differ, so do the results: each is its own mention's, not the other's
    assert as_tuples(linked[0]) != as_tuples(linked[1])
    assert not _close(linked[1], alone[0]) and not _close(linked[0], alone[1])


def _close(a, b):
    try:
        assert_same_links(as_tuples(a), as_tuples(b), tol=TOL)
    except AssertionError:
        return False
    return True


# -- the stage clock ---------------------------------------------------------------------------------------------------
def test_stage_clock_records_every_stage(sharp_model, word_tokenizer, small_kb, documents):
    linker = document_linker(sharp_model, word_tokenizer, small_kb)
    linker.clock = StageClock()
    linker.link(documents)
    report = linker.clock.report()
    assert set(report) == {"tokenize", "encoder", "decoder", "trie", "beam"}
    assert all(v["seconds"] >= 0 and v["calls"] > 0 for v in report.values())
    assert report["tokenize"]["calls"] == 1
    assert list(report) == sorted(report, key=lambda k: -linker.clock.seconds[k])
    # a stage inside another pauses it: each counts its own time only
    import time

    clock = StageClock()
    with clock.stage("outer"):
        time.sleep(0.02)
        with clock.stage("inner"):
            time.sleep(0.05)
    assert dict(clock.calls) == {"outer": 1, "inner": 1}
    assert 0.05 <= clock.seconds["inner"] < 0.05 + 0.04
    assert 0.02 <= clock.seconds["outer"] < 0.05
    # unset: nothing is timed
    linker.clock = None
    assert linker.link(documents[:2])


# -- the spaCy component -----------------------------------------------------------------------------------------------
PATTERNS = [{"label": "Disease", "pattern": p} for p in ("renal failure", "lung cancer", "cystic fibrosis")] + [
    {"label": "Chemical", "pattern": "liver"}
]
TEXTS = [
    "acute renal failure and chronic lung cancer with cystic fibrosis of the liver . renal failure again .",
    "No entities here .",
    "lung cancer",
    "the liver and renal failure",
]


@pytest.fixture()
def resources(tmp_path, sharp_model, word_tokenizer):
    kb = random_kb(1, n_concepts=30)
    save_model(sharp_model, word_tokenizer, tmp_path / "model")
    kb.to_jsonl(tmp_path / "kb.jsonl")
    return kb, tmp_path


def document_nlp(tmp_path, input_mode="document"):
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(PATTERNS)
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "device": "cpu",
            "inputs": {"input_mode": input_mode},
            "decoding": {"num_beams": 3, "top_k": 3, "max_source_tokens": 96},
        },
    )
    return nlp


def linked(doc):
    return [
        (
            e.text,
            e.kb_id_,
            e._.kb_id,
            [(cid, name) for cid, name, _ in e._.kb_candidates],
            [score for _, _, score in e._.kb_candidates],
        )
        for e in doc.ents
    ]


def same_docs(a, b):
    assert [[row[:4] for row in d] for d in a] == [[row[:4] for row in d] for d in b]
    assert_same_links([[row[4] for row in d] for d in a], [[row[4] for row in d] for d in b], tol=TOL)


def test_component_in_document_mode_links_and_survives_saving(resources, tmp_path_factory):
    kb, tmp_path = resources
    nlp = document_nlp(tmp_path)
    component = nlp.get_pipe("genbioel")
    assert component.inputs.input_mode == "document" and component.linker.inputs.input_mode == "document"
    docs = list(nlp.pipe(TEXTS, batch_size=2))
    ents = [e for d in docs for e in d.ents]
    assert len(ents) == 8
    assert all(e._.kb_id in kb and e.kb_id_ == e._.kb_id for e in ents)
    # one call per doc gives the same (a batch's documents never mix)
    same_docs([linked(d) for d in docs], [linked(nlp(t)) for t in TEXTS])
    out = tmp_path_factory.mktemp("pipeline") / "nlp"
    nlp.to_disk(out)
    loaded = spacy.load(out)
    assert loaded.config["components"]["genbioel"]["inputs"]["input_mode"] == "document"
    assert loaded.get_pipe("genbioel").linker.inputs.input_mode == "document"
    same_docs([linked(d) for d in loaded.pipe(TEXTS, batch_size=3)], [linked(d) for d in docs])


def test_component_links_what_the_linker_links_from_the_same_mentions(resources):
    _, tmp_path = resources
    nlp = document_nlp(tmp_path)
    linker = nlp.get_pipe("genbioel").linker
    encoded = spy_encoder(linker)
    doc = nlp(TEXTS[0])
    mentions = [
        Mention(
            e.text,
            left=doc.text[: e.start_char],
            right=doc.text[e.end_char :],
            doc_id="x",
            start=e.start_char,
            end=e.end_char,
            label=e.label_,
        )
        for e in doc.ents
    ]
    # the component read one input with all five mentions marked
    assert len(encoded) == 1
    start = word_tokenizer_marker(linker)
    assert encoded[0].count(start) == len(mentions) == 5
    expected = linker.link(mentions)
    assert [e._.kb_id for e in doc.ents] == [r[0].ids[0] for r in expected]
    assert_same_links(
        [[(cid, name, score) for cid, name, score in e._.kb_candidates] for e in doc.ents],
        [[(cid, c.name, round(c.score, 6)) for c in r for cid in c.ids][:3] for r in expected],
        tol=TOL,
    )
    # mention mode reads other inputs: one per distinct mention in context
    mention_nlp = document_nlp(tmp_path, input_mode="mention")
    mention_linker = mention_nlp.get_pipe("genbioel").linker
    mention_encoded = spy_encoder(mention_linker)
    mention_nlp(TEXTS[0])
    assert len(mention_encoded) == 5 and all(row.count(start) == 1 for row in mention_encoded)


def word_tokenizer_marker(linker):
    (start,) = linker.tokenizer(" START", add_special_tokens=False)["input_ids"]
    return start


# -- the annotation benchmark ------------------------------------------------------------------------------------------
def test_parse_settings():
    from spacy_genbioel.workflows.benchmark_annotate import DEFAULT_SETTINGS, parse_settings

    assert parse_settings("mention-0,mention-64,document,document+int8") == [
        ("mention-0", "mention", 0, None),
        ("mention-64", "mention", 64, None),
        ("document", "document", 64, None),
        ("document+int8", "document", 64, "int8"),
    ]
    assert parse_settings(" mention-16 , ") == [("mention-16", "mention", 16, None)]
    assert [s[0] for s in DEFAULT_SETTINGS] == ["mention-0", "mention-16", "mention-64", "document"]
    for bad in ("bogus", "mention-x", "document-wide", "documents", "document+fp8"):
        with pytest.raises(ValueError, match="Unknown setting"):
            parse_settings(bad)


def test_annotation_benchmark_on_a_tiny_pipeline(resources, tmp_path_factory):
    from spacy_genbioel.workflows.benchmark_annotate import parse_settings, run_annotation_benchmark

    _, tmp_path = resources
    out = tmp_path_factory.mktemp("pipeline") / "nlp"
    document_nlp(tmp_path, input_mode="mention").to_disk(out)
    texts = [TEXTS[0], TEXTS[2], TEXTS[3]]
    result = run_annotation_benchmark(
        out, texts, parse_settings("mention-0,mention-16,document,document+int8"), threads=(1,), batch_size=2
    )
    assert result["documents"] == 3 and len(result["runs"]) == 4
    int8 = result["runs"].pop()
    assert (int8["dtype"], int8["input_mode"], int8["mentions"]) == ("int8", "document", 8)
    assert result["per_mention_docs_per_s"] == result["runs"][1]["docs_per_s"] > 0  # the widest context
    assert result["per_document_docs_per_s"] == result["runs"][2]["docs_per_s"] > 0
    assert result["per_document_speedup"] > 0
    for run, (name, mode) in zip(
        result["runs"], [("mention-0", "mention"), ("mention-16", "mention"), ("document", "document")]
    ):
        assert (run["name"], run["input_mode"], run["threads"]) == (name, mode, 1)
        assert run["documents"] == 3 and run["mentions"] == 8
        stages = run["linker_stage_seconds"]
        assert {"tokenize", "encoder", "decoder", "trie", "beam", "spacy_overhead"} <= set(stages)
        assert all(v >= 0 for k, v in stages.items() if k != "spacy_overhead")
        assert stages["spacy_overhead"] >= -1e-3  # the component's time less its stages
        assert set(run["pipe_seconds"]) == {"tokenizer", "entity_ruler", "genbioel"}
        assert 0 <= run["top1_agreement_with_first"] <= 1
        assert 0 < run["searches"] <= run["mentions_decoded"] == 8
    assert result["runs"][0]["top1_agreement_with_first"] == 1.0
    # per-document input reads one input per document: the duplicated mention is searched once
    assert result["runs"][2]["searches"] < 8
    assert result["runs"][2]["context_words"] is None and result["runs"][0]["context_words"] == 0
