"""The seq2seq objective and the short loop built on it.

:func:`encode_examples` builds a batch exactly as inference sees it: the
encoder text and the decoder prompt (``"mention is"``) of
:class:`~spacy_genbioel.linking.inputs.builder.InputBuilder`, tokenized by the
linker's :class:`~spacy_genbioel.linking.inputs.builder.SourceEncoder` and
:class:`~spacy_genbioel.linking.inputs.builder.PromptTokenizer`, with labels
on the name tokens and EOS only. :class:`Seq2SeqLoss` is the loss of a
micro-batch, the step the training engine and :func:`train_seq2seq` both
take.

Why not ``Seq2SeqTrainer``: the loss must cover only the name tokens and EOS
after a decoder prompt that is built exactly as at inference, with a
wall-clock budget for CPU runs; :func:`train_seq2seq` (the demo's and the
benchmark's quick model: no checkpoints, no evaluation) says that more
plainly than trainer callbacks. Longer runs use
:class:`~spacy_genbioel.training.engine.TrainingEngine`.
"""

from __future__ import annotations

import logging
from dataclasses import fields
from functools import partial
from typing import Dict, List, Optional, Sequence

import torch

from spacy_genbioel.linking.inputs.builder import InputBuilder, PromptTokenizer, SourceEncoder
from spacy_genbioel.models import special_ids
from spacy_genbioel.training.examples import TrainingExample, iterate_forever
from spacy_genbioel.training.loop import autocast, budget_clock, build_optimizer, lr_factor, set_seed, train_step
from spacy_genbioel.training.settings import EngineConfig, TrainConfig

logger = logging.getLogger(__name__)

__all__ = ["TrainConfig", "Seq2SeqLoss", "encode_examples", "sequence_loss", "train_seq2seq"]


def encode_examples(
    examples: Sequence[TrainingExample],
    tokenizer,
    prompts: PromptTokenizer,
    inputs: InputBuilder,
    pad_token_id: int,
    max_source_tokens: int = 256,
    sources: Optional[SourceEncoder] = None,
) -> Dict[str, torch.Tensor]:
    """Encoder inputs, decoder inputs and labels; labels are -100 on the prompt,
    so the loss covers the name tokens and EOS only. The encoder inputs come
    from the linker's :class:`~spacy_genbioel.linking.inputs.builder.SourceEncoder`
    (the mention and its markers always in, the context trimmed around them);
    pass ``sources`` to keep one encoder's counts across batches."""
    enc = (sources or SourceEncoder(tokenizer)).encode([e.mention for e in examples], inputs, max_source_tokens)
    prompt_ids = prompts.prompts([inputs.prompt(e.mention) for e in examples])
    target_ids = prompts.targets([e.target for e in examples])
    full = [p + t for p, t in zip(prompt_ids, target_ids)]
    width = max(len(f) for f in full) - 1
    dec = torch.full((len(full), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(full), width), -100, dtype=torch.long)
    for row, (seq, prompt) in enumerate(zip(full, prompt_ids)):
        dec[row, : len(seq) - 1] = torch.tensor(seq[:-1])
        first = len(prompt) - 1  # position whose next token is the first name token
        labels[row, first : len(seq) - 1] = torch.tensor(seq[len(prompt) :])
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "decoder_input_ids": dec,
        "labels": labels,
    }


def sequence_loss(model, batch: Dict[str, torch.Tensor], label_smoothing: float = 0.0) -> torch.Tensor:
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        decoder_input_ids=batch["decoder_input_ids"],
    )
    logits = out.logits.float()
    return torch.nn.functional.cross_entropy(
        logits.view(-1, logits.shape[-1]), batch["labels"].view(-1), ignore_index=-100, label_smoothing=label_smoothing
    )


class Seq2SeqLoss:
    """The loss of a micro-batch of examples: encoded by :func:`encode_examples`,
    moved to ``device``, the forward pass under autocast to ``autocast_dtype``
    (``None``: fp32), label-smoothed cross-entropy on the name tokens."""

    def __init__(
        self,
        model,
        tokenizer,
        inputs: InputBuilder,
        device: torch.device,
        *,
        max_source_tokens: int = 256,
        label_smoothing: float = 0.0,
        autocast_dtype: Optional[torch.dtype] = None,
    ) -> None:
        self.model, self.tokenizer, self.inputs, self.device = model, tokenizer, inputs, device
        self.max_source_tokens, self.label_smoothing, self.autocast_dtype = (
            max_source_tokens,
            label_smoothing,
            autocast_dtype,
        )
        start_id, eos_id, self.pad_id = special_ids(model, tokenizer)
        self.prompts = PromptTokenizer(tokenizer, start_id, eos_id, inputs=inputs)
        self.sources = SourceEncoder(tokenizer)

    def __call__(self, batch: Sequence[TrainingExample]) -> torch.Tensor:
        tensors = encode_examples(
            batch, self.tokenizer, self.prompts, self.inputs, self.pad_id, self.max_source_tokens, self.sources
        )
        tensors = {k: v.to(self.device, non_blocking=True) for k, v in tensors.items()}
        with autocast(self.device, self.autocast_dtype):
            return sequence_loss(self.model, tensors, self.label_smoothing)


def train_seq2seq(
    model,
    tokenizer,
    examples: List[TrainingExample],
    config: TrainConfig,
    inputs: Optional[InputBuilder] = None,
    device: Optional[torch.device] = None,
    stop_after: Optional[int] = None,
) -> List[float]:
    """Train in place on shuffled epochs of ``examples`` (fp32, warm-up then a
    cosine decay clipped at 5 % of the peak, until ``max_steps`` or
    ``max_seconds``); returns the loss of every step. ``stop_after``: stop after
    that many steps, the schedule still shaped by ``max_steps``."""
    if not examples:
        raise ValueError("No training examples")
    set_seed(config.seed)
    device = device or next(model.parameters()).device
    batch_loss = Seq2SeqLoss(
        model,
        tokenizer,
        inputs or InputBuilder(),
        device,
        max_source_tokens=config.max_source_tokens,
        label_smoothing=config.label_smoothing,
    )
    schedule = EngineConfig(
        **{f.name: getattr(config, f.name) for f in fields(TrainConfig)},
        scheduler="clipped_cosine",
        min_lr_ratio=0.05,
        schedule_horizon="steps",
    )
    optimizer = build_optimizer(model, schedule)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(schedule, s))
    stream = iterate_forever(examples, config.seed)
    model.train()
    losses: List[float] = []
    clock = budget_clock(config.budget_clock)
    began = clock()
    for step in range(min(config.max_steps, stop_after if stop_after is not None else config.max_steps)):
        batch = [next(stream) for _ in range(config.batch_size)]
        loss, _ = train_step(
            model, optimizer, scheduler, partial(batch_loss, batch), max_grad_norm=config.max_grad_norm
        )
        losses.append(loss)
        if config.log_every and step % config.log_every == 0:
            logger.info("step %d loss %.4f lr %.2e", step, losses[-1], scheduler.get_last_lr()[0])
        if config.max_seconds is not None and clock() - began > config.max_seconds:
            logger.info("time budget of %.0fs reached at step %d", config.max_seconds, step + 1)
            break
    model.eval()
    return losses
