"""The released path's defaults: `package` applies the input style a model records it was trained
on (unless told otherwise), `evaluate --skip-missing` scores nothing without its corpus, and so
the `released` workflow runs to its end without a test split."""

import json
import logging
from collections import OrderedDict

import pytest
import torch
from spacy.util import load_config
from test_released_workflow import _project, _run
from test_training import _pubtator
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.models import save_model
from spacy_genbioel.training.package import EntitySource, package

runner = CliRunner()


@pytest.fixture()
def recorded(tmp_path, micro_model, word_tokenizer, small_kb):
    """A model folder whose config records the released NCBI style (as `import-checkpoint` writes it), and a KB."""
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    config_file = tmp_path / "model" / "config.json"
    config_file.write_text(
        json.dumps({**json.loads(config_file.read_text()), "genbioel_inputs": "genbioel-released-ncbi.v1"})
    )
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    return tmp_path


def _packaged(folder, name, **settings):
    out = package(
        folder / "model",
        folder / "kb.jsonl",
        folder / name,
        settings={"num_beams": 2, "top_k": 2, **settings},
        entities=EntitySource(abbreviations=False),
    )
    component = load_config(out / "config.cfg")["components"]["genbioel"]
    return component["inputs"]["style"], component["decoding"]["max_source_tokens"]


def test_package_applies_the_recorded_style_unless_overridden(recorded, micro_model, caplog):
    with caplog.at_level(logging.INFO, logger="spacy_genbioel"):
        # its whole input: 1024 tokens at most, the micro model's 128 positions here
        assert _packaged(recorded, "pkg") == ("genbioel-released-ncbi.v1", micro_model.config.max_position_embeddings)
    assert (
        f"inputs.style genbioel-released-ncbi.v1: recorded by the model in {recorded / 'model'} "
        "(override with --inputs.style)"
    ) in caplog.text
    assert _packaged(recorded, "own_max", **{"decoding.max_source_tokens": 64}) == ("genbioel-released-ncbi.v1", 64)
    assert _packaged(recorded, "dotted", **{"inputs.style": "genbioel.v1"}) == ("genbioel.v1", 256)
    assert _packaged(recorded, "bare", style="genbioel-released-bc5cdr.v1") == ("genbioel-released-bc5cdr.v1", 256)


def test_package_keeps_the_default_style_for_a_model_that_records_none(tmp_path, micro_model, word_tokenizer, small_kb):
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    assert _packaged(tmp_path, "pkg") == ("genbioel.v1", 256)


def test_evaluate_skips_a_missing_corpus_only_when_asked(tmp_path, small_kb):
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    args = [
        "evaluate",
        "--corpus",
        str(tmp_path / "test.txt"),
        "--linker",
        "tfidf",
        "--kb",
        str(tmp_path / "kb.jsonl"),
        "--json",
        str(tmp_path / "report.json"),
    ]
    skipped = runner.invoke(app, [*args, "--skip-missing"])
    assert skipped.exit_code == 0, skipped.output
    said = " ".join(skipped.output.split())  # wasabi wraps its lines
    assert (
        f"No corpus at {tmp_path / 'test.txt'}: nothing scored" in said
        and f"{tmp_path / 'report.json'} not written" in said
    )
    assert not (tmp_path / "report.json").exists()
    failed = runner.invoke(app, args)
    assert failed.exit_code != 0 and not (tmp_path / "report.json").exists()


def test_released_workflow_runs_to_its_end_without_a_test_split(tmp_path, micro_model, word_tokenizer):
    kb = KnowledgeBase(
        [
            Concept("D1", ["renal failure", "kidney failure"]),
            Concept("D2", ["breast cancer"]),
            Concept("D3", ["cystic fibrosis"]),
        ]
    )
    data = tmp_path / "data"
    (data / "vocab").mkdir(parents=True)
    kb.to_jsonl(data / "vocab" / "kb.jsonl")
    for split, seed, n in (("train", 0, 6), ("dev", 1, 3)):
        _pubtator(data / f"{split}.txt", kb, seed, n)
    released = tmp_path / "released"
    (released / "ANGEL_ncbi").mkdir(parents=True)
    micro_model.config.to_json_file(released / "ANGEL_ncbi" / "config.json")
    torch.save(OrderedDict(micro_model.state_dict()), released / "ANGEL_ncbi" / "pytorch_model.bin")
    word_tokenizer.save_pretrained(released / "bart-large")
    project = _project(tmp_path)
    done = _run(
        project,
        "released",
        {
            "data_dir": data,
            "train": "train.txt",
            "dev": "dev.txt",
            "test": "test.txt",
            "kb_sources": data / "vocab" / "kb.jsonl",
            "kb_format": "jsonl",
            "released_dir": released,
            "abbreviations": "no-abbreviations",
            "device": "cpu",
        },
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # packaged with the style the import recorded (no --inputs.style in the step), then nothing scored
    config = load_config(project / "packages" / "ncbi_released" / "config.cfg")
    assert config["components"]["genbioel"]["inputs"]["style"] == "genbioel-released-ncbi.v1"
    assert (
        " ".join(done.stdout.split()).count(f"No corpus at {data / 'test.txt'}") == 3
    )  # released-evaluate, test-peers' two
    assert not (project / "metrics").exists() or not any((project / "metrics").iterdir())


def test_add_pipe_feeds_a_model_its_recorded_style_unless_told_otherwise(recorded, micro_model, caplog):
    import spacy

    def component(**config):
        nlp = spacy.blank("en")
        linker = nlp.add_pipe(
            "genbioel", config={"model": str(recorded / "model"), "kb": str(recorded / "kb.jsonl"), **config}
        )
        linker.initialize()
        return linker

    with caplog.at_level(logging.INFO, logger="spacy_genbioel"):
        linker = component()
    assert linker.inputs.style == "genbioel-released-ncbi.v1"
    assert linker.decoding.max_source_tokens == micro_model.config.max_position_embeddings
    assert "feeds its model the inputs.style it records, genbioel-released-ncbi.v1" in caplog.text
    assert component(recorded_inputs=False).inputs.style == "genbioel.v1"
    assert component(inputs={"style": "genbioel-released-bc5cdr.v1"}).inputs.style == "genbioel-released-bc5cdr.v1"
    assert component(decoding={"max_source_tokens": 64}).decoding.max_source_tokens == 64


def test_a_package_told_the_default_style_keeps_it_when_loaded(recorded):
    import spacy

    out = package(
        recorded / "model",
        recorded / "kb.jsonl",
        recorded / "pkg",
        settings={"inputs.style": "genbioel.v1", "num_beams": 2, "top_k": 2},
        entities=EntitySource(abbreviations=False),
    )
    assert spacy.load(out).get_pipe("genbioel").inputs.style == "genbioel.v1"
    assert spacy.load(_packaged_path(recorded)).get_pipe("genbioel").inputs.style == "genbioel-released-ncbi.v1"


def _packaged_path(folder):
    return package(
        folder / "model",
        folder / "kb.jsonl",
        folder / "pkg_recorded",
        settings={"num_beams": 2, "top_k": 2},
        entities=EntitySource(abbreviations=False),
    )
