"""The cascade's early step (``fit-fusion --defer``): a costly retriever runs only for the mentions the
others do not settle; its fit, its file, its setting and the command's checks."""

import copy
import dataclasses
import json

import pytest
from conftest import mentions_for, random_kb
from test_fusion import synthetic, write_jsonl
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.linking.decoding.candidates import make_candidate_generator
from spacy_genbioel.linking.decoding.decoder import DecodingSettings, GenerativeLinker
from spacy_genbioel.linking.reranking.cascade import CascadeError, CascadeReranker, early_model
from spacy_genbioel.linking.reranking.fusion import FusionModel, feature_names
from spacy_genbioel.linking.settings import RerankerSettings
from spacy_genbioel.training.cascade_fit import CascadeTargets, fit_cascade
from spacy_genbioel.training.fusion_fit import fit_fusion, read_fusion_examples

SOURCES = ["genbioel", "tfidf", "dense"]


class Counting:
    """A retriever that records the mentions it is asked about."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []

    def link(self, mentions, top_k=5):
        self.asked.extend(m.text for m in mentions)
        return self.inner.link(mentions, top_k)


def early_cascade_model(threshold=0.5, defer=("dense",)):
    features = feature_names(SOURCES)
    weights = [0.5 + 0.25 * (i % 5) for i in range(len(features))]
    settle = {f: (0.0 if f.startswith("genbioel") else w) for f, w in zip(features, weights)}
    early = {f: (0.0 if f.startswith(("genbioel", "dense")) else w) for f, w in zip(features, weights)}
    return FusionModel(
        SOURCES,
        weights,
        depth=3,
        retrievers={"tfidf": {}, "dense": {}},
        generator="beam",
        cascade={
            "settle_weights": settle,
            "settle_threshold": 0.6,
            "beam_threshold": None,
            "early": {"defer": list(defer), "weights": early, "threshold": threshold},
        },
    )


@pytest.fixture()
def setup(micro_model, word_tokenizer):
    kb = random_kb(2, n_concepts=30)
    linker = GenerativeLinker(
        micro_model, word_tokenizer, kb, decoding=DecodingSettings(num_beams=3, top_k=3, batch_size=4)
    )
    tfidf = make_candidate_generator("tfidf", kb)
    mentions = mentions_for(kb, n=12)
    return kb, linker, tfidf, mentions


def reranker(setup, model, **settings):
    kb, linker, tfidf, _ = setup
    retrievers = {"tfidf": tfidf, "dense": Counting(tfidf)}  # the "costly" one: the same lists, counted
    return CascadeReranker(model, kb, retrievers, linker, RerankerSettings(fusion="f", cascade="on", **settings))


def test_the_deferred_retriever_runs_only_where_the_early_step_is_unsure(setup):
    kb, linker, tfidf, mentions = setup
    probe = reranker(setup, early_cascade_model())
    lists = tfidf.link(mentions, 3)
    early_p = [
        probe.early.rank(m.text, {"genbioel": [], "dense": [], "tfidf": r}, kb, 3, {})[0].score
        for m, r in zip(mentions, lists)
    ]
    threshold = sorted(early_p)[len(mentions) // 2]  # about half are settled early
    with_early = reranker(setup, early_cascade_model(threshold))
    results, paths = with_early.link(mentions, 3)
    unsure = [i for i, p in enumerate(early_p) if p < threshold]
    assert unsure and len(unsure) < len(mentions)
    assert [i for i, path in enumerate(paths) if path == "early"] == [
        i for i in range(len(mentions)) if i not in unsure
    ]
    assert with_early.retrievers["dense"].asked == [mentions[i].text for i in unsure]
    assert with_early.stats["early"] == len(mentions) - len(unsure)
    # the others are linked as without the early step, which asks the costly retriever about every mention
    without = reranker(setup, early_cascade_model(threshold), early_threshold=2.0)
    all_results, all_paths = without.link(mentions, 3)
    assert "early" not in all_paths and len(without.retrievers["dense"].asked) == len(mentions)
    for i in unsure:
        assert paths[i] == all_paths[i] and [c.ids for c in results[i]] == [c.ids for c in all_results[i]]
        assert [c.score for c in results[i]] == pytest.approx([c.score for c in all_results[i]], abs=1e-9)
    for i in set(range(len(mentions))) - set(unsure):
        assert results[i][0].score >= threshold and [c.score for c in results[i]] == sorted(
            (c.score for c in results[i]), reverse=True
        )


def test_an_early_step_that_settles_all_never_asks_the_deferred_retriever(setup):
    _, linker, _, mentions = setup
    everything = reranker(setup, early_cascade_model(threshold=0.0))
    _, paths = everything.link(mentions, 3)
    assert set(paths) == {"early"} and everything.retrievers["dense"].asked == []
    assert linker.stats["mentions_decoded"] == 0


@pytest.mark.parametrize("defer", [(), ("dense", "tfidf"), ("rescnn",)])
def test_an_early_step_must_defer_some_but_not_all_retrievers(setup, defer):
    with pytest.raises(CascadeError, match="defer"):
        reranker(setup, early_cascade_model(defer=defer))


def test_an_early_step_needs_a_weight_per_feature(setup):
    model = early_cascade_model()
    bad = copy.deepcopy(model.cascade)
    del bad["early"]["weights"][model.features[0]]
    with pytest.raises(CascadeError, match="early step's weights"):
        early_model(dataclasses.replace(model, cascade=bad))
    assert early_model(dataclasses.replace(model, cascade={**model.cascade, "early": None})) is None


def three_sources(n=80):
    """tfidf as :func:`synthetic` makes it; dense also right on the paraphrases (gold first)."""
    kb, gen, ret = synthetic(n)
    dense = []
    for rec in ret:
        rec = copy.deepcopy(rec)
        if rec["text"].startswith("paraphrase"):
            cands = rec["candidates"]
            gold = next(c for c in cands if c[0][0] in rec["gold"])
            rec["candidates"] = [[gold[0], gold[1], 0.9]] + [c for c in cands if c is not gold]
        dense.append(rec)
    return kb, gen, ret, dense


def test_fit_cascade_with_a_deferred_retriever(tmp_path):
    kb, gen, ret, dense = three_sources()
    examples = read_fusion_examples(
        {
            "genbioel": [write_jsonl(tmp_path / "g.jsonl", gen)],
            "tfidf": [write_jsonl(tmp_path / "t.jsonl", ret)],
            "dense": [write_jsonl(tmp_path / "d.jsonl", dense)],
        },
        kb,
    )
    model = fit_fusion(examples, kb, SOURCES, depth=3)
    targets = CascadeTargets(0.9, 0.5, min_mentions=5)
    fitted = fit_cascade(model, examples, kb, targets, defer=["dense"])
    early = fitted.cascade["early"]
    assert early["defer"] == ["dense"]
    assert all(w == 0 for f, w in early["weights"].items() if f.startswith(("genbioel", "dense"))), early["weights"]
    assert any(w != 0 for f, w in early["weights"].items() if f.startswith("tfidf"))
    report = fitted.cascade["report"]
    assert 0 <= report["early_share"] <= report["settled_share_with_early"] <= 1
    if early["threshold"] is not None:
        assert report["early_precision"] >= 0.9
    again = FusionModel.from_dict(json.loads(json.dumps(fitted.to_dict())))
    assert again.cascade == fitted.cascade and early_model(again)[1] == ["dense"]
    # a deferred name the fusion does not read, or none: no early step
    assert "early" not in fit_cascade(model, examples, kb, targets, defer=["rescnn"]).cascade
    assert "early" not in fit_cascade(model, examples, kb, targets).cascade


def test_fit_fusion_defer_option(tmp_path):
    kb, gen, ret, dense = three_sources()
    kb.to_jsonl(tmp_path / "kb.jsonl")
    files = {
        name: ",".join(str(write_jsonl(tmp_path / f"{name}{i}.jsonl", recs[i * 40 : (i + 1) * 40])) for i in range(2))
        for name, recs in (("genbioel", gen), ("tfidf", ret), ("dense", dense))
    }
    base = [
        "fit-fusion",
        *(a for name, f in files.items() for a in ("--source", f"{name}={f}")),
        "--kb",
        str(tmp_path / "kb.jsonl"),
        "--out",
        str(tmp_path / "fusion.json"),
        "--depth",
        "3",
        "--target-precision",
        "0.9",
    ]
    result = CliRunner().invoke(app, [*base, "--cascade", "--defer", "dense"])
    assert result.exit_code == 0, result.output
    assert FusionModel.load(tmp_path / "fusion.json").cascade["early"]["defer"] == ["dense"]
    assert "early step: dense deferred" in result.output
    result = CliRunner().invoke(app, [*base, "--defer", "dense"])
    assert result.exit_code != 0 and "--cascade" in result.output
    result = CliRunner().invoke(app, [*base, "--cascade", "--defer", "rescnn"])
    assert result.exit_code != 0 and "rescnn" in result.output


def test_the_component_takes_the_early_step_and_keeps_it_through_spacy_load(tmp_path, micro_model, word_tokenizer):
    import spacy

    from spacy_genbioel.models import save_model

    kb = random_kb(2, n_concepts=30)
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    kb.to_jsonl(tmp_path / "kb.jsonl")
    sources = ["genbioel", "tfidf", "exact"]  # exact match stands in for the costly retriever
    features = feature_names(sources)
    weights = [0.5 + 0.25 * (i % 5) for i in range(len(features))]
    model = FusionModel(
        sources,
        weights,
        depth=3,
        retrievers={"tfidf": {}, "exact": {}},
        generator="beam",
        cascade={
            "settle_weights": {f: (0.0 if f.startswith("genbioel") else w) for f, w in zip(features, weights)},
            "settle_threshold": 0.99,
            "beam_threshold": None,
            "early": {
                "defer": ["exact"],
                "threshold": 0.5,
                "weights": {f: (0.0 if f.startswith(("genbioel", "exact")) else w) for f, w in zip(features, weights)},
            },
        },
    )
    model.save(tmp_path / "fusion.json")
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": n} for n in kb.names[:8]])
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "device": "cpu",
            "decoding": {"num_beams": 3, "top_k": 3},
            "reranker": {"fusion": str(tmp_path / "fusion.json"), "cascade": "on"},
        },
    )
    texts = [f"We saw {kb.names[i]} and {kb.names[i + 1]} today ." for i in range(0, 8, 2)]
    docs = list(nlp.pipe(texts, batch_size=2))
    paths = [ent._.link_path for doc in docs for ent in doc.ents]
    assert "early" in paths and set(paths) <= {"early", "retrieval", "beam"}
    assert nlp.get_pipe("genbioel").stats["early"] == paths.count("early")
    nlp.to_disk(tmp_path / "pipeline")
    (tmp_path / "fusion.json").unlink()
    loaded = spacy.load(tmp_path / "pipeline")
    again = list(loaded.pipe(texts))
    for a, b in zip(docs, again):
        assert [(e._.kb_id, e._.link_path, e._.kb_candidates) for e in a.ents] == [
            (e._.kb_id, e._.link_path, e._.kb_candidates) for e in b.ents
        ]
    off = spacy.load(tmp_path / "pipeline", config={"components": {"genbioel": {"reranker": {"early_threshold": 2.0}}}})
    assert "early" not in [e._.link_path for doc in off.pipe(texts) for e in doc.ents]
