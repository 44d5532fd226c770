"""Plots of evaluation results; the only module that touches matplotlib
(imported when a plot is drawn, so evaluating never needs it)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Union

from spacy_genbioel.evaluation.analysis import SimilarityBins

__all__ = ["plot_similarity_bins"]


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
        ax.annotate(f"n={count}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
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
