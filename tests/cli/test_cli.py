import json

import pytest
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.models import load_model

runner = CliRunner()


def test_init_model_command(tmp_path, small_kb):
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    (tmp_path / "texts.txt").write_text("renal failure was seen in the patients\n" * 20)
    result = runner.invoke(
        app,
        [
            "init-model",
            "--preset",
            "tiny",
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--out",
            str(tmp_path / "m"),
            "--texts",
            str(tmp_path / "texts.txt"),
            "--vocab-size",
            "300",
        ],
    )
    assert result.exit_code == 0, result.output
    model, tokenizer = load_model(tmp_path / "m")
    assert model.config.d_model == 256 and len(tokenizer) <= 300


def test_init_model_rejects_unknown_preset(tmp_path, small_kb):
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    result = runner.invoke(
        app, ["init-model", "--preset", "huge", "--kb", str(tmp_path / "kb.jsonl"), "--out", str(tmp_path / "m")]
    )
    assert result.exit_code != 0
    assert "huge" in str(result.exception)


def test_benchmark_command_json(tmp_path, micro_model, word_tokenizer, monkeypatch):
    from conftest import random_kb

    from spacy_genbioel.workflows import benchmark

    micro_model.save_pretrained(tmp_path / "m")
    word_tokenizer.save_pretrained(tmp_path / "m")
    monkeypatch.setattr(benchmark, "benchmark_kb", lambda data_dir: (random_kb(3), "random"))
    monkeypatch.setattr(benchmark, "default_data_dir", lambda: None)
    result = runner.invoke(
        app,
        [
            "benchmark",
            "--model",
            str(tmp_path / "m"),
            "--n-mentions",
            "12",
            "--num-beams",
            "3",
            "--batch-size",
            "4",
            "--skip-mesh",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output.strip().splitlines()[-1])
    assert figures["mentions"] == 12 and [r["context_words"] for r in figures["runs"]] == [0, 16, 64]
    for run in figures["runs"]:
        assert run["top1_agreement"] == 1.0
        assert run["batched_mentions_per_s"] > 0 and run["reference_mentions_per_s"] > 0


def test_build_kb_command_with_augmentation(tmp_path):
    (tmp_path / "medic.txt").write_text("D001||Reiter Syndrome|Reactive Arthritis\nD002|613097||Tumor|Neoplasm\n")
    (tmp_path / "train.txt").write_text("1|t|ReA was seen.\n1|a|\n1\t0\t3\tReA\tDisease\tD001\n\n")
    result = runner.invoke(
        app,
        [
            "build-kb",
            "-f",
            "medic",
            str(tmp_path / "medic.txt"),
            "--out",
            str(tmp_path / "kb.jsonl"),
            "--no-dedup",
            "--augment-pubtator",
            str(tmp_path / "train.txt"),
        ],
    )
    assert result.exit_code == 0, result.output
    from spacy_genbioel.kb.base import KnowledgeBase

    kb = KnowledgeBase.load(tmp_path / "kb.jsonl")
    assert kb.ids_for_name("rea") == ("D001",)
    assert kb.ids_for_name("tumor") == ("D002", "613097")
    bad = runner.invoke(
        app, ["build-kb", "-f", "nope", str(tmp_path / "medic.txt"), "--out", str(tmp_path / "x.jsonl")]
    )
    assert bad.exit_code != 0
    one = runner.invoke(
        app,
        [
            "build-kb",
            "-f",
            "jsonl",
            str(tmp_path / "kb.jsonl"),
            "--out",
            str(tmp_path / "one.jsonl"),
            "--no-dedup",
            "--first-names-only",
        ],
    )
    assert one.exit_code == 0, one.output
    one_kb = KnowledgeBase.load(tmp_path / "one.jsonl")
    assert one_kb.names_of("D001") == ["reiter syndrome"] and len(one_kb) == len(kb)
    assert (
        one_kb.ids_for_name("tumor") == ("D002", "613097") and one_kb.n_names == 2
    )  # a shared first name stays shared


def test_evaluate_command_with_a_peer(tmp_path):
    from spacy_genbioel.kb.base import Concept, KnowledgeBase

    KnowledgeBase([Concept("D1", ["renal failure"]), Concept("D2", ["cystic fibrosis"])]).to_jsonl(
        tmp_path / "kb.jsonl"
    )
    text = "Renal failure and cystic fibrosis."
    (tmp_path / "dev.txt").write_text(
        f"1|t|{text}\n1|a|\n1\t0\t13\tRenal failure\tDisease\tD1\n1\t18\t33\tcystic fibrosis\tDisease\tD2|D9\n\n"
    )
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--corpus",
            str(tmp_path / "dev.txt"),
            "--linker",
            "exact",
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--train",
            str(tmp_path / "dev.txt"),
            "--json",
            str(tmp_path / "r.json"),
            "--plots",
            str(tmp_path / "plots"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["recall"]["recall"]["recall@1"] == 1.0
    assert (tmp_path / "plots" / "similarity_bins_exact.png").exists()
    missing = runner.invoke(app, ["evaluate", "--corpus", str(tmp_path / "dev.txt"), "--linker", "genbioel"])
    assert missing.exit_code != 0


def test_evaluate_names_a_bad_kb_or_corpus_without_a_traceback(tmp_path):
    corpus = tmp_path / "dev.txt"
    corpus.write_text("1|t|Renal failure.\n1\t0\t13\tRenal failure\tDisease\tD1\n\n", encoding="utf8")
    bad_kb = tmp_path / "kb.jsonl"
    bad_kb.write_bytes(b'{"id": "D1", "names": ["renal failure"]}\n\xff\xfe\n')
    result = runner.invoke(app, ["evaluate", "--corpus", str(corpus), "--linker", "tfidf", "--kb", str(bad_kb)])
    assert result.exit_code == 1
    assert "kb.jsonl:2" in result.output
    bad_corpus = tmp_path / "bad.txt"
    bad_corpus.write_text("1|t|Renal failure.\n1\tabc\t13\tRenal failure\tDisease\tD1\n\n", encoding="utf8")
    result = runner.invoke(app, ["evaluate", "--corpus", str(bad_corpus), "--linker", "exact", "--kb", str(bad_kb)])
    assert result.exit_code == 1 and "bad.txt:2" in result.output


def test_dotted_overrides_keep_their_values_exactly():
    import click

    from spacy_genbioel.cli._util import parse_overrides

    parsed = parse_overrides(
        [
            "--candidates.shortcut_threshold",
            "0.95",
            "--decoding.exact_match",
            "--output.threshold=null",
            "--candidates.retriever",
            "tfidf",
            "--training.learning-rate",
            "1e-4",
        ]
    )
    assert parsed == {
        "candidates.shortcut_threshold": 0.95,
        "decoding.exact_match": True,
        "output.threshold": None,
        "candidates.retriever": "tfidf",
        "training.learning_rate": 1e-4,
    }
    with pytest.raises(click.NoSuchOption, match="--beams"):
        parse_overrides(["--beams", "3"])
