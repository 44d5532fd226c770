"""``python -m spacy_genbioel``: the command line (:mod:`spacy_genbioel.cli`)."""

from spacy_genbioel.cli import app

app(prog_name="python -m spacy_genbioel")
