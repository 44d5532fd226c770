"""Encoder inputs, decoder prompts and trie-constrained batched beam search.

The linker reads ``left START mention END right`` and, prompted with
``"mention is"``, generates a KB name. Decoding is a vectorized port of the
Hugging Face beam search (same candidate selection, same finished-hypothesis
rule, same early-stopping heuristic, scores = mean log-probability of the
generated tokens with ``length_penalty=1``) with three differences that make it
fast:

* each distinct encoder input is encoded once, with the decoder's
  cross-attention keys and values: in document mode
  (:mod:`~spacy_genbioel.linking.inputs.documents`) all mentions of a document window
  share them; the decoder prompt is pre-filled once per mention and its KV
  cache copied to the beams;
* mentions with the same text, encoder input and allowed names are one search;
* the trie mask for every beam comes from flat arrays in one vectorized call
  (``TrieTensors.allowed_mask``), never a Python walk per beam per token;
* mentions whose search is over leave the batch, so long names do not keep
  short ones busy.

BART positions are absolute: left-padded prompts of different lengths share a
batch with each row's positions shifted back (:mod:`.prompt_batch`), and other
decoders group mentions by prompt length. Batched output equals one-at-a-time
output to float rounding (tests check it).

Retrieve, then generate: ``link(mentions, allowed=...)`` (or a ``retriever``
proposing ``num_candidates`` concepts per mention) limits each beam search to
the names of its allowed concepts (per-mention sub-tries,
:meth:`NameTrie.restrict`); ``exact_match`` ranks a KB name equal to the
normalized mention first (score 0) and ``shortcut_threshold`` does the same for
a confident retriever; ``search="forced"`` ranks the retriever's names by their
forced scores (:mod:`.forced`) without searching.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.decoding.candidates import CandidateSettings, allowed_name_sets, exact_matches
from spacy_genbioel.linking.decoding.forced import merge_lists, rank_by_forced
from spacy_genbioel.linking.decoding.prompt_batch import decoder_inputs, padded_prompts, prompt_batches, shiftable
from spacy_genbioel.linking.decoding.stages import (
    EncodedWindows,
    StageClock,
    distinct_searches,
    encoded_blocks,
    length_chunks,
    mention_inputs,
)
from spacy_genbioel.linking.inputs.builder import (
    InputBuilder,
    PromptTokenizer,
    SourceEncoder,
    has_linkable_text,
    model_max_positions,
)
from spacy_genbioel.linking.numbers import Bound, bounded, check_numbers
from spacy_genbioel.linking.trie.name_trie import NameTrie, TrieMismatchError, TrieRestriction
from spacy_genbioel.models import check_vocabulary, special_ids
from spacy_genbioel.ty import Candidate, Linker, Mention

logger = logging.getLogger(__name__)

_DEAD = -1.0e9  # Hugging Face's "impossible" score


@dataclass(frozen=True)
class DecodingSettings:
    """Trie-constrained beam search."""

    #: beams kept per mention
    num_beams: int = bounded(5, Bound(int, 1))
    #: candidates written per mention (at most ``num_beams``)
    top_k: int = bounded(5, Bound(int, 1))
    #: mentions decoded together
    batch_size: int = bounded(32, Bound(int, 1))
    #: encoder tokens per input (the context is trimmed around the mention to fit)
    max_source_tokens: int = bounded(256, Bound(int, 1))
    #: a KB name equal to the normalized mention is ranked first without generating
    exact_match: bool = False
    #: beam scores are summed log-probabilities divided by length ** length_penalty (1: the mean)
    length_penalty: float = bounded(1.0, Bound(float))
    #: mentions are encoded in blocks of this many batches: each distinct encoder input of a block
    #: is encoded once (a document window is never split); larger blocks share more, hold more memory
    block_batches: int = bounded(4, Bound(int, 1))
    #: ``beam``: trie-constrained beam search; ``forced``: rank the retriever's candidates
    #: (``candidates.retriever``) by the generator's forced scores (:mod:`.forced`), no search
    search: str = "beam"
    #: mentions of every prompt length share a batch (BART-like decoders, :mod:`.prompt_batch`); False: a batch
    #: per prompt length, as before (fewer mentions per batch: slower where few reach the generator)
    mixed_prompts: bool = True

    def __post_init__(self) -> None:
        check_numbers(self, "decoding")  # "5", ".5" (a config's or the command line's text) become numbers
        if self.search not in ("beam", "forced"):
            raise ValueError(f"search must be 'beam' or 'forced', got {self.search!r}")
        if self.top_k > self.num_beams:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed num_beams ({self.num_beams})")


class GenerativeLinker:
    """Links mentions to KB concepts with a seq2seq model and a name trie.

    Its settings are given once, at construction: ``inputs`` (what the model
    reads), ``decoding`` (the beam search) and ``candidates`` (how the
    ``retriever``'s proposals are used). ``retriever``: any
    :class:`~spacy_genbioel.ty.Linker` (``link(mentions, top_k)``); when given,
    ``link`` asks it for ``candidates.num_candidates`` candidates per mention and
    decodes only names of the concepts they carry.

    A ``trie`` given must fit the model, tokenizer and KB
    (:meth:`NameTrie.mismatch`); one that does not raises
    :class:`TrieMismatchError` saying why (the component then rebuilds it).
    """

    def __init__(
        self,
        model,
        tokenizer,
        kb: KnowledgeBase,
        trie: Optional[NameTrie] = None,
        *,
        inputs: Optional[InputBuilder] = None,
        decoding: Optional[DecodingSettings] = None,
        candidates: Optional[CandidateSettings] = None,
        retriever: Optional[Linker] = None,
    ) -> None:
        self.model = model
        self.retriever = retriever
        self.tokenizer = tokenizer
        self.kb = kb
        self.inputs = inputs or InputBuilder()
        self.decoding = decoding or DecodingSettings()
        self.candidates = candidates or CandidateSettings()
        if self.decoding.search == "forced" and retriever is None:
            raise ValueError("decoding.search = 'forced' scores a retriever's candidates: set candidates.retriever")
        self.model.eval()
        # transformers >= 5.2x names the decoder cache ``cache`` (``past_key_values`` is deprecated)
        self._cache_arg = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
        check_vocabulary(model, tokenizer)
        start, eos, pad = special_ids(model, tokenizer)
        self.eos_token_id, self.pad_token_id = eos, pad
        self.max_positions = model_max_positions(model)
        self.prompt_tokens = PromptTokenizer(
            tokenizer, start, eos, max_prompt_tokens=min(48, self.max_positions // 4), inputs=self.inputs
        )
        self.sources = SourceEncoder(tokenizer)
        root = self.prompt_tokens.root_token_id(self.inputs.prompt_suffix if self.inputs.decoder_prompt else None)
        if trie is not None:
            reasons = trie.mismatch(
                tokenizer, vocab_size=self.vocab_size, eos_token_id=eos, root_token_id=root, names=kb.names
            )
            if reasons:
                what = f"The trie {trie.source}" if trie.source else "The given trie"
                message = f"{what} does not fit this model, tokenizer and KB: {'; '.join(reasons)}"
                raise TrieMismatchError(message)
        if trie is None:
            trie = NameTrie.from_names(
                kb.names,
                tokenizer,
                eos_token_id=eos,
                root_token_id=root,
                vocab_size=self.vocab_size,
                max_name_tokens=min(128, self.max_positions - self.prompt_tokens.max_prompt_tokens),
            )
        self.trie = trie
        #: counts: ``mentions_decoded`` (sent to beam search), ``searches`` (distinct
        #: input, prompt and allowed names: what was actually decoded), ``encoder_inputs``
        #: and ``encoder_tokens`` (what the encoder read)
        self.stats: Counter = Counter()
        #: seconds per stage when set (tokenize, encoder, decoder, trie; beam: the search's own
        #: bookkeeping: softmax, top-k, reordering); None: not timed
        self.clock: Optional[StageClock] = None

    def _stage(self, name: str):
        return self.clock.stage(name) if self.clock is not None else nullcontext()

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def max_source_tokens(self) -> int:
        return min(self.decoding.max_source_tokens, self.max_positions, self.tokenizer.model_max_length or 10**6)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- public API ----------------------------------------------------------
    def link(
        self,
        mentions: Sequence[Mention],
        top_k: Optional[int] = None,
        allowed: Optional[Sequence[Optional[Sequence[str]]]] = None,
    ) -> List[List[Candidate]]:
        """Ranked candidates per mention (best first); an empty list where the
        mention has no text to link.

        ``allowed``: per mention, the concept IDs its name may come from (None:
        any). A name is allowed when any of its concepts is; the candidate still
        lists all the name's concepts. A mention whose allowed set is empty (or
        holds no concept with a name in the trie) is decoded unrestricted rather
        than left without an answer. Without ``allowed``, the ``retriever`` (if
        any) supplies the sets.
        """
        top_k = top_k or self.decoding.top_k
        results: List[List[Candidate]] = [[] for _ in mentions]
        if allowed is not None and len(allowed) != len(mentions):
            raise ValueError(f"allowed has {len(allowed)} entries for {len(mentions)} mentions")
        # nothing to link (only control characters, whitespace, emoji...): no answer, no decoding
        todo = [i for i, m in enumerate(mentions) if has_linkable_text(m.text, self.kb.normalize)]
        firsts = exact_matches(self.kb, mentions, todo) if self.decoding.exact_match else {}
        if top_k == 1:  # an exact match already fills the list: skip generation
            todo = [i for i in todo if i not in firsts]
        cfg = self.candidates
        retrieved: Dict[int, List[Candidate]] = {}
        if (
            self.retriever is not None
            and todo
            and (cfg.shortcut_threshold is not None or (allowed is None and cfg.restrict_to_candidates))
        ):
            retrieved = self._retrieve(mentions, todo)
        if cfg.shortcut_threshold is not None:
            for i, cands in retrieved.items():
                if i not in firsts and cands and cands[0].score >= cfg.shortcut_threshold:
                    firsts[i] = Candidate(cands[0].ids, cands[0].name, 0.0)
            if top_k == 1:
                todo = [i for i in todo if i not in firsts]
        for i, cand in firsts.items():
            results[i] = [cand]
        if not todo or self.trie.n_names == 0:
            return results
        if self.decoding.search == "forced":  # score the retrieved names instead of searching
            scored = rank_by_forced(
                self, [mentions[i] for i in todo], [(retrieved or self._retrieve(mentions, todo))[i] for i in todo]
            )
            for i, cands in zip(todo, scored):
                results[i] = merge_lists(results[i], cands)[:top_k]
            return results
        if allowed is None and retrieved and cfg.restrict_to_candidates:
            allowed = [self._concept_ids(retrieved[i]) if i in retrieved else None for i in range(len(mentions))]
        name_sets = allowed_name_sets(self.kb, [allowed[i] for i in todo]) if allowed is not None else None
        sources, prompts = mention_inputs(self, mentions, todo)
        unique, job_of = distinct_searches(sources, prompts, name_sets)
        self.stats["mentions_decoded"] += len(todo)
        self.stats["searches"] += len(unique)
        hyps_of: Dict[int, List[Tuple[float, int]]] = {}
        for positions, hyps in self._decode(
            [sources[p] for p in unique],
            [prompts[p] for p in unique],
            [name_sets[p] for p in unique] if name_sets is not None else None,
        ):
            for pos, hyp in zip(positions, hyps):
                hyps_of[pos] = hyp
        for pos, job in enumerate(job_of):
            i = todo[pos]
            results[i] = self._to_candidates(hyps_of[job], top_k, first=firsts.get(i))
        return results

    def propose(self, mentions: Sequence[Mention], which: Optional[Sequence[int]] = None) -> List[Optional[List[str]]]:
        """Allowed concept IDs per mention from the ``retriever``: the IDs
        of its top ``num_candidates`` candidates, in rank order (None for mentions
        not in ``which``)."""
        which = range(len(mentions)) if which is None else which
        retrieved = self._retrieve(mentions, which)
        return [self._concept_ids(retrieved[i]) if i in retrieved else None for i in range(len(mentions))]

    def _retrieve(self, mentions: Sequence[Mention], which: Sequence[int]) -> Dict[int, List[Candidate]]:
        """The ``retriever``'s top ``num_candidates`` candidates for the mentions in ``which``."""
        if self.retriever is None:
            raise ValueError("GenerativeLinker has no retriever")
        which = list(which)
        proposals = self.retriever.link([mentions[i] for i in which], self.candidates.num_candidates)
        return dict(zip(which, proposals))

    @staticmethod
    def _concept_ids(candidates: Sequence[Candidate]) -> List[str]:
        return list(dict.fromkeys(cid for c in candidates for cid in c.ids))

    # -- internals -----------------------------------------------------------
    def _to_candidates(
        self, hyps: List[Tuple[float, int]], top_k: int, first: Optional[Candidate] = None
    ) -> List[Candidate]:
        out: List[Candidate] = [first] if first is not None else []
        first_index = self.kb.name_index(first.name) if first is not None else None
        for score, node in hyps:
            if len(out) >= top_k:
                break
            name_indices = self.trie.names_at(node)
            if len(name_indices) == 0:
                continue
            if first_index is not None and bool((name_indices == first_index).any()):
                continue
            ids = tuple(dict.fromkeys(cid for ni in name_indices for cid in self.kb.ids_for_name_index(int(ni))))
            out.append(Candidate(ids, self.kb.names[int(name_indices[0])], float(score)))
        return out

    def encode_sources(self, mentions: Sequence[Mention]) -> List[List[int]]:
        """Encoder token ids per mention (:class:`SourceEncoder`: the mention and its
        markers always in, the context trimmed around them), as training builds them."""
        return self.sources.ids(mentions, self.inputs, self.max_source_tokens)

    def _decode(
        self, sources: List[List[int]], prompts: List[List[int]], name_sets: Optional[List[Optional[np.ndarray]]] = None
    ):
        """Yield (positions, hypotheses) per batch (of mixed prompt lengths where :attr:`mixes_prompts`).
        ``sources``: encoder token ids; ``name_sets`` (parallel to ``sources``)
        restricts mentions to those names.

        Mentions are taken in blocks of whole encoder inputs (one document window
        is never split across blocks); each distinct input of a block is encoded
        once, and every mention reading it is decoded from those states."""
        bs = self.decoding.batch_size
        for windows, row_of, groups in encoded_blocks(self, sources, prompts):
            for members in prompt_batches(groups, self.mixes_prompts):
                for start in range(0, len(members), bs):
                    chunk = members[start : start + bs]
                    restriction = self.trie.restrict([name_sets[i] for i in chunk], self.device) if name_sets else None
                    with self._stage("beam"):
                        hyps = self._search(
                            windows, [row_of[i] for i in chunk], [prompts[i] for i in chunk], restriction=restriction
                        )
                    yield chunk, hyps

    @property
    def mixes_prompts(self) -> bool:
        """Whether mentions of different prompt lengths share a decoder batch (``decoding.mixed_prompts``
        and a decoder whose positions can be shifted back, :func:`.prompt_batch.shiftable`)."""
        return self.decoding.mixed_prompts and shiftable(self.model)

    @torch.inference_mode()
    def encode_windows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> "EncodedWindows":
        """Encode distinct encoder inputs once: their attention mask and the
        decoder's cross-attention keys and values, which every mention reading
        them shares (a one-token decoder pass computes them, whatever the model).
        On CPU a right-padded batch is encoded in chunks of similar length
        (:func:`~.stages.length_chunks`), the keys and values padded back to the
        batch's width: the same states without the padding's cost."""
        device = self.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        with self._stage("encoder"):
            chunks = length_chunks(attention_mask) if device.type == "cpu" else None
            if chunks is None:
                kv, hidden = self._cross_kv(input_ids, attention_mask)
                return EncodedWindows(kv, attention_mask, tuple(hidden.shape[1:]), hidden.dtype)
            width = attention_mask.shape[1]
            kv = []
            for rows, length in chunks:
                part, hidden = self._cross_kv(input_ids[rows, :length], attention_mask[rows, :length])
                if not kv:
                    kv = [
                        tuple(t.new_zeros((len(input_ids), t.shape[1], width, *t.shape[3:])) for t in pair)
                        for pair in part
                    ]
                for whole, piece in zip(kv, part):
                    for full, chunk in zip(whole, piece):
                        full[rows, :, :length] = chunk
        return EncodedWindows(kv, attention_mask, (width, *hidden.shape[2:]), hidden.dtype)

    def _cross_kv(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """The encoder's states and, per decoder layer, the cross-attention keys and values."""
        encoder_outputs = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        start = torch.full(
            (input_ids.shape[0], 1),
            self.prompt_tokens.decoder_start_token_id,
            dtype=torch.long,
            device=input_ids.device,
        )
        out = self.model(
            encoder_outputs=encoder_outputs, attention_mask=attention_mask, decoder_input_ids=start, use_cache=True
        )
        cross = getattr(out, self._cache_arg).cross_attention_cache
        return [(layer.keys, layer.values) for layer in cross.layers], encoder_outputs.last_hidden_state

    @torch.inference_mode()
    def beam_search(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        prompt_ids: torch.Tensor,
        *,
        restriction: Optional[TrieRestriction] = None,
    ) -> List[List[Tuple[float, int]]]:
        """Constrained beam search, each mention with its own encoder input (row ``i`` of ``input_ids`` for
        mention ``i``).

        Returns per mention the finished hypotheses as (score, terminal trie
        node), best first, with Hugging Face's junk placeholders removed.
        ``restriction`` (rows = mentions of this batch) narrows the trie per mention.
        """
        windows = self.encode_windows(input_ids, attention_mask)
        return self._search(windows, list(range(input_ids.shape[0])), prompt_ids.tolist(), restriction=restriction)

    @torch.inference_mode()
    def _search(
        self,
        windows: "EncodedWindows",
        rows: Sequence[int],
        prompts: Sequence[Sequence[int]],
        *,
        restriction: Optional[TrieRestriction] = None,
    ) -> List[List[Tuple[float, int]]]:
        """Beam search; mention ``i`` reads encoded window ``rows[i]`` and is prompted with ``prompts[i]``
        (of one length, or of several for a decoder whose positions shift back)."""
        device = self.device
        model = self.model
        trie = self.trie.on_device(device)
        K = self.decoding.num_beams
        lp = self.decoding.length_penalty
        V = self.vocab_size
        n = len(rows)
        prompt_ids, pads = padded_prompts(prompts, self.pad_token_id, device)
        index = torch.tensor(rows, dtype=torch.long, device=device)
        # each mention's copy of its window's cross-attention keys and values
        cache = EncoderDecoderCache(
            DynamicCache(), DynamicCache([(k.index_select(0, index), v.index_select(0, index)) for k, v in windows.kv])
        )
        enc_mask = windows.mask.index_select(0, index)
        # the decoder reads the encoder states' shape only: their keys and values
        # are in the cache, so a zero-stride view stands in for them
        placeholder = torch.zeros((), dtype=windows.dtype, device=device)
        with self._stage("decoder"):
            out = model(
                encoder_outputs=BaseModelOutput(last_hidden_state=placeholder.expand(n, *windows.shape)),
                attention_mask=enc_mask,
                use_cache=True,
                **decoder_inputs(model, prompt_ids, pads, 0),
                **{self._cache_arg: cache},
            )
        cache = getattr(out, self._cache_arg)
        # the prompt is read once per mention; beams start from copies of its cache
        cache.batch_repeat_interleave(K)
        logits = out.logits[:, -1, :].float().repeat_interleave(K, dim=0)
        enc_mask = enc_mask.repeat_interleave(K, dim=0)
        pads = pads.repeat_interleave(K) if pads is not None else None
        past = prompt_ids.shape[1]
        del out

        max_new = self.trie.max_depth
        running = torch.full((n, K), _DEAD, device=device)
        running[:, 0] = 0.0
        nodes = torch.zeros(n * K, dtype=torch.long, device=device)
        fin_scores = torch.full((n, K), _DEAD, device=device)
        fin_nodes = torch.full((n, K), -1, dtype=torch.long, device=device)
        fin_done = torch.zeros((n, K), dtype=torch.bool, device=device)
        improvable = torch.ones(n, dtype=torch.bool, device=device)
        top_num_beam = torch.arange(2 * K, device=device) < K
        active = torch.arange(n, device=device)  # original row of each live mention
        results: List[List[Tuple[float, int]]] = [[] for _ in range(n)]
        beam_offsets = torch.arange(n, device=device)[:, None] * K

        for step in range(max_new):
            m = active.shape[0]
            log_probs = torch.log_softmax(logits, dim=-1)
            with self._stage("trie"):
                if restriction is None:
                    allowed_tokens = trie.allowed_mask(nodes, V)
                else:
                    allowed_tokens = restriction.allowed_mask(trie, nodes, active.repeat_interleave(K), V)
            log_probs = log_probs.masked_fill(~allowed_tokens, float("-inf"))
            acc = (log_probs.view(m, K, V) + running[:, :, None]).view(m, K * V)
            top_scores, top_idx = torch.topk(acc, 2 * K, dim=1)
            parent = top_idx // V
            token = top_idx % V
            hits = token == self.eos_token_id
            if step + 1 >= max_new:
                hits = torch.ones_like(hits)
            parent_rows = (parent + beam_offsets[:m]).view(-1)
            with self._stage("trie"):
                child = trie.advance(nodes[parent_rows], token.view(-1)).view(m, 2 * K)

            # running beams for the next step: best K that did not just finish
            run_all = top_scores + hits.float() * _DEAD
            keep = torch.topk(run_all, K, dim=1).indices
            running = torch.gather(run_all, 1, keep)
            keep_rows = torch.gather(parent, 1, keep) + beam_offsets[:m]
            nodes = torch.gather(child, 1, keep).view(-1)

            # finished hypotheses: only candidates within the top K count; those
            # grown from Hugging Face's dead placeholder beams are junk and skipped
            just = hits & top_num_beam[None, :] & (top_scores > _DEAD / 2)
            cand = top_scores / float((step + 1) ** lp)
            cand = cand + (~improvable[:, None]).float() * _DEAD + (~just).float() * _DEAD
            merged = torch.cat([fin_scores, cand], dim=1)
            best = torch.topk(merged, K, dim=1).indices
            fin_scores = torch.gather(merged, 1, best)
            fin_nodes = torch.gather(torch.cat([fin_nodes, child], dim=1), 1, best)
            fin_done = torch.gather(torch.cat([fin_done, just], dim=1), 1, best)

            # Hugging Face's stopping heuristic (early_stopping=False), per mention
            best_possible = running[:, :1] / float((step + 1) ** lp)
            worst = torch.where(
                fin_done, fin_scores.min(dim=1, keepdim=True).values, torch.full_like(fin_scores, _DEAD)
            )
            improvable = improvable & (best_possible > worst).any(dim=1) & ~hits.all(dim=1)

            next_tokens = torch.gather(token, 1, keep)
            finished = ~improvable
            if bool(finished.any()):
                for row in torch.nonzero(finished).view(-1).tolist():
                    results[int(active[row])] = finished_hypotheses(fin_scores[row], fin_nodes[row], fin_done[row])
                if bool(finished.all()):
                    break
                live = torch.nonzero(improvable).view(-1)
                live_beams = (live[:, None] * K + torch.arange(K, device=device)).view(-1)
                # keep_rows index the old rows, so one gather both reorders and drops
                keep_rows, next_tokens = keep_rows[live], next_tokens[live]
                active, running, improvable = active[live], running[live], improvable[live]
                fin_scores, fin_nodes, fin_done = fin_scores[live], fin_nodes[live], fin_done[live]
                nodes = nodes.view(-1, K)[live].view(-1)
                enc_mask = enc_mask[live_beams]
                pads = pads[live_beams] if pads is not None else None
                cache.reorder_cache(keep_rows.view(-1))
            else:
                reorder_self_attention(cache, keep_rows.view(-1))
            with self._stage("decoder"):
                out = model(
                    encoder_outputs=BaseModelOutput(
                        last_hidden_state=placeholder.expand(enc_mask.shape[0], *windows.shape)
                    ),
                    attention_mask=enc_mask,
                    use_cache=True,
                    **decoder_inputs(model, next_tokens.reshape(-1, 1), pads, past),
                    **{self._cache_arg: cache},
                )
            past += 1
            cache = getattr(out, self._cache_arg)
            logits = out.logits[:, -1, :].float()
            del out
        return results


def reorder_self_attention(cache, beam_idx: torch.Tensor) -> None:
    """Reorder beams within their mentions: beams of one mention share their cross-attention keys and
    values, so only the self-attention cache needs touching."""
    self_cache = getattr(cache, "self_attention_cache", None)
    (self_cache if self_cache is not None else cache).reorder_cache(beam_idx)


def finished_hypotheses(scores: torch.Tensor, nodes: torch.Tensor, done: torch.Tensor) -> List[Tuple[float, int]]:
    """A mention's finished hypotheses as (score, terminal trie node), in the order kept (best first)."""
    return [(float(s), int(n)) for s, n in zip(scores[done].tolist(), nodes[done].tolist())]
