# Set-up is part of each target so that a fresh machine with only Python works.
PYTHON ?= python
PIP = $(PYTHON) -m pip

.PHONY: install demo lint test test-slow benchmark

# torch first, pinned. Which build that is depends on the index: the wheels of the machines this project
# is built on hold the CPU build, but on PyPI a Linux `pip install torch` is the CUDA build (gigabytes of
# CUDA packages). On such a machine take the CPU build from PyTorch's own index:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
# (README, "Install", has the GPU install too.)
TORCH_INDEX ?=

install:
	$(PIP) install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -e ".[test,scispacy,plots,minilm,ner-transformer,package,faiss]"

demo: install
	$(PYTHON) -m spacy_genbioel demo

# ruff (format and lint, config in pyproject.toml) over the tree, mypy over the linking package
lint: install
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy spacy_genbioel/linking

test: lint
	$(PYTHON) -m pytest -q

test-slow: install
	$(PYTHON) -m pytest -q -m slow

benchmark: install
	$(PYTHON) -m spacy_genbioel benchmark
