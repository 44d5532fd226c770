"""The training engine: resumable, evaluated, logged seq2seq training.

It takes the same step as the short loop of
:mod:`~spacy_genbioel.training.seq2seq` (same batch encoding and loss:
:class:`~spacy_genbioel.training.seq2seq.Seq2SeqLoss`; same optimizer step:
:func:`~spacy_genbioel.training.loop.train_step`) and adds what a multi-hour
run needs: CPU or GPU (bf16 autocast on CUDA, fp32 master weights), gradient
accumulation, seeds, resumable checkpoints, a tqdm bar with loss and learning
rate, evaluation on dev every N steps with a caller-supplied function keeping
the best model, a JSONL log and a loss/accuracy curve. Its settings are
:class:`~spacy_genbioel.training.settings.EngineConfig` (``[training]``).

Why a short loop rather than ``Seq2SeqTrainer`` (or accelerate):

* the decoder input is a *prompt* (``"mention is"``) built exactly as at
  inference by :class:`~spacy_genbioel.linking.decoding.decoder.PromptTokenizer`, and the loss
  covers only the name tokens and EOS; ``Seq2SeqTrainer`` wants ``labels``
  that it shifts itself, so the prompt would have to be smuggled in through a
  custom collator *and* a ``compute_loss`` override, i.e. most of this file
  again, plus the trainer's own conventions;
* the data are epochs regenerated from a seed (new synonym pairs and
  templates each epoch of KB-guided pre-training) whose position must be part
  of the checkpoint, which the trainer's sampler does not know about;
* evaluation is constrained beam search over a name trie, not
  ``predict_with_generate``; it is passed in as a plain function;
* a wall-clock budget matters on CPU, and the whole loop fits on a screen:
  one device, no distributed launch, nothing hidden. Multi-GPU training
  would be the point to move to accelerate.

Checkpoints (``out_dir/checkpoint``, :mod:`~spacy_genbioel.training.checkpoints`)
hold the model and tokenizer as a Hugging Face directory (safetensors), plus
``trainer_state.pt``: optimizer, scheduler, step, data position
(:class:`~spacy_genbioel.training.sources.EpochSampler`) and RNG states. A
resumed run produces the same parameters as an uninterrupted one. The best
model by the evaluation metric is kept in ``out_dir/best``; ``out_dir/model``
is the final export (best when evaluated, else last).
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.progress import StepProgress
from spacy_genbioel.training.checkpoints import (
    STATE_FILE,
    export_model,
    load_weights,
    rng_state,
    save_snapshot,
    set_rng_state,
)
from spacy_genbioel.training.evaluator import Evaluator
from spacy_genbioel.training.examples import TrainingExample
from spacy_genbioel.training.loop import budget_clock, build_optimizer, log_due, lr_factor, set_seed, train_step
from spacy_genbioel.training.seq2seq import Seq2SeqLoss
from spacy_genbioel.training.settings import EngineConfig
from spacy_genbioel.training.sources import EpochSampler, ExampleSource, as_source
from spacy_genbioel.training.trainlog import CURVE_FILE, LOG_FILE, append_log, plot_training_curve, truncate_log
from spacy_genbioel.util import PathLike, autocast_dtype, resolve_device

logger = logging.getLogger(__name__)

__all__ = ["EngineConfig", "TrainResult", "TrainingEngine", "STATE_FILE", "LOG_FILE", "CURVE_FILE"]


# -- results --------------------------------------------------------------------------
@dataclass
class TrainResult:
    step: int  # optimizer steps done in total (resumed ones included)
    losses: List[float] = field(default_factory=list)  # this run's loss per optimizer step
    evaluations: List[Dict[str, Any]] = field(default_factory=list)
    best_step: Optional[int] = None
    best_metric: Optional[float] = None
    stopped_by: str = "max_steps"  # max_steps | max_seconds | until_step
    seconds: float = 0.0  # wall-clock of all runs together
    resumed_from: Optional[int] = None
    model_dir: Optional[Path] = None  # the final export, when there is an out_dir

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["model_dir"] = str(self.model_dir) if self.model_dir else None
        data["final_loss"] = self.losses[-1] if self.losses else None
        del data["losses"]
        return data


def _metric(value: Union[float, Dict[str, float]], name: str) -> Tuple[Dict[str, float], float]:
    metrics = (
        {name: float(value)}
        if isinstance(value, (int, float))
        else {k: float(v) for k, v in value.items() if v is not None}
    )
    if name not in metrics:
        raise KeyError(f"The evaluator returned {sorted(metrics)}, not the metric {name!r}")
    return metrics, metrics[name]


# -- the engine -----------------------------------------------------------------------
class TrainingEngine:
    """Trains ``model`` in place on examples; see the module docstring.

    ``out_dir=None`` trains without checkpoints, logs or exports (tests,
    quick experiments). ``evaluate(model, tokenizer)`` returns a number or a
    dict holding ``config.eval_metric``. ANGEL's rounds reuse its device,
    precision, evaluation with best-model bookkeeping, log and export.
    """

    def __init__(
        self,
        model,
        tokenizer,
        config: EngineConfig,
        *,
        inputs: Optional[InputBuilder] = None,
        out_dir: Optional[PathLike] = None,
        evaluate: Optional[Evaluator] = None,
        device: Union[str, torch.device, None] = None,
    ) -> None:
        if config.grad_accumulation < 1 or config.batch_size < 1 or config.max_steps < 1:
            raise ValueError("batch_size, grad_accumulation and max_steps must be at least 1")
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.inputs = inputs or InputBuilder()
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.evaluate = evaluate
        if device is None:
            self.device = next(model.parameters()).device
        else:
            self.device = device if isinstance(device, torch.device) else resolve_device(device)
            self.model.to(self.device)
        if self.config.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"Unknown precision {self.config.precision!r}; use auto, fp32 or bf16")
        self.autocast_dtype = autocast_dtype(self.config.precision, self.device, cpu_bf16=False)
        self.loss = Seq2SeqLoss(
            model,
            tokenizer,
            self.inputs,
            self.device,
            max_source_tokens=config.max_source_tokens,
            label_smoothing=config.label_smoothing,
            autocast_dtype=self.autocast_dtype,
        )
        self.pad_id, self.prompts = self.loss.pad_id, self.loss.prompts

    # -- paths ------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Optional[Path]:
        return self.out_dir / "checkpoint" if self.out_dir else None

    @property
    def best_dir(self) -> Optional[Path]:
        return self.out_dir / "best" if self.out_dir else None

    @property
    def log_path(self) -> Optional[Path]:
        return self.out_dir / LOG_FILE if self.out_dir else None

    # -- training ---------------------------------------------------------------------
    def _micro_batch_loss(self, batch: List[TrainingExample]) -> torch.Tensor:
        return self.loss(batch)

    def train(
        self,
        examples: Union[ExampleSource, Sequence[TrainingExample]],
        *,
        resume: bool = True,
        until_step: Optional[int] = None,
    ) -> TrainResult:
        """Train until ``config.max_steps`` (or the time budget, or ``until_step``).

        With ``resume`` and a checkpoint in ``out_dir``, training continues
        from it (model weights included). ``until_step`` stops early with a
        checkpoint, as an interruption would, leaving the schedule unchanged.
        """
        cfg = self.config
        source = as_source(examples)
        optimizer = build_optimizer(self.model, cfg)
        clock = budget_clock(cfg.budget_clock)
        spent = [0.0]  # share of max_seconds used, read by the schedule
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(cfg, s, spent[0]))
        step, epoch, position, elapsed_before = 0, 0, 0, 0.0
        best_metric: Optional[float] = None
        best_step: Optional[int] = None
        resumed_from: Optional[int] = None
        state_path = self.checkpoint_dir / STATE_FILE if self.checkpoint_dir else None
        if resume and state_path is not None and state_path.exists():
            state = torch.load(state_path, map_location="cpu", weights_only=True)
            load_weights(self.model, self.checkpoint_dir)
            self.model.to(self.device)
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            step, epoch, position = int(state["step"]), int(state["epoch"]), int(state["position"])
            elapsed_before = float(state.get("elapsed", 0.0))
            best_metric = state.get("best_metric")
            best_step = state.get("best_step")
            set_rng_state(state["rng"])
            resumed_from = step
            if self.log_path is not None and self.log_path.exists():
                truncate_log(self.log_path, step)
                self.log({"event": "resume", "step": step})
            logger.info("Resumed from %s at step %d (epoch %d)", self.checkpoint_dir, step, epoch)
        else:
            set_seed(cfg.seed)
            if self.out_dir is not None:
                self.clear_outputs()
                self.log({"event": "start", "config": asdict(cfg), "device": str(self.device)})
        sampler = EpochSampler(source, cfg.seed, epoch, position)
        result = TrainResult(step=step, best_step=best_step, best_metric=best_metric, resumed_from=resumed_from)
        stop_at = min(cfg.max_steps, until_step) if until_step is not None else cfg.max_steps
        began = clock()

        def record_time() -> None:
            if cfg.max_seconds:
                spent[0] = (elapsed_before + clock() - began) / cfg.max_seconds

        last_eval_step = step if resumed_from is not None else -1
        bar = StepProgress.start(
            "train",
            stop_at,
            initial=step,
            max_seconds=cfg.max_seconds,
            budget_before=elapsed_before,
            clock=clock,
            budget_name="cpu budget" if cfg.budget_clock == "cpu" else "budget",
            enabled=cfg.progress and step < stop_at,
        )
        window: List[float] = []
        ended = False
        self.model.train()
        try:
            while step < stop_at:
                step_loss, lr = train_step(
                    self.model,
                    optimizer,
                    scheduler,
                    lambda: self._micro_batch_loss(sampler.take(cfg.batch_size)),
                    grad_accumulation=cfg.grad_accumulation,
                    max_grad_norm=cfg.max_grad_norm,
                    before_schedule=record_time,
                )
                step += 1
                result.losses.append(step_loss)
                window.append(step_loss)
                bar.update(1, loss=f"{step_loss:.4f}", lr=f"{lr:.2e}")
                if log_due(step, cfg.log_every):
                    self.log(
                        {
                            "step": step,
                            "loss": sum(window) / len(window),
                            "lr": lr,
                            "epoch": sampler.epoch,
                            "elapsed": round(elapsed_before + clock() - began, 2),
                        }
                    )
                    window = []
                # the budget covers the whole run, resumed parts included
                out_of_time = cfg.max_seconds is not None and elapsed_before + clock() - began > cfg.max_seconds
                finished = step >= stop_at or out_of_time
                if self.evaluate is not None and (
                    (cfg.eval_every and step % cfg.eval_every == 0)
                    or (finished and step >= cfg.max_steps)
                    or out_of_time
                ):
                    best_metric, best_step = self.run_evaluation(step, result, best_metric, best_step)
                    last_eval_step = step
                evaluated_now = last_eval_step == step
                if self.out_dir is not None and (
                    finished or evaluated_now or (cfg.save_every and step % cfg.save_every == 0)
                ):
                    self._save_checkpoint(
                        optimizer, scheduler, sampler, step, elapsed_before + clock() - began, best_metric, best_step
                    )
                if out_of_time:
                    result.stopped_by = "max_seconds"
                    logger.info("Time budget of %.0fs reached at step %d", cfg.max_seconds, step)
                    break
            else:
                result.stopped_by = "max_steps" if step >= cfg.max_steps else "until_step"
            ended = True
        finally:
            bar.close(stopped=ended)
            self.model.eval()
        result.step = step
        result.best_metric, result.best_step = best_metric, best_step
        result.seconds = elapsed_before + clock() - began
        if self.out_dir is not None and result.stopped_by != "until_step":
            result.model_dir = self.export()
            self.log({"event": "end", **{k: v for k, v in result.to_dict().items() if k != "evaluations"}})
            self.plot()
        return result

    # -- evaluation, checkpoints, logs ------------------------------------------------------
    def run_evaluation(
        self, step: int, result: TrainResult, best_metric: Optional[float], best_step: Optional[int]
    ) -> Tuple[Optional[float], Optional[int]]:
        """Evaluate now (recorded in ``result`` and the log); a better model is
        saved to ``best/``. Returns the best metric and step so far."""
        cfg = self.config
        began = time.monotonic()
        self.model.eval()
        with torch.no_grad():
            metrics, value = _metric(self.evaluate(self.model, self.tokenizer), cfg.eval_metric)
        self.model.train()
        improved = best_metric is None or (value > best_metric if cfg.greater_is_better else value < best_metric)
        if improved:
            best_metric, best_step = value, step
            if self.best_dir is not None:
                save_snapshot(
                    self.model,
                    self.tokenizer,
                    self.best_dir,
                    json_files={"best.json": {"step": step, "metrics": metrics}},
                )
        record = {"step": step, "eval": metrics, "best": improved, "eval_seconds": round(time.monotonic() - began, 2)}
        result.evaluations.append(record)
        self.log(record)
        logger.info(
            "step %d: %s%s", step, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), " (best)" if improved else ""
        )
        return best_metric, best_step

    def _save_checkpoint(
        self, optimizer, scheduler, sampler: EpochSampler, step: int, elapsed: float, best_metric, best_step
    ) -> None:
        state = {
            "step": step,
            "epoch": sampler.epoch,
            "position": sampler.position,
            "elapsed": elapsed,
            "best_metric": best_metric,
            "best_step": best_step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
        }
        info = {
            "step": step,
            "epoch": sampler.epoch,
            "best_step": best_step,
            "best_metric": best_metric,
            "config": asdict(self.config),
        }
        save_snapshot(
            self.model, self.tokenizer, self.checkpoint_dir, state=state, json_files={"checkpoint.json": info}
        )

    def export(self) -> Path:
        """``out_dir/model``: the best model when there was an evaluation, else the last weights."""
        return export_model(self.model, self.tokenizer, self.best_dir, self.out_dir / "model")

    def clear_outputs(self, *extra: str) -> None:
        """A fresh run must not inherit an older run's best model, checkpoint,
        export or log (nor the folders named in ``extra``)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for stale in (
            self.checkpoint_dir,
            self.best_dir,
            self.out_dir / "model",
            *(self.out_dir / name for name in extra),
        ):
            if stale.exists():
                shutil.rmtree(stale)
        if self.log_path.exists():
            self.log_path.unlink()

    def log(self, record: Dict[str, Any]) -> None:
        append_log(self.log_path, record)

    def plot(self, path: Optional[PathLike] = None) -> Optional[Path]:
        if self.log_path is None or not self.log_path.exists():
            return None
        return plot_training_curve(self.log_path, path or self.out_dir / CURVE_FILE, metric=self.config.eval_metric)
