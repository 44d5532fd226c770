"""Workflows built on the library: the embedded demo and the benchmarks.

* :mod:`.demo` -- ``python -m spacy_genbioel demo``: a tiny linker trained on
  the embedded KB, packaged and run on sample texts;
* :mod:`.benchmark` -- ``python -m spacy_genbioel benchmark``: the batched
  decoder against the one-at-a-time reference, and the full-MeSH trie build;
* :mod:`.benchmark_annotate` -- ``benchmark --pipeline DIR``: a packaged
  pipeline's annotation throughput per linker input setting, and the
  per-pipe timing and benchmark abstracts that ``bench/`` scripts reuse.

The library never imports this package (``tests/test_layout.py`` checks);
nothing here is imported by ``import spacy_genbioel``.
"""
