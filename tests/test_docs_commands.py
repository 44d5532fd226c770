"""What the README and docs/ tell a user to run exists (issue 30: the README named a
workflow, ``ncbi-fusion``, that did not): every ``spacy project run X`` is a workflow
or command of project.yml, every ``python -m spacy_genbioel CMD`` a command whose
``--options`` it has, every ``make X`` a Makefile target, every repository path
(``bench/…``, ``configs/…``, ``tests/…``, ``spacy_genbioel/…``, ``docs/…``) a file."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
CLI = re.compile(r"(?:python -m spacy_genbioel|spacy-genbioel)\s+([a-z][a-z0-9-]*)([^;`|)]*)")
# the command or workflow, and the project folder when one is given (default: the repository's)
PROJECT_RUN = re.compile(r"spacy project run ([A-Za-z0-9_-]+)(?:\s+([A-Za-z0-9_.][\w./-]*))?")
MAKE = re.compile(r"(?:^\s*|`)make ([a-z][a-z-]*)")
# a path, not a pattern such as configs/ner_<corpus>_cnn.cfg
PATH = re.compile(
    r"(?<![\w./-])((?:bench|configs|tests|spacy_genbioel|docs)/[A-Za-z0-9_./-]+[A-Za-z0-9_])(?![\w./<{*-])"
)
#: files the docs name as missing on purpose (docs/training.md: what build-kb stops on without the var file)
NAMED_AS_MISSING = {"configs/corpora/bc5cdr_crosswalk.tsv"}
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*(?:\.[a-z0-9_]+)*)")


def mentions(pattern):
    """(doc, line number, match) for every match of ``pattern`` in the docs."""
    for doc in DOCS:
        for number, line in enumerate(doc.read_text(encoding="utf8").splitlines(), 1):
            for match in pattern.finditer(line):
                yield doc.relative_to(ROOT), number, match


def cli_commands():
    import typer.main

    from spacy_genbioel.cli import app

    return typer.main.get_command(app).commands


def project_names(folder: str):
    path = ROOT / folder / "project.yml"
    if not path.exists():
        return set()
    project = yaml.safe_load(path.read_text(encoding="utf8"))
    return set(project.get("workflows", {})) | {command["name"] for command in project.get("commands", [])}


def test_every_project_run_names_a_workflow_or_command():
    missing = [
        f"{doc}:{n}: spacy project run {m.group(1)} {m.group(2) or '.'}"
        for doc, n, m in mentions(PROJECT_RUN)
        if m.group(1) not in project_names(m.group(2) or ".")
    ]
    assert not missing, "no such workflow or command in that project.yml:\n" + "\n".join(missing)


def test_every_cli_command_and_option_exists():
    commands = cli_commands()
    wrong = []
    for doc, n, match in mentions(CLI):
        name, rest = match.group(1), match.group(2)
        command = commands.get(name)
        if command is None:
            wrong.append(f"{doc}:{n}: no command {name!r}")
            continue
        options = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        takes_overrides = bool(command.context_settings.get("allow_extra_args"))
        for option in OPTION.findall(rest):
            if option in options or ("." in option and takes_overrides):
                continue
            wrong.append(f"{doc}:{n}: {name} has no option {option}")
    assert not wrong, "\n".join(wrong)


def test_every_make_target_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf8")
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.M))
    missing = [f"{doc}:{n}: make {m.group(1)}" for doc, n, m in mentions(MAKE) if m.group(1) not in targets]
    assert not missing, "no such Makefile target:\n" + "\n".join(missing)


def test_every_repository_path_exists():
    missing = [
        f"{doc}:{n}: {m.group(1)}"
        for doc, n, m in mentions(PATH)
        if m.group(1) not in NAMED_AS_MISSING and not (ROOT / m.group(1)).exists()
    ]
    assert not missing, "no such file:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    "line, found",
    [
        ("python -m spacy_genbioel evaluate --corpus D --linker tfidf", ("evaluate", ["--corpus", "--linker"])),
        ("`python -m spacy_genbioel folds T --k 2; python -m spacy_genbioel fit-fusion --out F`", ("folds", ["--k"])),
    ],
)
def test_the_cli_pattern_reads_a_command_and_its_options(line, found):
    match = CLI.search(line)
    assert (match.group(1), OPTION.findall(match.group(2))) == found


@pytest.mark.parametrize(
    "line, found",
    [
        ("spacy project run all      # NCBI", ("all", None)),
        ("`spacy project run evaluate . --vars.corpus x`", ("evaluate", ".")),
        ("python -m spacy project run kb-hpo configs/kbs   # also", ("kb-hpo", "configs/kbs")),
    ],
)
def test_the_project_run_pattern_reads_the_project_folder(line, found):
    assert PROJECT_RUN.search(line).groups() == found
