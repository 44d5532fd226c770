"""Candidate-restricted decoding (retrieve, then generate) and the exact-match shortcut."""

import dataclasses
import random

import numpy as np
import pytest
import spacy
import test_pipeline
import torch
from conftest import assert_same_links, mentions_for, random_kb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pipeline import TEXTS, linked, make_nlp

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.decoding.candidates import (
    LazyCandidateGenerator,
    check_candidates,
    known_candidates,
    make_candidate_generator,
)
from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.settings import CandidateSettings, DecodingSettings, nested_overrides
from spacy_genbioel.linking.trie.name_trie import NameTrie
from spacy_genbioel.retrieval.tfidf import TfidfLinker
from spacy_genbioel.ty import Candidate, Mention

#: test_pipeline's KB and model folder, a fixture of this module's tests too (an assignment, not an import that
#: the tests' argument would redefine)
resources = test_pipeline.resources

V, EOS, ROOT = 20, 2, 3
sequences_strategy = st.lists(st.lists(st.integers(4, V - 1), min_size=1, max_size=6), min_size=1, max_size=30)


def build(seqs):
    return NameTrie.from_sequences(seqs, vocab_size=V, eos_token_id=EOS, root_token_id=ROOT)


def brute_force_children(seqs, names, prefix):
    """Tokens that extend ``prefix`` towards one of ``names`` (EOS appended)."""
    out = set()
    for i in names:
        full = [*seqs[i], EOS]
        if len(full) > len(prefix) and full[: len(prefix)] == list(prefix):
            out.add(full[len(prefix)])
    return out


# -- trie level ------------------------------------------------------------------


@given(sequences_strategy, st.data())
@settings(max_examples=60, deadline=None)
def test_restricted_mask_equals_brute_force(seqs, data):
    trie = build(seqs)
    n_rows = data.draw(st.integers(1, 4))
    name_sets = [
        data.draw(
            st.none() | st.lists(st.integers(0, len(seqs) + 2), max_size=6).map(lambda x: np.array(x, dtype=np.int64))
        )
        for _ in range(n_rows)
    ]
    restriction = trie.restrict(name_sets)
    # every prefix of every name, plus nodes off the trie
    prefixes = {tuple(s[:d]) for s in ([*q, EOS] for q in seqs) for d in range(len(s) + 1)}
    queries = [(row, trie.walk(p), p) for row in range(n_rows) for p in sorted(prefixes)]
    queries += [(row, -1, None) for row in range(n_rows)]
    rows = torch.tensor([q[0] for q in queries])
    nodes = torch.tensor([q[1] for q in queries])
    tensors = trie.on_device("cpu")
    mask = tensors.allowed_mask(nodes) if restriction is None else restriction.allowed_mask(tensors, nodes, rows)
    for k, (row, node, prefix) in enumerate(queries):
        names = name_sets[row]
        valid = [] if names is None else [int(i) for i in names if 0 <= i < len(seqs)]
        if node < 0:
            expected = set()
        elif not valid:  # None or nothing in the trie: unrestricted
            expected = set(trie.children(node).tolist())
        else:
            expected = brute_force_children(seqs, valid, prefix)
        assert set(torch.nonzero(mask[k]).view(-1).tolist()) == expected, (row, prefix, names)
    if all(s is None or not any(0 <= i < len(seqs) for i in s) for s in name_sets):
        assert restriction is None


def test_name_terminals_survive_the_file_round_trip(tmp_path):
    seqs = [[5, 6], [5, 6], [7], [5, 7, 8]]
    trie = build(seqs)
    trie.to_disk(tmp_path / "trie.safetensors")
    again = NameTrie.from_disk(tmp_path / "trie.safetensors")
    for t in (trie, again):
        assert [t.walk([*s, EOS]) for s in seqs] == t.name_terminals.tolist()
        assert t.terminals_of(np.array([1, 9, -1, 3])).tolist() == [t.walk([5, 6, EOS]), t.walk([5, 7, 8, EOS])]
    keys = trie.path_keys(np.array([0, 1]), np.array([trie.walk([5, 6, EOS]), trie.walk([7, EOS])]))
    n = trie.n_nodes
    assert keys.tolist() == sorted(
        [trie.walk([5]), trie.walk([5, 6]), trie.walk([5, 6, EOS]), n + trie.walk([7]), n + trie.walk([7, EOS])]
    )


