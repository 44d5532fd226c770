"""SapBERT-style self-alignment of a dense encoder on KB synonyms (Liu et al. 2021).

A batch holds ``batch_size`` positive pairs: two names of one concept (every
name of every concept with at least two names is paired with a random other
synonym once per epoch) and, with ``--train``, training mentions paired with
their gold KB name (SapBERT's fine-tuning on a task's training set). Both
sides are encoded in one pass, every in-batch pair is scored by cosine
similarity, hard pairs are mined online, and the multi-similarity loss (Wang
et al. 2019) is taken over them:

``L = mean_i [ 1/alpha log(1 + sum_{p in P_i} exp(-alpha (S_ip - base)))
              + 1/beta log(1 + sum_{n in N_i} exp(beta (S_in - base))) ]``

where ``P_i``/``N_i`` are the mined positive/negative partners of item ``i``.
Two items are positives when their concept sets meet (a name shared by
several concepts belongs to all of them, so MEDIC's MeSH/OMIM twins are never
pushed apart), negatives otherwise.

Miners (``[loss] miner``):

* ``ms`` (default): the multi-similarity miner -- a positive pair is hard when
  ``S_ip - epsilon < max_n S_in``, a negative pair when
  ``S_in + epsilon > min_p S_ip`` (pytorch-metric-learning's
  ``MultiSimilarityMiner``);
* ``triplet``: what SapBERT's released code runs -- pairs of the triplets
  ``(a, p, n)`` with ``d_an - d_ap <= triplet_margin`` in Euclidean distance
  of the unit vectors (pytorch-metric-learning's
  ``TripletMarginMiner(margin=0.2, type_of_triplets="all")``);
* ``none``: all in-batch pairs.

Defaults: ``alpha=2, beta=50, base=0.5, epsilon=0.1`` are the
multi-similarity paper's and pytorch-metric-learning's defaults (``base`` is
the paper's lambda); SapBERT's ``train/pretrain.sh`` and
``src/metric_learning.py`` use ``MultiSimilarityLoss(alpha=1, beta=60,
base=0.5)`` with the triplet miner at margin 0.2, batch 256 pairs, lr 2e-5,
25 tokens, ``[CLS]`` pooling, AdamW with weight decay 0.01, one epoch; set
those in the config to follow it exactly. The loss and miners are written
here (about 40 lines, tested against a brute-force computation and, when it
is installed, pytorch-metric-learning itself) rather than adding a
dependency.

Outputs in ``OUT``: ``model/`` (safetensors weights, tokenizer and
``dense_config.json`` with the pooling, read by
:class:`~spacy_genbioel.retrieval.dense.DenseLinker`), ``train_log.jsonl``,
``config.cfg`` and ``result.json``. Settings live in ``configs/dense_*.cfg``
(sections ``[encoder]``, ``[training]``, ``[loss]``, ``[data]``), read by
:func:`~spacy_genbioel.training.settings.load_dense_config`. The optimizer
step, schedule and seed are the other training loops' own
(:mod:`~spacy_genbioel.training.loop`).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

import torch

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.progress import StepProgress
from spacy_genbioel.retrieval.dense import DenseEncoder
from spacy_genbioel.training.checkpoints import fresh_tmp, replace_dir
from spacy_genbioel.training.examples import read_examples_jsonl
from spacy_genbioel.training.loop import autocast as autocast_to
from spacy_genbioel.training.loop import log_due, lr_factor, set_seed, train_step
from spacy_genbioel.training.settings import DENSE_SECTIONS, MINERS, DenseTrainConfig, load_dense_config
from spacy_genbioel.training.trainlog import LOG_FILE, append_log
from spacy_genbioel.util import PathLike, atomic_json, autocast_dtype

logger = logging.getLogger(__name__)

__all__ = [
    "DENSE_SECTIONS",
    "MINERS",
    "DenseTrainConfig",
    "DenseTrainResult",
    "SynonymPair",
    "SynonymPairs",
    "batch_loss",
    "load_dense_config",
    "mention_pairs_from_jsonl",
    "mine",
    "ms_mine",
    "multi_similarity_loss",
    "same_concept",
    "train_dense",
    "train_sapbert",
    "triplet_mine",
]


# -- loss and miners ---------------------------------------------------------------------
def same_concept(id_sets: Sequence[FrozenSet[str]]) -> "torch.Tensor":
    """(n, n) bool: items ``i`` and ``j`` share a concept (diagonal included)."""
    index: Dict[str, int] = {}
    incidence = torch.zeros(len(id_sets), max(1, sum(len(s) for s in id_sets)))
    for row, ids in enumerate(id_sets):
        for cid in ids:
            incidence[row, index.setdefault(cid, len(index))] = 1.0
    return (incidence @ incidence.T) > 0


def _pairs(same: "torch.Tensor") -> Tuple["torch.Tensor", "torch.Tensor"]:
    """All positive (off-diagonal) and negative pairs of a ``same`` relation."""
    eye = torch.eye(same.shape[0], dtype=torch.bool, device=same.device)
    return same & ~eye, ~same


def ms_mine(sim: "torch.Tensor", same: "torch.Tensor", epsilon: float = 0.1) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Multi-similarity mining: (hard positive mask, hard negative mask)."""
    pos, neg = _pairs(same)
    hardest_neg = sim.masked_fill(~neg, float("-inf")).max(dim=1, keepdim=True).values
    easiest_pos = sim.masked_fill(~pos, float("inf")).min(dim=1, keepdim=True).values
    return pos & (sim - epsilon < hardest_neg), neg & (sim + epsilon > easiest_pos)


