"""Plots of evaluation results; the only module that touches matplotlib
(imported when a plot is drawn, so evaluating never needs it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

from spacy_genbioel.evaluation.analysis import SimilarityBins
from spacy_genbioel.evaluation.calibration import DEFAULT_COVERAGES, CalibrationCurve

__all__ = ["plot_similarity_bins", "plot_calibration"]


def plot_similarity_bins(
    result: Union[SimilarityBins, Dict[str, Any]],
    path: Union[str, Path],
    *,
    title: str = "Accuracy by mention / gold-name TF-IDF similarity",
) -> Path:
    """Bar chart (PNG) of accuracy per similarity bin, with counts on the bars.

    Uses matplotlib's Agg canvas directly (imported lazily), so no global
    backend is switched.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = result.to_dict() if isinstance(result, SimilarityBins) else result
    rows = data["bins"]
    labels = [row.get("label") or f"[{row['low']:.2f}, {row['high']:.2f})" for row in rows]
    accuracy = [row["accuracy"] if row["accuracy"] is not None else 0.0 for row in rows]
    counts = [row["count"] for row in rows]
    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    bars = ax.bar(range(len(rows)), accuracy, color="#4c72b0")
    for bar, count in zip(bars, counts):
        ax.annotate(
            f"n={count}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8
        )
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("max TF-IDF cosine(mention, gold concept names)")
    ax.set_ylabel("accuracy (recall@1)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), format="png", dpi=100)
    return path


def plot_calibration(
    curves: Sequence[CalibrationCurve],
    path: Union[str, Path],
    *,
    target_precision: Optional[float] = None,
    coverages: Sequence[float] = DEFAULT_COVERAGES,
    title: str = "Precision against coverage (abstaining below a top-score threshold)",
) -> Path:
    """Precision-coverage curves (PNG), one line per linker, with the target precision
    and the reported coverages as guides (:mod:`.calibration`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for curve in curves:
        points = [p for p in curve.points if p.precision is not None]
        label = f"{curve.linker} (recall@1 {curve.recall_at_1:.3f})" if curve.recall_at_1 is not None else curve.linker
        ax.step(
            [p.coverage for p in points],
            [p.precision for p in points],
            where="post",
            label=label,
            marker="o" if len(points) < 30 else None,
            markersize=3,
        )  # a few points (exact match: one) stay visible
    target = target_precision if target_precision is not None else (curves[0].target_precision if curves else None)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    for coverage in coverages:
        ax.axvline(coverage, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlim(0, 1.02)
    ax.set_xlabel("coverage (share of mentions linked)")
    ax.set_ylabel("precision of linked mentions (top ID right)")
    ax.set_title(title, fontsize=10)
    if curves:
        ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(str(path), format="png", dpi=100)
    return path