# -- decoding --------------------------------------------------------------------

CANDIDATE_KEYS = ("num_candidates", "restrict_to_candidates", "shortcut_threshold")


def make_linker(model, tokenizer, kb, retriever=None, **config):
    cfg = dict(num_beams=4, top_k=4, batch_size=4)
    cfg.update(config)
    candidates = CandidateSettings(**{key: cfg.pop(key) for key in CANDIDATE_KEYS if key in cfg})
    return GenerativeLinker(
        model, tokenizer, kb, decoding=DecodingSettings(**cfg), candidates=candidates, retriever=retriever
    )


def generated_from(kb, cand, allowed):
    """The candidate's name belongs to an allowed concept."""
    return bool(set(kb.ids_for_name(cand.name, normalize=False)) & set(allowed))


@given(st.integers(0, 10_000))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_outputs_come_from_allowed_concepts(micro_model, word_tokenizer, seed):
    kb = random_kb(seed, n_concepts=25)
    rng = random.Random(seed)
    linker = make_linker(micro_model, word_tokenizer, kb, num_beams=3, top_k=3)
    mentions = mentions_for(kb, n=6)
    allowed = [None if rng.random() < 0.25 else rng.sample(kb.concept_ids, rng.randint(1, 4)) for _ in mentions]
    restricted = linker.link(mentions, allowed=allowed)
    free = linker.link(mentions)
    for ranked, ids, unrestricted in zip(restricted, allowed, free):
        assert ranked
        if ids is None:
            assert_same_links(ranked, unrestricted)
        for cand in ranked:
            assert cand.ids == kb.ids_for_name(cand.name, normalize=False)
            if ids is not None:
                assert generated_from(kb, cand, ids)
    # allowing everything is unrestricted decoding, names and scores alike
    assert linker.link(mentions, allowed=[kb.concept_ids] * len(mentions)) == free


def test_mixed_batch_equals_each_mention_alone(micro_model, word_tokenizer, small_kb):
    linker = make_linker(micro_model, word_tokenizer, small_kb, batch_size=5)
    mentions = mentions_for(small_kb, n=12)
    ids = small_kb.concept_ids
    allowed = [None if i % 3 == 0 else ids[i : i + 1 + i % 4] for i in range(len(mentions))]
    batched = linker.link(mentions, allowed=allowed)
    singles = [linker.link([m], allowed=[a])[0] for m, a in zip(mentions, allowed)]
    assert_same_links(batched, singles)
    assert all(batched)


def test_shared_name_is_allowed_through_any_of_its_concepts(micro_model, word_tokenizer):
    kb = KnowledgeBase(
        [
            Concept("A", ["renal failure", "acute renal failure"]),
            Concept("B", ["renal failure", "chronic renal failure"]),
            Concept("C", ["lung cancer"]),
        ]
    )
    linker = make_linker(micro_model, word_tokenizer, kb, num_beams=4, top_k=4)
    mention = Mention("renal failure")
    only_b = linker.link([mention], allowed=[["B"]])[0]
    assert {c.name for c in only_b} == {"renal failure", "chronic renal failure"}
    shared = [c for c in only_b if c.name == "renal failure"][0]
    assert shared.ids == ("A", "B")  # the name still lists all its concepts
    only_c = linker.link([mention], allowed=[["C", "C"]])[0]
    assert [c.name for c in only_c] == ["lung cancer"]


