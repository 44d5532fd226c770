"""DPO for a seq2seq linker: the sequence log-probabilities of the chosen
and rejected names after a mention's inference prompt, and the loss (or,
:func:`rank_loss`, a ranking loss on the forced scores the cascade reads, and
:func:`listwise_loss`, its softmax over each mention's whole list of names).

Both names of a pair are encoded by
:func:`~spacy_genbioel.training.seq2seq.encode_examples` with the mining
linker's prompt tokens, so ``log p / length`` of a candidate equals its beam
score; :func:`pair_logprobs` reads each mention's source once for both.
No label smoothing: it would change the probabilities DPO compares.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence
from transformers.modeling_outputs import BaseModelOutput

from spacy_genbioel.training.examples import TrainingExample
from spacy_genbioel.training.seq2seq import encode_examples

if TYPE_CHECKING:
    from spacy_genbioel.training.angel.mining import PreferencePair


def encode_pairs(
    pairs: Sequence[PreferencePair],
    tokenizer,
    prompts,
    inputs,
    pad_token_id: int,
    max_source_tokens: int = 256,
    sources=None,
) -> Dict[str, torch.Tensor]:
    """The chosen names (first half of the rows) and the rejected ones (second
    half) after each mention's inference prompt, by
    :func:`~spacy_genbioel.training.seq2seq.encode_examples` (``sources``: its
    :class:`~spacy_genbioel.linking.inputs.builder.SourceEncoder`, with the corpus's
    documents registered in document mode)."""
    examples = [TrainingExample(p.mention, p.chosen) for p in pairs] + [
        TrainingExample(p.mention, p.rejected) for p in pairs
    ]
    return encode_examples(examples, tokenizer, prompts, inputs, pad_token_id, max_source_tokens, sources)


def encode_lists(
    lists: Sequence[Sequence[PreferencePair]],
    tokenizer,
    prompts,
    inputs,
    pad_token_id: int,
    max_source_tokens: int = 256,
    sources=None,
) -> Dict[str, torch.Tensor]:
    """Each list (one mention's pairs, sharing their chosen name) as consecutive rows: the chosen
    name, then every rejected one, as :func:`encode_pairs` encodes them."""
    examples: List[TrainingExample] = []
    for pairs in lists:
        examples.append(TrainingExample(pairs[0].mention, pairs[0].chosen))
        examples.extend(TrainingExample(p.mention, p.rejected) for p in pairs)
    return encode_examples(examples, tokenizer, prompts, inputs, pad_token_id, max_source_tokens, sources)


def _label_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    token_nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return -token_nll.sum(dim=-1)


def sequence_logprobs(model, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``log p(name + EOS | source, prompt)`` per row of an
    :func:`~spacy_genbioel.training.seq2seq.encode_examples` batch: the sum of
    the log-probabilities of the labelled tokens, without label smoothing."""
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    )
    return _label_logprobs(out.logits, batch["labels"])


def pair_logprobs(model, batch: Mapping[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`sequence_logprobs` of an :func:`encode_pairs` batch as (chosen,
    rejected), reading each mention's source once for both names."""
    n = batch["decoder_input_ids"].shape[0] // 2
    mask = batch["attention_mask"][:n]
    encoded = model.get_encoder()(input_ids=batch["input_ids"][:n], attention_mask=mask, return_dict=True)
    out = model(
        encoder_outputs=BaseModelOutput(last_hidden_state=encoded.last_hidden_state.repeat(2, 1, 1)),
        attention_mask=mask.repeat(2, 1),
        decoder_input_ids=batch["decoder_input_ids"],
    )
    logps = _label_logprobs(out.logits, batch["labels"])
    return logps[:n], logps[n:]


def list_logprobs(model, batch: Mapping[str, torch.Tensor], sizes: Sequence[int]) -> torch.Tensor:
    """:func:`sequence_logprobs` of an :func:`encode_lists` batch whose lists have ``sizes`` rows,
    reading each list's source once."""
    counts = torch.as_tensor(list(sizes), device=batch["input_ids"].device)
    starts = torch.cumsum(counts, 0) - counts
    mask = batch["attention_mask"][starts]
    encoded = model.get_encoder()(input_ids=batch["input_ids"][starts], attention_mask=mask, return_dict=True)
    out = model(
        encoder_outputs=BaseModelOutput(last_hidden_state=encoded.last_hidden_state.repeat_interleave(counts, 0)),
        attention_mask=mask.repeat_interleave(counts, 0),
        decoder_input_ids=batch["decoder_input_ids"],
    )
    return _label_logprobs(out.logits, batch["labels"])


def listwise_loss(
    scores: torch.Tensor, sizes: Sequence[int], scale: float = 5.0, offsets: Optional[torch.Tensor] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-list softmax cross-entropy over ``scale`` x the forced scores of a list's names (``scores``:
    the lists' rows in order, each list's chosen name first) plus ``offsets`` (fixed per row: a retrieval
    prior, say), the chosen name being the answer; and each list's margin of forced scores alone, the chosen
    name's score less the best rejected one's (positive: the generator ranks it first)."""
    split = list(sizes)
    padded = pad_sequence(list(torch.split(scores, split)), batch_first=True, padding_value=-math.inf)
    logits = scale * padded
    if offsets is not None:
        logits = logits + pad_sequence(list(torch.split(offsets.to(logits), split)), batch_first=True)
    losses = -torch.log_softmax(logits, dim=-1)[:, 0]
    return losses, padded[:, 0] - padded[:, 1:].max(dim=-1).values


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-pair DPO loss and its logit ``beta * (chosen log-ratio - rejected
    log-ratio)`` (the implicit reward margin: positive when the policy moved
    towards the chosen name)."""
    logits = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return -F.logsigmoid(logits), logits


def rank_loss(chosen: torch.Tensor, rejected: torch.Tensor, scale: float = 5.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-pair logistic ranking loss on forced scores (``chosen`` and ``rejected``: mean log-probability per
    labelled token, the score the cascade ranks retrieved names by) and its logit ``scale * (chosen -
    rejected)``: positive when the model already ranks the chosen name first. No reference model: the
    score itself is what the cascade reads."""
    logits = scale * (chosen - rejected)
    return -F.logsigmoid(logits), logits
