"""``--reranker.fusion none`` switches a saved pipeline's own fusion off, so ``evaluate`` measures the
generator alone; ``null`` on the command line means the same, and leaving the setting out keeps the
pipeline's fusion."""

import json

import pytest
import spacy
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.linking.reranking.fusion import FusionModel
from spacy_genbioel.linking.reranking.settings import NO_FUSION

runner = CliRunner()


@pytest.fixture()
def fused_pipeline(tmp_path, micro_model, word_tokenizer):
    """A micro pipeline packaged with its own fusion.json (the configured file then removed), and a corpus."""
    from conftest import random_kb

    from spacy_genbioel.models import save_model
    from spacy_genbioel.training.package import EntitySource, package

    kb = random_kb(1, n_concepts=30)
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    kb.to_jsonl(tmp_path / "kb.jsonl")
    FusionModel(
        ["genbioel", "tfidf"], [0.5, 0.25, 1.0, 0.75, 0.5, 2.0, 1.5, 1.0, 3.0, 0.25], depth=3, retrievers={"tfidf": {}}
    ).save(tmp_path / "fusion.json")
    out = package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg",
        entities=EntitySource(entity_label="Disease", abbreviations=False),
        settings={"decoding.num_beams": 3, "decoding.top_k": 3, "reranker.fusion": str(tmp_path / "fusion.json")},
    )
    (tmp_path / "fusion.json").unlink()  # the pipeline's own copy is what links
    lines = []
    for doc, concept in enumerate(list(kb)[:4]):
        name = concept.names[0]
        lines += [f"{doc}|t|{name} was seen.", f"{doc}|a|", f"{doc}\t0\t{len(name)}\t{name}\tDisease\t{concept.id}", ""]
    (tmp_path / "dev.txt").write_text("\n".join(lines) + "\n")
    return out, tmp_path


def _evaluate(pipeline, tmp_path, *overrides):
    predictions = tmp_path / "predictions.jsonl"
    args = ["evaluate", "--corpus", str(tmp_path / "dev.txt"), "--pipeline", str(pipeline), "--device", "cpu"]
    result = runner.invoke(app, [*args, "--predictions", str(predictions), *overrides])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in predictions.read_text().splitlines()]
    return [score for row in rows for *_, score in row["candidates"]]


def test_evaluate_with_fusion_none_links_with_the_generator_alone(fused_pipeline):
    pipeline, tmp_path = fused_pipeline
    fused = _evaluate(pipeline, tmp_path)
    assert fused and all(0.0 <= s <= 1.0 for s in fused)  # fused probabilities
    for value in (NO_FUSION, "null"):
        alone = _evaluate(pipeline, tmp_path, "--reranker.cascade", "off", "--reranker.fusion", value)
        assert alone and all(s <= 0.0 for s in alone) and alone != fused  # the generator's mean log-probabilities
    nlp = spacy.load(pipeline, config={"components": {"genbioel": {"reranker": {"fusion": NO_FUSION}}}})
    assert nlp.get_pipe("genbioel").fusion is None and nlp.get_pipe("genbioel").reranker is None


def test_evaluate_reads_numbers_as_numbers_and_refuses_nan_naming_the_setting(fused_pipeline):
    pipeline, tmp_path = fused_pipeline
    assert _evaluate(pipeline, tmp_path, "--output.threshold", ".5", "--decoding.length_penalty", "+1")
    args = ["evaluate", "--corpus", str(tmp_path / "dev.txt"), "--pipeline", str(pipeline), "--device", "cpu"]
    for setting, value in (("reranker.settle_threshold", "nan"), ("decoding.length_penalty", "inf")):
        result = runner.invoke(app, [*args, f"--{setting}", value])
        said = result.output + str(result.exception)
        assert result.exit_code != 0 and f"{setting} must be a finite number" in said and repr(value) in said
