"""Every training stage's settings: the dataclasses, their defaults, and the
one loader that reads them from ``configs/*.cfg`` and checks them.

A config file (confection/thinc format) has sections; each stage says which
sections and settings it knows, and :func:`read_config` rejects anything
else, so a typo (``lr`` for ``learning_rate``) fails at once instead of being
ignored. Overrides use dotted keys, as in spaCy: ``{"training.max_seconds":
600}`` (``--training.max_seconds 600`` on the command line).

The seq2seq stages (``pretrain``, ``finetune``, ``angel``:
:func:`load_stage_config`) read

* ``[training]``: :class:`EngineConfig`;
* ``[inputs]``: the encoder input (``context_words``, ``max_mention_words``,
  ``lowercase``, ``decoder_prompt``), shared with the packaged pipeline;
* ``[data]``: stage-specific data settings (pre-training templates; how many
  KB-guided examples fine-tuning mixes in; the dev subset and beams used for
  evaluation during training);
* ``[angel]``: :class:`AngelConfig` (the ``angel`` stage).

``train-dense`` (:func:`load_dense_config`) reads ``[encoder]``,
``[training]``, ``[loss]`` and ``[data]`` into one :class:`DenseTrainConfig`.

This module imports neither torch nor the model code: the settings of a run
can be read and checked before anything heavy loads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Sequence, Tuple, Type, TypeVar

from spacy_genbioel.retrieval.rescnn_checks import Bound, check_setting
from spacy_genbioel.util import PathLike

if TYPE_CHECKING:
    from spacy_genbioel.linking.inputs.builder import InputBuilder

T = TypeVar("T")


# -- checking and reading ------------------------------------------------------------------
def check_settings(section: str, settings: Mapping[str, Any], known: Sequence[str], where: str = "") -> None:
    """Raise ``ValueError`` naming the unknown settings of ``[section]`` and the known ones."""
    unknown = sorted(set(settings) - set(known))
    if unknown:
        prefix = f"{where}: " if where else ""
        raise ValueError(f"{prefix}Unknown [{section}] settings: {', '.join(unknown)}; known: {', '.join(known)}")


def setting_names(cls: type) -> Tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def settings_from_dict(cls: Type[T], data: Mapping[str, Any], section: str, where: str = "") -> T:
    """``cls(**data)`` for a settings dataclass, after :func:`check_settings`."""
    check_settings(section, data, setting_names(cls), where)
    return cls(**data)


# -- numbers ------------------------------------------------------------------------------------
# every numeric (and flag) setting of the training configs, with its range: a config file or a dotted
# override spelling "nan", "inf", ".5" or "+1" is coerced or refused where the setting is defined, as the
# component's blocks are (linking/numbers.py) and train-rescnn's (retrieval/rescnn_checks.py)
_COUNT, _POSITIVE, _FLAG = Bound(int, 0), Bound(int, 1), Bound(bool)
_RATE, _SHARE = Bound(float, 0.0), Bound(float, 0.0, 1.0)
TRAIN_BOUNDS: Dict[str, Bound] = {
    "max_steps": _COUNT,
    "max_seconds": Bound(float, 0.0, optional=True),
    "batch_size": _POSITIVE,
    "learning_rate": _RATE,
    "weight_decay": _RATE,
    "warmup_steps": _COUNT,
    "label_smoothing": Bound(float, 0.0, 1.0, below=True),
    "max_grad_norm": _RATE,
    "max_source_tokens": _POSITIVE,
    "seed": Bound(int),
    "log_every": _COUNT,
}
ENGINE_BOUNDS: Dict[str, Bound] = {
    **TRAIN_BOUNDS,
    "grad_accumulation": _POSITIVE,
    "min_lr_ratio": _SHARE,
    "poly_power": Bound(float, 0.0, open=True),
    "adam_beta1": Bound(float, 0.0, 1.0, below=True),
    "adam_beta2": Bound(float, 0.0, 1.0, below=True),
    "adam_eps": Bound(float, 0.0, open=True),
    "eval_every": _COUNT,
    "greater_is_better": _FLAG,
    "save_every": _COUNT,
    "progress": _FLAG,
}
ANGEL_BOUNDS: Dict[str, Bound] = {
    "rounds": _COUNT,
    "patience": _COUNT,
    "mentions_per_round": _COUNT,
    "steps_per_round": _COUNT,
    "seconds_per_round": Bound(float, 0.0, open=True, optional=True),
    "top_k": _POSITIVE,
    "num_beams": _POSITIVE,
    "mine_batch_size": _POSITIVE,
    "beta": Bound(float, 0.0, open=True),
    "sft_weight": _RATE,
    "gold_fallback": _FLAG,
    "kb_negatives": _COUNT,
    "kb_negative_pool": _POSITIVE,
    "disable_dropout": _FLAG,
    "save_pairs": _FLAG,
    "score_after": _COUNT,
    "mining_candidates": _POSITIVE,
    "deferred_weight": Bound(float, 0.0, open=True),
    "rank_scale": Bound(float, 0.0, open=True),
    "retrieval_prior": Bound(float, 0.0),
}
DATA_BOUNDS: Dict[str, Bound] = {
    "max_context_synonyms": _COUNT,
    "use_definitions": _FLAG,
    "max_synonyms_per_concept": Bound(int, 1, optional=True),
    "kb_examples_per_epoch": _COUNT,
    "eval_mentions": _COUNT,
    "eval_beams": _POSITIVE,
    "eval_batch_size": _POSITIVE,
}
DENSE_BOUNDS: Dict[str, Bound] = {
    **{k: TRAIN_BOUNDS[k] for k in ("max_steps", "max_seconds", "batch_size", "learning_rate", "weight_decay")},
    **{k: TRAIN_BOUNDS[k] for k in ("warmup_steps", "max_grad_norm", "seed", "log_every")},
    "max_length": _POSITIVE,
    "min_lr_ratio": _SHARE,
    "poly_power": Bound(float, 0.0, open=True),
    "progress": _FLAG,
    "alpha": _RATE,
    "beta": _RATE,
    "base": Bound(float),
    "epsilon": _RATE,
    "triplet_margin": _RATE,
    "kb_pairs": _FLAG,
    "mention_repeats": _COUNT,
}


def check_numbers(settings: Any, section: str, bounds: Mapping[str, Bound]) -> None:
    """Each field of ``settings`` named in ``bounds`` as the number (flag) it spells, in place; a value
    out of its range raises ValueError naming ``section.field``, the range and the value."""
    for name, bound in bounds.items():
        value = getattr(settings, name)
        number = check_setting(f"{section}.{name}", value, bound)
        if number is not value:
            object.__setattr__(settings, name, number)


def check_data(data: Mapping[str, Any]) -> Dict[str, Any]:
    """A stage's ``[data]`` settings with their numbers checked (:data:`DATA_BOUNDS`)."""
    return {k: check_setting(f"data.{k}", v, DATA_BOUNDS[k]) if k in DATA_BOUNDS else v for k, v in data.items()}


