"""Abstention calibration: precision against coverage for a linker's top score.

A linker *links* a mention when its top candidate's score is at least a
threshold ``t`` and abstains otherwise (the ``genbioel`` component's
``[output] threshold``). Over the evaluated gold mentions (those with gold
IDs, as :func:`~spacy_genbioel.evaluation.recall.recall_at_k` counts them):

* **coverage(t)** = mentions linked / mentions evaluated (a mention without
  any candidate is never linked);
* **precision(t)** = linked mentions whose top candidate is right / mentions
  linked, "right" being GenBioEL's rule at rank 1
  (:func:`~spacy_genbioel.evaluation.recall.hit_rank` ``== 1``: the top
  candidate's IDs meet the gold IDs); None when nothing is linked.

The curve has one point per distinct top score, from the highest down:
mentions sharing a score are linked or abstained together (a threshold cannot
split a tie), so the curve does not depend on the order of the mentions.
Scores are taken as the component writes and compares them (6 decimals), so a
threshold read off the curve abstains on the same mentions in the pipeline. At
the lowest threshold every answered mention is linked, and precision x
coverage = recall@1 there (precision = recall@1 when every mention has an
answer). The scores are each linker's own: GenBioEL's mean token
log-probability (at most 0; an exact-match or retriever shortcut scores 0),
TF-IDF and dense cosines (at most 1), exact match 1.0, so curves compare by
coverage, never by threshold.

:func:`calibration_curve` builds a :class:`CalibrationCurve`;
``curve.threshold_for(target)`` is the lowest threshold (most coverage) whose
precision reaches ``target``; ``curve.at_coverage(0.9)`` the highest threshold
linking at least 90% of the mentions. :func:`read_calibration` reads a curve
written by ``evaluate --calibration``, :func:`calibrated_threshold` the
threshold ``package --calibration`` ships, and :func:`compare_calibrations`
tabulates several curves.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from spacy_genbioel.evaluation.recall import check_lengths, gold_id_set, hit_rank, ratio
from spacy_genbioel.linking.settings import written_score
from spacy_genbioel.ty import Candidate, Mention
from spacy_genbioel.util import PathLike, atomic_json, parse_json, read_text

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_COVERAGES",
    "DEFAULT_TARGET_PRECISION",
    "CalibrationError",
    "CalibrationPoint",
    "CalibrationCurve",
    "calibration_curve",
    "read_calibration",
    "write_calibration",
    "compare_calibrations",
    "calibrated_threshold",
]

DEFAULT_TARGET_PRECISION = 0.95
DEFAULT_COVERAGES: Tuple[float, ...] = (0.9, 0.95)
FORMAT = "genbioel.calibration.v1"


class CalibrationError(ValueError):
    """A calibration file that cannot be read (the message names it)."""


@dataclass(frozen=True)
class CalibrationPoint:
    """Linking the mentions whose top score is at least ``threshold``."""

    threshold: float
    n_linked: int
    n_correct: int
    coverage: float
    precision: Optional[float]


@dataclass
class CalibrationCurve:
    """Precision against coverage, one point per distinct top score, thresholds decreasing."""

    linker: str
    n_mentions: int  # evaluated: with gold IDs
    n_answered: int  # with at least one candidate
    points: List[CalibrationPoint] = field(default_factory=list)
    target_precision: float = DEFAULT_TARGET_PRECISION

    @property
    def recall_at_1(self) -> Optional[float]:
        return ratio(self.points[-1].n_correct, self.n_mentions) if self.points else (0.0 if self.n_mentions else None)

    def at_coverage(self, coverage: float) -> Optional[CalibrationPoint]:
        """The highest-threshold point linking at least ``coverage`` of the mentions (None: never reached)."""
        needed = math.ceil(coverage * self.n_mentions - 1e-9)
        return next((p for p in self.points if p.n_linked >= needed), None)

    def threshold_for(self, target: Optional[float] = None) -> Optional[CalibrationPoint]:
        """The point of most coverage (lowest threshold) whose precision is at least ``target``
        (default: the curve's ``target_precision``); None when no threshold reaches it."""
        target = self.target_precision if target is None else target
        reaching = [p for p in self.points if p.precision is not None and p.precision >= target]
        return reaching[-1] if reaching else None

    def summary(self, target: Optional[float] = None, coverages: Sequence[float] = DEFAULT_COVERAGES) -> Dict[str, Any]:
        """The figures a report shows: recall@1, the threshold for ``target``, precision at each coverage."""
        target = self.target_precision if target is None else target
        chosen = self.threshold_for(target)
        return {
            "linker": self.linker,
            "n_mentions": self.n_mentions,
            "n_answered": self.n_answered,
            "recall@1": self.recall_at_1,
            "target_precision": target,
            "threshold_for_target": asdict(chosen) if chosen else None,
            "at_coverage": {f"{c:g}": (asdict(p) if (p := self.at_coverage(c)) else None) for c in coverages},
        }

    def to_dict(self) -> Dict[str, Any]:
        return {"format": FORMAT, **self.summary(), "points": [asdict(p) for p in self.points]}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "CalibrationCurve":
        return cls(
            linker=str(data["linker"]),
            n_mentions=int(data["n_mentions"]),
            n_answered=int(data["n_answered"]),
            points=[CalibrationPoint(**p) for p in data["points"]],
            target_precision=float(data.get("target_precision", DEFAULT_TARGET_PRECISION)),
        )

    def format_rows(self, coverages: Sequence[float] = DEFAULT_COVERAGES) -> List[Tuple[str, str]]:
        """``(label, value)`` rows for a wasabi table."""

        def show(p: Optional[CalibrationPoint]) -> str:
            if p is None:
                return "not reached"
            precision = "-" if p.precision is None else f"{p.precision:.4f}"
            return f"precision {precision} at coverage {p.coverage:.4f} (threshold {p.threshold:.6g})"

        rows = [(f"precision @{c:.0%} coverage", show(self.at_coverage(c))) for c in coverages]
        rows.append((f"threshold for precision {self.target_precision:g}", show(self.threshold_for())))
        return rows


def calibration_curve(
    gold: Sequence[Mention],
    predictions: Sequence[Sequence[Candidate]],
    *,
    linker: str = "linker",
    target_precision: float = DEFAULT_TARGET_PRECISION,
) -> CalibrationCurve:
    """The precision-coverage curve of ``predictions``' top scores (see the module's definitions)."""
    check_lengths(gold, predictions)
    scored: List[Tuple[float, bool]] = []
    n_mentions = 0
    for index, (mention, candidates) in enumerate(zip(gold, predictions)):
        ids = gold_id_set(mention)
        if not ids:
            continue
        n_mentions += 1
        if not candidates:
            continue
        score = written_score(candidates[0].score)  # the component compares the score it writes
        if math.isnan(score):
            raise ValueError(f"mention {index} ({mention.text!r}): the top candidate's score is NaN")
        scored.append((score, hit_rank(ids, candidates[:1]) == 1))
    scored.sort(key=lambda item: -item[0])
    points: List[CalibrationPoint] = []
    n_linked = n_correct = 0
    for score, group in groupby(scored, key=lambda item: item[0]):
        members = list(group)
        n_linked += len(members)
        n_correct += sum(1 for _, right in members if right)
        points.append(CalibrationPoint(score, n_linked, n_correct, n_linked / n_mentions, ratio(n_correct, n_linked)))
    return CalibrationCurve(linker, n_mentions, len(scored), points, target_precision)


def write_calibration(path: PathLike, curve: CalibrationCurve) -> Path:
    """The curve as JSON (summary and every point), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_json(path, curve.to_dict())
    return path


def read_calibration(path: PathLike) -> CalibrationCurve:
    """A curve written by :func:`write_calibration`; a file that is not one raises
    :class:`CalibrationError` naming it."""
    path = Path(path)
    data = parse_json(read_text(path, CalibrationError), path, CalibrationError)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CalibrationError(
            f'{path}: not a calibration curve (expected "format": "{FORMAT}"; write one with `evaluate --calibration`)'
        )
    try:
        return CalibrationCurve.from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        raise CalibrationError(f"{path}: damaged calibration curve ({type(err).__name__}: {err})") from err


def compare_calibrations(
    curves: Sequence[CalibrationCurve], target: Optional[float] = None, coverages: Sequence[float] = DEFAULT_COVERAGES
) -> List[Dict[str, Any]]:
    """One row per curve: linker, recall@1, precision at each coverage, threshold and coverage for ``target``."""
    rows = []
    for curve in curves:
        chosen = curve.threshold_for(target)
        row: Dict[str, Any] = {"linker": curve.linker, "n_mentions": curve.n_mentions, "recall@1": curve.recall_at_1}
        for c in coverages:
            point = curve.at_coverage(c)
            row[f"precision@{c:g}"] = point.precision if point else None
        row["threshold"] = chosen.threshold if chosen else None
        row["coverage_at_target"] = chosen.coverage if chosen else None
        rows.append(row)
    return rows


def calibrated_threshold(path: PathLike, target: Optional[float] = None) -> Tuple[Optional[float], Dict[str, Any]]:
    """The threshold of the curve in ``path`` that reaches ``target`` precision (default:
    the file's), and where it comes from (for the pipeline's ``meta.json``). None, with
    a warning, when no threshold reaches it: the pipeline then links every mention."""
    curve = read_calibration(path)
    target = curve.target_precision if target is None else target
    point = curve.threshold_for(target)
    source = {
        "file": str(path),
        "linker": curve.linker,
        "target_precision": target,
        "dev_mentions": curve.n_mentions,
        "dev_coverage": point.coverage if point else None,
        "dev_precision": point.precision if point else None,
    }
    if point is None:
        logger.warning(
            "%s: no threshold reaches precision %s (recall@1 %s); the pipeline will link every mention",
            path,
            target,
            curve.recall_at_1,
        )
        return None, source
    return point.threshold, source
