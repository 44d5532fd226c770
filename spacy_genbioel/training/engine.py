"""The training engine: resumable, evaluated, logged seq2seq training.

It extends the short loop of :mod:`~spacy_genbioel.training.seq2seq` (same
batch encoding, same loss) with what a multi-hour run needs: CPU or GPU (bf16
autocast on CUDA, fp32 master weights), gradient accumulation, seeds,
resumable checkpoints, a tqdm bar with loss and learning rate, evaluation on
dev every N steps with a caller-supplied function keeping the best model, a
JSONL log and a loss/accuracy curve.

Why a short loop rather than ``Seq2SeqTrainer`` (or accelerate):

* the decoder input is a *prompt* (``"mention is"``) built exactly as at
  inference by :class:`~spacy_genbioel.linking.decoder.PromptTokenizer`, and the loss
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

Checkpoints (``out_dir/checkpoint``) hold the model and tokenizer as a Hugging
Face directory (safetensors), plus ``trainer_state.pt``: optimizer,
scheduler, step, data position and RNG states, saved with ``torch.save`` as
plain tensors and dicts and read back with ``weights_only=True``. A resumed
run produces the same parameters as an uninterrupted one. The best model by
the evaluation metric is kept in ``out_dir/best``; ``out_dir/model`` is the
final export (best when evaluated, else last).
"""
from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np
import torch

from spacy_genbioel.linking.decoder import InputBuilder, PromptTokenizer
from spacy_genbioel.models.bart import save_model, special_ids
from spacy_genbioel.util import PathLike, autocast_dtype, resolve_device
from spacy_genbioel.training.examples import TrainingExample
from spacy_genbioel.training.seq2seq import TrainConfig, budget_clock, config_from_dict, encode_examples, sequence_loss, set_seed

logger = logging.getLogger(__name__)

Evaluator = Callable[[Any, Any], Union[float, Dict[str, float]]]

STATE_FILE = "trainer_state.pt"
LOG_FILE = "train_log.jsonl"
CURVE_FILE = "curve.png"


@dataclass
class EngineConfig(TrainConfig):
    """:class:`TrainConfig` plus what the engine adds (all settable from ``configs/*.cfg``).

    ``batch_size`` is per micro-batch; an optimizer step sees
    ``batch_size * grad_accumulation`` examples. ``max_steps`` counts
    optimizer steps and shapes the learning-rate schedule.
    """

    grad_accumulation: int = 1
    scheduler: str = "cosine"  # cosine | linear | polynomial | constant (after linear warm-up)
    min_lr_ratio: float = 0.05  # floor of the decay, as a fraction of learning_rate
    poly_power: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    eval_every: int = 0  # optimizer steps between evaluations (0: only at the end)
    eval_metric: str = "recall@1"
    greater_is_better: bool = True
    save_every: int = 0  # steps between checkpoints (0: at evaluations and at the end)
    precision: str = "auto"  # auto: bf16 autocast on CUDA; fp32; bf16
    progress: bool = True
    # what the decay runs over: "steps" (max_steps only) or "budget" (whichever
    # of max_steps and max_seconds runs out first: under a time budget the
    # learning rate still reaches its floor by the end of the run instead of
    # stopping high up the curve of an unreachable max_steps)
    schedule_horizon: str = "budget"

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "EngineConfig":
        return config_from_dict(cls, data, "training")


# -- data -----------------------------------------------------------------------------
class ExampleSource(Protocol):
    """Examples per epoch; the engine shuffles each epoch itself."""

    def epoch(self, epoch: int) -> Sequence[TrainingExample]:
        ...


class FixedExamples:
    """The same examples every epoch (fine-tuning)."""

    def __init__(self, examples: Sequence[TrainingExample]) -> None:
        self.examples = list(examples)

    def epoch(self, epoch: int) -> Sequence[TrainingExample]:
        return self.examples

    def __len__(self) -> int:
        return len(self.examples)


class MixedExamples:
    """Several sources, concatenated per epoch (e.g. fine-tuning examples plus KB names)."""

    def __init__(self, *sources: ExampleSource) -> None:
        self.sources = sources

    def epoch(self, epoch: int) -> Sequence[TrainingExample]:
        out: List[TrainingExample] = []
        for source in self.sources:
            out.extend(source.epoch(epoch))
        return out


class _Sampler:
    """Shuffled epochs of an :class:`ExampleSource` with a resumable position."""

    def __init__(self, source: ExampleSource, seed: int, epoch: int = 0, position: int = 0) -> None:
        self.source = source
        self.seed = seed
        self.epoch = epoch
        self.position = position
        self._load()

    def _load(self) -> None:
        self._examples = self.source.epoch(self.epoch)
        if len(self._examples) == 0:
            raise ValueError(f"No training examples in epoch {self.epoch}")
        self._order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self._examples))

    def take(self, n: int) -> List[TrainingExample]:
        batch: List[TrainingExample] = []
        while len(batch) < n:
            if self.position >= len(self._order):
                self.epoch += 1
                self.position = 0
                self._load()
            batch.append(self._examples[int(self._order[self.position])])
            self.position += 1
        return batch


