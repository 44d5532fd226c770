"""A short, explicit seq2seq training loop.

Why not ``Seq2SeqTrainer``: the loss must cover only the name tokens and EOS
after a decoder prompt that is built exactly as at inference
(:class:`~spacy_genbioel.linking.decoder.PromptTokenizer`), with a wall-clock budget
for CPU runs; a 60-line loop says that more plainly than trainer callbacks.
"""
from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from spacy_genbioel.linking.decoder import InputBuilder, PromptTokenizer
from spacy_genbioel.models.bart import special_ids
from spacy_genbioel.training.examples import TrainingExample, iterate_forever

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    max_steps: int = 1000
    max_seconds: Optional[float] = None
    # "wall" or "cpu" (process CPU time of all threads: a budget that does not
    # shrink when other processes share the machine)
    budget_clock: str = "wall"
    batch_size: int = 64
    learning_rate: float = 5e-4
    weight_decay: float = 0.01
    warmup_steps: int = 50
    label_smoothing: float = 0.1
    max_grad_norm: float = 1.0
    max_source_tokens: int = 256
    seed: int = 0
    log_every: int = 50


def budget_clock(name: str):
    """``wall`` (monotonic seconds) or ``cpu`` (process CPU time of all threads:
    a budget that does not shrink when other processes share the machine)."""
    if name == "wall":
        return time.monotonic
    if name == "cpu":
        return time.process_time
    raise ValueError(f"Unknown budget_clock {name!r}; use wall or cpu")


def config_from_dict(cls, data, what: str):
    """``cls(**data)`` for a settings dataclass, naming unknown keys and the known ones."""
    from dataclasses import fields

    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"Unknown {what} settings: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return cls(**data)


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def encode_examples(
    examples: Sequence[TrainingExample],
    tokenizer,
    prompts: PromptTokenizer,
    inputs: InputBuilder,
    pad_token_id: int,
    max_source_tokens: int = 256,
) -> Dict[str, torch.Tensor]:
    """Encoder inputs, decoder inputs and labels; labels are -100 on the prompt,
    so the loss covers the name tokens and EOS only."""
    enc = tokenizer(
        [inputs.source(e.mention) for e in examples], return_tensors="pt", padding=True, truncation=True,
        max_length=max_source_tokens,
    )
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
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "decoder_input_ids": dec, "labels": labels}


def sequence_loss(model, batch: Dict[str, torch.Tensor], label_smoothing: float = 0.0) -> torch.Tensor:
    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=batch["decoder_input_ids"]
    )
    logits = out.logits.float()
    return torch.nn.functional.cross_entropy(
        logits.view(-1, logits.shape[-1]), batch["labels"].view(-1), ignore_index=-100, label_smoothing=label_smoothing
    )


def train_seq2seq(
    model,
    tokenizer,
    examples: List[TrainingExample],
    config: TrainConfig,
    inputs: Optional[InputBuilder] = None,
    device: Optional[torch.device] = None,
) -> List[float]:
    """Train in place; returns the loss of every step."""
    if not examples:
        raise ValueError("No training examples")
    set_seed(config.seed)
    inputs = inputs or InputBuilder()
    device = device or next(model.parameters()).device
    start_id, eos_id, pad_id = special_ids(model, tokenizer)
    prompts = PromptTokenizer(tokenizer, start_id, eos_id)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.learning_rate,
    )

    def lr_factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
        return max(0.05, 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    stream = iterate_forever(examples, config.seed)
    model.train()
    losses: List[float] = []
    clock = budget_clock(config.budget_clock)
    began = clock()
    for step in range(config.max_steps):
        batch = [next(stream) for _ in range(config.batch_size)]
        tensors = {k: v.to(device) for k, v in encode_examples(batch, tokenizer, prompts, inputs, pad_id, config.max_source_tokens).items()}
        loss = sequence_loss(model, tensors, config.label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        losses.append(loss.detach().item())
        if config.log_every and step % config.log_every == 0:
            logger.info("step %d loss %.4f lr %.2e", step, losses[-1], scheduler.get_last_lr()[0])
        if config.max_seconds is not None and clock() - began > config.max_seconds:
            logger.info("time budget of %.0fs reached at step %d", config.max_seconds, step + 1)
            break
    model.eval()
    return losses
