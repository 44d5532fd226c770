"""``fit-fusion --anchor``: the L2 penalty pulls the weights toward another fusion's (the shipped
retrieval fusion, fitted on thousands of training mentions) instead of zero."""

import json

import numpy as np
from test_cascade_early import SOURCES, three_sources
from test_fusion import write_jsonl
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.linking.reranking.fusion import FusionModel, feature_names
from spacy_genbioel.training.cascade_fit import CascadeTargets, fit_cascade, without_lists
from spacy_genbioel.training.fusion_fit import fit_fusion, read_fusion_examples


def examples_of(tmp_path):
    kb, gen, ret, dense = three_sources()
    files = {
        "genbioel": [write_jsonl(tmp_path / "g.jsonl", gen)],
        "tfidf": [write_jsonl(tmp_path / "t.jsonl", ret)],
        "dense": [write_jsonl(tmp_path / "d.jsonl", dense)],
    }
    return kb, read_fusion_examples(files, kb)


def anchor_model():
    features = feature_names(SOURCES)
    weights = [0.0 if f.startswith("genbioel") else 0.3 + 0.1 * i for i, f in enumerate(features)]
    early = {f: (0.0 if f.startswith(("genbioel", "dense")) else -0.5) for f in features}
    early["exact"] = 0.0
    return FusionModel(
        SOURCES,
        weights,
        depth=3,
        generator="none",
        cascade={"early": {"defer": ["dense"], "weights": early, "threshold": 0.9}},
    )


def varying(examples, kb, features):
    """The features that vary over the candidates (a constant one gets weight 0 whatever the anchor)."""
    from spacy_genbioel.linking.reranking.fusion import fusion_features

    rows = np.concatenate([fusion_features(ex.text, ex.lists, SOURCES, 3, kb, {})[2] for ex in examples])
    return [f for f, s in zip(features, rows.std(axis=0)) if s > 1e-9]


def test_a_strong_penalty_keeps_the_anchor_weights(tmp_path):
    kb, examples = examples_of(tmp_path)
    anchor = anchor_model()
    toward = dict(zip(anchor.features, anchor.weights))
    free = fit_fusion(examples, kb, SOURCES, depth=3, l2=1e4)
    held = fit_fusion(examples, kb, SOURCES, depth=3, l2=1e4, anchor=toward)
    moving = varying(examples, kb, free.features)
    assert moving, "the synthetic sources must vary"
    for f, w_free, w_held in zip(free.features, free.weights, held.weights):
        if f in moving:
            assert abs(w_free) < 1e-2 and abs(w_held - toward[f]) < 1e-2 * max(1.0, abs(toward[f])), (f, w_held)
    assert held.fit["anchored"] is True and "anchored" not in free.fit


def test_a_weak_penalty_fits_the_data_alike(tmp_path):
    """With l2 near zero the anchor changes the start point only: the fitted likelihood is the same."""
    kb, examples = examples_of(tmp_path)
    toward = dict(zip(anchor_model().features, anchor_model().weights))
    free = fit_fusion(examples, kb, SOURCES, depth=3, l2=1e-6)
    held = fit_fusion(examples, kb, SOURCES, depth=3, l2=1e-6, anchor=toward)
    assert abs(free.fit["loss"] - held.fit["loss"]) < 1e-2
    assert free.fit["recall"]["fusion"] == held.fit["recall"]["fusion"]


def test_the_cascade_anchors_its_early_step_to_the_anchors_early_step(tmp_path):
    kb, examples = examples_of(tmp_path)
    anchor = anchor_model()
    model = fit_fusion(examples, kb, SOURCES, depth=3)
    targets = CascadeTargets(0.9, 0.5, min_mentions=5)
    fitted = fit_cascade(model, examples, kb, targets, l2=1e4, defer=["dense"], anchor=anchor)
    early = fitted.cascade["early"]["weights"]
    moving = [f for f in varying(without_lists(examples, ["genbioel", "dense"]), kb, model.features)]
    assert moving and all(abs(early[f] + 0.5) < 1e-2 for f in moving if f.startswith("tfidf")), early
    settle = fitted.cascade["settle_weights"]
    toward = dict(zip(anchor.features, anchor.weights))
    moving = [f for f in varying(without_lists(examples, ["genbioel"]), kb, model.features)]
    assert moving and all(abs(settle[f] - toward[f]) < 1e-2 * max(1.0, abs(toward[f])) for f in moving), settle


def test_fit_fusion_anchor_option(tmp_path):
    kb, gen, ret, dense = three_sources()
    kb.to_jsonl(tmp_path / "kb.jsonl")
    anchor_model().save(tmp_path / "anchor.json")
    args = ["fit-fusion", "--kb", str(tmp_path / "kb.jsonl"), "--depth", "3", "--cascade", "--defer", "dense"]
    for name, recs in (("genbioel", gen), ("tfidf", ret), ("dense", dense)):
        args += ["--source", f"{name}={write_jsonl(tmp_path / f'{name}.jsonl', recs)}"]
    result = CliRunner().invoke(
        app, [*args, "--out", str(tmp_path / "f.json"), "--anchor", str(tmp_path / "anchor.json"), "--l2", "10"]
    )
    assert result.exit_code == 0, result.output
    fit = json.loads((tmp_path / "f.json").read_text())["fit"]
    assert fit["anchor"] == str(tmp_path / "anchor.json") and fit["l2"] == 10.0
    shipped = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "s.json"), "--anchor", "genbioel:retrieval"])
    assert shipped.exit_code == 0, shipped.output
    missing = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "m.json"), "--anchor", str(tmp_path / "no.json")])
    assert missing.exit_code != 0 and "no.json" in missing.output
