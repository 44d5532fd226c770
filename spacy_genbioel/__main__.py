from spacy_genbioel.cli import app

app(prog_name="python -m spacy_genbioel")
