"""Every command-line error is one line without a traceback (issue 30 item 4): a mistyped
``evaluate --linker``, and any library error (a bad file, a bad setting, a missing extra)
that reaches the ``app`` (:class:`~spacy_genbioel.cli._util.CommandLine`); ``--verbose``
keeps the traceback. The paths each command checks itself: test_cli_path_errors.py."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.cli._util import CommandLine, one_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "dev.txt"
    path.write_text("1|t|Gout\n1|a|Gout again.\n1\t0\t4\tGout\tDisease\tD006073\n\n", encoding="utf8")
    return path


def test_a_mistyped_linker_is_one_line_naming_the_known_ones(tmp_path, corpus):
    result = CliRunner().invoke(
        app, ["evaluate", "--corpus", str(corpus), "--linker", "tfdif", "--kb", str(tmp_path / "kb.jsonl")]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--linker: Unknown linker 'tfdif'" in lines[0] and "tfidf" in lines[0]


def test_a_mistyped_linker_from_the_real_command_line(tmp_path, corpus):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spacy_genbioel",
            "evaluate",
            "--corpus",
            str(corpus),
            "--linker",
            "tfdif",
            "--kb",
            str(tmp_path / "kb.jsonl"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert [line for line in (done.stdout + done.stderr).splitlines() if line.strip()] == [
        line for line in done.stderr.splitlines() if "Unknown linker 'tfdif'" in line
    ]


def _boom_app():
    cli = CommandLine()

    @cli.command()
    def boom(kind: str) -> None:
        raise {
            "value": ValueError("kb.jsonl:3: bad\n  record"),
            "file": FileNotFoundError("model/config.json not found"),
            "import": ImportError("annotate --engine ray needs ray (pip install 'spacy_genbioel[ray]')"),
            "bug": TypeError("a bug"),
        }[kind]

    @cli.command()
    def other() -> None:
        """A second command, so that ``boom`` is a subcommand."""

    return cli


@pytest.mark.parametrize(
    "kind, line",
    [
        ("value", "kb.jsonl:3: bad record"),
        ("file", "model/config.json not found"),
        ("import", "annotate --engine ray needs ray (pip install 'spacy_genbioel[ray]')"),
    ],
)
def test_library_errors_end_a_command_in_one_line(kind, line, capsys):
    with pytest.raises(SystemExit) as stop:
        _boom_app()(["boom", kind])
    assert stop.value.code == 1
    assert capsys.readouterr().err == f"\u2718 {line}\n"


def test_verbose_keeps_the_traceback_and_bugs_are_not_hidden(caplog):
    with caplog.at_level(logging.INFO, logger="spacy_genbioel"), pytest.raises(ValueError, match="bad"):
        _boom_app()(["boom", "value"])
    with pytest.raises(TypeError, match="a bug"):
        _boom_app()(["boom", "bug"])


def test_one_line_joins_and_cuts():
    assert (
        one_line(ValueError("Config error\n\n  genbioel -> threshold\tunexpected"))
        == "Config error genbioel -> threshold\tunexpected"
    )
    assert one_line(ValueError("")) == "ValueError" and one_line("x" * 1000).endswith("...")