@pytest.mark.parametrize("empty", [[], ["NOT-IN-KB"], ()])
def test_empty_allowed_set_falls_back_to_unrestricted(micro_model, word_tokenizer, small_kb, empty):
    linker = make_linker(micro_model, word_tokenizer, small_kb)
    mentions = mentions_for(small_kb, n=3)
    assert linker.link(mentions, allowed=[empty] * 3) == linker.link(mentions)
    with pytest.raises(ValueError, match="allowed"):
        linker.link(mentions, allowed=[None])


def test_unrestricted_decoding_builds_no_restriction(micro_model, word_tokenizer, small_kb, monkeypatch):
    linker = make_linker(micro_model, word_tokenizer, small_kb)

    def boom(*args, **kwargs):
        raise AssertionError("restrict called without a restriction")

    monkeypatch.setattr(NameTrie, "restrict", boom)
    assert all(linker.link(mentions_for(small_kb, n=4)))
    assert all(linker.link(mentions_for(small_kb, n=4), allowed=[None] * 4))


def test_candidate_generator_restricts_link(micro_model, word_tokenizer, small_kb):
    tfidf = TfidfLinker(small_kb)
    linker = make_linker(micro_model, word_tokenizer, small_kb, num_candidates=3)
    mentions = mentions_for(small_kb, n=8)
    linker.retriever = tfidf
    allowed = linker.propose(mentions)
    expected = [list(dict.fromkeys(cid for c in cands for cid in c.ids)) for cands in tfidf.link(mentions, 3)]
    assert allowed == expected
    through_generator = linker.link(mentions)
    assert through_generator == linker.link(mentions, allowed=allowed)
    for ranked, ids in zip(through_generator, allowed):
        assert ranked and all(generated_from(small_kb, c, ids) for c in ranked if ids)
    # more candidates than the KB has names: everything TF-IDF finds is allowed
    linker.candidates = dataclasses.replace(linker.candidates, num_candidates=10 * small_kb.n_names)
    assert all(linker.link(mentions))
    # an explicit allowed list wins over the generator
    everything = [small_kb.concept_ids] * len(mentions)
    linker.retriever = None
    free = linker.link(mentions)
    linker.retriever = tfidf
    assert linker.link(mentions, allowed=everything) == free


def test_exact_match_shortcut(micro_model, word_tokenizer, small_kb, monkeypatch):
    name = small_kb.names[5]
    mentions = [Mention(name.upper() + " ."), Mention("zzz unknown words")]
    plain = make_linker(micro_model, word_tokenizer, small_kb).link(mentions)
    linker = make_linker(micro_model, word_tokenizer, small_kb, exact_match=True)
    ranked = linker.link(mentions)
    assert ranked[0][0] == Candidate(small_kb.ids_for_name_index(5), name, 0.0)
    rest = [c for c in plain[0] if c.name != name]
    assert ranked[0][1:] == rest[: len(ranked[0]) - 1] and len(ranked[0]) == 4
    assert ranked[1] == plain[1]  # no exact match: the model's answer
    # top_k=1: nothing left to generate for an exact match
    calls = []
    original = linker._decode
    monkeypatch.setattr(linker, "_decode", lambda sources, *a: calls.append(len(sources)) or original(sources, *a))
    assert linker.link(mentions, top_k=1) == [[ranked[0][0]], plain[1][:1]]
    assert calls == [1]
    calls.clear()
    assert linker.link(mentions[:1], top_k=1) == [[ranked[0][0]]] and calls == []


class FixedRetriever:
    """A candidate generator with given (id, score) answers per mention text."""

    def __init__(self, kb, answers):
        self.kb, self.answers, self.calls = kb, answers, []

    def link(self, mentions, top_k=5):
        self.calls.append([m.text for m in mentions])
        out = []
        for m in mentions:
            cands = []
            for cid, score in self.answers.get(m.text, [])[:top_k]:
                cands.append(Candidate((cid,), self.kb.names_of(cid)[0], score))
            out.append(cands)
        return out


