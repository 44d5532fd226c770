"""Commands given a missing, unwritable or malformed path end with one line naming it, not a
traceback (issue 31 item 10): ``evaluate`` with a missing pipeline, a device without CUDA,
a NaN, deeply nested or folder fusion file; ``visualize`` with an unwritable ``--out``;
``package`` with a missing model or ``--out`` a file; ``fit-fusion`` with an unknown source."""

import json

import pytest
import torch
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.linking.reranking.fusion import FusionModel, feature_names

runner = CliRunner()


def refused(args, *expected):
    """Run a command that must fail cleanly: exit status 1 or 2 (typer's usage error), no exception
    but the exit, and every ``expected`` text in its output (lines joined: the error box wraps them)."""
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code in (1, 2), result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    text = " ".join(result.output.replace("│", " ").split())
    for part in expected:
        assert " ".join(str(part).split()) in text, text
    return text


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "dev.txt"
    path.write_text("1|t|Renal failure.\n1\t0\t13\tRenal failure\tDisease\tD1\n\n", encoding="utf8")
    return path


@pytest.fixture()
def empty_pipeline(tmp_path):
    """A pipeline whose genbioel component has no model yet: loading it reads settings only."""
    import spacy

    import spacy_genbioel  # noqa: F401

    nlp = spacy.blank("en")
    nlp.add_pipe("genbioel", config={"device": "cpu"})
    nlp.to_disk(tmp_path / "nlp")
    return tmp_path / "nlp"


def fusion_file(path, text_edit=lambda t: t):
    sources = ["genbioel", "tfidf"]
    data = FusionModel(sources, [0.0] * len(feature_names(sources))).to_dict()
    path.write_text(text_edit(json.dumps(data)), encoding="utf8")
    return path


def test_evaluate_with_a_missing_pipeline(tmp_path, corpus):
    refused(["evaluate", "--corpus", corpus, "--pipeline", tmp_path / "nope"], "nope", "not a spaCy pipeline directory")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_evaluate_on_cuda_without_cuda(corpus, empty_pipeline):
    refused(["evaluate", "--corpus", corpus, "--pipeline", empty_pipeline, "--device", "cuda"], "no CUDA device")


@pytest.mark.parametrize(
    "edit, reason",
    [
        (lambda t: t.replace('"exact": 0.0', '"exact": NaN'), "NaN is not a finite number"),
        (lambda t: t.replace('"fit": {}', '"fit": ' + '{"a": ' * 5000 + "1" + "}" * 5000), "nested deeper than"),
        (lambda t: t.replace('"fit": {}', '"fit": ' + "[" * 100_000 + "]" * 100_000), "nested deeper than"),
        (lambda t: t.replace('"depth": 5', '"depth": 2.9'), "depth must be a whole number"),
        (lambda t: t.replace("tfidf", "bogus"), "unknown retriever source 'bogus'"),
    ],
)
def test_evaluate_with_a_malformed_fusion_file(tmp_path, corpus, empty_pipeline, edit, reason):
    path = fusion_file(tmp_path / "fusion.json", edit)
    refused(["evaluate", "--corpus", corpus, "--pipeline", empty_pipeline, "--fusion", path], str(path), reason)


def test_evaluate_with_a_fusion_folder(tmp_path, corpus, empty_pipeline):
    (tmp_path / "fusion.json").mkdir()
    refused(
        ["evaluate", "--corpus", corpus, "--pipeline", empty_pipeline, "--fusion", tmp_path / "fusion.json"],
        "fusion.json: a folder",
    )


def test_visualize_with_an_unwritable_out(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_folder").mkdir()
    base = ["visualize", "--pipeline", tmp_path / "nlp", "--text", "renal failure", "--out"]
    refused([*base, tmp_path / "a_file" / "page.html"], "page.html", "a_file is a file")
    refused([*base, tmp_path / "a_folder"], "a_folder: a folder")


def test_package_with_a_missing_model_or_out_a_file(tmp_path, small_kb):
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    (tmp_path / "out_file").write_text("x")
    (tmp_path / "model").mkdir()
    base = ["package", "--kb", tmp_path / "kb.jsonl", "--no-entity-ruler", "--no-abbreviations"]
    refused([*base, "--model", tmp_path / "missing", "--out", tmp_path / "out"], "missing: model directory not found")
    refused([*base, "--model", tmp_path / "model", "--out", tmp_path / "out_file"], "out_file: a file, not a folder")
    refused([*base, "--model", tmp_path / "model", "--out", tmp_path / "out_file" / "pkg"], "cannot make its folder")
    refused([*base, "--model", tmp_path / "model", "--out", tmp_path / "out"], "No Hugging Face model")


def test_package_with_a_nan_fusion_file(tmp_path, small_kb, micro_model, word_tokenizer):
    from spacy_genbioel.models import save_model

    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    nan = fusion_file(tmp_path / "nan.json", lambda t: t.replace('"exact": 0.0', '"exact": NaN'))
    refused(
        [
            "package",
            "--kb",
            tmp_path / "kb.jsonl",
            "--no-entity-ruler",
            "--no-abbreviations",
            "--model",
            tmp_path / "model",
            "--out",
            tmp_path / "out",
            "--fusion",
            nan,
        ],
        "nan.json: not a JSON fusion file (NaN is not a finite number)",
    )
    assert not (tmp_path / "out").exists()


def test_fit_fusion_with_an_unknown_source(tmp_path, small_kb):
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    refused(
        [
            "fit-fusion",
            "--source",
            f"genbioel={tmp_path / 'a.jsonl'}",
            "--source",
            f"bogus={tmp_path / 'b.jsonl'}",
            "--kb",
            tmp_path / "kb.jsonl",
            "--out",
            tmp_path / "fusion.json",
        ],
        "--source bogus",
        "not a retriever",
    )
