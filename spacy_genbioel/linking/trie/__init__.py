"""The KB's names as a token-id prefix trie: :mod:`.name_trie` (:class:`~.name_trie.NameTrie`,
built as flat arrays, restricted per mention), :mod:`.name_tokens` (the names' token ids, word by
word where the tokenizer allows), :mod:`.storage` (``trie.safetensors``, read memory-mapped and
checked) and :mod:`.tensors` (its batched torch queries for decoding)."""
