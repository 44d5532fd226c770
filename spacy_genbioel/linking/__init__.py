"""The ``genbioel`` spaCy component and everything inference needs, in the order data flows.

* :mod:`.inputs`: what the model reads (``left START mention END right``, the ``mention is``
  prompt, their token ids), whole documents, the released models' styles, abbreviations;
* :mod:`.decoding`: the generator (batched, KV-cached, trie-constrained beam search), retrieve
  then generate, forced scores of given names, and the one-at-a-time yardstick;
* :mod:`.trie`: the KB's names as a token trie in flat arrays, its file and its torch queries;
* :mod:`.reranking`: score fusion, the cascade, and linking with the retrievers alone;
* here, the component: :mod:`.component` (the factory and pipe), :mod:`.settings` (its config
  blocks, defined once; :mod:`.numbers` checks their numbers), :mod:`.paths`, :mod:`.model_inputs`,
  :mod:`.span_outputs`, :mod:`.kb_view`, :mod:`.scispacy_compat` and :mod:`.scorer`.

Importing the package (or a sub-package) does not load torch; the component registers through
the ``spacy_factories`` entry point.
"""
