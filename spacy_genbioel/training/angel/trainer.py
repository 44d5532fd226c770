"""ANGEL's rounds (:class:`AngelTrainer`) and the ``angel`` project step
(:func:`angel`); the method and the decisions are in the package docstring
(:mod:`spacy_genbioel.training.angel`).

The training engine supplies the device, precision, dev evaluation with
best-model bookkeeping, the log and the export, and
:func:`~spacy_genbioel.training.loop.train_step` the optimizer step, so the
stage leaves the same files as the others (``model``, ``best``,
``train_log.jsonl``, ``curve.png``) plus ``pairs/round_NNN.jsonl``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from spacy_genbioel.evaluation.recall import gold_id_set
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.linking.decoding.candidates import make_candidate_generator
from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.progress import StepProgress
from spacy_genbioel.retrieval.tfidf import TfidfLinker
from spacy_genbioel.training.angel.dpo import (
    dpo_loss,
    encode_lists,
    encode_pairs,
    list_logprobs,
    listwise_loss,
    pair_logprobs,
    rank_loss,
)
from spacy_genbioel.training.angel.mining import (
    GoldFallback,
    PreferencePair,
    group_lists,
    kb_negative_pairs,
    mine_pairs,
    prior_floor,
    rank_priors,
    weight_deferred,
    write_pairs_jsonl,
)
from spacy_genbioel.training.engine import TrainingEngine, TrainResult
from spacy_genbioel.training.evaluator import mining_candidates, stage_evaluator
from spacy_genbioel.training.examples import read_mentions_jsonl
from spacy_genbioel.training.loop import (
    autocast,
    budget_clock,
    build_optimizer,
    log_due,
    lr_factor,
    set_seed,
    train_step,
)
from spacy_genbioel.training.settings import AngelConfig, load_stage_config
from spacy_genbioel.training.sources import ExampleSource, SampledSource
from spacy_genbioel.training.stages import kb_guided_examples, load_for_training
from spacy_genbioel.ty import Linker, Mention
from spacy_genbioel.util import PathLike, atomic_json

logger = logging.getLogger(__name__)

PAIRS_DIR = "pairs"


# -- results ------------------------------------------------------------------------------------
@dataclass
class AngelResult:
    rounds: List[Dict[str, Any]] = field(default_factory=list)  # one record per round (the log's "round" events)
    step: int = 0  # optimizer steps over all rounds
    baseline_metric: Optional[float] = None  # dev metric of the start model
    best_round: Optional[int] = None  # 0: no round beat the start model
    best_metric: Optional[float] = None
    stopped_by: str = "rounds"  # rounds | patience | max_seconds | max_steps
    seconds: float = 0.0
    model_dir: Optional[Path] = None

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["model_dir"] = str(self.model_dir) if self.model_dir else None
        return data


# -- the rounds -----------------------------------------------------------------------------------
class AngelTrainer:
    """Negative-aware rounds on a model in place; see the module docstring.

    ``engine`` (a :class:`~spacy_genbioel.training.engine.TrainingEngine`) holds
    the model, tokenizer, ``[training]`` and ``[inputs]`` settings, device and
    output folder. Its ``evaluate(model, tokenizer)`` returns the dev metrics
    (``config.eval_metric`` among them); without it every round runs and
    the last model is exported. ``kb_examples`` (e.g.
    :class:`~spacy_genbioel.training.pretraining.PretrainingExamples`) supplies
    the examples of ``angel.kb_negatives`` KB-negative pairs per round.
    An engine without ``out_dir`` writes nothing (tests, experiments).
    """

    def __init__(
        self,
        engine: TrainingEngine,
        kb: KnowledgeBase,
        angel: Optional[AngelConfig] = None,
        *,
        kb_examples: Optional[ExampleSource] = None,
    ) -> None:
        self.angel = angel or AngelConfig()
        if self.angel.kb_negatives and kb_examples is None:
            raise ValueError("kb_negatives needs kb_examples (KB-guided pre-training examples)")
        # the engine supplies the model, the device, precision, optimizer groups, dev
        # evaluation with best-model bookkeeping, the log and the export
        self.engine = engine
        model, tokenizer, config = engine.model, engine.tokenizer, engine.config
        self.model, self.tokenizer, self.kb, self.config = model, tokenizer, kb, config
        self.inputs = self.engine.inputs
        self.kb_examples = kb_examples
        decoding = DecodingSettings(
            num_beams=max(self.angel.num_beams, self.angel.top_k),
            top_k=self.angel.top_k,
            batch_size=self.angel.mine_batch_size,
            max_source_tokens=config.max_source_tokens,
        )
        # forced mining asks the cascade's question (the forced score of each retrieved name); the
        # retriever also tells which mentions the cascade would hand to the generator (deferred_weight)
        candidates = mining_candidates(self.angel)
        forced = self.angel.mining == "forced"
        self.retriever: Optional[Linker] = None
        if forced or self.angel.deferred_weight != 1.0:
            self.retriever = make_candidate_generator(candidates.retriever, kb, candidates.model)
        self.linker = GenerativeLinker(
            model,
            tokenizer,
            kb,
            inputs=self.inputs,
            decoding=replace(decoding, search="forced") if forced else decoding,
            candidates=candidates if forced else None,
            retriever=self.retriever if forced else None,
        )
        # the pairs are scored after the prompt the mining search used, token for token
        self.prompts = self.linker.prompt_tokens
        self._fallback: Optional[GoldFallback] = None
        self._priors: Dict[int, Dict[str, float]] = {}  # id(mention) -> name -> retrieval prior (this round's)
        self._tfidf = None

    @property
    def out_dir(self) -> Optional[Path]:
        return self.engine.out_dir

    # -- scoring --------------------------------------------------------------------------
    def _autocast(self):
        return autocast(self.engine.device, self.engine.autocast_dtype)

    def _encode(self, pairs: Sequence[Any], encode: Callable[..., Dict[str, torch.Tensor]] = encode_pairs):
        """``pairs`` (or, with ``encode=encode_lists``, lists) encoded after the mining prompt, on the device."""
        batch = encode(
            pairs,
            self.tokenizer,
            self.prompts,
            self.inputs,
            self.engine.pad_id,
            self.config.max_source_tokens,
            self.engine.loss.sources,
        )
        return {k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()}

    def score_pairs(
        self, pairs: Sequence[PreferencePair], batch_size: Optional[int] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) sequence log-probabilities of the current model,
        without dropout or gradients, on the CPU."""
        batch_size = batch_size or 2 * self.config.batch_size
        chosen: List[torch.Tensor] = []
        rejected: List[torch.Tensor] = []
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            for begin in range(0, len(pairs), batch_size):
                with self._autocast():
                    c, r = pair_logprobs(self.model, self._encode(pairs[begin : begin + batch_size]))
                chosen.append(c.float().cpu())
                rejected.append(r.float().cpu())
        self.model.train(was_training)
        if not chosen:
            return torch.zeros(0), torch.zeros(0)
        return torch.cat(chosen), torch.cat(rejected)

    def _batch_loss(self, pairs: Sequence[PreferencePair], ref_chosen: torch.Tensor, ref_rejected: torch.Tensor):
        tensors = self._encode(pairs)
        with self._autocast():
            chosen, rejected = pair_logprobs(self.model, tensors)
        device = chosen.device
        n_tokens = (tensors["labels"] != -100).sum(dim=-1).clamp(min=1)
        n_chosen, n_rejected = n_tokens[: len(pairs)], n_tokens[len(pairs) :]
        if self.angel.loss == "rank":  # the forced scores the cascade compares
            losses, logits = rank_loss(chosen / n_chosen, rejected / n_rejected, self.angel.rank_scale)
        else:
            losses, logits = dpo_loss(chosen, rejected, ref_chosen.to(device), ref_rejected.to(device), self.angel.beta)
        weights = torch.tensor([p.weight for p in pairs], dtype=losses.dtype, device=device)
        loss = (losses * weights).sum() / weights.sum()  # the mean when every pair weighs 1
        if self.angel.sft_weight:
            loss = loss + self.angel.sft_weight * (-chosen / n_chosen).mean()
        return loss, logits.detach(), (chosen - rejected).detach()

    def _lists_loss(self, lists: Sequence[Sequence[PreferencePair]]):
        """``loss = "listwise"``: the weighted mean of the lists' :func:`listwise_loss` (plus
        ``sft_weight`` x the chosen names' mean token NLL) and each list's margin."""
        tensors = self._encode(lists, encode_lists)
        sizes = [1 + len(pairs) for pairs in lists]
        with self._autocast():
            logps = list_logprobs(self.model, tensors, sizes)
        scores = logps / (tensors["labels"] != -100).sum(dim=-1).clamp(min=1)
        offsets = None
        if self.angel.retrieval_prior:  # retrieval's ranking as a fixed part of each logit
            floor = prior_floor(self.retriever, self.angel.mining_candidates)
            priors = [self._priors.get(id(pairs[0].mention), {}) for pairs in lists]
            offsets = self.angel.retrieval_prior * torch.tensor(
                [
                    prior.get(name, floor)
                    for pairs, prior in zip(lists, priors)
                    for name in (pairs[0].chosen, *(p.rejected for p in pairs))
                ]
            )
        losses, margins = listwise_loss(scores, sizes, self.angel.rank_scale, offsets)
        weights = torch.tensor([pairs[0].weight for pairs in lists], dtype=losses.dtype, device=losses.device)
        loss = (losses * weights).sum() / weights.sum()
        if self.angel.sft_weight:
            counts = torch.as_tensor(sizes, device=scores.device)
            first = torch.cumsum(counts, 0) - counts  # each list's chosen row
            loss = loss + self.angel.sft_weight * (-scores[first]).mean()
        return loss, margins.detach()

    def score_lists(self, lists: Sequence[Sequence[PreferencePair]], batch_size: Optional[int] = None) -> torch.Tensor:
        """Each list's margin (chosen name's forced score less the best rejected one's) under the current
        model, without dropout or gradients, on the CPU."""
        batch_size = batch_size or self.config.batch_size
        margins: List[torch.Tensor] = []
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            for begin in range(0, len(lists), batch_size):
                margins.append(self._lists_loss(lists[begin : begin + batch_size])[1].float().cpu())
        self.model.train(was_training)
        return torch.cat(margins) if margins else torch.zeros(0)

    # -- mining -----------------------------------------------------------------------------
    def mine(self, mentions: Sequence[Mention], round_no: int = 1) -> Tuple[List[PreferencePair], Dict[str, Any]]:
        """This round's pairs: mined from ``mentions`` with the current model, plus
        ``kb_negatives`` KB-negative pairs; returns them with mining statistics."""
        ang = self.angel
        if ang.gold_fallback and self._fallback is None:
            self._fallback = GoldFallback(self.kb)
        self.model.eval()
        pairs, stats = mine_pairs(
            self.linker,
            mentions,
            ang.top_k,
            gold_fallback=self._fallback,
            chunk_size=4 * ang.mine_batch_size,
            progress=self.config.progress,
            pairing="all" if ang.loss == "listwise" else "angel",
        )
        info = stats.to_dict()
        if ang.retrieval_prior and self.retriever is not None:  # this round's lists' priors
            usable = [m for m in mentions if gold_id_set(m)]
            priors = rank_priors(self.retriever, usable, ang.mining_candidates)
            self._priors = {id(m): p for m, p in zip(usable, priors)}
        if ang.deferred_weight != 1.0 and self.retriever is not None:
            first = self.retriever.link(list(mentions), top_k=1)
            pairs = weight_deferred(pairs, {id(m): r for m, r in zip(mentions, first)}, ang.deferred_weight)
            info["deferred_pairs"] = sum(p.weight != 1.0 for p in pairs)
        if ang.kb_negatives:
            if self._tfidf is None:
                self._tfidf = TfidfLinker(self.kb)
            examples = SampledSource(self.kb_examples, ang.kb_negatives, self.config.seed).epoch(round_no)
            kb_pairs = kb_negative_pairs(
                self.kb,
                list(examples),
                tfidf=self._tfidf,
                pool=ang.kb_negative_pool,
                seed=1000 * self.config.seed + round_no,
            )
            info["kb_pairs"] = len(kb_pairs)
            pairs = pairs + kb_pairs
        return pairs, info

    # -- training one round ------------------------------------------------------------------------
    def train_round(
        self,
        pairs: Sequence[PreferencePair],
        round_no: int = 1,
        first_step: int = 0,
        out_of_time: Callable[[], bool] = lambda: False,
        budget_left: Optional[float] = None,
    ) -> Dict[str, Any]:
        """DPO on ``pairs`` against the current model as the reference; returns
        the round's training statistics (``steps``, mean ``train_loss``,
        preference accuracy and margin before and after, ...). ``budget_left``:
        seconds of the run's ``max_seconds`` left as the round starts (for the bar)."""
        cfg, ang = self.config, self.angel
        began = time.monotonic()
        # listwise: a micro-batch holds batch_size mentions' lists, and no reference is scored
        lists = group_lists(pairs) if ang.loss == "listwise" else []
        ref_chosen, ref_rejected = (torch.zeros(0), torch.zeros(0)) if lists else self.score_pairs(pairs)
        n = len(lists) if lists else len(pairs)
        per_step = cfg.batch_size * cfg.grad_accumulation
        planned = ang.steps_per_round or max(1, math.ceil(n / per_step))
        planned = max(0, min(planned, cfg.max_steps - first_step))
        # a fresh optimizer and schedule each round (ANGEL: a new trainer per round)
        # over the round's steps, or its time when seconds_per_round ends first
        round_cfg = replace(cfg, max_steps=max(1, planned), max_seconds=ang.seconds_per_round)

        def time_fraction() -> float:
            return (time.monotonic() - began) / ang.seconds_per_round if ang.seconds_per_round else 0.0

        optimizer = build_optimizer(self.model, cfg)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(round_cfg, s, time_fraction()))
        rng = np.random.default_rng([cfg.seed, round_no])
        order, position = rng.permutation(n), 0
        correct = 0.0  # pairs the policy prefers rightly, summed over a step's micro-batches

        def micro_batch_loss() -> torch.Tensor:
            nonlocal order, position, correct
            if position + cfg.batch_size > n and position > 0:
                order, position = rng.permutation(n), 0
            idx = order[position : position + cfg.batch_size]
            position += len(idx)
            if lists:
                loss, margins = self._lists_loss([lists[i] for i in idx])
                correct += (margins > 0).float().mean().item()
                return loss
            index = torch.as_tensor(idx, dtype=torch.long)
            loss, logits, _ = self._batch_loss([pairs[i] for i in idx], ref_chosen[index], ref_rejected[index])
            correct += (logits > 0).float().mean().item()
            return loss

        losses: List[float] = []
        accuracies: List[float] = []
        window: List[float] = []
        spent = time.monotonic() - began  # scoring the pairs counts in the round's time
        bounds = [
            (left - spent, total, total - left + spent, name)
            for left, total, name in (
                (ang.seconds_per_round, ang.seconds_per_round, "round budget"),
                (budget_left, cfg.max_seconds, "budget"),
            )
            if left is not None and total is not None
        ]
        _, max_seconds, before, name = min(bounds) if bounds else (None, None, 0.0, "budget")
        bar = StepProgress.start(
            f"angel round {round_no}",
            planned,
            max_seconds=max_seconds,
            budget_before=before,
            budget_name=name,
            enabled=cfg.progress and bool(planned),
            leave=False,
        )
        ended = False
        self.model.train(not ang.disable_dropout)
        stopped_by = "steps"
        step = 0
        try:
            while step < planned:
                correct = 0.0
                loss, lr = train_step(
                    self.model,
                    optimizer,
                    scheduler,
                    micro_batch_loss,
                    grad_accumulation=cfg.grad_accumulation,
                    max_grad_norm=cfg.max_grad_norm,
                )
                step += 1
                losses.append(loss)
                accuracies.append(correct / cfg.grad_accumulation)
                window.append(losses[-1])
                bar.update(1, loss=f"{losses[-1]:.4f}", lr=f"{lr:.2e}")
                if log_due(step, cfg.log_every):
                    self.engine.log(
                        {
                            "round": round_no,
                            "step": first_step + step,
                            "loss": sum(window) / len(window),
                            "reward_accuracy": accuracies[-1],
                            "lr": lr,
                        }
                    )
                    window = []
                if out_of_time():
                    stopped_by = "max_seconds"
                    break
                if ang.seconds_per_round is not None and time.monotonic() - began > ang.seconds_per_round:
                    stopped_by = "seconds_per_round"
                    break
            ended = True
        finally:
            bar.close(stopped=ended)
            self.model.eval()
        # before (the reference) and after training, on (a sample of) the round's pairs
        sample = torch.as_tensor(np.sort(rng.permutation(n)[: ang.score_after or n]), dtype=torch.long)
        record: Dict[str, Any] = {
            "steps": step,
            "stopped_by": stopped_by,
            "train_loss": sum(losses) / len(losses) if losses else None,
            "reward_accuracy": sum(accuracies) / len(accuracies) if accuracies else None,
        }
        if lists:  # the share of (a sample of) the lists whose chosen name the model now ranks first
            margins = self.score_lists([lists[i] for i in sample.tolist()])
            record.update(
                lists=n,
                scored_lists=len(sample),
                list_accuracy_after=float((margins > 0).float().mean()),
                margin_after=float(margins.mean()),
                train_seconds=round(time.monotonic() - began, 2),
            )
            return record
        ref_chosen, ref_rejected = ref_chosen[sample], ref_rejected[sample]
        after_chosen, after_rejected = self.score_pairs([pairs[i] for i in sample.tolist()])
        losses_after, logits_after = dpo_loss(after_chosen, after_rejected, ref_chosen, ref_rejected, ang.beta)
        return {
            **record,
            "scored_pairs": len(sample),
            "preference_accuracy_before": float((ref_chosen > ref_rejected).float().mean()),
            "preference_accuracy_after": float((after_chosen > after_rejected).float().mean()),
            "margin_before": float((ref_chosen - ref_rejected).mean()),
            "margin_after": float((after_chosen - after_rejected).mean()),
            "dpo_loss_after": float(losses_after.mean()),
            "reward_accuracy_after": float((logits_after > 0).float().mean()),
            "train_seconds": round(time.monotonic() - began, 2),
        }

    # -- the whole run -------------------------------------------------------------------------------
    def run(self, mentions: Sequence[Mention]) -> AngelResult:
        """Rounds of mining, DPO and dev evaluation on the training ``mentions``
        (de-duplicated; those without gold IDs are left out). The start model is
        evaluated first and stays the best unless a round beats it; a round that
        mines no pair trains nothing and counts as a round without improvement.
        Rounds go on from the last model, better or not (as ANGEL's)."""
        cfg, ang, engine = self.config, self.angel, self.engine
        pool = [m for m in dict.fromkeys(mentions) if gold_id_set(m)]
        if not pool:
            raise ValueError("No training mentions with gold IDs to mine")
        if self.inputs.input_mode == "document":  # mining chunks and DPO batches read whole documents
            for sources in (self.engine.loss.sources, self.linker.sources):
                sources.documents.register(mentions)
        set_seed(cfg.seed)
        clock = budget_clock(cfg.budget_clock)
        began, wall_began = clock(), time.monotonic()

        def out_of_time() -> bool:
            return cfg.max_seconds is not None and clock() - began > cfg.max_seconds

        if self.out_dir is not None:  # a run starts afresh: no older run's best model, export, pairs or log
            engine.clear_outputs(PAIRS_DIR)
        engine.log(
            {
                "event": "start",
                "config": asdict(cfg),
                "angel": asdict(ang),
                "device": str(engine.device),
                "mentions": len(pool),
            }
        )
        order = random.Random(f"{cfg.seed}/angel").sample(range(len(pool)), len(pool))
        per_round = ang.mentions_per_round or len(pool)
        bookkeeping = TrainResult(step=0)
        result = AngelResult()
        best_metric: Optional[float] = None
        best_step: Optional[int] = None
        if engine.evaluate is not None:
            best_metric, best_step = engine.run_evaluation(0, bookkeeping, None, None)
            result.baseline_metric = best_metric
            result.best_round, result.best_metric = 0, best_metric
        step, waiting = 0, 0
        for round_no in range(1, ang.rounds + 1):
            if out_of_time():
                result.stopped_by = "max_seconds"
                break
            if step >= cfg.max_steps:
                result.stopped_by = "max_steps"
                break
            round_began = time.monotonic()
            start = (round_no - 1) * per_round
            chosen = [pool[order[(start + i) % len(pool)]] for i in range(min(per_round, len(pool)))]
            pairs, info = self.mine(chosen, round_no)
            if ang.save_pairs and self.out_dir is not None:
                write_pairs_jsonl(pairs, self.out_dir / PAIRS_DIR / f"round_{round_no:03d}.jsonl")
            record: Dict[str, Any] = {"event": "round", "round": round_no, "mining": info, "pairs": len(pairs)}
            logger.info(
                "round %d: %d pairs from %d mentions (train recall@1 %s)",
                round_no,
                len(pairs),
                info["mentions"],
                info["recall@1"],
            )
            trained = {"steps": 0, "stopped_by": "no_pairs"}
            if pairs:
                trained = self.train_round(
                    pairs,
                    round_no,
                    step,
                    out_of_time,
                    None if cfg.max_seconds is None else cfg.max_seconds - (clock() - began),
                )
            step += trained["steps"]
            record.update(trained)
            improved = False
            if engine.evaluate is not None and trained["steps"]:
                best_metric, best_step = engine.run_evaluation(step, bookkeeping, best_metric, best_step)
                record["eval"] = bookkeeping.evaluations[-1]["eval"]
                improved = best_step == step
                if improved:
                    result.best_round, result.best_metric = round_no, best_metric
            waiting = 0 if improved else waiting + 1
            record.update(step=step, best=improved, seconds=round(time.monotonic() - round_began, 2))
            engine.log(record)
            result.rounds.append(record)
            if trained["stopped_by"] == "max_seconds":
                result.stopped_by = "max_seconds"
                break
            if engine.evaluate is not None and waiting >= ang.patience:
                result.stopped_by = "patience"
                logger.info("dev %s did not improve for %d round(s): stopping", cfg.eval_metric, waiting)
                break
        result.step = step
        result.seconds = time.monotonic() - wall_began
        if self.out_dir is not None:
            result.model_dir = engine.export()
            engine.log({"event": "end", **{k: v for k, v in result.to_dict().items() if k != "rounds"}})
            engine.plot()
        return result


