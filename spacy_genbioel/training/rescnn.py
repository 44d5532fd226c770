"""BioSyn-style training of the ResCNN retriever (Sung et al. 2020, as Lai et al. 2021 train theirs).

Queries are texts with gold concepts: training mentions (normalized, paired
with their gold IDs by ``corpus``) and KB synonyms (names of concepts with two
names or more, ``kb_queries`` of them drawn afresh each epoch; a name is never
its own candidate), both taken from :class:`~spacy_genbioel.training.sapbert.SynonymPairs`,
the SapBERT-style trainer's pair sampling.

At the start of each epoch the candidates are refreshed (BioSyn's iterative
candidate retrieval): every KB name is encoded with the current network, and
each query gets the ``topk * dense_ratio`` nearest names by cosine, filled up
to ``topk`` with its nearest names by character 3-gram TF-IDF (the sparse
scores, fixed). A step scores a batch of queries against their candidates,
``score = sparse_weight * tfidf + scale * cosine`` (both weights learned, at
``sparse_learning_rate`` as BioSyn's sparse weight), and minimizes the
marginal negative log-likelihood of the candidates that share a gold concept
(:func:`marginal_nll`: BioSyn's synonym marginalization; queries without a
positive candidate are left out). The network, both queries and candidates
are encoded with gradients, as in BioSyn. Inference ranks by cosine alone.

Outputs in ``OUT``: ``model/`` (:class:`~spacy_genbioel.retrieval.rescnn.ResCNNEncoder`
files), ``train_log.jsonl``, ``config.cfg``, ``result.json``. Settings:
``configs/rescnn.cfg`` (``[model]``, ``[training]``, ``[data]``), every one of
them a field of :class:`ResCNNTrainConfig`.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.progress import StepProgress
from spacy_genbioel.retrieval.rescnn import ResCNNArch, ResCNNEncoder, ResCNNLinker
from spacy_genbioel.retrieval.rescnn_checks import check_rescnn_settings
from spacy_genbioel.retrieval.settings import ResCNNSettings
from spacy_genbioel.training.checkpoints import fresh_tmp, replace_dir
from spacy_genbioel.training.loop import log_due, set_seed, train_step
from spacy_genbioel.training.sapbert import DenseTrainResult, SynonymPairs, mention_pairs_from_jsonl
from spacy_genbioel.training.settings import read_config
from spacy_genbioel.training.trainlog import LOG_FILE, append_log
from spacy_genbioel.util import PathLike, atomic_json

logger = logging.getLogger(__name__)

__all__ = [
    "RESCNN_SECTIONS",
    "Query",
    "ResCNNTrainConfig",
    "ResCNNTrainResult",
    "epoch_queries",
    "load_rescnn_config",
    "marginal_nll",
    "PoolSearch",
    "refresh_candidates",
    "train_rescnn",
    "train_rescnn_step",
]


@dataclass
class ResCNNTrainConfig:
    """Every setting of ``train-rescnn``; the config file groups them (:data:`RESCNN_SECTIONS`)."""

    # [model]: the paper's best shape (ResCNNArch)
    hidden: int = 256
    blocks: int = 4
    filters: int = 100
    kernel_sizes: Sequence[int] = (1, 3, 5)
    dropout: float = 0.2
    max_length: int = 25
    # [training]
    epochs: int = 10
    max_seconds: Optional[float] = None
    batch_size: int = 16  # queries per step (BioSyn's 16), each with topk candidates
    learning_rate: float = 1e-3  # the paper's rate for the CNN (Adam)
    weight_decay: float = 0.0
    sparse_learning_rate: float = 0.01  # BioSyn's rate for the sparse weight (and here the cosine scale)
    initial_sparse_weight: float = 0.0
    initial_scale: float = 20.0
    topk: int = 20  # BioSyn's candidates per query
    dense_ratio: float = 0.5  # share of them taken from the dense ranking (BioSyn's 0.5)
    max_grad_norm: float = 1.0
    seed: int = 0
    log_every: int = 20
    progress: bool = True
    # [data]
    kb_queries: int = 4000  # KB synonyms drawn as queries each epoch (0: mentions only)
    mention_repeats: int = 1  # training mentions per epoch
    encode_batch: int = 256  # texts per batch when the candidates are refreshed
    # 0: each refresh encodes every KB name (BioSyn); N: only a pool of names, each query's N nearest by
    # TF-IDF and its gold concepts' names (a 788k-name KB: refreshes took 73% of a CPU run's budget)
    refresh_pool: int = 0

    def arch(self) -> ResCNNArch:
        return ResCNNArch(
            self.hidden, self.blocks, self.filters, tuple(self.kernel_sizes), self.dropout, self.max_length
        )

    def __post_init__(self) -> None:
        # every numeric setting finite and in range, however the config was built (file, overrides, code)
        dotted = {
            f"{section}.{name}": getattr(self, name) for section, names in RESCNN_SECTIONS.items() for name in names
        }
        for key, value in check_rescnn_settings(dotted, "rescnn").items():
            setattr(self, key.partition(".")[2], value)
        if not 0.0 <= self.dense_ratio <= 1.0 or self.topk < 2 or self.batch_size < 1:
            raise ValueError("rescnn: need 0 <= dense_ratio <= 1, topk >= 2 and batch_size >= 1")
        if self.refresh_pool < 0 or (0 < self.refresh_pool <= self.topk):
            raise ValueError(
                "rescnn: refresh_pool must be 0 (the whole KB) or "
                f"more than topk ({self.topk}), got {self.refresh_pool}"
            )


RESCNN_SECTIONS: Dict[str, Sequence[str]] = {
    "model": ("hidden", "blocks", "filters", "kernel_sizes", "dropout", "max_length"),
    "training": (
        "epochs",
        "max_seconds",
        "batch_size",
        "learning_rate",
        "weight_decay",
        "sparse_learning_rate",
        "initial_sparse_weight",
        "initial_scale",
        "topk",
        "dense_ratio",
        "max_grad_norm",
        "seed",
        "log_every",
        "progress",
    ),
    "data": ("kb_queries", "mention_repeats", "encode_batch", "refresh_pool"),
}
assert {f.name for f in fields(ResCNNTrainConfig)} == {n for names in RESCNN_SECTIONS.values() for n in names}


def load_rescnn_config(
    path: Optional[PathLike], overrides: Optional[Mapping[str, Any]] = None
) -> Tuple[ResCNNTrainConfig, str]:
    """``configs/rescnn.cfg`` (None: the defaults) with dotted overrides (``{"training.epochs": 3}``)."""
    if path is None:
        values: Dict[str, Dict[str, Any]] = {}
        for key, value in (overrides or {}).items():
            section, _, name = key.partition(".")
            if name not in RESCNN_SECTIONS.get(section, ()):
                raise ValueError(
                    f"Unknown setting {key!r}; known: "
                    + ", ".join(f"{s}.{n}" for s, names in RESCNN_SECTIONS.items() for n in names)
                )
            values.setdefault(section, {})[name] = value
        config = ResCNNTrainConfig(**{k: v for settings in values.values() for k, v in settings.items()})
        return config, ""
    values, text = read_config(path, overrides, RESCNN_SECTIONS)
    return ResCNNTrainConfig(**{k: v for settings in values.values() for k, v in settings.items()}), text


# -- the loss -------------------------------------------------------------------------------------
def marginal_nll(scores: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """BioSyn's synonym marginalization: ``-log sum_{positive c} softmax(scores)_c``, averaged over
    the rows with a positive (0 when none has one)."""
    keep = positive.any(dim=1)
    if not bool(keep.any()):
        return scores.sum() * 0.0
    scores, positive = scores[keep], positive[keep]
    return (
        torch.logsumexp(scores, dim=1) - torch.logsumexp(scores.masked_fill(~positive, float("-inf")), dim=1)
    ).mean()


# -- queries and candidates --------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    """A training query: its normalized text, gold concepts and its own KB name index (-1: none)."""

    text: str
    gold: FrozenSet[str]
    own: int = -1


def epoch_queries(kb: KnowledgeBase, pairs: SynonymPairs, config: ResCNNTrainConfig, epoch: int) -> List[Query]:
    """The epoch's queries, shuffled: ``kb_queries`` KB synonyms drawn afresh and the training mentions."""
    rng = random.Random(f"{config.seed}/{epoch}/rescnn")
    synonyms = [name for names in pairs.groups for name in names]
    drawn = rng.sample(synonyms, min(len(synonyms), config.kb_queries))
    queries = []
    for name in drawn:
        own = kb.name_index(name)
        queries.append(
            Query(
                name,
                frozenset(kb.ids_for_name_index(own)) if own is not None else frozenset(),
                own if own is not None else -1,
            )
        )
    queries += [Query(p.left, p.left_ids) for p in pairs.mention_pairs] * config.mention_repeats
    rng.shuffle(queries)
    return queries


