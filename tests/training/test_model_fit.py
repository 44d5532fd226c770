"""``fit-fusion --model``: a model not trained here scored on a labelled split, the fusion and the cascade fitted
on its own predictions, and the pipeline packaged with that fusion linking through the cascade."""

import json
import random

import pytest
import spacy
from conftest import WORDS, random_kb
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.linking.reranking.cascade import CascadeReranker
from spacy_genbioel.linking.reranking.fusion import FusionModel
from spacy_genbioel.models import save_model
from spacy_genbioel.training.model_fit import FitOptions, HeldOutSplit, ModelFitError, fit_model_fusion
from spacy_genbioel.training.package import EntitySource, package
from spacy_genbioel.ty import Mention

runner = CliRunner()
#: gold mentions are linked: no entity ruler, no abbreviation detector
QUIET = EntitySource(entity_ruler=False, abbreviations=False)


def write_corpus(path, kb, n_docs=12, seed=0):
    """A PubTator corpus whose mentions are KB names (some with a word swapped or added), gold their concept; one
    mention in four is labelled Chemical, the others Disease."""
    rng = random.Random(seed)
    lines = []
    for d in range(n_docs):
        title, mentions, text = f"Case {d} .", [], f"Case {d} ."
        for k in range(4):
            cid = rng.choice(kb.concept_ids)
            name = rng.choice(kb.names_of(cid))
            if rng.random() < 0.3:
                words = name.split()
                name = " ".join(words[:-1] + [rng.choice(WORDS)]) if len(words) > 1 else f"{name} {rng.choice(WORDS)}"
            text += " The patient had "
            start = len(text)
            text += name
            label = "Chemical" if k == 3 else "Disease"
            mentions.append(f"{1000 + d}\t{start}\t{start + len(name)}\t{name}\t{label}\t{cid}")
            text += " ."
        abstract = text[len(title) + 1 :]
        lines += [f"{1000 + d}|t|{title}", f"{1000 + d}|a|{abstract}", *mentions, ""]
    path.write_text("\n".join(lines) + "\n", encoding="utf8")
    return path


@pytest.fixture()
def released(tmp_path, micro_model, word_tokenizer):
    """A model folder (as import-checkpoint writes one), its KB and a labelled split it was not trained on."""
    kb = random_kb(3, n_concepts=40)
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    kb.to_jsonl(tmp_path / "kb.jsonl")
    return tmp_path / "model", tmp_path / "kb.jsonl", write_corpus(tmp_path / "heldout.txt", kb)


def fit_args(model, corpus, out, *words):
    return [
        "fit-fusion",
        "--model",
        str(model),
        "--corpus",
        str(corpus),
        "--retrievers",
        "tfidf",
        "--out",
        str(out),
        *words,
    ]


def test_the_command_fits_fusion_and_cascade_on_the_models_own_predictions(tmp_path, released):
    model, kb, corpus = released
    out, work = tmp_path / "fusion.json", tmp_path / "work"
    result = runner.invoke(
        app,
        fit_args(
            model,
            corpus,
            out,
            "--kb",
            str(kb),
            "--generator",
            "forced",
            "--cascade",
            "--target-precision",
            "0.9",
            "--predictions",
            str(work),
        ),
    )
    assert result.exit_code == 0, result.output
    fusion = FusionModel.load(out)
    assert fusion.sources == ["genbioel", "tfidf"] and fusion.generator == "forced"
    assert {"settle_weights", "settle_threshold", "beam_threshold"} <= set(fusion.cascade)
    assert fusion.cascade["report"]["mentions"] == fusion.fit["mentions"] == 48
    assert fusion.fit["scored"]["corpus"] == str(corpus) and fusion.fit["scored"]["generator"] == "forced"
    assert "cascade:" in result.output
    # the generator's rows were forced scores of tfidf's top candidates: every name it scored is one tfidf listed
    files = {
        "genbioel": work / "predictions" / "genbioel_forced_tfidf_5.jsonl",
        "tfidf": work / "predictions" / "tfidf.jsonl",
    }
    rows = {source: path.read_text(encoding="utf8").splitlines() for source, path in files.items()}
    assert len(rows["genbioel"]) == len(rows["tfidf"]) == 48
    for generated, retrieved in zip(rows["genbioel"], rows["tfidf"]):
        names = [{c[1] for c in json.loads(line)["candidates"]} for line in (generated, retrieved)]
        assert names[0] and names[0] <= names[1]
    # a rerun reuses the predictions scored already (the pipeline is not needed again)
    files["genbioel"].write_text("\n".join(rows["genbioel"][:10]) + "\n", encoding="utf8")
    again = ["--kb", str(kb), "--predictions", str(work)]
    result = runner.invoke(app, fit_args(model, corpus, out, *again, "--generator", "forced"))
    assert result.exit_code == 0, result.output
    assert FusionModel.load(out).fit["mentions"] == 10 and not FusionModel.load(out).cascade
    # beam lists are another row: scored, not taken from the forced one
    result = runner.invoke(app, fit_args(model, corpus, out, *again, "--generator-beams", "2"))
    assert result.exit_code == 0, result.output
    assert FusionModel.load(out).fit["mentions"] == 48 and FusionModel.load(out).generator == "beam"
    assert (work / "predictions" / "genbioel_beam2.jsonl").is_file()


