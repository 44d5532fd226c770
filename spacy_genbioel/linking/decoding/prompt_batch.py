"""Decoder prompts of different lengths in one batch.

The decoder prompt is the mention itself ("reiter syndrome is"), so prompts
differ in length, and BART's decoder positions are absolute: left-padding a
batch of prompts would shift every position of the shorter ones. Until now
mentions were therefore grouped by prompt length and each group decoded
alone. That is cheap when thousands of mentions reach the generator, and
expensive when few do: a cascade sends it 3-15% of the mentions, spread over a
dozen prompt lengths, and each group is a search of its own, a dozen
sequential decoder steps, each reading the whole output layer.

Where the decoder's positions are a learned table added to the token
embeddings (BART, mBART: ``embed_positions``), the shift is undone exactly.
Each row gets its token embeddings plus ``P[its own position] - P[the batch's
position]``, and its padding is masked. Mentions of every prompt length then
share one batch. The log-probabilities equal those of the grouped search to
float rounding (about 4e-6 on a tiny BART; tests check 1e-4 on scores).
Other decoders (a BERT decoder, say) keep one group per length.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

__all__ = ["shiftable", "prompt_batches", "padded_prompts", "decoder_inputs"]

# position tables whose forward is ``weight[positions + offset]``, positions counted from the cache length
_SHIFTABLE = frozenset({"BartLearnedPositionalEmbedding", "MBartLearnedPositionalEmbedding"})


def shiftable(model: Any) -> bool:
    """Whether ``model``'s decoder takes prompts of different lengths in one batch (learned absolute positions)."""
    try:
        decoder = model.get_decoder()
    except (AttributeError, NotImplementedError):
        return False
    positions = getattr(decoder, "embed_positions", None)
    return (
        type(positions).__name__ in _SHIFTABLE
        and hasattr(positions, "offset")
        and getattr(decoder, "embed_tokens", None) is not None
    )


def prompt_batches(groups: Mapping[int, List[int]], mixed: bool) -> List[List[int]]:
    """The positions to decode together before chunking: one list per prompt length (``groups``,
    shortest first), or, ``mixed``, all of them in one list ordered by prompt length (so that a
    chunk of it pads little)."""
    if not mixed:
        return [list(members) for members in groups.values()]
    merged = [p for length in sorted(groups) for p in groups[length]]
    return [merged] if merged else []


def padded_prompts(
    prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Prompts left-padded to the longest: ``(ids, pads)``; ``pads``: each row's padding, None when
    every prompt has one length (the batch needs no shifting)."""
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    ids = torch.tensor([[pad_id] * pad + list(p) for p, pad in zip(prompts, pads)], dtype=torch.long, device=device)
    if not any(pads):
        return ids, None
    return ids, torch.tensor(pads, dtype=torch.long, device=device)


def decoder_inputs(
    model: Any, tokens: torch.Tensor, pads: Optional[torch.Tensor], past: int
) -> Dict[str, torch.Tensor]:
    """Keyword arguments of a decoder pass over ``tokens`` (rows x new tokens) after ``past`` cached
    positions, row ``r`` left-padded by ``pads[r]`` (None: no row is): the ids as they are, or
    embeddings whose positions are each row's own, with an attention mask over the padding."""
    if pads is None:
        return {"decoder_input_ids": tokens}
    decoder = model.get_decoder()
    table = decoder.embed_positions
    device = tokens.device
    batch_positions = torch.arange(past, past + tokens.shape[1], device=device)
    own = (batch_positions[None, :] - pads[:, None]).clamp(min=0)  # a padding token reads position 0: masked anyway
    weight = table.weight
    shift = weight[own + table.offset].float() - weight[batch_positions + table.offset].float()[None]
    embeds = decoder.embed_tokens(tokens)
    mask = torch.arange(past + tokens.shape[1], device=device)[None, :] >= pads[:, None]
    return {"decoder_inputs_embeds": (embeds.float() + shift).to(embeds.dtype), "decoder_attention_mask": mask.long()}