def triplet_mine(
    sim: "torch.Tensor", same: "torch.Tensor", margin: float = 0.2
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """The pairs of all triplets ``(a, p, n)`` with ``d(a, n) - d(a, p) <= margin``,
    ``d`` the Euclidean distance of unit vectors (SapBERT's miner)."""
    pos, neg = _pairs(same)
    dist = (2.0 - 2.0 * sim).clamp(min=0.0).sqrt()
    nearest_neg = dist.masked_fill(~neg, float("inf")).min(dim=1, keepdim=True).values
    farthest_pos = dist.masked_fill(~pos, float("-inf")).max(dim=1, keepdim=True).values
    return pos & (nearest_neg - dist <= margin), neg & (dist - farthest_pos <= margin)


def mine(
    sim: "torch.Tensor", same: "torch.Tensor", miner: str = "ms", epsilon: float = 0.1, triplet_margin: float = 0.2
) -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Hard (positive, negative) pair masks by ``miner`` (``ms``, ``triplet`` or ``none``)."""
    if miner == "ms":
        return ms_mine(sim, same, epsilon)
    if miner == "triplet":
        return triplet_mine(sim, same, triplet_margin)
    if miner == "none":
        return _pairs(same)
    raise ValueError(f"Unknown miner {miner!r}; use one of {MINERS}")


def multi_similarity_loss(
    sim: "torch.Tensor",
    pos: "torch.Tensor",
    neg: "torch.Tensor",
    alpha: float = 2.0,
    beta: float = 50.0,
    base: float = 0.5,
) -> "torch.Tensor":
    """Mean over items of the multi-similarity loss on the masked pairs (an item
    without pairs adds 0, as in pytorch-metric-learning)."""
    zero = sim.new_zeros(sim.shape[0], 1)
    pos_logits = (-alpha * (sim - base)).masked_fill(~pos, float("-inf"))
    neg_logits = (beta * (sim - base)).masked_fill(~neg, float("-inf"))
    pos_loss = torch.logsumexp(torch.cat([pos_logits, zero], dim=1), dim=1) / alpha
    neg_loss = torch.logsumexp(torch.cat([neg_logits, zero], dim=1), dim=1) / beta
    return (pos_loss + neg_loss).mean()


# -- data -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SynonymPair:
    """Two texts of one concept, each with every concept it may stand for."""

    left: str
    right: str
    left_ids: FrozenSet[str]
    right_ids: FrozenSet[str]


class SynonymPairs:
    """Positive pairs, regenerated and shuffled each epoch from a seed.

    KB pairs: every normalized name of a concept with two or more names,
    paired with a random other name of it (concepts with the very same name
    list, such as a MeSH ID and its OMIM twin, are visited once). Mention pairs:
    ``(normalized mention, gold KB name)`` from training examples, de-duplicated,
    ``mention_repeats`` times per epoch.
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        mention_pairs: Iterable[Tuple[str, str, Iterable[str]]] = (),
        *,
        kb_pairs: bool = True,
        mention_repeats: int = 1,
        seed: int = 0,
    ) -> None:
        self.kb, self.seed = kb, seed
        self.mention_repeats = max(0, int(mention_repeats))
        self.groups: List[List[str]] = []
        if kb_pairs:
            seen = set()
            for cid in kb.concept_ids:
                names = kb.names_of(cid)
                if len(names) >= 2 and tuple(names) not in seen:
                    seen.add(tuple(names))
                    self.groups.append(names)
        self.mention_pairs: List[SynonymPair] = []
        unique = set()
        for mention, target, ids in mention_pairs:
            left = kb.normalize(mention)
            gold = frozenset(i for i in ids if i in kb)
            if not left or not gold or not self._ids(target) or left == target or (left, target) in unique:
                continue
            unique.add((left, target))
            self.mention_pairs.append(SynonymPair(left, target, gold | self._ids(left), self._ids(target)))
        if not self.groups and not self.mention_pairs:
            raise ValueError(
                "No positive pairs: the KB has no concept with two names and no training mentions were given"
            )

    def _ids(self, name: str) -> FrozenSet[str]:
        return frozenset(self.kb.ids_for_name(name, normalize=False))

    def __len__(self) -> int:
        return sum(len(g) for g in self.groups) + len(self.mention_pairs) * self.mention_repeats

    def epoch(self, epoch: int) -> List[SynonymPair]:
        rng = random.Random(f"{self.seed}/{epoch}/pairs")
        pairs: List[SynonymPair] = []
        for names in self.groups:
            for i, name in enumerate(names):
                other = names[(i + rng.randrange(1, len(names))) % len(names)]
                pairs.append(SynonymPair(name, other, self._ids(name), self._ids(other)))
        pairs.extend(self.mention_pairs * self.mention_repeats)
        rng.shuffle(pairs)
        return pairs


