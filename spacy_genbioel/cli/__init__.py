"""Command line: ``python -m spacy_genbioel COMMAND`` (spaCy's layout).

:mod:`._util` holds the shared ``app``, logging set-up and override parsing;
each command group lives in one thin module that imports ``app`` and calls
library functions. Importing this package registers every command.

A command module imports library code inside its command function, when the
command runs, never at module level: ``--help`` (and every command's) then
starts without spaCy, thinc, torch or transformers
(``tests/cli/test_cli_startup.py``). Option defaults and type hints need no
heavy module (builtin types, Path, light constants).
"""

from __future__ import annotations

from typing import List, Optional

from spacy_genbioel.cli import (  # noqa: F401  (register their commands)  # noqa: E402,F401  (corpus, tokenizer, pretrain, finetune, angel, train-dense; package)
    annotate,  # noqa: E402,F401  (annotate)
    crossfit,  # noqa: E402,F401  (crossfit, crossfit-folds, folds-report, cascade-folds-report)
    demo,
    evaluate,
    export,  # noqa: E402,F401  (export-sources)
    fusion,  # noqa: E402,F401  (folds, fit-fusion)
    kb,
    models,
    ner,  # noqa: E402,F401  (ner-corpus)
    package,
    rescnn,  # noqa: E402,F401  (train-rescnn)
    train,
    visualize,  # noqa: E402,F401  (visualize)
)
from spacy_genbioel.cli._util import app, setup_logging

__all__ = ["app", "main", "setup_logging"]


def main(argv: Optional[List[str]] = None) -> None:
    app(args=argv)


if __name__ == "__main__":
    main()
