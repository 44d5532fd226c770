"""Markdown table of end-to-end reports (`evaluate --end-to-end --json`).

python bench/e2e_table.py metrics/ncbi_e2e_*.json
"""

import json
import sys
from pathlib import Path


def main(paths):
    print("| report | linking strict P / R / F1 | linking partial P / R / F1 | NER strict F1 | NER partial F1 |")
    print("|---|---|---|---|---|")
    for path in paths:
        r = json.loads(Path(path).read_text(encoding="utf8"))
        prf = lambda m: " / ".join(f"{m[k]:.4f}" for k in ("precision", "recall", "f1"))  # noqa: E731
        print(
            f"| {Path(path).stem} | {prf(r['linking']['strict'])} | {prf(r['linking']['partial'])} "
            f"| {r['ner']['strict']['f1']:.4f} | {r['ner']['partial']['f1']:.4f} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
