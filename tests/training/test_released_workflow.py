"""The `released` workflow of project.yml, offline, on a micro checkpoint written exactly as the released
ANGEL_* ones are (config.json and a `torch.save`d OrderedDict state dict, no tokenizer in the folder):
import, package with the paper's dictionary and the released input style, evaluate on test with the peers."""

import json
import os
import shutil
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import torch
from test_training import _pubtator

from spacy_genbioel.kb.base import Concept, KnowledgeBase

ROOT = Path(__file__).resolve().parents[2]


def _project(tmp_path: Path) -> Path:
    """A copy of the project (project.yml, configs) with the package's sources beside it, as a checkout has."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "project.yml", project / "project.yml")
    shutil.copytree(ROOT / "configs", project / "configs")
    os.symlink(ROOT / "spacy_genbioel", project / "spacy_genbioel")
    return project


def _run(project: Path, workflow: str, variables: dict) -> subprocess.CompletedProcess:
    args = [arg for name, value in variables.items() for arg in (f"--vars.{name}", str(value))]
    return subprocess.run(
        [sys.executable, "-m", "spacy", "project", "run", workflow, str(project), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "GENBIOEL_PROGRESS": "0"},
    )


def test_released_workflow_offline(tmp_path, micro_model, word_tokenizer):
    kb = KnowledgeBase(
        [
            Concept("D1", ["renal failure", "kidney failure"]),
            Concept("D2", ["breast cancer", "cancer of breast"]),
            Concept("D3", ["cystic fibrosis"]),
        ]
    )
    data = tmp_path / "data"
    (data / "vocab").mkdir(parents=True)
    kb.to_jsonl(data / "vocab" / "kb.jsonl")
    for split, seed, n in (("train", 0, 6), ("dev", 1, 3), ("test", 2, 3)):
        _pubtator(data / f"{split}.txt", kb, seed, n)
    released = tmp_path / "released"
    (released / "ANGEL_ncbi").mkdir(parents=True)
    micro_model.config.to_json_file(released / "ANGEL_ncbi" / "config.json")
    torch.save(OrderedDict(micro_model.state_dict()), released / "ANGEL_ncbi" / "pytorch_model.bin")  # as released
    word_tokenizer.save_pretrained(released / "bart-large")
    project = _project(tmp_path)
    variables = {
        "data_dir": data,
        "train": "train.txt",
        "dev": "dev.txt",
        "test": "test.txt",
        "kb_sources": data / "vocab" / "kb.jsonl",
        "kb_format": "jsonl",
        "released_dir": released,
        "abbreviations": "no-abbreviations",
        "device": "cpu",
    }

    # without the files, the import step says what is missing, where
    missing = _run(project, "released", {**variables, "released_dir": tmp_path / "nowhere"})
    assert missing.returncode != 0 and "nowhere/ANGEL_ncbi/pytorch_model.bin" in missing.stdout + missing.stderr

    done = _run(project, "released", variables)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((project / "training" / "ncbi_released" / "model" / "import.json").read_text())
    assert record["verification"]["max_abs_diff"] <= 1e-5
    config = (project / "packages" / "ncbi_released" / "config.cfg").read_text()
    assert 'style = "genbioel-released-ncbi.v1"' in config
    report = json.loads((project / "metrics" / "ncbi_released.json").read_text())
    assert (
        report["n_mentions"] == 6 and report["meta"]["kb_names"] >= kb.n_names
    )  # the paper's dictionary: + train and dev mentions
    for peer in ("tfidf", "dense"):
        assert json.loads((project / "metrics" / f"ncbi_published_{peer}.json").read_text())["n_mentions"] == 6
