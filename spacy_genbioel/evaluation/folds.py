"""Mean and spread over folds: every linker's recall from ``evaluate --json`` reports, and the cascade
against the fusion from the per-fold cascade benches (``crossfit-folds`` writes both).

:func:`linker_summary` reads ``FOLDS_DIR/fold-*/<kb>_<linker>.json`` (``plain_tfidf.json``, ``aug_fusion.json``,
...): per KB and linker, recall@1 and recall@5 as mean ± sample standard deviation over the folds, their
minimum and maximum, and how many folds reported (a linker missing on some folds is summed up over the folds
it has). :func:`cascade_summary` reads ``METRICS/<prefix>_fold<k>_<kb><suffix>.json``
(``cascade_aap_fold<k>_{plain,aug}_loss.json``): per KB and row of the benches,

- recall@1 as mean ± population sd over the folds, and its difference from the ``fusion`` row in points
  (mean, and how many folds are within 0.2 points of it or better: issue 28's accuracy goal);
- mentions per CPU second (mean), and the per-fold ratios to the ``fusion`` and ``generator`` rows:
  mean [min-max], and how many folds reach 5x the fusion (the speed goal);
- the share of mentions per path, mean over the folds.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Sequence

__all__ = ["linker_summary", "linker_markdown", "cascade_summary", "cascade_markdown", "spread"]


def _fold_number(path: Path) -> int:
    return int(path.name.split("-")[1])


def collect_linker_reports(folds_dir: Path) -> Dict[str, Dict[str, Dict[str, list]]]:
    """``{kb: {linker: {"recall@1": [...], "recall@5": [...], "folds": [...]}}}``."""
    table: Dict[str, Dict[str, Dict[str, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    folds = [p for p in folds_dir.glob("fold-*") if p.is_dir() and p.name.split("-")[1].isdigit()]
    for fold in sorted(folds, key=_fold_number):
        for path in sorted(fold.glob("*_*.json")):
            kb, _, linker = path.stem.partition("_")
            if kb == "fusion":  # fitted fusion weights (fusion_plain.json), not a report
                continue
            report = json.loads(path.read_text(encoding="utf8"))
            if "recall" not in report:
                continue
            recall = report["recall"]["recall"]
            row = table[kb][linker]
            row["recall@1"].append(recall["recall@1"])
            row["recall@5"].append(recall.get("recall@5", float("nan")))
            row["folds"].append(fold.name)
    return table


def spread(values: Sequence[float]) -> Dict[str, float]:
    """Mean, sample standard deviation (0 for one value), minimum and maximum."""
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def linker_summary(folds_dir: Path) -> Dict[str, Dict[str, dict]]:
    """Per KB and linker: folds, and :func:`spread` of recall@1 and recall@5
    (ValueError: no report under ``folds_dir``)."""
    table = collect_linker_reports(folds_dir)
    if not table:
        raise ValueError(f"no fold reports under {folds_dir} (fold-<k>/<kb>_<linker>.json)")
    return {
        kb: {
            linker: {
                "folds": len(row["folds"]),
                "recall@1": spread(row["recall@1"]),
                "recall@5": spread(row["recall@5"]),
            }
            for linker, row in sorted(rows.items())
        }
        for kb, rows in sorted(table.items())
    }


def linker_markdown(summary: Dict[str, Dict[str, dict]]) -> List[str]:
    """One markdown row per KB and linker; a linker reported on fewer folds than the others says so."""
    n_folds = max(s["folds"] for rows in summary.values() for s in rows.values())
    lines = ["| KB | linker | recall@1 mean ± sd | min-max | recall@5 mean ± sd | folds |", "|---|---|---|---|---|---|"]
    for kb, rows in summary.items():
        for linker, s in rows.items():
            r1, r5 = s["recall@1"], s["recall@5"]
            folds = f"{s['folds']}" + ("" if s["folds"] == n_folds else f" of {n_folds}")
            lines.append(
                f"| {kb} | {linker} | {r1['mean']:.4f} ± {r1['sd']:.4f} | {r1['min']:.4f}-{r1['max']:.4f} "
                f"| {r5['mean']:.4f} ± {r5['sd']:.4f} | {folds} |"
            )
    return lines


def collect_cascade_reports(metrics: Path, prefix: str, kb: str, suffix: str) -> Dict[int, dict]:
    """``{fold: rows}`` of the cascade benches of one KB, by fold number."""
    pattern = re.compile(rf"{re.escape(prefix)}_fold(\d+)_{re.escape(kb)}{re.escape(suffix)}\.json")
    found = {}
    for path in metrics.glob(f"{prefix}_fold*_{kb}{suffix}.json"):
        match = pattern.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = json.loads(path.read_text(encoding="utf8"))["rows"]
    return dict(sorted(found.items()))


def summarize_cascade(folds: Dict[int, dict], within: float = 0.2, speed_goal: float = 5.0) -> Dict[str, dict]:
    """Per row present in every fold: recall, speed and paths over the folds (see the module's docstring)."""
    names = [name for name in next(iter(folds.values())) if all(name in rows for rows in folds.values())]
    out: Dict[str, dict] = {}
    for name in names:
        rows = [folds[k][name] for k in folds]
        r1 = [r["recall@1"] for r in rows]
        row: dict = {
            "folds": len(rows),
            "recall@1": statistics.fmean(r1),
            "recall@1_sd": statistics.pstdev(r1),
            "recall@5": statistics.fmean(r["recall@5"] for r in rows),
            "mentions_per_cpu_second": statistics.fmean(r["mentions_per_cpu_second"] for r in rows),
        }
        for base in ("fusion", "generator"):
            if all(base in folds[k] for k in folds):
                ratios = [
                    folds[k][name]["mentions_per_cpu_second"] / folds[k][base]["mentions_per_cpu_second"] for k in folds
                ]
                row[f"x_{base}"] = {"mean": statistics.fmean(ratios), "min": min(ratios), "max": max(ratios)}
                if base == "fusion":
                    gaps = [100 * (folds[k][name]["recall@1"] - folds[k][base]["recall@1"]) for k in folds]
                    row["points_vs_fusion"] = {
                        "mean": statistics.fmean(gaps),
                        "min": min(gaps),
                        "max": max(gaps),
                        "folds_within": sum(g >= -within - 1e-9 for g in gaps),
                    }
                    row["folds_at_speed_goal"] = sum(x >= speed_goal for x in ratios)
        paths: Dict[str, float] = {}
        for r in rows:
            for path, share in r.get("paths", {}).items():
                paths[path] = paths.get(path, 0.0) + share / len(rows)
        row["paths"] = dict(sorted(paths.items()))
        out[name] = row
    return out


def cascade_summary(
    metrics: Path, prefix: str = "cascade_aap", suffix: str = "_loss", kbs: Iterable[str] = ("plain", "aug")
) -> Dict[str, Dict[str, dict]]:
    """:func:`summarize_cascade` per KB that has benches (ValueError: none has)."""
    summary = {}
    for kb in kbs:
        folds = collect_cascade_reports(metrics, prefix, kb, suffix)
        if folds:
            summary[kb] = summarize_cascade(folds)
    if not summary:
        raise ValueError(f"no {prefix}_fold<k>_<kb>{suffix}.json reports under {metrics}")
    return summary


def cascade_markdown(summary: Dict[str, Dict[str, dict]]) -> List[str]:
    """One markdown row per KB and row of the benches."""
    lines = [
        "| KB | row | recall@1 | vs fusion (points; folds within 0.2) | per CPU s | x fusion [min-max] "
        "(folds at 5x) | x generator | paths |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kb, rows in summary.items():
        for name, r in rows.items():
            gap = r.get("points_vs_fusion")
            gap_text = f"{gap['mean']:+.2f} ({gap['folds_within']} of {r['folds']})" if gap else ""
            xf, xg = r.get("x_fusion"), r.get("x_generator")
            xf_text = f"{xf['mean']:.2f} [{xf['min']:.2f}-{xf['max']:.2f}] ({r['folds_at_speed_goal']})" if xf else ""
            xg_text = f"{xg['mean']:.2f}" if xg else ""
            paths = ", ".join(f"{p} {100 * s:.1f}%" for p, s in r["paths"].items())
            lines.append(
                f"| {kb} | {name} | {r['recall@1']:.4f} ± {r['recall@1_sd']:.4f} | {gap_text} "
                f"| {r['mentions_per_cpu_second']:.1f} | {xf_text} | {xg_text} | {paths} |"
            )
    return lines
