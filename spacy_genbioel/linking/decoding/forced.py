"""Forced scoring: the generator's score of given names, without searching.

Beam search asks the generator which name to write, a dozen sequential decoder
steps with trie masks and beam bookkeeping. A reranker asks a cheaper question:
how likely is *this* name (teacher forcing)? The score of a name is what the
beam would give it: the sum of the log-probabilities of its tokens and EOS
(``log_softmax`` over the whole vocabulary: the trie masks names, it never
renormalizes) divided by ``length ** length_penalty``. For the names a beam
search returns, the two agree to float precision (tests check 1e-5).

Cost: the work is shared the way beam search shares it. Each distinct encoder
input is encoded once with its cross-attention keys and values
(:meth:`GenerativeLinker.encode_windows`); each mention's prompt is run once
and its self-attention cache copied to its candidates; then all candidate names
of a batch of mentions go through the decoder in one parallel pass (names
right-padded: the decoder is causal, padding after a name changes nothing
before it). Mentions of different prompt lengths share a batch as in beam
search (:mod:`.prompt_batch`), so the result depends on the batch only to
float rounding.

A name outside the trie (longer than the trie's limit, say) cannot be scored:
its score is None.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from spacy_genbioel.linking.decoding.prompt_batch import decoder_inputs, padded_prompts, prompt_batches
from spacy_genbioel.linking.decoding.stages import encoded_blocks, mention_inputs
from spacy_genbioel.linking.inputs.builder import has_linkable_text
from spacy_genbioel.ty import Candidate, Mention

__all__ = ["NameTokens", "forced_scores", "rank_by_forced", "merge_lists", "length_groups"]


class NameTokens:
    """Token ids (EOS included) of KB names, read back from the trie once and cached."""

    def __init__(self, trie) -> None:
        self.trie = trie
        self._cache: Dict[int, Optional[Tuple[int, ...]]] = {}

    def __call__(self, name_index: Optional[int]) -> Optional[Tuple[int, ...]]:
        if name_index is None:
            return None
        if name_index in self._cache:
            return self._cache[name_index]
        terminals = self.trie.name_terminals
        node = int(terminals[name_index]) if 0 <= name_index < len(terminals) else -1
        tokens: Optional[Tuple[int, ...]] = None
        if node > 0:
            path = []
            while node > 0:
                path.append(int(self.trie.child_tokens[node - 1]))
                node = int(self.trie.edge_keys[node - 1] // self.trie.vocab_size)
            tokens = tuple(reversed(path))
        self._cache[name_index] = tokens
        return tokens


def _name_tokens(linker: Any) -> NameTokens:
    cached = getattr(linker, "_forced_name_tokens", None)
    if cached is None or cached.trie is not linker.trie:
        cached = NameTokens(linker.trie)
        linker._forced_name_tokens = cached
    return cached


def forced_scores(
    linker: Any, mentions: Sequence[Mention], names: Sequence[Sequence[str]]
) -> List[List[Optional[float]]]:
    """Per mention, the generator's length-normalized log-probability of each of its ``names``
    (KB names; None for a name the trie does not hold, or a mention with nothing to link)."""
    if len(names) != len(mentions):
        raise ValueError(f"names has {len(names)} entries for {len(mentions)} mentions")
    tokens_of = _name_tokens(linker)
    kb = linker.kb
    out: List[List[Optional[float]]] = [[None] * len(n) for n in names]
    seqs: List[List[Optional[Tuple[int, ...]]]] = [[tokens_of(kb.name_index(name)) for name in n] for n in names]
    todo = [
        i
        for i, m in enumerate(mentions)
        if any(s is not None for s in seqs[i]) and has_linkable_text(m.text, kb.normalize)
    ]
    if not todo:
        return out
    sources, prompts = mention_inputs(linker, mentions, todo)
    linker.stats["mentions_scored"] += len(todo)
    max_rows = linker.decoding.batch_size * linker.decoding.num_beams
    for windows, row_of, groups in encoded_blocks(linker, sources, prompts):
        for members in prompt_batches(groups, linker.mixes_prompts):
            sizes = [sum(s is not None for s in seqs[todo[p]]) for p in members]
            for chunk in _chunks(members, sizes, linker.decoding.batch_size, max_rows):
                scores = _score_chunk(
                    linker,
                    windows,
                    [row_of[p] for p in chunk],
                    [prompts[p] for p in chunk],
                    [seqs[todo[p]] for p in chunk],
                )
                for p, row in zip(chunk, scores):
                    out[todo[p]] = row
    return out


def _chunks(members: List[int], sizes: List[int], max_mentions: int, max_rows: int):
    """Consecutive runs of mentions holding at most ``max_mentions`` mentions and ``max_rows`` names
    (a mention with more names than ``max_rows`` is a run of its own)."""
    chunk: List[int] = []
    rows = 0
    for member, size in zip(members, sizes):
        if chunk and (len(chunk) >= max_mentions or rows + size > max_rows):
            yield chunk
            chunk, rows = [], 0
        chunk.append(member)
        rows += size
    if chunk:
        yield chunk


@torch.inference_mode()
def _score_chunk(
    linker: Any,
    windows,
    rows: Sequence[int],
    prompts: Sequence[Sequence[int]],
    seqs: Sequence[Sequence[Optional[Tuple[int, ...]]]],
) -> List[List[Optional[float]]]:
    """Forced scores of the names of a batch of mentions (prompts of one length, or left-padded,
    :mod:`.prompt_batch`)."""
    model, device = linker.model, linker.device
    n = len(rows)
    index = torch.tensor(list(rows), dtype=torch.long, device=device)
    cache = EncoderDecoderCache(
        DynamicCache(), DynamicCache([(k.index_select(0, index), v.index_select(0, index)) for k, v in windows.kv])
    )
    enc_mask = windows.mask.index_select(0, index)
    placeholder = torch.zeros((), dtype=windows.dtype, device=device)
    arg = linker._cache_arg
    prompt_ids, pads = padded_prompts(prompts, linker.pad_token_id, device)
    with linker._stage("decoder"):
        out = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=placeholder.expand(n, *windows.shape)),
            attention_mask=enc_mask,
            use_cache=True,
            **decoder_inputs(model, prompt_ids, pads, 0),
            **{arg: cache},
        )
    first = torch.log_softmax(out.logits[:, -1, :].float(), dim=-1)  # (n, V): each name's first token
    cache = getattr(out, arg)
    del out
    owner: List[int] = []
    names: List[Tuple[int, ...]] = []
    for m, mention_seqs in enumerate(seqs):
        for s in mention_seqs:
            if s is not None:
                owner.append(m)
                names.append(s)
    results: List[List[Optional[float]]] = [[None] * len(s) for s in seqs]
    if not names:
        return results
    owner_t = torch.tensor(owner, dtype=torch.long, device=device)
    lengths = torch.tensor([len(s) for s in names], dtype=torch.long, device=device)
    width = int(lengths.max())
    target = torch.full((len(names), width), linker.pad_token_id, dtype=torch.long, device=device)
    for r, s in enumerate(names):
        target[r, : len(s)] = torch.tensor(s, dtype=torch.long)
    logp = first.index_select(0, owner_t).gather(1, target[:, :1])  # (R, 1)
    if width > 1:
        logp = torch.cat([logp, torch.zeros((len(names), width - 1), dtype=logp.dtype, device=device)], dim=1)
        # names of similar lengths run together: a group is padded to its own longest name, not the chunk's
        for group in length_groups([len(s) for s in names]):
            span = max(len(names[r]) for r in group)
            if span < 2:
                continue
            rows_t = torch.tensor(group, dtype=torch.long, device=device)
            owners, tokens = owner_t.index_select(0, rows_t), target.index_select(0, rows_t)[:, :span]
            with linker._stage("decoder"):  # each name starts from its mention's prompt cache
                out = model(
                    encoder_outputs=BaseModelOutput(last_hidden_state=placeholder.expand(len(group), *windows.shape)),
                    attention_mask=enc_mask.index_select(0, owners),
                    use_cache=True,
                    **decoder_inputs(
                        model,
                        tokens[:, :-1],
                        pads.index_select(0, owners) if pads is not None else None,
                        prompt_ids.shape[1],
                    ),
                    **{arg: _rows_of(cache, owners)},
                )
            logp[rows_t, 1:span] = torch.log_softmax(out.logits.float(), dim=-1).gather(2, tokens[:, 1:, None])[:, :, 0]
            del out
    valid = torch.arange(width, device=device)[None, :] < lengths[:, None]
    total = logp.masked_fill(~valid, 0.0).sum(dim=1)
    normalized = (total / lengths.float() ** linker.decoding.length_penalty).tolist()
    cursor = 0
    for m, mention_seqs in enumerate(seqs):
        for j, s in enumerate(mention_seqs):
            if s is not None:
                results[m][j] = float(normalized[cursor])
                cursor += 1
    return results


def _rows_of(cache: EncoderDecoderCache, rows: torch.Tensor) -> EncoderDecoderCache:
    """A new cache of ``rows`` of ``cache``'s self- and cross-attention keys and values; ``cache`` is left as it is."""

    def pick(part):
        return DynamicCache(
            [(layer.keys.index_select(0, rows), layer.values.index_select(0, rows)) for layer in part.layers]
        )

    return EncoderDecoderCache(pick(cache.self_attention_cache), pick(cache.cross_attention_cache))


