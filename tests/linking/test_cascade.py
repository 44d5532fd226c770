"""The cascade (linking/reranking/cascade.py): settle with retrieval, forced scores, beam where weak; its fit
(training/cascade_fit.py), the forced search mode, the union retriever, and the component's paths."""

import dataclasses

import numpy as np
import pytest
import spacy
from conftest import mentions_for, random_kb
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.linking.decoding.candidates import CandidateUnion, make_candidate_generator
from spacy_genbioel.linking.decoding.decoder import DecodingSettings, GenerativeLinker
from spacy_genbioel.linking.decoding.forced import forced_scores
from spacy_genbioel.linking.reranking.cascade import CascadeError, CascadeReranker, make_reranker, settle_model
from spacy_genbioel.linking.reranking.fusion import FusionModel, FusionReranker, feature_names
from spacy_genbioel.linking.settings import RerankerSettings
from spacy_genbioel.training.cascade_fit import (
    CascadeTargets,
    beam_threshold,
    fit_cascade,
    settle_for_recall,
    settle_threshold,
)
from spacy_genbioel.training.fusion_fit import fit_fusion, read_fusion_examples

SOURCES = ["genbioel", "tfidf"]
WEIGHTS = [0.5, 2.0, 1.0, 0.75, 0.5, 2.0, 1.5, 1.0, 3.0, 0.25]


def cascade_model(settle=0.5, beam=0.2, generator="forced"):
    features = feature_names(SOURCES)
    settle_weights = {f: (0.0 if f.startswith("genbioel") else w) for f, w in zip(features, WEIGHTS)}
    return FusionModel(
        SOURCES,
        WEIGHTS,
        depth=3,
        retrievers={"tfidf": {}},
        generator=generator,
        cascade={"settle_weights": settle_weights, "settle_threshold": settle, "beam_threshold": beam},
    )


@pytest.fixture()
def setup(micro_model, word_tokenizer):
    kb = random_kb(1, n_concepts=30)
    linker = GenerativeLinker(
        micro_model, word_tokenizer, kb, decoding=DecodingSettings(num_beams=3, top_k=3, batch_size=4)
    )
    retrievers = {"tfidf": make_candidate_generator("tfidf", kb)}
    return kb, linker, retrievers, mentions_for(kb, n=10)


def cascade(setup, **settings):
    kb, linker, retrievers, _ = setup
    return CascadeReranker(
        cascade_model(), kb, retrievers, linker, RerankerSettings(fusion="f.json", cascade="on", **settings)
    )


def test_settled_mentions_never_reach_the_generator(setup):
    _, linker, _, mentions = setup
    results, paths = cascade(setup, settle_threshold=0.0).link(mentions, 3)
    assert set(paths) == {"retrieval"} and all(results)
    assert linker.stats["mentions_scored"] == 0 and linker.stats["mentions_decoded"] == 0
    for found in results:
        scores = [c.score for c in found]
        assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)


def test_forced_path_fuses_the_forced_scores_of_every_retrieved_name(setup):
    kb, linker, retrievers, mentions = setup
    reranker = cascade(setup, settle_threshold=2.0, beam="never")
    results, paths = reranker.link(mentions, 3)
    assert set(paths) == {"forced"} and linker.stats["mentions_decoded"] == 0
    assert linker.stats["mentions_scored"] == len(mentions)
    retrieved = retrievers["tfidf"].link(mentions, 3)
    for mention, found, ret in zip(mentions, results, retrieved):
        names = list(dict.fromkeys(c.name for c in ret))
        scores = forced_scores(linker, [mention], [names])[0]
        generated = sorted(((s, n) for n, s in zip(names, scores)), reverse=True)
        from spacy_genbioel.ty import Candidate

        gen = [Candidate(kb.ids_for_name(n, normalize=False), n, s) for s, n in generated]
        expected = reranker.model.rank(mention.text, {"genbioel": gen, "tfidf": ret}, kb, 3, {})
        assert [c.ids[0] for c in found] == [c.ids[0] for c in expected]
        assert [c.score for c in found] == pytest.approx([c.score for c in expected], abs=1e-6)
    assert reranker.stats["forced"] == len(mentions)


