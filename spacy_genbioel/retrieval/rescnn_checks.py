"""The numeric settings of ``train-rescnn`` (``configs/rescnn.cfg``, dotted overrides), each checked
against its range and turned into the number it means.

A config file and ``--section.setting VALUE`` overrides give values as the config
parser and JSON read them: ``.5``, ``+1``, ``nan`` and ``inf`` stay strings there, and
JSON's ``NaN`` is a float NaN. A NaN ``initial_scale`` trained and saved a NaN model with
a success message, negative ``epochs`` trained nothing and said so. So every setting
here is coerced (a string spelling a finite number becomes that number; a whole float
becomes an int where an int is meant) or refused with its dotted name, the value and
where it came from::

    check_rescnn_settings({"training.initial_scale": "nan"}, "--training.initial_scale")
    # ValueError: --training.initial_scale: training.initial_scale must be a finite number > 0, got 'nan'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

__all__ = ["Bound", "RESCNN_BOUNDS", "check_rescnn_settings", "check_setting"]

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_FLAGS = {"true": True, "false": False}


@dataclass(frozen=True)
class Bound:
    """The values one setting takes: a ``kind`` (``int``, ``float``, ``bool``, or ``list`` of ints),
    ``low``/``high`` (None: unbounded; ``open``: ``low`` itself excluded), ``below``: ``high``
    excluded, ``optional``: None is a value (the setting is off)."""

    kind: type
    low: Optional[float] = None
    high: Optional[float] = None
    open: bool = False
    below: bool = False
    optional: bool = False

    def text(self) -> str:
        """What the setting must be, in words."""
        if self.kind is bool:
            return "true or false"
        what = {int: "a whole number", float: "a finite number", list: "a list of whole numbers"}[self.kind]
        if self.low is not None and self.high is not None:
            what += f" in {'(' if self.open else '['}{self.low:g}, {self.high:g}{')' if self.below else ']'}"
        elif self.low is not None:
            what += f" {'>' if self.open else '>='} {self.low:g}"
        return what + (" (or null: off)" if self.optional else "")


#: dotted setting -> its range (every setting of :class:`~spacy_genbioel.training.rescnn.ResCNNTrainConfig`)
RESCNN_BOUNDS: Dict[str, Bound] = {
    "model.hidden": Bound(int, 1),
    "model.blocks": Bound(int, 0),
    "model.filters": Bound(int, 1),
    "model.kernel_sizes": Bound(list, 1),
    "model.dropout": Bound(float, 0, 1, below=True),
    "model.max_length": Bound(int, 1),
    "training.epochs": Bound(int, 1),
    "training.max_seconds": Bound(float, 0, open=True, optional=True),
    "training.batch_size": Bound(int, 1),
    "training.learning_rate": Bound(float, 0, open=True),
    "training.weight_decay": Bound(float, 0),
    "training.sparse_learning_rate": Bound(float, 0),
    "training.initial_sparse_weight": Bound(float, 0),
    "training.initial_scale": Bound(float, 0, open=True),
    "training.topk": Bound(int, 2),
    "training.dense_ratio": Bound(float, 0, 1),
    "training.max_grad_norm": Bound(float, 0),
    "training.seed": Bound(int, 0),
    "training.log_every": Bound(int, 1),
    "training.progress": Bound(bool),
    "data.kb_queries": Bound(int, 0),
    "data.mention_repeats": Bound(int, 0),
    "data.encode_batch": Bound(int, 1),
    "data.refresh_pool": Bound(int, 0),
}


def check_setting(name: str, value: Any, bound: Bound, origin: str = "") -> Any:
    """``value`` of setting ``name`` as the number (flag, list) it spells, in ``bound``'s range; else a
    ValueError naming ``origin`` (the file or the override), the setting, what it must be and the value."""
    refused = ValueError(f"{origin + ': ' if origin else ''}{name} must be {bound.text()}, got {value!r}")
    if value is None:
        if bound.optional:
            return None
        raise refused
    if bound.kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _FLAGS:
            return _FLAGS[value.strip().lower()]
        raise refused
    if bound.kind is list:
        items = value if isinstance(value, (list, tuple)) else None
        if not items:
            raise refused
        whole = Bound(int, bound.low, bound.high, bound.open, bound.below)
        try:
            return [check_setting(name, item, whole) for item in items]
        except ValueError:
            raise refused from None
    number = _number(value, bound.kind)
    if number is None or not _in_range(number, bound):
        raise refused
    return number


def _number(value: Any, kind: type) -> Optional[float]:
    """``value`` as a finite ``kind`` (int or float), or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        text = value.strip()
        if kind is int and _INT.fullmatch(text):
            return int(text)
        if not _FLOAT.fullmatch(text):
            return None
        value = float(text)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if kind is int:
        return int(value) if float(value).is_integer() else None
    return float(value)


def _in_range(number: float, bound: Bound) -> bool:
    if bound.low is not None and (number <= bound.low if bound.open else number < bound.low):
        return False
    return bound.high is None or (number < bound.high if bound.below else number <= bound.high)


def check_rescnn_settings(values: Mapping[str, Any], origin: str = "") -> Dict[str, Any]:
    """Dotted ``values`` (``{"training.epochs": "3"}``) checked and coerced (:func:`check_setting`);
    a name not in :data:`RESCNN_BOUNDS` is passed on as it is (the config loader names it)."""
    return {
        name: check_setting(name, value, RESCNN_BOUNDS[name], origin) if name in RESCNN_BOUNDS else value
        for name, value in values.items()
    }