def test_retriever_shortcut(micro_model, word_tokenizer, small_kb, monkeypatch):
    ids = small_kb.concept_ids
    mentions = [Mention("sure thing"), Mention("unsure thing"), Mention("nothing retrieved")]
    retriever = FixedRetriever(
        small_kb, {"sure thing": [(ids[3], 0.95), (ids[4], 0.5)], "unsure thing": [(ids[5], 0.6), (ids[6], 0.55)]}
    )
    free = make_linker(micro_model, word_tokenizer, small_kb).link(mentions)
    restricted = make_linker(micro_model, word_tokenizer, small_kb, num_candidates=2)
    restricted.retriever = retriever
    restricted_out = restricted.link(mentions)

    # retrieve for the shortcut only: the rest decodes unrestricted
    linker = make_linker(
        micro_model, word_tokenizer, small_kb, num_candidates=2, restrict_to_candidates=False, shortcut_threshold=0.9
    )
    linker.retriever = retriever
    ranked = linker.link(mentions)
    top = Candidate((ids[3],), small_kb.names_of(ids[3])[0], 0.0)
    assert ranked[0][0] == top
    assert ranked[0][1:] == [c for c in free[0] if c.name != top.name][:3]
    assert ranked[1:] == free[1:]  # below the threshold, nothing retrieved: the model's answer

    # with restriction, the shortcut comes first and the rest is the restricted answer
    linker.candidates = dataclasses.replace(linker.candidates, restrict_to_candidates=True)
    both = linker.link(mentions)
    assert both[0][0] == top and both[1:] == restricted_out[1:]
    assert [c for c in both[0][1:]] == [c for c in restricted_out[0] if c.name != top.name][:3]

    # top_k=1: shortcut mentions are not decoded at all
    calls = []
    original = linker._decode
    monkeypatch.setattr(linker, "_decode", lambda sources, *a: calls.append(len(sources)) or original(sources, *a))
    assert linker.link(mentions, top_k=1)[0] == [top]
    assert calls == [2]

    # an exact match wins over the shortcut and is not retrieved for
    name = small_kb.names_of(ids[7])[0]
    linker.decoding = dataclasses.replace(linker.decoding, exact_match=True)
    retriever.answers[name] = [(ids[3], 0.99)]
    retriever.calls.clear()
    exact = linker.link([Mention(name), mentions[0]], top_k=1)
    assert exact[0][0].name == name and exact[1] == [top]
    assert retriever.calls == [["sure thing"]]


def test_shortcut_off_retrieves_nothing_without_restriction(micro_model, word_tokenizer, small_kb):
    retriever = FixedRetriever(small_kb, {})
    linker = make_linker(micro_model, word_tokenizer, small_kb, restrict_to_candidates=False)
    linker.retriever = retriever
    mentions = mentions_for(small_kb, n=3)
    assert linker.link(mentions) == make_linker(micro_model, word_tokenizer, small_kb).link(mentions)
    assert retriever.calls == []


# -- registry and pipeline ---------------------------------------------------------


def test_registry_builds_lazily(small_kb, monkeypatch):
    assert make_candidate_generator("none", small_kb) is None
    with pytest.raises(ValueError, match="tfidf"):
        make_candidate_generator("nope", small_kb)
    from spacy_genbioel.retrieval import dense

    built = []

    class Dense:
        def __init__(self, kb, model=None, settings=None):
            built.append(kb)

        def link(self, mentions, top_k=5):
            return [[] for _ in mentions]

    monkeypatch.setattr(dense, "DenseLinker", Dense)
    lazy = make_candidate_generator("dense", small_kb)
    assert isinstance(lazy, LazyCandidateGenerator) and built == []
    assert lazy.link([Mention("pain")], 3) == [[]] and built == [small_kb]
    assert {"none", "tfidf", "dense", "genbioel.tfidf_retriever.v1", "genbioel.dense_retriever.v1"} <= set(
        known_candidates()
    )
    check_candidates("genbioel.exact_retriever.v1")


