"""The ``genbioel`` spaCy component and everything inference needs.

:mod:`.component` (the factory and pipe), :mod:`.settings` (its config
blocks, defined once), :mod:`.inputs` (``left START mention END right`` and the
``mention is`` prompt), :mod:`.decoder` (batched, KV-cached, trie-constrained
beam search), :mod:`.trie` (the name trie as flat arrays; :mod:`.trie_tensors`
its batched torch queries),
:mod:`.candidates` (retrieve, then generate), :mod:`.abbreviations` (long
forms of short forms) and :mod:`.reference` (the one-at-a-time yardstick).
Importing the package does not load torch; the component registers through
the ``spacy_factories`` entry point.
"""
