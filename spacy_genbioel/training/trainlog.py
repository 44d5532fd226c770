"""The training log every stage writes (``train_log.jsonl``: one JSON record
per line: start, loss every ``log_every`` steps, evaluations, end) and the
loss/metric curve drawn from it (``curve.png``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from spacy_genbioel.util import PathLike

LOG_FILE = "train_log.jsonl"
CURVE_FILE = "curve.png"


def append_log(path: Optional[Path], record: Dict[str, Any]) -> None:
    """Add ``record`` to the log at ``path`` (``None``: a run that writes nothing)."""
    if path is None:
        return
    with path.open("a", encoding="utf8") as out:
        out.write(json.dumps(record, default=str) + "\n")


def truncate_log(path: Path, step: int) -> None:
    """Drop the records written after ``step`` (and any end record): a run resumed
    from the checkpoint of ``step`` writes them again."""
    kept = [
        line
        for line in path.read_text(encoding="utf8").splitlines()
        if line.strip() and json.loads(line).get("step", 0) <= step and json.loads(line).get("event") != "end"
    ]
    path.write_text("".join(line + "\n" for line in kept), encoding="utf8")


def read_log(path: PathLike) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf8").splitlines() if line.strip()]


def plot_training_curve(log_path: PathLike, png_path: PathLike, metric: str = "recall@1") -> Path:
    """Training loss (left axis) and the dev metric (right axis) against steps, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log_path)
    loss = [(r["step"], r["loss"]) for r in records if "loss" in r and "step" in r]
    evals = [(r["step"], r["eval"][metric]) for r in records if "eval" in r and metric in r["eval"]]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if loss:
        ax.plot(*zip(*loss), color="tab:blue", label="train loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss", color="tab:blue")
    if evals:
        ax2 = ax.twinx()
        ax2.plot(*zip(*evals), color="tab:orange", marker="o", label=f"dev {metric}")
        ax2.set_ylabel(f"dev {metric}", color="tab:orange")
        ax2.set_ylim(0, 1)
    ax.set_title(Path(log_path).parent.name or "training")
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path