def test_dense_generator_gets_its_model_directory(small_kb, monkeypatch):
    from spacy_genbioel.retrieval import dense

    seen = []
    monkeypatch.setattr(dense, "DenseLinker", lambda kb, model=None, settings=None: seen.append(model) or object())
    _ = make_candidate_generator("dense", small_kb, model="trained/dense/model").generator
    _ = make_candidate_generator("genbioel.dense_retriever.v1", small_kb).generator
    assert seen == ["trained/dense/model", None]
    assert isinstance(make_candidate_generator("tfidf", small_kb, model="ignored").generator, TfidfLinker)


@pytest.fixture()
def fixed_retriever():
    """A retriever another package could register: every mention gets the KB's first name."""
    import catalogue
    from spacy.util import registry

    name = "test.first_name_retriever.v1"

    class FirstName:
        def __init__(self, kb, score):
            self.kb, self.score = kb, score

        def link(self, mentions, top_k=5):
            name = self.kb.names[0]
            return [
                [Candidate(tuple(self.kb.ids_for_name(name, normalize=False)), name, self.score)][:top_k]
                for _ in mentions
            ]

    @registry.misc(name)
    def make_first_name_retriever(score: float = 0.5):
        return lambda kb: FirstName(kb, score)

    yield name
    catalogue.REGISTRY.pop((*registry.misc.namespace, name), None)


