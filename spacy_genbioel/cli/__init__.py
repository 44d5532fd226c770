"""Command line: ``python -m spacy_genbioel COMMAND`` (spaCy's layout).

:mod:`._util` holds the shared ``app``, logging set-up and override parsing;
each command group lives in one thin module that imports ``app`` and calls
library functions. Importing this package registers every command.
"""
from __future__ import annotations

from typing import List, Optional

from spacy_genbioel.cli._util import app, setup_logging
from spacy_genbioel.cli import demo, evaluate, kb, models  # noqa: F401  (register their commands)

from spacy_genbioel.training.cli_steps import register_commands  # noqa: E402  (corpus, tokenizer, pretrain, finetune, package)

register_commands(app)

from spacy_genbioel.annotate.runner import register_annotate  # noqa: E402

register_annotate(app)

from spacy_genbioel.ner import register_ner_commands  # noqa: E402

register_ner_commands(app)

from spacy_genbioel.training.angel import register_angel_commands  # noqa: E402

register_angel_commands(app)

from spacy_genbioel.training.sapbert import register_dense_commands  # noqa: E402  (train-dense)

register_dense_commands(app)

__all__ = ["app", "main", "setup_logging"]


def main(argv: Optional[List[str]] = None) -> None:
    app(args=argv)


if __name__ == "__main__":
    main()