def as_source(examples: Union[ExampleSource, Sequence[TrainingExample]]) -> ExampleSource:
    return examples if hasattr(examples, "epoch") else FixedExamples(examples)  # type: ignore[arg-type]


# -- schedule, RNG --------------------------------------------------------------------
def lr_factor(config: EngineConfig, step: int, time_fraction: float = 0.0) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    ``time_fraction`` is the share of ``max_seconds`` already spent; with
    ``schedule_horizon = "budget"`` the decay follows whichever of steps and
    time is further along.
    """
    if config.warmup_steps and step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.scheduler == "constant":
        return 1.0
    progress = (step - config.warmup_steps) / max(1, config.max_steps - config.warmup_steps)
    if config.schedule_horizon == "budget":
        if config.max_seconds:
            progress = max(progress, time_fraction)
    elif config.schedule_horizon != "steps":
        raise ValueError(f"Unknown schedule_horizon {config.schedule_horizon!r}; use steps or budget")
    progress = min(1.0, progress)
    floor = config.min_lr_ratio
    if config.scheduler == "cosine":
        shape = 0.5 * (1 + math.cos(math.pi * progress))
    elif config.scheduler == "linear":
        shape = 1.0 - progress
    elif config.scheduler == "polynomial":
        shape = (1.0 - progress) ** config.poly_power
    else:
        raise ValueError(f"Unknown scheduler {config.scheduler!r}; use cosine, linear, polynomial or constant")
    return floor + (1.0 - floor) * shape


def _rng_state() -> Dict[str, Any]:
    np_state = np.random.get_state(legacy=False)
    version, mt, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
    }


def _set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np_state = state["numpy"]
    np.random.set_state({
        "bit_generator": "MT19937",
        "state": {"key": np_state["key"].numpy().astype(np.uint32), "pos": np_state["pos"]},
        "has_gauss": np_state["has_gauss"],
        "gauss": np_state["gauss"],
    })
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))


# -- weights I/O ----------------------------------------------------------------------
def load_weights(model, model_dir: PathLike) -> None:
    """Load the safetensors weights of a Hugging Face directory into ``model`` in place.

    Keys that ``save_pretrained`` leaves out because they are tied to another
    parameter (BART's embeddings and LM head) may be missing; anything else
    missing or unexpected is an error.
    """
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text(encoding="utf8"))["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    state: Dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(model_dir / shard)))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{model_dir}: unexpected weights {result.unexpected_keys[:5]}")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
    untied = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs]
    buffers = dict(model.named_buffers())
    untied = [k for k in untied if k not in buffers]
    if untied:
        raise ValueError(f"{model_dir}: weights missing for {untied[:5]}")


def _save(model, tokenizer, path: Path) -> None:
    """``save_model`` without transformers' per-shard progress bar under our own."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        save_model(model, tokenizer, path)
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _replace_dir(tmp: Path, final: Path) -> None:
    """Swap a freshly written directory into place (a crash leaves the old or the new one)."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)


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
    metrics = {name: float(value)} if isinstance(value, (int, float)) else {k: float(v) for k, v in value.items() if v is not None}
    if name not in metrics:
        raise KeyError(f"The evaluator returned {sorted(metrics)}, not the metric {name!r}")
    return metrics, metrics[name]


# -- the engine -----------------------------------------------------------------------
class TrainingEngine:
    """Trains ``model`` in place on examples; see the module docstring.

    ``out_dir=None`` trains without checkpoints, logs or exports (tests,
    quick experiments). ``evaluate(model, tokenizer)`` returns a number or a
    dict holding ``config.eval_metric``.
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
        start_id, eos_id, self.pad_id = special_ids(model, tokenizer)
        self.prompts = PromptTokenizer(tokenizer, start_id, eos_id)
        if self.config.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"Unknown precision {self.config.precision!r}; use auto, fp32 or bf16")
        self.autocast_dtype = autocast_dtype(self.config.precision, self.device, cpu_bf16=False)

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
    def _optimizer(self) -> torch.optim.Optimizer:
        cfg = self.config
        decay = [p for p in self.model.parameters() if p.requires_grad and p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.requires_grad and p.ndim < 2]
        return torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
        )

    def _micro_batch_loss(self, batch: List[TrainingExample]) -> torch.Tensor:
        cfg = self.config
        tensors = encode_examples(batch, self.tokenizer, self.prompts, self.inputs, self.pad_id, cfg.max_source_tokens)
        tensors = {k: v.to(self.device, non_blocking=True) for k, v in tensors.items()}
        if self.autocast_dtype is not None:
            with torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype):
                return sequence_loss(self.model, tensors, cfg.label_smoothing)
        return sequence_loss(self.model, tensors, cfg.label_smoothing)

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
        optimizer = self._optimizer()
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
            _set_rng_state(state["rng"])
            resumed_from = step
            self._truncate_log(step)
            logger.info("Resumed from %s at step %d (epoch %d)", self.checkpoint_dir, step, epoch)
        else:
            set_seed(cfg.seed)
            if self.out_dir is not None:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                # a fresh run must not inherit an older run's best model or checkpoint
                for stale in (self.checkpoint_dir, self.best_dir, self.out_dir / "model"):
                    if stale.exists():
                        shutil.rmtree(stale)
                if self.log_path.exists():
                    self.log_path.unlink()
                self._log({"event": "start", "config": asdict(cfg), "device": str(self.device)})
        sampler = _Sampler(source, cfg.seed, epoch, position)
        result = TrainResult(step=step, best_step=best_step, best_metric=best_metric, resumed_from=resumed_from)
        stop_at = min(cfg.max_steps, until_step) if until_step is not None else cfg.max_steps
        began = clock()
        last_eval_step = step if resumed_from is not None else -1
        bar = None
        if cfg.progress and step < stop_at:
            from tqdm import tqdm

            bar = tqdm(total=cfg.max_steps, initial=step, desc="train", unit="step", dynamic_ncols=True)
        window: List[float] = []
        self.model.train()
        try:
            while step < stop_at:
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for _ in range(cfg.grad_accumulation):
                    loss = self._micro_batch_loss(sampler.take(cfg.batch_size))
                    (loss / cfg.grad_accumulation).backward()
                    total += loss.detach().float().item()
                if cfg.max_grad_norm:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                lr = scheduler.get_last_lr()[0]
                optimizer.step()
                elapsed = elapsed_before + clock() - began
                if cfg.max_seconds:
                    spent[0] = elapsed / cfg.max_seconds
                scheduler.step()
                step += 1
                step_loss = total / cfg.grad_accumulation
                result.losses.append(step_loss)
                window.append(step_loss)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{step_loss:.4f}", lr=f"{lr:.2e}", refresh=False)
                if cfg.log_every and (step % cfg.log_every == 0 or step == 1):
                    self._log({"step": step, "loss": sum(window) / len(window), "lr": lr, "epoch": sampler.epoch,
                               "elapsed": round(elapsed_before + clock() - began, 2)})
                    window = []
                # the budget covers the whole run, resumed parts included
                out_of_time = cfg.max_seconds is not None and elapsed_before + clock() - began > cfg.max_seconds
                finished = step >= stop_at or out_of_time
                if self.evaluate is not None and (
                    (cfg.eval_every and step % cfg.eval_every == 0) or (finished and step >= cfg.max_steps) or out_of_time
                ):
                    best_metric, best_step = self._run_evaluation(step, result, best_metric, best_step)
                    last_eval_step = step
                evaluated_now = last_eval_step == step
                if self.out_dir is not None and (
                    finished or evaluated_now or (cfg.save_every and step % cfg.save_every == 0)
                ):
                    self._save_checkpoint(optimizer, scheduler, sampler, step, elapsed_before + clock() - began,
                                          best_metric, best_step)
                if out_of_time:
                    result.stopped_by = "max_seconds"
                    logger.info("Time budget of %.0fs reached at step %d", cfg.max_seconds, step)
                    break
            else:
                result.stopped_by = "max_steps" if step >= cfg.max_steps else "until_step"
        finally:
            if bar is not None:
                bar.close()
            self.model.eval()
        result.step = step
        result.best_metric, result.best_step = best_metric, best_step
        result.seconds = elapsed_before + clock() - began
        if self.out_dir is not None and result.stopped_by != "until_step":
            result.model_dir = self._export()
            self._log({"event": "end", **{k: v for k, v in result.to_dict().items() if k != "evaluations"}})
            self.plot()
        return result

    # -- evaluation, checkpoints, logs ------------------------------------------------------
    def _run_evaluation(self, step: int, result: TrainResult, best_metric, best_step):
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
                tmp = self.best_dir.with_name("best.tmp")
                if tmp.exists():
                    shutil.rmtree(tmp)
                _save(self.model, self.tokenizer, tmp)
                (tmp / "best.json").write_text(json.dumps({"step": step, "metrics": metrics}, indent=2), encoding="utf8")
                _replace_dir(tmp, self.best_dir)
        record = {"step": step, "eval": metrics, "best": improved, "eval_seconds": round(time.monotonic() - began, 2)}
        result.evaluations.append(record)
        self._log(record)
        logger.info("step %d: %s%s", step, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), " (best)" if improved else "")
        return best_metric, best_step

    def _save_checkpoint(self, optimizer, scheduler, sampler: _Sampler, step: int, elapsed: float, best_metric, best_step) -> None:
        final = self.checkpoint_dir
        tmp = final.with_name(final.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        _save(self.model, self.tokenizer, tmp)
        state = {
            "step": step,
            "epoch": sampler.epoch,
            "position": sampler.position,
            "elapsed": elapsed,
            "best_metric": best_metric,
            "best_step": best_step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": _rng_state(),
        }
        torch.save(state, tmp / STATE_FILE)
        (tmp / "checkpoint.json").write_text(
            json.dumps({"step": step, "epoch": sampler.epoch, "best_step": best_step, "best_metric": best_metric,
                        "config": asdict(self.config)}, indent=2),
            encoding="utf8",
        )
        _replace_dir(tmp, final)

    def _export(self) -> Path:
        """``out_dir/model``: the best model when there was an evaluation, else the last weights."""
        target = self.out_dir / "model"
        tmp = self.out_dir / "model.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        if self.best_dir is not None and self.best_dir.exists():
            shutil.copytree(self.best_dir, tmp)
        else:
            _save(self.model, self.tokenizer, tmp)
        _replace_dir(tmp, target)
        return target

    def _log(self, record: Dict[str, Any]) -> None:
        if self.log_path is None:
            return
        with self.log_path.open("a", encoding="utf8") as out:
            out.write(json.dumps(record, default=str) + "\n")

    def _truncate_log(self, step: int) -> None:
        """Drop log records written after the checkpoint being resumed."""
        if self.log_path is None or not self.log_path.exists():
            return
        kept = [line for line in self.log_path.read_text(encoding="utf8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step and json.loads(line).get("event") != "end"]
        self.log_path.write_text("".join(line + "\n" for line in kept), encoding="utf8")
        self._log({"event": "resume", "step": step})

    def plot(self, path: Optional[PathLike] = None) -> Optional[Path]:
        if self.log_path is None or not self.log_path.exists():
            return None
        return plot_training_curve(self.log_path, path or self.out_dir / CURVE_FILE, metric=self.config.eval_metric)


def read_log(path: PathLike) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf8").splitlines() if line.strip()]


def plot_training_curve(log_path: PathLike, png_path: PathLike, metric: str = "recall@1") -> Path:
    """Training loss (left axis) and the dev metric (right axis) against steps, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log_path)
    loss = [(r["step"], r["loss"]) for r in records if "loss" in r and "step" in r]
    evals = [(r["step"], r["eval"][metric]) for r in records if "eval" in r and metric in r["eval"]]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if loss:
        ax.plot(*zip(*loss), color="tab:blue", label="train loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss", color="tab:blue")
    if evals:
        ax2 = ax.twinx()
        ax2.plot(*zip(*evals), color="tab:orange", marker="o", label=f"dev {metric}")
        ax2.set_ylabel(f"dev {metric}", color="tab:orange")
        ax2.set_ylim(0, 1)
    ax.set_title(Path(log_path).parent.name or "training")
    fig.tight_layout()
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


# -- dev evaluation with the generative linker ----------------------------------------------
def linking_evaluator(
    kb,
    mentions: Sequence,
    *,
    inputs: Optional[InputBuilder] = None,
    num_beams: int = 5,
    batch_size: int = 64,
    ks: Sequence[int] = (1, 5),
    max_mentions: Optional[int] = None,
) -> Evaluator:
    """``evaluate(model, tokenizer) -> {"recall@1": ..., "recall@5": ...}`` on dev
    mentions, with trie-constrained decoding (GenBioEL's recall rule). The trie
    depends only on the tokenizer and is built once."""
    from spacy_genbioel.linking.decoder import DecodingConfig, GenerativeLinker
    from spacy_genbioel.evaluation.report import recall_at_k

    chosen = list(mentions)[:max_mentions] if max_mentions else list(mentions)
    cache: Dict[int, Any] = {}

    def evaluate(model, tokenizer) -> Dict[str, float]:
        linker = GenerativeLinker(
            model, tokenizer, kb, cache.get(id(tokenizer)), inputs=inputs,
            config=DecodingConfig(num_beams=num_beams, top_k=max(ks), batch_size=batch_size),
        )
        cache[id(tokenizer)] = linker.trie
        predictions = linker.link(chosen, top_k=max(ks))
        result = recall_at_k(chosen, predictions, ks=ks)
        return {f"recall@{k}": result.recall[k] for k in result.ks if result.recall[k] is not None}

    return evaluate
