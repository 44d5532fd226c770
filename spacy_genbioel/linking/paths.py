"""The component's resource paths, checked when it is added to a pipeline.

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
from typing import Any

from spacy_genbioel.models import ModelFileNotFoundError

__all__ = ["RESOURCE_PATHS", "check_resource_paths", "loading_saved_pipeline"]

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
            raise ModelFileNotFoundError(f"The '{name}' component's {key} {str(value)!r} does not exist "
                                         f"(config '{key}', relative to {Path.cwd()})")
