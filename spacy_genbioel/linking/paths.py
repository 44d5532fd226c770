"""The component's resource paths, checked when it is added to a pipeline, and its saved ``cfg.json``.

The component loads its model, tokenizer and KB lazily (on first use,
``nlp.initialize()`` or ``nlp.to_disk()``), so a mistyped path used to pass
``nlp.add_pipe`` and fail on the first document. :func:`check_resource_paths`
refuses it at ``add_pipe``, naming the setting and the path. A pipeline that
``spacy.load`` reads is left alone: its ``from_disk`` brings its own model and
KB, and the paths its config was built with may be long gone (a saved
pipeline travels whole). spaCy gives a factory no flag for that; the sign is
the pipeline's meta, which ``spacy.load`` sets from ``meta.json`` before it
builds the components, while ``spacy.blank`` leaves it empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from spacy_genbioel.kb.normalizers import get_normalizer
from spacy_genbioel.models import ModelFileNotFoundError, ModelFormatError
from spacy_genbioel.util import parse_json, read_text

__all__ = ["RESOURCE_PATHS", "check_resource_paths", "loading_saved_pipeline", "read_component_cfg"]

#: the top-level settings that name files or folders
RESOURCE_PATHS = ("model", "tokenizer", "kb")


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
        try:
            get_normalizer(meta["kb_normalizer"])
        except ValueError as err:
            raise ModelFormatError(f"{path}: {err}") from err
    return meta
