"""Command line: ``python -m spacy_genbioel COMMAND`` (spaCy's layout).

:mod:`._util` holds the shared ``app``, logging set-up and override parsing;
each command group lives in one thin module that imports ``app`` and calls
library functions. Importing this package registers every command.
"""
from __future__ import annotations

from typing import List, Optional

from spacy_genbioel.cli._util import app, setup_logging
from spacy_genbioel.cli import demo, evaluate, kb, models  # noqa: F401  (register their commands)

from spacy_genbioel.cli import train, package  # noqa: E402,F401  (corpus, tokenizer, pretrain, finetune, angel, train-dense; package)

from spacy_genbioel.cli import annotate  # noqa: E402,F401  (annotate)

from spacy_genbioel.cli import ner  # noqa: E402,F401  (ner-corpus)

from spacy_genbioel.cli import visualize  # noqa: E402,F401  (visualize)

from spacy_genbioel.cli import fusion  # noqa: E402,F401  (folds, fit-fusion)

from spacy_genbioel.cli import export  # noqa: E402,F401  (export-sources)

from spacy_genbioel.cli import rescnn  # noqa: E402,F401  (train-rescnn)

from spacy_genbioel.cli import crossfit  # noqa: E402,F401  (crossfit, crossfit-folds, folds-report, cascade-folds-report)

__all__ = ["app", "main", "setup_logging"]


def main(argv: Optional[List[str]] = None) -> None:
    app(args=argv)


if __name__ == "__main__":
    main()