def test_beam_runs_where_retrieval_is_weak_or_always(setup):
    _, linker, _, mentions = setup
    _, paths = cascade(setup, settle_threshold=2.0, beam="always").link(mentions, 3)
    assert set(paths) == {"beam"} and linker.stats["mentions_decoded"] == len(mentions)
    linker.stats.clear()
    _, paths = cascade(setup, settle_threshold=2.0, beam="weak", beam_threshold=2.0).link(mentions, 3)
    assert set(paths) == {"beam"}
    _, paths = cascade(setup, settle_threshold=2.0, beam="weak", beam_threshold=-1.0).link(mentions, 3)
    assert set(paths) == {"forced"}


def test_a_cascade_fitted_on_beam_lists_gives_the_unsettled_mentions_todays_fusion(setup):
    kb, linker, retrievers, mentions = setup
    model = cascade_model(generator="beam")
    reranker = CascadeReranker(model, kb, retrievers, linker, RerankerSettings(fusion="f", cascade="on", beam="never"))
    probability = [
        reranker.settle.rank(m.text, {"genbioel": [], "tfidf": r}, kb, 3, {})[0].score
        for m, r in zip(mentions, retrievers["tfidf"].link(mentions, 3))
    ]
    reranker.settle_threshold = sorted(probability)[len(mentions) // 2]  # about half settle
    results, paths = reranker.link(mentions, 3)
    unsettled = [i for i, p in enumerate(probability) if p < reranker.settle_threshold]
    assert unsettled and [paths[i] for i in unsettled] == ["beam"] * len(unsettled)
    assert set(paths) == {"retrieval", "beam"} and linker.stats["mentions_scored"] == 0  # no forced scoring
    fused = FusionReranker(model, kb, retrievers).rerank(
        [mentions[i] for i in unsettled], linker.link([mentions[i] for i in unsettled], 3), 3
    )
    for i, expected in zip(unsettled, fused):
        assert [c.ids for c in results[i]] == [c.ids for c in expected]
        assert [c.score for c in results[i]] == pytest.approx([c.score for c in expected], abs=1e-6)


def test_empty_mentions_take_no_path_and_the_batch_does_not_matter(setup):
    from spacy_genbioel.ty import Mention

    _, _, _, mentions = setup
    reranker = cascade(setup, settle_threshold=0.6, beam_threshold=0.3)
    results, paths = reranker.link([Mention("..."), *mentions], 3)
    assert results[0] == [] and paths[0] == "none"
    alone = [reranker.link([m], 3) for m in mentions]
    for (found, path), got, got_path in zip(alone, results[1:], paths[1:]):
        assert path == [got_path] and [c.ids for c in found[0]] == [c.ids for c in got]


def test_a_fusion_without_a_cascade_fit_is_refused(setup):
    kb, linker, retrievers, _ = setup
    plain = FusionModel(SOURCES, WEIGHTS, depth=3)
    with pytest.raises(CascadeError, match="fit-fusion --cascade"):
        settle_model(plain)
    with pytest.raises(CascadeError, match="needs a fusion"):
        make_reranker(None, kb, linker, RerankerSettings(cascade="on"), None)
    assert make_reranker(None, kb, linker, RerankerSettings(), None) is None
    factory = lambda source, model: retrievers[source]  # noqa: E731
    assert isinstance(make_reranker(plain, kb, linker, RerankerSettings(fusion="f"), factory), FusionReranker)
    built = make_reranker(
        cascade_model(generator="beam"), kb, linker, RerankerSettings(fusion="f", cascade="on"), factory
    )
    assert isinstance(built, CascadeReranker) and built.model.generator == "beam"
    bad = dataclasses.replace(cascade_model(), cascade={**cascade_model().cascade, "settle_threshold": "high"})
    with pytest.raises(CascadeError, match="settle_threshold"):
        CascadeReranker(bad, kb, retrievers, linker, RerankerSettings(fusion="f", cascade="on"))


@pytest.mark.parametrize("bad", [{"cascade": "maybe"}, {"beam": "sometimes"}])
def test_reranker_settings_are_checked(bad):
    with pytest.raises(ValueError, match="reranker"):
        RerankerSettings(**bad)


# -- the forced search mode and the union retriever -------------------------------------------------
def test_forced_search_ranks_the_retrievers_names(micro_model, word_tokenizer):
    kb = random_kb(2, n_concepts=25)
    retriever = make_candidate_generator("tfidf+exact", kb)
    assert isinstance(retriever, CandidateUnion)
    linker = GenerativeLinker(
        micro_model,
        word_tokenizer,
        kb,
        decoding=DecodingSettings(num_beams=4, top_k=4, search="forced"),
        retriever=retriever,
    )
    mentions = mentions_for(kb, n=6)
    results = linker.link(mentions)
    proposals = retriever.link(mentions, linker.candidates.num_candidates)
    for mention, found, props in zip(mentions, results, proposals):
        names = {c.name for c in props}
        assert found and {c.name for c in found} <= names and len(found) <= 4
        assert [c.score for c in found] == pytest.approx(
            forced_scores(linker, [mention], [[c.name for c in found]])[0], abs=1e-6
        )
    assert linker.stats["mentions_decoded"] == 0
    with pytest.raises(ValueError, match="candidates.retriever"):
        GenerativeLinker(micro_model, word_tokenizer, kb, decoding=DecodingSettings(search="forced"))
    with pytest.raises(ValueError, match="search"):
        DecodingSettings(search="greedy")
    with pytest.raises(ValueError, match="Unknown candidate generator 'bm25'"):
        make_candidate_generator("tfidf+bm25", kb)


# -- the fit ------------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=60), st.floats(0.5, 1.0), st.integers(1, 5)
)
def test_thresholds_meet_their_targets(pairs, target, min_mentions):
    p = np.array([x for x, _ in pairs])
    ok = np.array([y for _, y in pairs])
    t = settle_threshold(p, ok, target, min_mentions)
    if t is not None:
        chosen = p >= t
        assert chosen.sum() >= min_mentions and ok[chosen].mean() >= target - 1e-12
    b = beam_threshold(p, ok, 1 - target, min_mentions)  # ok as "reached": the same rule
    if b is not None:
        below = p < b
        assert below.sum() >= min_mentions and ok[below].mean() <= 1 - target + 1e-12


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 1), st.booleans(), st.booleans()), min_size=1, max_size=60),
    st.sampled_from([0.0, 0.002, 0.05]),
    st.integers(1, 5),
)
def test_settling_for_recall_loses_at_most_the_allowed_recall(rows, max_loss, min_mentions):
    p = np.array([x for x, _, _ in rows])
    retrieval, fusion = np.array([r for _, r, _ in rows]), np.array([f for _, _, f in rows])
    t = settle_for_recall(p, retrieval, fusion, max_loss, min_mentions)
    if t is None:
        return
    settled = p >= t
    assert settled.sum() >= min_mentions
    assert fusion.mean() - np.where(settled, retrieval, fusion).mean() <= max_loss + 1e-9
    lower = p[p < t]  # settling from the next lower probability on would lose more (or take too few)
    if len(lower):
        more = p >= lower.max()
        assert fusion.mean() - np.where(more, retrieval, fusion).mean() > max_loss + 1e-12 or more.sum() < min_mentions


