"""The mention record shared by corpus readers, training-data builders and evaluation."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Tuple


@dataclass(frozen=True)
class Mention:
    """One gold or predicted mention with its context.

    ``ids`` holds every concept ID of the mention (a composite mention such as
    ``D001|D002`` has several; an evaluation counts a hit on any of them).
    ``left`` and ``right`` are the document text before and after the mention.
    """

    text: str
    ids: Tuple[str, ...] = ()
    left: str = ""
    right: str = ""
    doc_id: str = ""
    start: int = -1
    end: int = -1
    label: str = ""
    composite: bool = field(default=False)

    @property
    def is_composite(self) -> bool:
        return self.composite or len(self.ids) > 1
