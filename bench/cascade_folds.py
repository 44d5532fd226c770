"""Mean and spread over folds of ``bench/cascade.py`` reports: the cascade against today's fusion, per KB.

Reads ``METRICS/<prefix>_fold<k>_<kb><suffix>.json`` (``bench/aap.sh cascade`` writes
``cascade_aap_fold<k>_{plain,aug}_loss.json``) and prints one markdown row per KB and row of the reports:

- recall@1 as mean ± population sd over the folds, and its difference from the ``fusion`` row in
  points (mean, and how many folds are within 0.2 points of it or better: issue 28's accuracy goal);
- mentions per CPU second (mean), and the per-fold ratios to the ``fusion`` and ``generator`` rows:
  mean [min-max], and how many folds reach 5x the fusion (the speed goal);
- the share of mentions per path, mean over the folds::

    python bench/cascade_folds.py metrics --suffix _loss --json metrics/cascade_aap_folds.json
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def collect(metrics: Path, prefix: str, kb: str, suffix: str) -> Dict[int, dict]:
    """``{fold: rows}`` of the reports of one KB, by fold number."""
    pattern = re.compile(rf"{re.escape(prefix)}_fold(\d+)_{re.escape(kb)}{re.escape(suffix)}\.json")
    found = {}
    for path in metrics.glob(f"{prefix}_fold*_{kb}{suffix}.json"):
        match = pattern.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = json.loads(path.read_text(encoding="utf8"))["rows"]
    return dict(sorted(found.items()))


def summarize(folds: Dict[int, dict], within: float = 0.2, speed_goal: float = 5.0) -> Dict[str, dict]:
    """Per row present in every fold: recall, speed and paths over the folds (see the module's docstring)."""
    names = [name for name in next(iter(folds.values())) if all(name in rows for rows in folds.values())]
    out: Dict[str, dict] = {}
    for name in names:
        rows = [folds[k][name] for k in folds]
        r1 = [r["recall@1"] for r in rows]
        row: dict = {"folds": len(rows), "recall@1": statistics.fmean(r1), "recall@1_sd": statistics.pstdev(r1),
                     "recall@5": statistics.fmean(r["recall@5"] for r in rows),
                     "mentions_per_cpu_second": statistics.fmean(r["mentions_per_cpu_second"] for r in rows)}
        for base in ("fusion", "generator"):
            if all(base in folds[k] for k in folds):
                ratios = [folds[k][name]["mentions_per_cpu_second"] / folds[k][base]["mentions_per_cpu_second"] for k in folds]
                row[f"x_{base}"] = {"mean": statistics.fmean(ratios), "min": min(ratios), "max": max(ratios)}
                if base == "fusion":
                    gaps = [100 * (folds[k][name]["recall@1"] - folds[k][base]["recall@1"]) for k in folds]
                    row["points_vs_fusion"] = {"mean": statistics.fmean(gaps), "min": min(gaps), "max": max(gaps),
                                               "folds_within": sum(g >= -within - 1e-9 for g in gaps)}
                    row["folds_at_speed_goal"] = sum(x >= speed_goal for x in ratios)
        paths: Dict[str, float] = {}
        for r in rows:
            for path, share in r.get("paths", {}).items():
                paths[path] = paths.get(path, 0.0) + share / len(rows)
        row["paths"] = dict(sorted(paths.items()))
        out[name] = row
    return out


def markdown(summary: Dict[str, Dict[str, dict]]) -> List[str]:
    lines = ["| KB | row | recall@1 | vs fusion (points; folds within 0.2) | per CPU s | x fusion [min-max] "
             "(folds at 5x) | x generator | paths |", "|---|---|---|---|---|---|---|---|"]
    for kb, rows in summary.items():
        for name, r in rows.items():
            gap = r.get("points_vs_fusion")
            gap_text = f"{gap['mean']:+.2f} ({gap['folds_within']} of {r['folds']})" if gap else ""
            xf, xg = r.get("x_fusion"), r.get("x_generator")
            xf_text = f"{xf['mean']:.2f} [{xf['min']:.2f}-{xf['max']:.2f}] ({r['folds_at_speed_goal']})" if xf else ""
            xg_text = f"{xg['mean']:.2f}" if xg else ""
            paths = ", ".join(f"{p} {100 * s:.1f}%" for p, s in r["paths"].items())
            lines.append(f"| {kb} | {name} | {r['recall@1']:.4f} ± {r['recall@1_sd']:.4f} | {gap_text} "
                         f"| {r['mentions_per_cpu_second']:.1f} | {xf_text} | {xg_text} | {paths} |")
    return lines


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metrics", type=Path, help="the folder of the per-fold reports")
    parser.add_argument("--prefix", default="cascade_aap")
    parser.add_argument("--suffix", default="_loss", help="after the KB in the file name ('' for the precision-targeted runs)")
    parser.add_argument("--kbs", default="plain,aug")
    parser.add_argument("--json", type=Path, help="write the summary as JSON")
    args = parser.parse_args(argv)
    summary = {}
    for kb in [k for k in args.kbs.split(",") if k]:
        folds = collect(args.metrics, args.prefix, kb, args.suffix)
        if folds:
            summary[kb] = summarize(folds)
    if not summary:
        raise SystemExit(f"no {args.prefix}_fold<k>_<kb>{args.suffix}.json reports under {args.metrics}")
    print("\n".join(markdown(summary)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf8")


if __name__ == "__main__":
    main()