def test_fit_cascade_and_the_command(tmp_path):
    from test_fusion import fit_args, synthetic, write_jsonl

    kb, gen, ret = synthetic(80)
    examples = read_fusion_examples(
        {"genbioel": [write_jsonl(tmp_path / "g.jsonl", gen)], "tfidf": [write_jsonl(tmp_path / "t.jsonl", ret)]}, kb
    )
    model = fit_fusion(examples, kb, SOURCES, depth=3)
    fitted = fit_cascade(
        dataclasses.replace(model, generator="forced"), examples, kb, CascadeTargets(0.9, 0.5, min_mentions=5)
    )
    c = fitted.cascade
    assert all(v == 0 for f, v in c["settle_weights"].items() if f.startswith("genbioel"))
    assert c["report"]["mentions"] == 80 and 0 <= c["report"]["settled_share"] <= 1
    if c["settle_threshold"] is not None:
        assert c["report"]["settled_precision"] >= 0.9
    again = FusionModel.from_dict(fitted.to_dict())
    assert (
        again.cascade == fitted.cascade
        and again.weights == pytest.approx(fitted.weights)
        and settle_model(again).weights == pytest.approx([c["settle_weights"][f] for f in fitted.features])
    )
    kb.to_jsonl(tmp_path / "kb.jsonl")
    paths = {
        "g": [write_jsonl(tmp_path / f"g{i}.jsonl", gen[i * 40 : (i + 1) * 40]) for i in range(2)],
        "t": [write_jsonl(tmp_path / f"t{i}.jsonl", ret[i * 40 : (i + 1) * 40]) for i in range(2)],
    }
    result = CliRunner().invoke(
        app, fit_args(tmp_path, paths, "--generator", "forced", "--cascade", "--target-precision", "0.9")
    )
    assert result.exit_code == 0, result.output
    saved = FusionModel.load(tmp_path / "out" / "fusion.json")
    assert saved.generator == "forced" and "settle_threshold" in saved.cascade and "cascade:" in result.output
    result = CliRunner().invoke(app, fit_args(tmp_path, paths, "--cascade", "--max-recall-loss", "0.01"))
    assert result.exit_code == 0, result.output
    saved = FusionModel.load(tmp_path / "out" / "fusion.json")
    assert saved.generator == "beam" and saved.cascade["targets"]["max_recall_loss"] == 0.01
    result = CliRunner().invoke(app, fit_args(tmp_path, paths, "--generator", "sampled"))
    assert result.exit_code == 1 and "generator" in result.output


