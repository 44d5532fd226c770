"""Mean and spread over folds of every linker's recall, from ``evaluate --json`` reports.

Reads ``FOLDS_DIR/fold-*/<kb>_<linker>.json`` (``bench/aap.sh`` writes them: ``plain_tfidf.json``,
``aug_fusion.json``, ...) and prints one markdown row per KB and linker: recall@1 and recall@5 as
mean ± sample standard deviation over the folds, their minimum and maximum, and how many folds
reported. A linker missing on some folds is reported over the folds it has, and says so::

    python bench/folds_report.py training/aap/tiny/folds --json metrics/aap_folds.json
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def collect(folds_dir: Path) -> Dict[str, Dict[str, Dict[str, List[float]]]]:
    """``{kb: {linker: {"recall@1": [...], "recall@5": [...], "folds": [...]}}}``."""
    table: Dict[str, Dict[str, Dict[str, List]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for fold in sorted(folds_dir.glob("fold-*"), key=lambda p: int(p.name.split("-")[1])):
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


def summarize(values: Sequence[float]) -> Dict[str, float]:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folds_dir", type=Path)
    parser.add_argument("--json", type=Path, help="Write the summary as JSON")
    args = parser.parse_args(argv)
    table = collect(args.folds_dir)
    if not table:
        raise SystemExit(f"no fold reports under {args.folds_dir}")
    summary = {kb: {linker: {"folds": len(row["folds"]), "recall@1": summarize(row["recall@1"]),
                             "recall@5": summarize(row["recall@5"])} for linker, row in sorted(rows.items())}
               for kb, rows in sorted(table.items())}
    n_folds = max(s["folds"] for rows in summary.values() for s in rows.values())
    print("| KB | linker | recall@1 mean ± sd | min-max | recall@5 mean ± sd | folds |")
    print("|---|---|---|---|---|---|")
    for kb, rows in summary.items():
        for linker, s in rows.items():
            r1, r5 = s["recall@1"], s["recall@5"]
            folds = f"{s['folds']}" + ("" if s["folds"] == n_folds else f" of {n_folds}")
            print(f"| {kb} | {linker} | {r1['mean']:.4f} ± {r1['sd']:.4f} | {r1['min']:.4f}-{r1['max']:.4f} "
                  f"| {r5['mean']:.4f} ± {r5['sd']:.4f} | {folds} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2), encoding="utf8")


if __name__ == "__main__":
    main()
