"""Quiet by default, traps closed (issue 30 items 3 and 4): no third-party bars or warnings
on a load, link or save; files another user can read; the demo leaves no untrained model
behind; its spinner asks :func:`~spacy_genbioel.progress.wanted` like every bar."""

import logging
import os
import stat
import warnings
from pathlib import Path

import pytest
import spacy
from conftest import random_kb
from transformers.utils import logging as hf_logging
from typer.testing import CliRunner

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.models import save_model
from spacy_genbioel.models.hf import quiet_transformers
from spacy_genbioel.util import atomic_write, share_files


@pytest.fixture()
def hf_bars_on():
    """transformers' bars enabled, as in a user's fresh process (another test may have turned them off)."""
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    yield
    (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


@pytest.fixture()
def umask():
    """Set the process umask for a test and put the old one back."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_load_link_and_save_draw_no_bars_and_warn_nothing(tmp_path, micro_model, word_tokenizer, capfd, hf_bars_on):
    random_kb(1, n_concepts=20).to_jsonl(tmp_path / "kb.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_model(micro_model, word_tokenizer, tmp_path / "model")
        nlp = spacy.blank("en")
        nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": "renal failure"}])
        nlp.add_pipe(
            "genbioel", config={"model": str(tmp_path / "model"), "kb": str(tmp_path / "kb.jsonl"), "device": "cpu"}
        )
        assert nlp("The patient had renal failure .").ents[0]._.kb_id
        nlp.to_disk(tmp_path / "nlp")
        assert spacy.load(tmp_path / "nlp")("renal failure again").ents[0]._.kb_id
    assert [str(w.message) for w in caught] == []
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "Writing model shards" not in err and err == ""
    assert hf_logging.is_progress_bar_enabled()  # put back as it was


def test_quiet_transformers_keeps_the_bars_under_verbose_logging(hf_bars_on, caplog):
    with quiet_transformers():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
    with caplog.at_level(logging.INFO, logger="spacy_genbioel"), quiet_transformers():
        assert hf_logging.is_progress_bar_enabled()  # --verbose: transformers speaks too


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_saved_models_are_readable_as_the_umask_allows(tmp_path, micro_model, word_tokenizer, umask, mask, expected):
    umask(mask)
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    files = sorted(p for p in (tmp_path / "model").iterdir() if p.is_file())
    assert (tmp_path / "model" / "model.safetensors") in files
    assert {p.name: mode(p) for p in files} == {p.name: expected for p in files}


def test_share_files_and_atomic_write_honour_the_umask(tmp_path, umask):
    umask(0o022)
    private = tmp_path / "private.bin"
    private.write_bytes(b"x")
    os.chmod(private, 0o600)
    executable = tmp_path / "run.sh"
    executable.write_text("echo")
    os.chmod(executable, 0o755)
    share_files([tmp_path])
    assert mode(private) == 0o644 and mode(executable) == 0o755  # nothing is taken away
    atomic_write(tmp_path / "out.bin", lambda p: (p.write_bytes(b"y"), os.chmod(p, 0o600)))
    assert mode(tmp_path / "out.bin") == 0o644


def test_the_demo_leaves_no_untrained_model_beside_its_pipeline(tmp_path, monkeypatch):
    from spacy_genbioel.workflows import demo

    monkeypatch.setattr(
        demo, "train_seq2seq", lambda model, tokenizer, examples, config, **kw: [0.0]
    )  # no training here
    out = tmp_path / "demo_pipeline"
    assert demo.build_demo_pipeline(out, train_seconds=0) == (out, 1)
    assert sorted(tmp_path.iterdir()) == [out]  # once demo_pipeline_model/ was left here
    assert (out / "genbioel" / "model" / "model.safetensors").exists()


@pytest.mark.parametrize(
    "env, spins", [("0", False), ("1", True), (None, False)]
)  # None: CliRunner's stderr is no terminal
def test_the_demo_spinner_asks_whether_bars_are_wanted(monkeypatch, tmp_path, env, spins):
    from spacy_genbioel.cli import app
    from spacy_genbioel.cli import demo as demo_cli
    from spacy_genbioel.workflows import demo

    spun = []

    class Spinner:
        def __enter__(self):
            spun.append(True)

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(demo_cli.msg, "loading", lambda text: Spinner())
    monkeypatch.setattr(demo, "run_demo", lambda out, **kw: demo.DemoResult(out, [], 1.0, 0, 0.0, 0))
    if env is None:
        monkeypatch.delenv("GENBIOEL_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("GENBIOEL_PROGRESS", env)
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert bool(spun) is spins


def test_the_demo_writes_a_nested_out_folder(tmp_path, monkeypatch):
    from spacy_genbioel.workflows import demo

    monkeypatch.setattr(
        demo, "train_seq2seq", lambda model, tokenizer, examples, config, **kw: [0.0]
    )  # no training here
    out = tmp_path / "training" / "demo" / "pipeline"  # the project's demo-pipeline step writes here
    assert demo.build_demo_pipeline(out, train_seconds=0) == (out, 1)
    assert (out / "genbioel" / "cfg.json").exists()


def test_the_demo_trains_a_number_of_steps_whatever_the_machine_is_doing(tmp_path, monkeypatch):
    """A CPU-time budget trained 233 steps instead of 406 on a busy machine (OpenMP threads spinning for a
    core), and the demo linked 0.61 instead of 0.94: steps decide, seconds only cap."""
    from spacy_genbioel.cli import app
    from spacy_genbioel.workflows import demo

    configs = []
    monkeypatch.setattr(
        demo, "train_seq2seq", lambda model, tokenizer, examples, config, **kw: configs.append((config, kw)) or [0.0]
    )
    demo.build_demo_pipeline(tmp_path / "a")
    config, kw = configs[-1]
    assert kw["stop_after"] == demo.DEMO_STEPS == 400 and config.budget_clock == "cpu"
    assert config.max_steps >= 100_000  # the schedule: flat after the warm-up, as the demo always trained
    assert config.max_seconds >= demo.DEMO_SECONDS  # the cap: CPU seconds of every thread
    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda out, **kw: seen.update(kw) or demo.DemoResult(out, [], 1.0, 0, 0.0, 0))
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "d"), "--train-steps", "50"])
    assert result.exit_code == 0, result.output
    assert seen["train_steps"] == 50 and seen["train_seconds"] == demo.DEMO_SECONDS