@pytest.mark.parametrize(
    "words, message",
    [
        (["--source", "genbioel=a.jsonl"], "not both"),
        ([], "--corpus"),
        (["--corpus", "x.txt", "--alternative", "tfidf"], "--alternative"),
        (["--corpus", "x.txt", "--defer", "tfidf"], "--cascade"),
        (["--corpus", "x.txt", "--retrievers", "nope"], "not a retriever"),
    ],
)
def test_the_model_mode_refuses_what_it_cannot_do(tmp_path, words, message):
    result = runner.invoke(app, ["fit-fusion", "--model", str(tmp_path), "--out", str(tmp_path / "f.json"), *words])
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "f.json").exists()


def test_neither_source_nor_model_is_refused(tmp_path):
    result = runner.invoke(app, ["fit-fusion", "--kb", "kb.jsonl", "--out", str(tmp_path / "f.json")])
    assert result.exit_code == 2 and "--source" in result.output and "--model" in result.output


def test_the_packaged_pipeline_links_through_the_cascade_with_that_fusion(tmp_path, released):
    model, kb, corpus = released
    fitted = fit_model_fusion(
        model, HeldOutSplit(corpus), kb=kb, retrievers=["tfidf"], options=FitOptions(generator="forced", cascade=True)
    )
    c = fitted.model.cascade
    assert c["settle_threshold"] is not None and c["report"]["settled_share"] > 0  # tfidf is sure of exact KB names
    fitted.model.save(tmp_path / "fusion.json")
    # as `package --model DIR --kb KB --fusion FILE --reranker.cascade on`
    settings = {"reranker.fusion": str(tmp_path / "fusion.json"), "reranker.cascade": "on", "device": "cpu"}
    package(model, kb, tmp_path / "pipeline", settings=settings, entities=QUIET)
    nlp = spacy.load(tmp_path / "pipeline")
    component = nlp.get_pipe("genbioel")
    assert isinstance(component.reranker, CascadeReranker)
    names = random_kb(3, n_concepts=40).names[:30] + ["renal acute cancer syndrome", "lung liver pain"]
    results, paths = component.link_paths([Mention(n, left="the patient had ", right=" .") for n in names])
    assert "retrieval" in paths and "forced" in paths and all(results)


def test_a_pipeline_is_scored_as_it_is_over_its_own_kb(tmp_path, released):
    model, kb, corpus = released
    package(model, kb, tmp_path / "plain", settings={"device": "cpu"}, entities=QUIET)
    fitted = fit_model_fusion(tmp_path / "plain", HeldOutSplit(corpus, labels=("Disease",)), retrievers=["tfidf"])
    assert fitted.model.fit["mentions"] == 36 and fitted.model.fit["scored"]["kb"].endswith("kb.jsonl")
    random_kb(4, n_concepts=40).to_jsonl(tmp_path / "other.jsonl")
    with pytest.raises(ModelFitError, match="not the KB the pipeline"):
        fit_model_fusion(tmp_path / "plain", HeldOutSplit(corpus), kb=tmp_path / "other.jsonl", retrievers=["tfidf"])
    fitted.model.save(tmp_path / "fusion.json")
    package(
        model,
        kb,
        tmp_path / "fused",
        settings={"device": "cpu", "reranker.fusion": str(tmp_path / "fusion.json")},
        entities=QUIET,
    )
    with pytest.raises(ModelFitError, match="its own fusion"):
        fit_model_fusion(tmp_path / "fused", HeldOutSplit(corpus), retrievers=["tfidf"])
    with pytest.raises(ModelFitError, match="needs the KB"):
        fit_model_fusion(model, HeldOutSplit(corpus), retrievers=["tfidf"])
