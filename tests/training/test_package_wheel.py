"""Installable pipelines: the package step declares this package, ``package-wheel``
builds a wheel that requires it, and (marker ``slow``) the wheel installed in a
fresh virtualenv links a document after ``spacy.load("en_<name>")``."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

import spacy_genbioel
from spacy_genbioel.cli import app
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.training import wheel as wheel_module
from spacy_genbioel.training.wheel import WheelError, build_wheel, wheel_requirements

runner = CliRunner()
KB = [
    Concept("D016918", ["reactive arthritis"]),
    Concept("613097", ["cystic fibrosis"]),
    Concept("D001943", ["breast cancer"]),
]


@pytest.fixture()
def pipeline_dir(tmp_path, micro_model, word_tokenizer):
    from spacy_genbioel.models import save_model
    from spacy_genbioel.training.package import EntitySource, PipelineMeta, package

    save_model(micro_model, word_tokenizer, tmp_path / "model")
    KnowledgeBase(KB).to_jsonl(tmp_path / "kb.jsonl")
    return package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg",
        settings={"num_beams": 2, "top_k": 2},
        entities=EntitySource(entity_label="Disease", abbreviations=False),
        meta=PipelineMeta(name="genbioel_wheeltest", version="0.0.1", kb_url="mesh,omim"),
    )


def test_package_meta_declares_this_package(pipeline_dir):
    meta = json.loads((pipeline_dir / "meta.json").read_text())
    assert meta["requirements"] == [f"spacy_genbioel>={spacy_genbioel.__version__}"]
    assert set(meta["kb_url_templates"]) == {"mesh", "omim"}


def test_a_pipeline_with_scispacy_requires_the_extra(tmp_path, pipeline_dir):
    """scispacy's abbreviation detector in the pipeline: pip must install scispacy with this package."""
    pytest.importorskip("scispacy")
    from spacy_genbioel.training.package import EntitySource, package

    with_detector = package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg2",
        settings={"num_beams": 2, "top_k": 2},
        entities=EntitySource(entity_label="Disease"),
    )
    meta = json.loads((with_detector / "meta.json").read_text())
    assert meta["requirements"] == [f"spacy_genbioel[scispacy]>={spacy_genbioel.__version__}"]