def length_groups(lengths: Sequence[int], slack: float = 1.25) -> List[List[int]]:
    """Indices of ``lengths`` in groups of similar lengths (shortest first), each group's padded size
    (members x its longest) at most ``slack`` times its real size: the decoder runs one pass per group
    instead of padding every name to the longest of the chunk (NCBI's candidate names: 2.5x the tokens)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: List[List[int]] = []
    total = 0
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[i] <= slack * (total + lengths[i]):
            groups[-1].append(i)
            total += lengths[i]
        else:
            groups.append([i])
            total = lengths[i]
    return groups


def rank_by_forced(
    linker: Any, mentions: Sequence[Mention], proposals: Sequence[Sequence[Candidate]]
) -> List[List[Candidate]]:
    """The names of each mention's ``proposals`` (any sources' candidates), each once, ranked
    by the generator's forced score (the scores replace the proposers'); names it cannot
    score are dropped. A candidate lists every concept of its name, as the beam's do."""
    kb = linker.kb
    names = [list(dict.fromkeys(c.name for c in cands)) for cands in proposals]
    scores = forced_scores(linker, mentions, names)
    out: List[List[Candidate]] = []
    for mention_names, mention_scores in zip(names, scores):
        scored = [(s, name) for name, s in zip(mention_names, mention_scores) if s is not None]
        order = sorted(range(len(scored)), key=lambda j: (-scored[j][0], j))
        out.append([Candidate(_ids(kb, scored[j][1]), scored[j][1], float(scored[j][0])) for j in order])
    return out


def _ids(kb, name: str) -> Tuple[str, ...]:
    index = kb.name_index(name)
    return tuple(kb.ids_for_name_index(index)) if index is not None else ()


def merge_lists(first: Sequence[Candidate], second: Sequence[Candidate]) -> List[Candidate]:
    """Two generator lists of one mention (beam and forced scores: one scale) as one, best first,
    each name once at its better score."""
    best: Dict[str, Candidate] = {}
    for cand in (*first, *second):
        if cand.name not in best or cand.score > best[cand.name].score:
            best[cand.name] = cand
    return sorted(best.values(), key=lambda c: -c.score)