# -- the project step -------------------------------------------------------------------------------
def angel(
    model_dir: PathLike,
    train_jsonl: PathLike,
    dev_jsonl: Optional[PathLike],
    kb_path: PathLike,
    config_path: PathLike,
    out_dir: PathLike,
    overrides: Optional[Mapping[str, Any]] = None,
    device: str = "auto",
) -> AngelResult:
    """Negative-aware training of a fine-tuned model on ``train_jsonl``'s mentions,
    evaluated on ``dev_jsonl`` after each round; the best model ends in
    ``out_dir/model``. Settings: ``[training]``, ``[inputs]``, ``[data]``
    (dev evaluation) and ``[angel]`` of ``config_path``; overrides use dotted
    keys (``{"angel.kb_negatives": 500}``)."""
    stage = load_stage_config(config_path, overrides)
    settings = stage.angel
    kb = KnowledgeBase.load(kb_path)
    mentions = [m for m, _ in read_mentions_jsonl(train_jsonl)]
    kb_examples = kb_guided_examples(stage, kb) if settings.kb_negatives else None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, dev = load_for_training(model_dir, device)
    engine = TrainingEngine(
        model,
        tokenizer,
        stage.training,
        inputs=stage.inputs,
        out_dir=out,
        evaluate=stage_evaluator(stage, kb, dev_jsonl),
        device=dev,
    )
    trainer = AngelTrainer(engine, kb, settings, kb_examples=kb_examples)
    (out / "config.cfg").write_text(stage.text, encoding="utf8")
    result = trainer.run(mentions)
    atomic_json(out / "result.json", result.to_dict())
    return result
