"""The generator: :mod:`.decoder` (:class:`~.decoder.GenerativeLinker`, batched, KV-cached,
trie-constrained beam search), :mod:`.stages` (what its searches share: distinct searches, encoded
windows, per-stage timing), :mod:`.prompt_batch` (prompts of different lengths in one batch),
:mod:`.candidates` (retrieve, then generate), :mod:`.forced` (the generator's scores of given
names, without searching) and :mod:`.reference` (the one-at-a-time yardstick tests compare with)."""
