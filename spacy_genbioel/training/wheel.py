"""The ``package-wheel`` step: a pipeline directory (from :mod:`.package`) as an
installable wheel, ``pip install`` then ``spacy.load("en_<name>")``.

spaCy's ``python -m spacy package DIR OUT --build wheel`` does the packaging:
the package is named ``<lang>_<meta name>``, and its requirements are the
``meta.json`` ``requirements`` (our package step writes
``spacy_genbioel>=<version>``: :func:`~spacy_genbioel.training.package.requirements`)
plus spaCy and the packages whose registered functions the config names. It
needs the ``build`` package (the ``[package]`` extra). The wheel is moved to
``out_dir`` and its ``Requires-Dist`` checked for this package, so a wheel that
would install without the code it needs is refused.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import List, Optional

from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = ["WheelError", "build_wheel", "has_build", "wheel_requirements"]

PACKAGE = "spacy_genbioel"


class WheelError(RuntimeError):
    """The wheel could not be built, or it does not declare this package."""


def has_build() -> bool:
    """Whether the ``build`` package (``pip install 'spacy_genbioel[package]'``) is installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("build")
        return True
    except PackageNotFoundError:
        return False


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_requirements(wheel: PathLike) -> List[str]:
    """The ``Requires-Dist`` lines of a wheel's ``METADATA``."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
        if metadata is None:
            raise WheelError(f"{wheel} has no .dist-info/METADATA")
        text = archive.read(metadata).decode("utf8")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def _declares_package(requirements: List[str]) -> bool:
    return any(
        _canonical(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]) == _canonical(PACKAGE) for req in requirements
    )


def build_wheel(
    pipeline_dir: PathLike, out_dir: PathLike, name: Optional[str] = None, version: Optional[str] = None
) -> Path:
    """Build the wheel of the pipeline in ``pipeline_dir`` with ``spacy package`` and
    move it into ``out_dir`` (``name``/``version`` override ``meta.json``'s).
    Returns the wheel's path; :class:`WheelError` names what went wrong."""
    pipeline = Path(pipeline_dir)
    meta_path = pipeline / "meta.json"
    if not meta_path.is_file() or not (pipeline / "config.cfg").is_file():
        raise WheelError(f"{pipeline} is not a saved spaCy pipeline (no meta.json or config.cfg)")
    if not has_build():
        raise WheelError("building a wheel needs the 'build' package: pip install 'spacy_genbioel[package]'")
    meta = json.loads(meta_path.read_text(encoding="utf8"))
    if not _declares_package(list(meta.get("requirements", []))):
        logger.warning("%s does not list %s in its requirements; spaCy adds it from the config", meta_path, PACKAGE)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / f".build-{meta.get('lang', 'xx')}_{name or meta.get('name', 'pipeline')}"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir()
    command = [sys.executable, "-m", "spacy", "package", str(pipeline), str(work), "--build", "wheel", "--force"]
    if name:
        command += ["--name", name]
    if version:
        command += ["--version", version]
    # spaCy loads the pipeline in the child: let it import this very spacy_genbioel
    import spacy_genbioel

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(Path(spacy_genbioel.__file__).resolve().parents[1]), env.get("PYTHONPATH")) if p
    )
    logger.info("running %s", " ".join(command))
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise WheelError(f"spacy package failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
        wheels = sorted(work.glob("*/dist/*.whl"))
        if len(wheels) != 1:
            raise WheelError(
                f"spacy package left {len(wheels)} wheels in {work}, "
                f"expected one:\n{(proc.stdout + proc.stderr)[-3000:]}"
            )
        requirements = wheel_requirements(wheels[0])
        if not _declares_package(requirements):
            raise WheelError(f"{wheels[0].name} does not require {PACKAGE} (Requires-Dist: {requirements})")
        target = out / wheels[0].name
        shutil.move(str(wheels[0]), target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.info("%s requires %s", target.name, ", ".join(requirements))
    return target