def read_config(
    path: PathLike, overrides: Optional[Mapping[str, Any]], sections: Mapping[str, Sequence[str]]
) -> Tuple[Dict[str, Dict[str, Any]], str]:
    """A config file with dotted-key ``overrides`` applied, every section and
    setting checked against ``sections`` (section -> known setting names);
    returns ``{section: {setting: value}}`` and the resolved config text (written
    next to a stage's outputs)."""
    from confection import Config

    config = Config().from_disk(str(path), overrides=dict(overrides or {}))
    unknown = [name for name in config if name not in sections]
    if unknown:
        raise ValueError(
            f"{path}: Unknown sections {', '.join(f'[{s}]' for s in unknown)}; "
            f"use {', '.join(f'[{s}]' for s in sections)}"
        )
    values: Dict[str, Dict[str, Any]] = {}
    for name, settings in config.items():
        check_settings(name, settings, sections[name], str(path))
        values[name] = dict(settings)
    return values, config.to_str()


# -- the seq2seq stages --------------------------------------------------------------------
@dataclass
class TrainConfig:
    """The short loop's settings (:func:`~spacy_genbioel.training.seq2seq.train_seq2seq`)."""

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

    def __post_init__(self) -> None:
        check_numbers(self, "training", TRAIN_BOUNDS)


@dataclass
class EngineConfig(TrainConfig):
    """:class:`TrainConfig` plus what the training engine adds (``[training]``).

    ``batch_size`` is per micro-batch; an optimizer step sees
    ``batch_size * grad_accumulation`` examples. ``max_steps`` counts
    optimizer steps and shapes the learning-rate schedule.
    """

    grad_accumulation: int = 1
    # cosine | linear | polynomial | constant (after linear warm-up);
    # clipped_cosine: the cosine cut at min_lr_ratio instead of scaled onto it (the short loop's)
    scheduler: str = "cosine"
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

    def __post_init__(self) -> None:
        check_numbers(self, "training", ENGINE_BOUNDS)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EngineConfig":
        return settings_from_dict(cls, data, "training")