def fake_wheel(path, requires):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(
            "x-1.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: x\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        )
    return path


def test_wheel_requirements_and_refusals(tmp_path, pipeline_dir, monkeypatch):
    assert wheel_requirements(fake_wheel(tmp_path / "a.whl", ["spacy-genbioel>=0.1.0", "spacy<3.9"])) == [
        "spacy-genbioel>=0.1.0",
        "spacy<3.9",
    ]
    with zipfile.ZipFile(tmp_path / "b.whl", "w") as archive:
        archive.writestr("x/__init__.py", "")
    with pytest.raises(WheelError, match="no .dist-info/METADATA"):
        wheel_requirements(tmp_path / "b.whl")
    with pytest.raises(WheelError, match="not a saved spaCy pipeline"):
        build_wheel(tmp_path, tmp_path / "wheels")
    monkeypatch.setattr(wheel_module, "has_build", lambda: False)
    result = runner.invoke(app, ["package-wheel", str(pipeline_dir), "--out", str(tmp_path / "wheels")])
    assert result.exit_code == 1 and "pip install 'spacy_genbioel[package]'" in " ".join(result.output.split())


@pytest.mark.parametrize(
    "requires,accepted",
    [
        (["spacy<3.9"], False),
        (["spacy-genbioel-extras>=1"], False),
        (["spacy_genbioel[scispacy]>=0.1.0", "spacy<3.9"], True),
        (["Spacy-GenBioEL>=0.1.0"], True),
    ],
)
def test_the_wheel_must_require_this_package(tmp_path, pipeline_dir, monkeypatch, requires, accepted):
    """spacy package run for real is the slow test's; here its result is faked."""

    def fake_run(command, **kwargs):
        work = Path(command[command.index("package") + 2])
        (work / "en_x-0.0.1" / "dist").mkdir(parents=True)
        fake_wheel(work / "en_x-0.0.1" / "dist" / "en_x-0.0.1-py3-none-any.whl", requires)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(wheel_module, "has_build", lambda: True)
    monkeypatch.setattr(wheel_module.subprocess, "run", fake_run)
    if accepted:
        assert build_wheel(pipeline_dir, tmp_path / "wheels") == tmp_path / "wheels" / "en_x-0.0.1-py3-none-any.whl"
    else:
        with pytest.raises(WheelError, match="does not require spacy_genbioel"):
            build_wheel(pipeline_dir, tmp_path / "wheels")
    # the work folder is gone either way
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == (["en_x-0.0.1-py3-none-any.whl"] if accepted else [])


# -- end to end: a fresh virtualenv --------------------------------------------------------------------------
def source_copy(dest: Path) -> Path:
    """The files a wheel of this package is built from, away from the checkout (no build/ or egg-info left there)."""
    root = Path(spacy_genbioel.__file__).resolve().parents[1]
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(root / name, dest / name)
    shutil.copytree(root / "spacy_genbioel", dest / "spacy_genbioel", ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def make_venv(venv: Path, view: Path) -> Path:
    """A virtualenv whose third-party packages (torch, spaCy...) are this interpreter's, through
    symbolic links, minus spacy_genbioel and every .pth file (the editable install's among them):
    pip in it sees everything but this package, which must come from the wheels."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    view.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower()
        if not (name.startswith(("spacy_genbioel", "__editable__", "en_genbioel")) or name.endswith(".pth")):
            (view / entry.name).symlink_to(entry)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "_system_packages.pth").write_text(str(view) + "\n")
    return python


LINK = """
import json, spacy, spacy_genbioel
nlp = spacy.load("en_genbioel_wheeltest")
doc = nlp("Reactive arthritis and breast cancer.")
print(json.dumps({"file": spacy_genbioel.__file__, "pipes": nlp.pipe_names,
                  "ents": [[e.text, e.kb_id_, e._.kb_id] for e in doc.ents]}))
"""


@pytest.mark.slow
def test_wheel_installs_in_a_fresh_virtualenv_and_links(tmp_path, pipeline_dir):
    pytest.importorskip("build")
    start = time.perf_counter()
    wheels = tmp_path / "wheels"
    pipeline_wheel = build_wheel(pipeline_dir, wheels)
    assert pipeline_wheel.name == "en_genbioel_wheeltest-0.0.1-py3-none-any.whl"
    assert f"spacy_genbioel>={spacy_genbioel.__version__}" in wheel_requirements(pipeline_wheel)
    built = time.perf_counter()
    (tmp_path / "src").mkdir()
    src = source_copy(tmp_path / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(wheels)],
        check=True,
        capture_output=True,
    )
    python = make_venv(tmp_path / "venv", tmp_path / "system_view")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-index", "--find-links", str(wheels), str(pipeline_wheel)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    # pip pulled this package in as the pipeline's requirement, from the wheel
    collected = next(line for line in install.stdout.splitlines() if line.startswith("Installing collected packages"))
    assert "spacy_genbioel" in collected and "en-genbioel-wheeltest" in collected
    installed = time.perf_counter()
    run = subprocess.run([str(python), "-c", LINK], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # the venv's own copy from the wheel, not the checkout
    assert Path(result["file"]).resolve().is_relative_to((tmp_path / "venv").resolve())
    assert result["pipes"][-1] == "genbioel"
    assert [text for text, _, _ in result["ents"]] == ["Reactive arthritis", "breast cancer"]
    assert all(kb_id == ext and kb_id in {c.id for c in KB} for _, kb_id, ext in result["ents"])
    print(
        f"\nwheel {built - start:.1f}s, install {installed - built:.1f}s, "
        f"load+link {time.perf_counter() - installed:.1f}s, "
        f"total {time.perf_counter() - start:.1f}s"
    )
