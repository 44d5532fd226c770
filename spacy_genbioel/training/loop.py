"""What every training loop here shares: seeds, the budget clock, the
learning-rate schedule, the optimizer, autocast, one optimizer step and when
to log.

The training engine (:mod:`~spacy_genbioel.training.engine`), the short
seq2seq loop (:mod:`~spacy_genbioel.training.seq2seq`), ANGEL's DPO rounds
(:mod:`~spacy_genbioel.training.angel`) and SapBERT-style encoder training
(:mod:`~spacy_genbioel.training.sapbert`) differ in their data and losses;
the step itself (accumulate, clip, step, schedule) is :func:`train_step` in
all of them. Their progress bars are :class:`spacy_genbioel.progress.StepProgress`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from typing import Any, Callable, ContextManager, Optional, Tuple

import numpy as np
import torch


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def budget_clock(name: str) -> Callable[[], float]:
    """``wall`` (monotonic seconds) or ``cpu`` (process CPU time of all threads:
    a budget that does not shrink when other processes share the machine)."""
    if name == "wall":
        return time.monotonic
    if name == "cpu":
        return time.process_time
    raise ValueError(f"Unknown budget_clock {name!r}; use wall or cpu")


def lr_factor(config: Any, step: int, time_fraction: float = 0.0) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    ``config`` has the schedule settings of
    :class:`~spacy_genbioel.training.settings.EngineConfig` (``warmup_steps``,
    ``max_steps``, ``scheduler``, ``min_lr_ratio``, ``poly_power``,
    ``max_seconds``, ``schedule_horizon``; a config without the last decays
    over steps). ``time_fraction`` is the share of ``max_seconds`` already
    spent; with ``schedule_horizon = "budget"`` the decay follows whichever of
    steps and time is further along.
    """
    if config.warmup_steps and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.scheduler == "constant":
        return 1.0
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    horizon = getattr(config, "schedule_horizon", "steps")
    if horizon == "budget":
        if config.max_seconds:
            progress = max(progress, time_fraction)
    elif horizon != "steps":
        raise ValueError(f"Unknown schedule_horizon {horizon!r}; use steps or budget")
    progress = min(1.0, progress)
    floor = config.min_lr_ratio
    if config.scheduler == "clipped_cosine":
        return max(floor, 0.5 * (1 + math.cos(math.pi * progress)))
    if config.scheduler == "cosine":
        shape = 0.5 * (1 + math.cos(math.pi * progress))
    elif config.scheduler == "linear":
        shape = 1.0 - progress
    elif config.scheduler == "polynomial":
        shape = (1.0 - progress) ** config.poly_power
    else:
        raise ValueError(
            f"Unknown scheduler {config.scheduler!r}; use cosine, linear, polynomial, clipped_cosine or constant"
        )
    return floor + (1.0 - floor) * shape


def build_optimizer(model, config: Any) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (biases and norms exempt);
    ``config`` has ``learning_rate``, ``weight_decay``, ``adam_beta1``,
    ``adam_beta2`` and ``adam_eps``."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_eps,
    )


def autocast(device: torch.device, dtype: Optional[torch.dtype]) -> ContextManager:
    """Autocast to ``dtype`` on ``device``; ``None``: plain fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def train_step(
    model,
    optimizer: torch.optim.Optimizer,
    scheduler,
    micro_batch_loss: Callable[[], torch.Tensor],
    *,
    grad_accumulation: int = 1,
    max_grad_norm: float = 0.0,
    before_schedule: Optional[Callable[[], None]] = None,
) -> Tuple[float, float]:
    """One optimizer step over ``grad_accumulation`` calls of
    ``micro_batch_loss`` (each draws its own batch): backward, clip to
    ``max_grad_norm`` (0: no clipping), step, advance the schedule.
    ``before_schedule`` runs between the optimizer step and the schedule (the
    engine records the time spent there, which the schedule reads). Returns
    the mean micro-batch loss and the learning rate the step used."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for _ in range(grad_accumulation):
        loss = micro_batch_loss()
        (loss / grad_accumulation).backward()
        total += loss.detach().float().item()
    if max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    if before_schedule is not None:
        before_schedule()
    scheduler.step()
    return total / grad_accumulation, lr


def log_due(step: int, log_every: int) -> bool:
    """Whether optimizer step ``step`` (1-based) writes a log record: the first and every ``log_every``-th."""
    return bool(log_every) and (step % log_every == 0 or step == 1)