@dataclass
class AngelConfig:
    """The ``[angel]`` section of ``configs/angel_*.cfg``; optimizer, batch,
    precision, time budget and seed come from ``[training]``."""

    rounds: int = 10  # mine-train-evaluate rounds at most
    patience: int = 1  # rounds without a better dev recall@1 before stopping
    mentions_per_round: int = 0  # training mentions mined per round, cycling through all (0: all)
    steps_per_round: int = 0  # optimizer steps per round (0: one pass over the round's pairs)
    seconds_per_round: Optional[float] = None  # training time per round (mining and evaluation not counted)
    top_k: int = 5  # candidates per mention that make pairs (ANGEL's dpo_topk)
    num_beams: int = 5  # beams of the mining search (ANGEL: 10)
    mine_batch_size: int = 64
    beta: float = 0.1
    sft_weight: float = 0.0  # weight of the chosen name's mean token NLL (0: plain DPO, as ANGEL)
    gold_fallback: bool = False  # gold missing from the top-k: best TF-IDF gold synonym vs top wrong prediction
    kb_negatives: int = 0  # KB-guided pre-training pairs mixed into each round (kb_negative_pairs)
    kb_negative_pool: int = 1  # the rejected name is drawn from this many most similar other-concept names
    disable_dropout: bool = True
    save_pairs: bool = True  # write pairs/round_NNN.jsonl
    # pairs re-scored after each round for the logged preference accuracy and margin (0: all)
    score_after: int = 512
    # what the model is asked when pairs are mined: "beam" (ANGEL: its own beam search over the whole KB)
    # or "forced" (the cascade's question: its forced score of each name mining_retriever retrieves, so the
    # names it wrongly prefers among those the cascade will show it become the rejected ones)
    mining: str = "beam"
    mining_retriever: str = "tfidf"  # forced mining: a retriever or a union (tfidf+rescnn), as candidates.retriever
    mining_retriever_model: Optional[str] = None  # its model directory (NAME=DIR pairs), as candidates.model
    mining_candidates: int = 10  # concepts each retriever proposes per mention
    # pairs of mentions whose top retrieved concept is wrong (those the cascade hands to the generator)
    # count this many times in the loss; 1: every pair alike
    deferred_weight: float = 1.0
    # the loss over each pair: "dpo" (ANGEL's: the log-ratios of the summed log-probabilities against the
    # round's reference model) or "rank" (the cascade's own question: a logistic loss on the difference of
    # the two names' forced scores, mean log-probability per token, scaled by rank_scale; no reference)
    # or "listwise" (forced mining only: a softmax over rank_scale x the forced scores of the gold name and
    # every wrong name of the mention's top_k, one encoder pass per mention; batch_size counts mentions)
    loss: str = "dpo"
    rank_scale: float = 5.0
    # listwise only (other losses ignore it): each name's logit also gets retrieval_prior x its retrieval
    # prior (over mining_retriever's parts, the sum of -log its rank; a part that did not propose it counts
    # rank mining_candidates + 1), so the softmax is the generator's scores fused with retrieval's ranking
    # and the loss asks the generator for what retrieval misses (its gradient vanishes where retrieval
    # alone already puts the gold name first)
    retrieval_prior: float = 0.0

    def __post_init__(self) -> None:
        if self.mining not in ("beam", "forced"):
            raise ValueError(f"[angel] mining: 'beam' or 'forced' (got {self.mining!r})")
        if self.loss not in ("dpo", "rank", "listwise"):
            raise ValueError(f"[angel] loss: 'dpo', 'rank' or 'listwise' (got {self.loss!r})")
        if self.loss == "listwise" and self.mining != "forced":
            raise ValueError("[angel] loss 'listwise' ranks the retrieved names: it needs mining = 'forced'")
        check_numbers(self, "angel", ANGEL_BOUNDS)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AngelConfig":
        return settings_from_dict(cls, data, "angel")


