"""The GenBioEL/GENRE way of decoding, kept as a yardstick.

One mention at a time through ``model.generate`` with
``prefix_allowed_tokens_fn`` walking a nested-dict trie per beam per step (the
KV cache of Hugging Face stays on). The benchmark runs it side by side with
:class:`~spacy_genbioel.linking.decoding.decoder.GenerativeLinker`, and tests use it to prove
that the batched decoder returns the same names.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.inputs.builder import has_linkable_text
from spacy_genbioel.ty import Candidate, Mention


class DictTrie:
    """GENRE's nested-dict trie over ``[root] + name tokens + [eos]`` sequences."""

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        self.root: Dict[int, dict] = {}
        for seq in sequences:
            level = self.root
            for token in seq:
                level = level.setdefault(int(token), {})

    def get(self, prefix: Sequence[int]) -> List[int]:
        level = self.root
        for token in prefix:
            child = level.get(int(token))
            if child is None:
                return []
            level = child
        return list(level)


class ReferenceLinker:
    """Same model, KB and trie contents as a GenerativeLinker, decoded the slow way."""

    def __init__(self, linker: GenerativeLinker) -> None:
        self.linker = linker
        trie = linker.trie
        self.sequence_names: Dict[tuple, List[int]] = {}
        sequences = []
        for name_idx, tokens in trie.sequences():
            seq = [trie.root_token_id, *tokens]
            sequences.append(seq)
            self.sequence_names.setdefault(tuple(tokens), []).append(name_idx)
        self.dict_trie = DictTrie(sequences)

    @torch.inference_mode()
    def link(self, mentions: Sequence[Mention], top_k: Optional[int] = None) -> List[List[Candidate]]:
        lk = self.linker
        cfg = lk.decoding
        top_k = min(top_k or cfg.top_k, cfg.num_beams)
        results: List[List[Candidate]] = []
        for mention in mentions:
            if not has_linkable_text(mention.text, lk.kb.normalize):
                results.append([])
                continue
            enc = {k: v.to(lk.device) for k, v in lk.sources.pad(lk.encode_sources([mention])).items()}
            prompt = lk.prompt_tokens.prompts([lk.inputs.prompt(mention)])[0]
            prompt_len = len(prompt)

            def allowed(batch_id: int, sent: torch.Tensor, prompt_len: int = prompt_len) -> List[int]:
                # walk from the last prompt token, as GenBioEL does
                tokens = sent.tolist()[prompt_len - 1 :]
                return self.dict_trie.get(tokens) or [lk.pad_token_id]

            out = lk.model.generate(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                decoder_input_ids=torch.tensor([prompt], device=lk.device),
                num_beams=cfg.num_beams,
                num_return_sequences=top_k,
                max_length=prompt_len + lk.trie.max_depth,
                length_penalty=cfg.length_penalty,
                early_stopping=False,
                prefix_allowed_tokens_fn=allowed,
                output_scores=True,
                return_dict_in_generate=True,
                do_sample=False,
                use_cache=True,
                decoder_start_token_id=lk.prompt_tokens.decoder_start_token_id,
                eos_token_id=lk.eos_token_id,
                pad_token_id=lk.pad_token_id,
                bos_token_id=None,
                forced_bos_token_id=None,
                forced_eos_token_id=None,
                no_repeat_ngram_size=0,
                min_length=0,
            )
            ranked: List[Candidate] = []
            for seq, score in zip(out.sequences.tolist(), out.sequences_scores.tolist()):
                gen = seq[prompt_len:]
                if lk.eos_token_id not in gen or score < -1e5:
                    continue  # junk from Hugging Face's placeholder beams
                gen = gen[: gen.index(lk.eos_token_id) + 1]
                name_indices = self.sequence_names.get(tuple(gen))
                if not name_indices:
                    continue
                ids = tuple(dict.fromkeys(c for ni in name_indices for c in lk.kb.ids_for_name_index(ni)))
                ranked.append(Candidate(ids, lk.kb.names[name_indices[0]], float(score)))
            results.append(ranked)
        return results
