"""Mean and spread over folds of every linker's recall: now ``python -m spacy_genbioel folds-report``
(:mod:`spacy_genbioel.evaluation.folds`); this wrapper keeps the command docs/benchmarks.md names::

    python bench/folds_report.py training/aap/tiny/folds --json metrics/aap_folds.json
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from spacy_genbioel.cli import app


def main(argv: Optional[Sequence[str]] = None) -> None:
    app(args=["folds-report", *(sys.argv[1:] if argv is None else argv)], prog_name="python bench/folds_report.py")


if __name__ == "__main__":
    main()