INPUT_KEYS = ("context_words", "max_mention_words", "lowercase", "decoder_prompt", "input_mode")
DATA_DEFAULTS: Dict[str, Any] = {
    # pre-training (GenBioEL section 2.2)
    "max_context_synonyms": 3,
    "use_definitions": True,
    "max_synonyms_per_concept": None,
    # fine-tuning: KB-guided examples mixed into each epoch (0: none), so a
    # small model keeps every name reachable while it learns the corpus
    "kb_examples_per_epoch": 0,
    # evaluation during training
    "eval_mentions": 0,  # first N dev mentions (0: all)
    "eval_beams": 5,
    "eval_batch_size": 64,
}
STAGE_SECTIONS: Dict[str, Sequence[str]] = {
    "training": setting_names(EngineConfig),
    "inputs": INPUT_KEYS,
    "data": tuple(DATA_DEFAULTS),
    "angel": setting_names(AngelConfig),
}


@dataclass
class StageConfig:
    """One seq2seq training stage's settings, read from a ``.cfg`` file."""

    training: EngineConfig
    inputs: InputBuilder
    data: Dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the resolved config, written next to the outputs
    angel: AngelConfig = field(default_factory=AngelConfig)  # [angel]; defaults when the file has none

    def to_dict(self) -> Dict[str, Any]:
        return {
            "training": asdict(self.training),
            "inputs": {k: getattr(self.inputs, k) for k in INPUT_KEYS},
            "data": self.data,
        }


def load_stage_config(path: PathLike, overrides: Optional[Mapping[str, Any]] = None) -> StageConfig:
    """Read a stage config (``configs/{pretrain,finetune,angel}_*.cfg``) with dotted-key overrides."""
    from spacy_genbioel.linking.inputs.builder import InputBuilder

    values, text = read_config(path, overrides, STAGE_SECTIONS)
    try:
        return StageConfig(
            training=EngineConfig(**values.get("training", {})),
            inputs=InputBuilder(**values.get("inputs", {})),
            data=check_data({**DATA_DEFAULTS, **values.get("data", {})}),
            text=text,
            angel=AngelConfig(**values.get("angel", {})),
        )
    except ValueError as err:  # a setting out of range: name the file (and the override, when there is one)
        raise ValueError(f"{path}{' with overrides' if overrides else ''}: {err}") from None


# -- train-dense ------------------------------------------------------------------------------
MINERS = ("ms", "triplet", "none")


@dataclass
class DenseTrainConfig:
    """All settings of ``train-dense``; the config file groups them in sections (:data:`DENSE_SECTIONS`)."""

    # [encoder]
    pooling: str = "cls"
    max_length: int = 25
    # [training]
    max_steps: int = 10000
    max_seconds: Optional[float] = None
    batch_size: int = 64  # positive pairs per step (2 x batch_size texts)
    learning_rate: float = 2e-5
    weight_decay: float = 0.01
    warmup_steps: int = 0
    scheduler: str = "constant"  # constant | linear | cosine | polynomial (loop.lr_factor)
    min_lr_ratio: float = 0.0
    poly_power: float = 1.0
    max_grad_norm: float = 1.0
    seed: int = 0
    log_every: int = 20
    precision: str = "auto"  # auto | fp32 | bf16: autocast of the encoder (util.autocast_dtype)
    progress: bool = True
    # [loss]
    miner: str = "ms"
    alpha: float = 2.0
    beta: float = 50.0
    base: float = 0.5
    epsilon: float = 0.1
    triplet_margin: float = 0.2
    # [data]
    kb_pairs: bool = True
    mention_repeats: int = 1

    def __post_init__(self) -> None:
        if self.miner not in MINERS:
            raise ValueError(f"Unknown miner {self.miner!r}; use one of {MINERS}")
        check_numbers(self, "train-dense", DENSE_BOUNDS)


DENSE_SECTIONS: Dict[str, Sequence[str]] = {
    "encoder": ("pooling", "max_length"),
    "training": (
        "max_steps",
        "max_seconds",
        "batch_size",
        "learning_rate",
        "weight_decay",
        "warmup_steps",
        "scheduler",
        "min_lr_ratio",
        "poly_power",
        "max_grad_norm",
        "seed",
        "log_every",
        "precision",
        "progress",
    ),
    "loss": ("miner", "alpha", "beta", "base", "epsilon", "triplet_margin"),
    "data": ("kb_pairs", "mention_repeats"),
}


def load_dense_config(path: PathLike, overrides: Optional[Mapping[str, Any]] = None) -> Tuple[DenseTrainConfig, str]:
    """A ``configs/dense_*.cfg`` file with dotted overrides (``{"training.max_seconds": 600}``);
    returns the settings and the resolved config text."""
    values, text = read_config(path, overrides, DENSE_SECTIONS)
    return DenseTrainConfig(**{k: v for settings in values.values() for k, v in settings.items()}), text
