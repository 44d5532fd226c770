"""Every numeric (and flag) setting of the training configs is coerced or refused where it is defined:
"nan", "inf", text and values out of range never reach a training run; ".5" and "+1" are numbers."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.retrieval.rescnn_checks import Bound
from spacy_genbioel.training.settings import (
    ANGEL_BOUNDS,
    DATA_BOUNDS,
    DENSE_BOUNDS,
    ENGINE_BOUNDS,
    AngelConfig,
    DenseTrainConfig,
    EngineConfig,
    load_stage_config,
)

CLASSES = [(EngineConfig, ENGINE_BOUNDS, "training"), (AngelConfig, ANGEL_BOUNDS, "angel")]
CLASSES.append((DenseTrainConfig, DENSE_BOUNDS, "train-dense"))
SPELLINGS = ["nan", "inf", "-inf", "abc", "", "1e309", "-1", "0", ".5", "+1", "1", "3", "0.999", "true"]


def accepted(value, bound: Bound):
    """What the value should become under ``bound``, or None when it must be refused (an oracle written
    apart from the checker: Python's own parsing)."""
    if bound.kind is bool:
        return {"true": True, "false": False}.get(value.strip().lower()) if isinstance(value, str) else None
    try:
        number = float(value)
    except ValueError:
        return None
    if not math.isfinite(number) or (bound.kind is int and number != int(number)):
        return None
    if bound.kind is int and not value.lstrip("+-").isdigit():
        return None
    low_ok = bound.low is None or (number > bound.low if bound.open else number >= bound.low)
    high_ok = bound.high is None or (number < bound.high if bound.below else number <= bound.high)
    return (int(number) if bound.kind is int else number) if low_ok and high_ok else None


def test_every_numeric_field_declares_a_range():
    for cls, bounds, _ in CLASSES:
        numeric = {f.name for f in dataclasses.fields(cls) if f.type in ("int", "float", "bool", "Optional[float]")}
        assert numeric <= set(bounds), (cls.__name__, numeric - set(bounds))
    assert set(DATA_BOUNDS) == {
        "max_context_synonyms",
        "use_definitions",
        "max_synonyms_per_concept",
        "kb_examples_per_epoch",
        "eval_mentions",
        "eval_beams",
        "eval_batch_size",
    }


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(CLASSES), st.data(), st.sampled_from(SPELLINGS))
def test_a_setting_spelled_as_text_is_its_number_or_refused_naming_it(entry, data, value):
    cls, bounds, section = entry
    name = data.draw(st.sampled_from(sorted(bounds)))
    expected = accepted(value, bounds[name])
    if expected is None:
        with pytest.raises(ValueError, match=rf"{section}\.{name} must be"):
            cls(**{name: value})
    else:
        assert getattr(cls(**{name: value}), name) == expected


def test_a_config_file_override_out_of_range_names_the_file_and_the_setting(tmp_path):
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "configs" / "angel_tiny.cfg"
    with pytest.raises(ValueError, match=r"angel_tiny.cfg with overrides: training.learning_rate must be"):
        load_stage_config(config, {"training.learning_rate": "nan"})
    with pytest.raises(ValueError, match=r"data.eval_beams must be a whole number >= 1"):
        load_stage_config(config, {"data.eval_beams": 0})
    stage = load_stage_config(config, {"training.learning_rate": ".5", "angel.top_k": "+3"})
    assert (stage.training.learning_rate, stage.angel.top_k) == (0.5, 3)