def test_a_registered_retriever_serves_evaluate_and_candidate_generation(fixed_retriever, small_kb, tmp_path):
    import json

    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    lazy = make_candidate_generator(fixed_retriever, small_kb)
    first = small_kb.names[0]
    assert lazy.link([Mention("anything")], 3) == [
        [Candidate(small_kb.ids_for_name(first, normalize=False), first, 0.5)]
    ]
    assert fixed_retriever in known_candidates()

    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    gold = small_kb.ids_for_name(first, normalize=False)[0]
    (tmp_path / "dev.txt").write_text(f"1|t|{first} here.\n1|a|\n1\t0\t{len(first)}\t{first}\tDisease\t{gold}\n\n")
    result = CliRunner().invoke(
        app,
        [
            "evaluate",
            "--corpus",
            str(tmp_path / "dev.txt"),
            "--linker",
            fixed_retriever,
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["linker"] == fixed_retriever and report["recall"]["recall"]["recall@1"] == 1.0


def test_pipeline_config_round_trip(resources, tmp_path_factory):
    kb, tmp_path = resources
    nlp = make_nlp(tmp_path, candidates={"retriever": "tfidf", "num_candidates": 2}, decoding={"exact_match": True})
    pipe = nlp.get_pipe("genbioel")
    before = [linked(d) for d in nlp.pipe(TEXTS)]
    generator = pipe.linker.retriever
    assert isinstance(generator, LazyCandidateGenerator) and generator.name == "tfidf"
    assert pipe.linker.candidates.num_candidates == 2 and pipe.linker.decoding.exact_match
    allowed = pipe.linker.propose([Mention("renal failure")])[0]
    first = before[0][0]
    assert first[0] == "renal failure" and allowed
    exact = kb.name_index("renal failure")
    for _cid, name, score in first[4]:
        if exact is not None and name == "renal failure":
            assert score == 0.0
        else:
            assert set(kb.ids_for_name(name, normalize=False)) & set(allowed)
    out = tmp_path_factory.mktemp("pipeline") / "nlp"
    nlp.to_disk(out)
    assert not list((out / "genbioel").glob("*tfidf*"))
    loaded = spacy.load(out)
    cfg = loaded.config["components"]["genbioel"]
    assert (cfg["candidates"]["retriever"], cfg["candidates"]["num_candidates"], cfg["decoding"]["exact_match"]) == (
        "tfidf",
        2,
        True,
    )
    assert_same_links([linked(d) for d in loaded.pipe(TEXTS)], before)
    # overriding at load time, as `evaluate --candidates.retriever none` does
    overrides = nested_overrides({"retriever": "none", "decoding.exact_match": False})
    assert overrides == {"candidates": {"retriever": "none"}, "decoding": {"exact_match": False}}
    plain = spacy.load(out, config={"components": {"genbioel": overrides}})
    assert plain.get_pipe("genbioel").linker.retriever is None
    assert [linked(d) for d in plain.pipe(TEXTS)] == [linked(d) for d in make_nlp(tmp_path).pipe(TEXTS)]


def test_pipeline_rejects_bad_candidate_config():
    nlp = spacy.blank("en")
    with pytest.raises(ValueError, match="candidate generator"):
        nlp.add_pipe("genbioel", config={"candidates": {"retriever": "nope"}})
    with pytest.raises(ValueError, match="num_candidates"):
        nlp.add_pipe("genbioel", config={"candidates": {"num_candidates": 0}})


def test_pipeline_warns_on_a_shortcut_without_retriever(caplog):
    with caplog.at_level("WARNING", logger="spacy_genbioel.linking.settings"):
        pipe = spacy.blank("en").add_pipe("genbioel", config={"candidates": {"shortcut_threshold": 0.9}})
    assert "no effect" in caplog.text
    assert pipe.candidates.shortcut_threshold == 0.9 and pipe.candidates.restrict_to_candidates


def test_evaluate_command_overrides_candidates(resources, tmp_path_factory):
    import json

    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    kb, tmp_path = resources
    out = tmp_path_factory.mktemp("pipeline") / "nlp"
    make_nlp(tmp_path).to_disk(out)
    name = kb.names[0]
    text = f"The patient had {name} and renal failure ."
    start = text.index(name)
    ids = "|".join(kb.ids_for_name(name, normalize=False))
    (tmp_path / "dev.txt").write_text(
        f"1|t|{text}\n1|a|\n1\t{start}\t{start + len(name)}\t{name}\tDisease\t{ids}\n"
        f"1\t{text.index('renal')}\t{text.index('renal') + 13}\trenal failure\tDisease\t{kb.concept_ids[1]}\n\n"
    )
    args = [
        "evaluate",
        "--corpus",
        str(tmp_path / "dev.txt"),
        "--linker",
        "genbioel",
        "--pipeline",
        str(out),
        "--device",
        "cpu",
    ]
    result = CliRunner().invoke(
        app,
        [
            *args,
            "--candidates.retriever",
            "tfidf",
            "--candidates.num_candidates",
            "3",
            "--decoding.exact_match",
            "--top-k",
            "3",
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["meta"]["candidates"], report["meta"]["num_candidates"], report["meta"]["exact_match"]) == (
        "tfidf",
        3,
        True,
    )
    assert report["recall"]["recall"]["recall@1"] >= 0.5  # the exact match
    bad = CliRunner().invoke(app, [*args, "--candidates.retriever", "nope"])
    assert bad.exit_code != 0
    bad = CliRunner().invoke(app, [*args, "--candidates.retreiver", "tfidf"])
    assert bad.exit_code == 2 and "candidates.retreiver" in bad.output
    result = CliRunner().invoke(
        app,
        [
            *args,
            "--candidates.retriever",
            "tfidf",
            "--candidates.restrict_to_candidates",
            "false",
            "--candidates.shortcut_threshold",
            "0.99",
            "--json",
            str(tmp_path / "s.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "s.json").read_text())["meta"]
    assert (meta["candidates"], meta["restrict_to_candidates"], meta["shortcut_threshold"]) == ("tfidf", False, 0.99)
    bad = CliRunner().invoke(app, [*args, "--candidates.retriever", "none", "--candidates.shortcut_threshold", "0.9"])
    assert bad.exit_code != 0 and "retriever" in bad.output