class PoolSearch:
    """``nearest_names`` over a pool of KB names only (``refresh_pool``), answering in the KB's name indices:
    each query's ``size`` nearest names by TF-IDF and the names of its gold concepts, encoded once."""

    def __init__(
        self,
        kb: KnowledgeBase,
        encoder: ResCNNEncoder,
        tfidf,
        queries: Sequence[Query],
        size: int,
        batch_size: int = 256,
    ) -> None:
        pool = {kb.name_index(c.name) for row in tfidf.link([q.text for q in queries], top_k=size) for c in row}
        pool.update(kb.name_index(name) for q in queries for cid in sorted(q.gold) for name in kb.names_of(cid))
        self.kb, self.encoder, self.batch_size = kb, encoder, batch_size
        self.pool = np.array(sorted(i for i in pool if i is not None), dtype=np.int64)
        self.vectors = encoder.encode([kb.names[int(i)] for i in self.pool], batch_size=batch_size, progress=False)

    def nearest_names(self, queries: torch.Tensor, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(scores, KB name indices; -1 past the pool's end) of the ``k`` nearest pool names per query row."""
        n = queries.shape[0]
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        index = np.full((n, k), -1, dtype=np.int64)
        take = min(k, len(self.pool))
        with torch.inference_mode():
            for start in range(0, n, self.batch_size):
                top = (queries[start : start + self.batch_size] @ self.vectors.T).topk(take, dim=1) if take else None
                if top is not None:
                    scores[start : start + self.batch_size, :take] = top.values.numpy()
                    index[start : start + self.batch_size, :take] = self.pool[top.indices.numpy()]
        return scores, index


def refresh_candidates(
    linker: Union[ResCNNLinker, PoolSearch], tfidf, queries: Sequence[Query], config: ResCNNTrainConfig
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidate name indices, their TF-IDF scores, positive mask), each (queries, topk): the
    ``topk * dense_ratio`` nearest names by cosine, then TF-IDF's nearest, a query's own name left out."""
    kb, k = linker.kb, config.topk
    texts = [q.text for q in queries]
    n_dense = int(round(k * config.dense_ratio))
    _, dense = linker.nearest_names(
        linker.encoder.encode(texts, batch_size=config.encode_batch, progress=False), min(len(kb.names), k + 1)
    )
    sparse = tfidf.link(texts, top_k=k + 1)
    chosen = np.zeros((len(queries), k), dtype=np.int64)
    for row, query in enumerate(queries):
        dense_row = [int(i) for i in dense[row] if i >= 0 and i != query.own]
        picked = dense_row[:n_dense]
        for name in [kb.name_index(c.name) for c in sparse[row]] + dense_row[n_dense:]:
            if len(picked) == k:
                break
            if name is not None and name != query.own and name not in picked:
                picked.append(name)
        picked += [picked[-1] if picked else 0] * (k - len(picked))  # a tiny KB: repeat the last
        chosen[row] = picked
    sparse_scores = tfidf.pair_scores(texts, chosen, normalize=False)
    positive = np.array(
        [
            [bool(query.gold.intersection(kb.ids_for_name_index(int(i)))) for i in chosen[row]]
            for row, query in enumerate(queries)
        ],
        dtype=bool,
    ).reshape(chosen.shape)
    return chosen, sparse_scores, positive


# -- training --------------------------------------------------------------------------------------------
@dataclass
class ResCNNTrainResult(DenseTrainResult):
    """:class:`~spacy_genbioel.training.sapbert.DenseTrainResult` plus the time spent refreshing
    candidates and the learned score weights."""

    stopped_by: str = "epochs"
    refresh_seconds: float = 0.0
    sparse_weight: float = 0.0
    scale: float = 0.0
    trainable_parameters: int = 0


class _Weights(torch.nn.Module):
    """BioSyn's learned sparse weight, and the scale of the cosine."""

    def __init__(self, sparse: float, scale: float) -> None:
        super().__init__()
        self.sparse = torch.nn.Parameter(torch.tensor(float(sparse)))
        self.scale = torch.nn.Parameter(torch.tensor(float(scale)))


def _step_loss(
    encoder: ResCNNEncoder,
    weights: _Weights,
    texts: Sequence[str],
    names: Sequence[str],
    sparse: torch.Tensor,
    positive: torch.Tensor,
) -> torch.Tensor:
    queries = encoder.embed(texts)
    candidates = encoder.embed(names).view(len(texts), -1, queries.shape[1])
    scores = weights.sparse * sparse + weights.scale * torch.einsum("bd,bkd->bk", queries, candidates)
    return marginal_nll(scores, positive)


def train_rescnn(
    encoder: ResCNNEncoder,
    kb: KnowledgeBase,
    pairs: SynonymPairs,
    config: ResCNNTrainConfig,
    out_dir: Optional[PathLike] = None,
) -> ResCNNTrainResult:
    """Train ``encoder`` in place for ``epochs`` (or until ``max_seconds``); with ``out_dir``,
    write the log and save the network to ``out_dir/model``."""
    from spacy_genbioel.retrieval.tfidf import TfidfLinker

    set_seed(config.seed)
    out = Path(out_dir) if out_dir is not None else None
    log_path = out / LOG_FILE if out is not None else None
    if log_path is not None:
        out.mkdir(parents=True, exist_ok=True)
        log_path.unlink(missing_ok=True)
    model = encoder.model
    weights = _Weights(config.initial_sparse_weight, config.initial_scale).to(encoder.device)
    optimizer = torch.optim.Adam(
        [
            {"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": config.weight_decay},
            {"params": list(weights.parameters()), "lr": config.sparse_learning_rate, "weight_decay": 0.0},
        ],
        lr=config.learning_rate,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    tfidf = TfidfLinker(kb)
    result = ResCNNTrainResult(trainable_parameters=model.n_trainable)
    append_log(
        log_path,
        {
            "event": "start",
            "config": asdict(config),
            "trainable_parameters": result.trainable_parameters,
            "kb_names": len(kb.names),
            "mention_queries": len(pairs.mention_pairs),
        },
    )
    began = time.monotonic()
    bar = StepProgress.start(
        "train-rescnn", config.epochs, unit="epoch", max_seconds=config.max_seconds, enabled=config.progress
    )
    try:
        for epoch in range(config.epochs):
            refresh_began = time.monotonic()
            queries = epoch_queries(kb, pairs, config, epoch)
            if config.refresh_pool:
                search: Union[ResCNNLinker, PoolSearch] = PoolSearch(
                    kb, encoder, tfidf, queries, config.refresh_pool, config.encode_batch
                )
            else:
                search = ResCNNLinker(
                    kb, encoder, ResCNNSettings(cache=False, batch_size=config.encode_batch, progress=False)
                )
            chosen, sparse, positive = refresh_candidates(search, tfidf, queries, config)
            del search
            result.refresh_seconds += time.monotonic() - refresh_began
            model.train()
            window: List[float] = []
            for start in range(0, len(queries), config.batch_size):
                rows = slice(start, start + config.batch_size)
                texts = [q.text for q in queries[rows]]
                names = [kb.names[int(i)] for i in chosen[rows].reshape(-1)]
                batch_sparse = torch.from_numpy(sparse[rows]).to(encoder.device)
                batch_positive = torch.from_numpy(positive[rows]).to(encoder.device)
                value, _ = train_step(
                    model,
                    optimizer,
                    scheduler,
                    partial(_step_loss, encoder, weights, texts, names, batch_sparse, batch_positive),
                    max_grad_norm=config.max_grad_norm,
                )
                result.step += 1
                result.losses.append(value)
                window.append(value)
                if log_due(result.step, config.log_every):
                    append_log(
                        log_path,
                        {
                            "step": result.step,
                            "epoch": epoch,
                            "loss": sum(window) / len(window),
                            "sparse_weight": weights.sparse.item(),
                            "scale": weights.scale.item(),
                            "elapsed": round(time.monotonic() - began, 2),
                        },
                    )
                    window = []
                if config.max_seconds is not None and time.monotonic() - began > config.max_seconds:
                    result.stopped_by = "max_seconds"
                    break
            model.eval()
            result.epoch = epoch + 1
            positives = float(positive.any(axis=1).mean()) if len(queries) else 0.0
            append_log(
                log_path,
                {
                    "event": "epoch",
                    "epoch": epoch + 1,
                    "queries": len(queries),
                    "with_positive": round(positives, 4),
                    "elapsed": round(time.monotonic() - began, 2),
                },
            )
            bar.update(
                1, loss=f"{(sum(result.losses[-50:]) / max(1, len(result.losses[-50:]))):.4f}", pos=f"{positives:.3f}"
            )
            if result.stopped_by == "max_seconds":
                logger.info("Time budget of %.0fs reached in epoch %d", config.max_seconds, epoch + 1)
                break
    finally:
        # an exception leaves the bar open-ended; a finished run or a spent budget closes it as stopped
        bar.close(stopped=result.epoch == config.epochs or result.stopped_by == "max_seconds")
    model.eval()
    result.seconds = time.monotonic() - began
    result.sparse_weight, result.scale = weights.sparse.item(), weights.scale.item()
    if out is not None:
        result.model_dir = _save_model(encoder, out / "model", result)
        append_log(log_path, {"event": "end", **{k: v for k, v in result.to_dict().items() if k != "losses"}})
    return result


def _save_model(encoder: ResCNNEncoder, final: Path, result: ResCNNTrainResult) -> Path:
    tmp = fresh_tmp(final)
    encoder.save(tmp, steps=result.step, epochs=result.epoch, sparse_weight=result.sparse_weight, scale=result.scale)
    replace_dir(tmp, final)
    return final


@dataclass(frozen=True)
class ResCNNRun:
    """Where ``train-rescnn`` reads and writes besides the KB and ``out``."""

    config: Optional[PathLike] = None
    train_jsonl: Optional[PathLike] = None
    #: the BERT directory whose word-piece table is taken (None: the installed all-MiniLM-L6-v2)
    wordpieces: Optional[PathLike] = None
    #: write the trained model's name index of the KB beside the KB
    index: bool = True
    device: str = "cpu"


def train_rescnn_step(
    kb_path: PathLike, out_dir: PathLike, run: ResCNNRun = ResCNNRun(), overrides: Optional[Mapping[str, Any]] = None
) -> ResCNNTrainResult:
    """The ``train-rescnn`` step: KB (+ training mentions) -> ``out_dir/model`` (and the KB's index beside it)."""
    from spacy_genbioel.util import resolve_device

    config, text = load_rescnn_config(run.config, overrides)
    kb = KnowledgeBase.load(kb_path)
    mentions = mention_pairs_from_jsonl(run.train_jsonl) if run.train_jsonl else []
    pairs = SynonymPairs(kb, mentions, kb_pairs=config.kb_queries > 0, seed=config.seed)
    logger.info("%d synonym groups, %d training mentions", len(pairs.groups), len(pairs.mention_pairs))
    encoder = ResCNNEncoder.from_wordpieces(run.wordpieces, config.arch(), seed=config.seed)
    encoder.model.to(resolve_device(run.device))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.cfg").write_text(text, encoding="utf8")
    result = train_rescnn(encoder, kb, pairs, config, out)
    atomic_json(out / "result.json", result.to_dict())
    if run.index and result.model_dir is not None:
        ResCNNLinker(
            kb, result.model_dir, ResCNNSettings(index_dir=str(Path(kb_path).resolve().parent), device=run.device)
        )
    return result