def mention_pairs_from_jsonl(path: PathLike) -> List[Tuple[str, str, Tuple[str, ...]]]:
    """``(mention text, target name, gold ids)`` of an examples file (``corpus`` output)."""
    return [(e.mention.text, e.target, e.mention.ids) for e in read_examples_jsonl(path)]


# -- training ------------------------------------------------------------------------------------------
@dataclass
class DenseTrainResult:
    step: int = 0
    epoch: int = 0
    seconds: float = 0.0
    stopped_by: str = "max_steps"
    losses: List[float] = field(default_factory=list)
    model_dir: Optional[Path] = None

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data["model_dir"] = str(self.model_dir) if self.model_dir else None
        data["losses"] = [round(x, 6) for x in self.losses]
        return data


def batch_loss(
    encoder: DenseEncoder,
    pairs: Sequence[SynonymPair],
    config: DenseTrainConfig,
    autocast: Optional["torch.dtype"] = None,
) -> Tuple["torch.Tensor", Dict[str, int]]:
    """The multi-similarity loss of one batch of pairs, and the mined pair counts.
    ``autocast`` covers the encoder only: similarities and loss stay in float32."""
    texts = [p.left for p in pairs] + [p.right for p in pairs]
    same = same_concept([p.left_ids for p in pairs] + [p.right_ids for p in pairs]).to(encoder.device)
    with autocast_to(encoder.device, autocast):
        vectors = encoder.embed(encoder.tokenize(texts))
    vectors = vectors.float()
    sim = vectors @ vectors.T
    pos, neg = mine(sim.detach(), same, config.miner, config.epsilon, config.triplet_margin)
    loss = multi_similarity_loss(sim, pos, neg, config.alpha, config.beta, config.base)
    return loss, {"hard_pos": int(pos.sum()), "hard_neg": int(neg.sum())}


