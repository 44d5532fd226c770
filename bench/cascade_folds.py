"""Mean and spread over folds of the cascade benches, the cascade against the fusion per KB: now
``python -m spacy_genbioel cascade-folds-report`` (:mod:`spacy_genbioel.evaluation.folds`); this wrapper
keeps the command docs/benchmarks.md names::

    python bench/cascade_folds.py metrics --suffix _loss --json metrics/cascade_aap_folds.json
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from spacy_genbioel.cli import app


def main(argv: Optional[Sequence[str]] = None) -> None:
    app(
        args=["cascade-folds-report", *(sys.argv[1:] if argv is None else argv)],
        prog_name="python bench/cascade_folds.py",
    )


if __name__ == "__main__":
    main()
