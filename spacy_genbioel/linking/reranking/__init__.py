"""After (or instead of) the generator: :mod:`.fusion` (score fusion of the generator's and the
retrievers' candidates), :mod:`.cascade` (which mentions retrieval settles, which get forced scores
or beam search), :mod:`.retrieval_only` (linking with no generator), :mod:`.beam_width` (how wide the
generator searches for the fusion it feeds) and :mod:`.settings` (the ``reranker`` config block)."""
