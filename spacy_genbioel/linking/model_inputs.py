"""Which inputs a model is fed: the style a model imported from a released checkpoint records
(``import-checkpoint`` writes ``config.genbioel_inputs``), applied unless the component is told
otherwise, and a warning where model and inputs do not match."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.linking.inputs.released_style import recorded_input_style, recorded_max_source_tokens
from spacy_genbioel.linking.settings import DecodingSettings, LinkerSettings

logger = logging.getLogger(__name__)

__all__ = ["recorded_inputs", "warn_on_input_style"]


def recorded_inputs(name: str, model: Any, settings: LinkerSettings) -> LinkerSettings:
    """``settings`` feeding ``model`` the inputs it records it was trained on, while ``resources.recorded_inputs``
    and ``inputs.style`` is left at ``genbioel.v1``: the style, and its whole input as ``decoding.max_source_tokens``
    where that setting is left at its default; else ``settings`` as they are."""
    style = recorded_input_style(model)
    if style is None or not settings.resources.recorded_inputs or settings.inputs.style != InputBuilder().style:
        return settings
    try:
        inputs = dataclasses.replace(settings.inputs, style=style)
    except ValueError as err:  # document input mode, say: the released styles write one input per mention
        logger.warning("The '%s' model records inputs.style %s, which these inputs cannot take (%s)", name, style, err)
        return settings
    decoding = settings.decoding
    tokens = recorded_max_source_tokens(model)
    if tokens and decoding.max_source_tokens == DecodingSettings().max_source_tokens:
        decoding = dataclasses.replace(decoding, max_source_tokens=tokens)
    logger.info(
        "The '%s' component feeds its model the inputs.style it records, %s (decoding.max_source_tokens %d; "
        "recorded_inputs = false or another inputs.style overrides it)",
        name,
        style,
        decoding.max_source_tokens,
    )
    return settings.replace(inputs=inputs, decoding=decoding)


def warn_on_input_style(name: str, model: Any, inputs: InputBuilder) -> None:
    """Warn when a model imported from a released checkpoint (``config.genbioel_inputs``, written
    by ``import-checkpoint``) is fed this package's inputs, or a model trained here the released ones."""
    trained_on = getattr(getattr(model, "config", None), "genbioel_inputs", None)
    if (trained_on is not None) != (inputs.released is not None):
        expected = (
            "GenBioEL's own (inputs.style genbioel-released-<corpus>.v1)"
            if trained_on
            else "this package's (genbioel.v1)"
        )
        logger.warning(
            "The '%s' model was trained on %s inputs, but the component writes inputs.style %r: its links "
            "will be worse than they should (docs/published.md)",
            name,
            expected,
            inputs.style,
        )
