"""The component's resource paths, checked when it is added to a pipeline, and its saved ``cfg.json``.

The component loads its model, tokenizer and KB lazily (on first use or
``nlp.initialize()``), so a mistyped path used to pass
``nlp.add_pipe`` and fail on the first document. :func:`check_resource_paths`
refuses it at ``add_pipe``, naming the setting and the path. A pipeline that
``spacy.load`` reads is left alone: its ``from_disk`` brings its own model and
KB, and the paths its config was built with may be long gone (a saved
pipeline travels whole). spaCy gives a factory no flag for that; the sign is
the pipeline's meta, which ``spacy.load`` sets from ``meta.json`` before it
builds the components, while ``spacy.blank`` leaves it empty.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

from spacy_genbioel.kb.normalizers import get_normalizer
from spacy_genbioel.models import ModelFileNotFoundError, ModelFormatError
from spacy_genbioel.models.hf import TOKENIZER_KEY
from spacy_genbioel.util import PathLike, parse_json, read_text

__all__ = [
    "RESOURCE_PATHS",
    "SAVED_PARTS",
    "check_resource_paths",
    "copy_model_folder",
    "copyable_model",
    "loading_saved_pipeline",
    "read_component_cfg",
]

#: the top-level settings that name files or folders
RESOURCE_PATHS = ("model", "tokenizer", "kb")
#: what a saved component holds besides cfg.json, by the names ``to_disk``/``from_disk``'s ``exclude`` takes:
#: ``model`` (model/: weights, config and tokenizer), ``trie`` (trie.safetensors), ``kb`` (kb.jsonl and
#: kb.safetensors), ``fusion`` (fusion.json)
SAVED_PARTS = ("model", "trie", "kb", "fusion")


def loading_saved_pipeline(nlp: Any) -> bool:
    """Whether ``nlp`` is being read from a directory (``spacy.load``): its meta came from ``meta.json``."""
    return bool(getattr(nlp, "_meta", None))


def check_resource_paths(nlp: Any, name: str, resources: Any) -> None:
    """Raise :class:`~spacy_genbioel.models.ModelFileNotFoundError` for a configured
    ``model``, ``tokenizer`` or ``kb`` that does not exist (not while ``spacy.load`` reads a pipeline)."""
    if loading_saved_pipeline(nlp):
        return
    for key in RESOURCE_PATHS:
        value = getattr(resources, key)
        if value and not Path(value).exists():
            raise ModelFileNotFoundError(
                f"The '{name}' component's {key} {str(value)!r} does not exist "
                f"(config '{key}', relative to {Path.cwd()})"
            )


def read_component_cfg(path: Path) -> Dict[str, Any]:
    """The component's ``cfg.json``, checked: a missing, unreadable or malformed
    file raises :class:`~spacy_genbioel.models.hf.ModelFormatError` naming it."""
    if not path.exists():
        raise ModelFileNotFoundError(f"{path} not found: not a saved genbioel component")
    meta = parse_json(read_text(path, ModelFormatError), path, ModelFormatError)
    if not isinstance(meta, dict) or not isinstance(meta.get("has_linker"), bool):
        raise ModelFormatError(f"{path}: expected a JSON object with has_linker true or false")
    if meta["has_linker"]:
        if not isinstance(meta.get("kb_normalizer"), str) or not isinstance(meta.get("kb_dedup"), bool):
            raise ModelFormatError(f"{path}: expected kb_normalizer (a name) and kb_dedup (true or false)")
        if not isinstance(meta.get("has_model", True), bool):
            raise ModelFormatError(f"{path}: has_model must be true or false")
        if not isinstance(meta.get("kb_checksum", ""), str):
            raise ModelFormatError(f"{path}: kb_checksum must be a string")
        if not isinstance(meta.get("fusion_config", ""), (str, type(None))):
            raise ModelFormatError(f"{path}: fusion_config must be a path or null")
        parts = meta.get("parts", list(SAVED_PARTS))
        if not isinstance(parts, list) or not set(parts) <= set(SAVED_PARTS):
            raise ModelFormatError(f"{path}: parts must be a list of {', '.join(SAVED_PARTS)}")
        try:
            get_normalizer(meta["kb_normalizer"])
        except ValueError as err:
            raise ModelFormatError(f"{path}: {err}") from err
    return meta


def copyable_model(model: Optional[str], tokenizer: Optional[str]) -> bool:
    """Whether the configured ``model`` folder is one :func:`~spacy_genbioel.models.save_model` wrote
    (safetensors weights, its tokenizer beside them, the tokenizer's fingerprint in config.json): then
    saving a component not used yet copies it instead of loading it. A separate ``tokenizer``, pickled
    weights or another folder are loaded once, to be written in that form."""
    if not model or tokenizer:
        return False
    folder = Path(model)
    if not folder.is_dir() or not any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")):
        return False
    try:
        return TOKENIZER_KEY in json.loads((folder / "config.json").read_text(encoding="utf8"))
    except (OSError, ValueError, TypeError):
        return False


def copy_model_folder(source: PathLike, target: Path) -> None:
    """``source``'s files into ``target`` (replaced), as they are."""
    if target.exists() and target.resolve() == Path(source).resolve():
        return
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target)
