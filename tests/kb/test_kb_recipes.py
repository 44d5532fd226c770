"""configs/kbs/project.yml: the KB recipes (kb-umls, kb-mesh, kb-rxnorm, kb-hpo, kb-mondo, kb-go), each run
on the small real-format files of tests/fixtures/kb_sources with its vars pointed at them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import srsly
from typer.testing import CliRunner

from spacy_genbioel.cli import app

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "configs" / "kbs"
FIXTURES = ROOT / "tests" / "fixtures" / "kb_sources"
RECIPES = {  # recipe -> (the var naming its input, the fixture, an ID the KB must hold, that concept's types)
    "kb-umls": ("umls_meta", FIXTURES / "umls", "C0011849", ["T047"]),
    "kb-mesh": ("mesh_desc", FIXTURES / "desc_sample.xml", "D003920", ["T047"]),
    "kb-rxnorm": ("rxnorm_rrf", FIXTURES / "rxnorm", "1191", ["T109", "T121"]),
    "kb-hpo": ("hpo_obo", FIXTURES / "hp.obo", "HP:0001250", ["human_phenotype"]),
    "kb-mondo": ("mondo_obo", FIXTURES / "mondo.obo", "MONDO:0005015", []),
    "kb-go": ("go_obo", FIXTURES / "go.obo", "GO:0006915", ["biological_process"]),
}


def _copy(tmp_path: Path) -> Path:
    """The recipe project copied out of the checkout: loading it creates its directories."""
    project = tmp_path / "kbs_project"
    project.mkdir()
    (project / "project.yml").write_text((PROJECT / "project.yml").read_text(encoding="utf8"), encoding="utf8")
    return project


def _config(project, overrides):
    from weasel.util import load_project_config, parse_config_overrides

    args = [arg for name, value in overrides.items() for arg in (f"--vars.{name}", str(value))]
    return load_project_config(project, overrides=parse_config_overrides(args))


def test_the_recipe_project_validates():
    from weasel.schemas import ProjectConfigSchema, validate
    from weasel.util import validate_project_commands

    project = srsly.read_yaml(PROJECT / "project.yml")
    assert validate(ProjectConfigSchema, project) == []
    validate_project_commands(project)
    assert {c["name"] for c in project["commands"]} == set(RECIPES)
    assert sorted(project["workflows"]["open"] + project["workflows"]["licensed"]) == sorted(RECIPES)
    urls = [asset["url"] for asset in project["assets"] if asset.get("url")]
    assert len(urls) == 4 and all(url.startswith("https://") for url in urls)
    # the licensed sources are the user's files, never fetched
    unfetched = {asset["dest"] for asset in project["assets"] if not asset.get("url")}
    assert unfetched == {"${vars.umls_meta}", "${vars.rxnorm_rrf}"}
    # what a user puts under assets/ (a licensed UMLS) or builds stays out of git
    assert {"assets/", "kbs/"} <= set((PROJECT / ".gitignore").read_text(encoding="utf8").split())


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_recipe_builds_its_kb_from_the_fixtures(tmp_path, recipe):
    var, source, cid, types = RECIPES[recipe]
    config = _config(_copy(tmp_path), {var: source, "out_dir": tmp_path})
    (command,) = [c for c in config["commands"] if c["name"] == recipe]
    assert command["deps"] == [str(source)]
    for line in command["script"]:
        args = shlex.split(line)
        assert args[:4] == ["python", "-m", "spacy_genbioel", "build-kb"], line
        result = CliRunner().invoke(app, [*args[3:], "--no-progress"])
        assert result.exit_code == 0, result.output
    (out,) = command["outputs"]
    records = {r["id"]: r for r in map(json.loads, Path(out).read_text(encoding="utf8").splitlines())}
    assert records[cid].get("types", []) == types
    assert all(":" not in key or key.startswith(cid.split(":")[0] + ":") for key in records)  # no imported terms


@pytest.mark.slow  # two `spacy project run` processes: about 20-40 s on a shared 2-core machine
def test_spacy_project_run_builds_a_kb(tmp_path):
    """The command a user types, end to end: `spacy project run kb-hpo configs/kbs`, on a copy of the project."""
    project = _copy(tmp_path)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spacy",
            "project",
            "run",
            "kb-hpo",
            str(project),
            "--vars.hpo_obo",
            str(FIXTURES / "hp.obo"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "GENBIOEL_PROGRESS": "0"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = [json.loads(line)["id"] for line in (project / "kbs" / "hpo.jsonl").read_text(encoding="utf8").splitlines()]
    assert ids == ["HP:0000118", "HP:0001250", "HP:0001263", "HP:0031797"]
    missing = subprocess.run(
        [sys.executable, "-m", "spacy", "project", "run", "kb-umls", str(project)],
        capture_output=True,
        text=True,
        env={**os.environ, "GENBIOEL_PROGRESS": "0"},
    )
    assert missing.returncode != 0 and "assets/umls/META" in missing.stdout + missing.stderr