def train_sapbert(
    encoder: DenseEncoder, pairs: SynonymPairs, config: DenseTrainConfig, out_dir: Optional[PathLike] = None
) -> DenseTrainResult:
    """Train ``encoder`` in place until ``max_steps`` or ``max_seconds``; with
    ``out_dir``, write the log and save the encoder to ``out_dir/model``."""
    set_seed(config.seed)
    out = Path(out_dir) if out_dir is not None else None
    log_path = out / LOG_FILE if out is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        if log_path.exists():
            log_path.unlink()
    device = encoder.device
    autocast = autocast_dtype(config.precision, device)
    append_log(
        log_path,
        {
            "event": "start",
            "config": asdict(config),
            "device": str(device),
            "autocast": str(autocast),
            "pairs_per_epoch": len(pairs),
        },
    )
    model = encoder.model
    # SapBERT's recipe: weight decay on every parameter (not the seq2seq stages' grouping)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(config, s))
    result = DenseTrainResult()
    epoch_pairs = pairs.epoch(0)
    position = 0
    began = time.monotonic()
    bar = StepProgress.start("train-dense", config.max_steps, max_seconds=config.max_seconds, enabled=config.progress)
    ended = False
    window: List[float] = []
    counts: Dict[str, int] = {}
    model.train()
    try:
        while result.step < config.max_steps:
            if position + config.batch_size > len(epoch_pairs):
                # the tail of an epoch that does not fill a batch is dropped
                result.epoch += 1
                epoch_pairs, position = pairs.epoch(result.epoch), 0
            batch = epoch_pairs[position : position + config.batch_size]
            position += config.batch_size

            def micro_batch_loss(batch: List[SynonymPair] = batch) -> torch.Tensor:
                loss, mined = batch_loss(encoder, batch, config, autocast)
                counts.update(mined)
                return loss

            value, lr = train_step(model, optimizer, scheduler, micro_batch_loss, max_grad_norm=config.max_grad_norm)
            result.step += 1
            result.losses.append(value)
            window.append(value)
            bar.update(1, loss=f"{value:.4f}", pos=counts["hard_pos"], neg=counts["hard_neg"])
            if log_due(result.step, config.log_every):
                append_log(
                    log_path,
                    {
                        "step": result.step,
                        "loss": sum(window) / len(window),
                        "lr": lr,
                        "epoch": result.epoch,
                        **counts,
                        "elapsed": round(time.monotonic() - began, 2),
                    },
                )
                window = []
            if config.max_seconds is not None and time.monotonic() - began > config.max_seconds:
                result.stopped_by = "max_seconds"
                logger.info("Time budget of %.0fs reached at step %d", config.max_seconds, result.step)
                break
        ended = True
    finally:
        bar.close(stopped=ended)
        model.eval()
    result.seconds = time.monotonic() - began
    if out is not None:
        final = out / "model"
        tmp = fresh_tmp(final)
        encoder.save(tmp, base_model=str(encoder.source_dir) if encoder.source_dir else None, steps=result.step)
        replace_dir(tmp, final)
        result.model_dir = final
        append_log(log_path, {"event": "end", **{k: v for k, v in result.to_dict().items() if k != "losses"}})
    return result


def train_dense(
    kb_path: PathLike,
    out_dir: PathLike,
    config_path: PathLike,
    model_dir: Optional[PathLike] = None,
    train_jsonl: Optional[PathLike] = None,
    overrides: Optional[Mapping[str, Any]] = None,
    device: str = "auto",
) -> DenseTrainResult:
    """The ``train-dense`` step: KB (+ training mentions) -> ``out_dir/model``.
    ``overrides`` are dotted config keys (``{"training.max_seconds": 900}``)."""
    config, text = load_dense_config(config_path, overrides)
    kb = KnowledgeBase.load(kb_path)
    mentions = mention_pairs_from_jsonl(train_jsonl) if train_jsonl else []
    pairs = SynonymPairs(
        kb, mentions, kb_pairs=config.kb_pairs, mention_repeats=config.mention_repeats, seed=config.seed
    )
    logger.info(
        "%d synonym groups, %d mention pairs: %d pairs per epoch",
        len(pairs.groups),
        len(pairs.mention_pairs),
        len(pairs),
    )
    encoder = DenseEncoder.load(model_dir, pooling=config.pooling, max_length=config.max_length, device=device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.cfg").write_text(text, encoding="utf8")
    result = train_sapbert(encoder, pairs, config, out)
    atomic_json(out / "result.json", result.to_dict())
    return result