# -- the component --------------------------------------------------------------------------------------
def test_component_writes_paths_and_saves_its_cascade(tmp_path, micro_model, word_tokenizer):
    from spacy_genbioel.models import save_model

    kb = random_kb(1, n_concepts=30)
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    kb.to_jsonl(tmp_path / "kb.jsonl")
    cascade_model(settle=0.5, beam=0.2).save(tmp_path / "fusion.json")
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": n} for n in kb.names[:6]])
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "device": "cpu",
            "decoding": {"num_beams": 3, "top_k": 3},
            "reranker": {"fusion": str(tmp_path / "fusion.json"), "cascade": "on", "settle_threshold": 2.0},
        },
    )
    component = nlp.get_pipe("genbioel")
    texts = [f"We saw {kb.names[i]} and {kb.names[i + 1]} today ." for i in range(0, 6, 2)]
    docs = list(nlp.pipe(texts, batch_size=2))
    paths = [ent._.link_path for doc in docs for ent in doc.ents]
    assert paths and set(paths) <= {"forced", "beam"} and "forced" in paths
    assert sum(component.stats.values()) == len(paths) and isinstance(component.reranker, CascadeReranker)
    nlp.to_disk(tmp_path / "pipeline")
    (tmp_path / "fusion.json").unlink()
    loaded = spacy.load(tmp_path / "pipeline")
    again = list(loaded.pipe(texts))
    for a, b in zip(docs, again):
        assert [(e._.kb_id, e._.link_path) for e in a.ents] == [(e._.kb_id, e._.link_path) for e in b.ents]
        assert [e._.kb_candidates for e in a.ents] == [e._.kb_candidates for e in b.ents]
    assert loaded.get_pipe("genbioel").fusion.cascade == cascade_model(settle=0.5, beam=0.2).cascade
