"""ANGEL: negative-aware preference training (Kim et al., ACL Findings 2025).

A positive-only model (fine-tuned, or KB-guided pre-trained) ranks KB names
for the training mentions with the very constrained beam search it uses at
inference; its own mistakes become preference pairs ``(x, e_w, e_l)``, and DPO
(Rafailov et al. 2023) raises ``log p(e_w|x)`` against ``log p(e_l|x)``
relative to a frozen reference model::

    loss = -log sigmoid(beta * ((log p(e_w|x) - log p_ref(e_w|x)) - (log p(e_l|x) - log p_ref(e_l|x))))

Pairs (:func:`preference_pairs`, :func:`mine_pairs`): a candidate is correct
when its IDs meet the gold IDs (a name shared by several concepts carries them
all). Every correct candidate at rank ``k`` is paired with every wrong one
ranked above it; a correct top-1 is paired with the highest-ranked wrong
candidate; a mention whose gold is not in the top-k gives no pair, or, with
``gold_fallback``, the gold concept's best TF-IDF synonym
(:func:`~spacy_genbioel.training.targets.select_targets`) against the top wrong
prediction.

Rounds (:class:`AngelTrainer`), as ANGEL's released trainer: mine with the
current model on the round's share of the training mentions, take the current
model as the reference, train, evaluate dev recall@1, keep the best model and
stop when dev recall@1 has not improved for ``patience`` rounds. The
pre-training variant (:func:`kb_negative_pairs`) pairs a KB-guided
pre-training example's target with the name of *another* concept most similar
to it by character 3-gram TF-IDF; ``kb_negatives`` mixes such pairs into each
round.

Decisions, and where they depart from ANGEL's released code
(``dmis-lab/ANGEL``, ``train_negative_aware.py``, as we read it):

* Sequence log-probabilities are the sum over the name tokens and EOS after
  *exactly* the inference decoder prompt: the pairs are encoded by
  :func:`~spacy_genbioel.training.seq2seq.encode_examples` with the mining
  linker's own :class:`~spacy_genbioel.linking.decoder.PromptTokenizer`, so chosen
  and rejected share the prompt and decoder start the trie search used, and
  ``log p / length`` of a candidate equals its beam score (a test checks it).
  ANGEL decodes the beams to text and gives TRL ``"mention is name"``
  strings to tokenize again: the prompt is scored along with the name, and the
  chosen string keeps the decoded name's leading space (``"is  name"``) while
  the rejected one is stripped whenever the chosen name is not the top-1, so
  the two sides of a pair need not even share the tokens after ``is``.
* No label smoothing inside the log-probabilities (it would change the
  probabilities DPO compares); ``[training] label_smoothing`` is unused here.
* The reference is the model at the start of each round (ANGEL builds a new
  ``DPOTrainer`` around a deep copy every round). The round's pairs are fixed
  and the reference is frozen, so its log-probabilities are computed once per
  round in one no-grad pass (TRL's ``precompute_ref_log_probs``) rather than
  by a second model held in memory.
* Dropout is off during DPO by default (``disable_dropout``, TRL's default):
  policy and reference then agree at the first step, whose loss is log 2.
* Dev recall@1 is measured after each round on the model that round trained.
  ANGEL measures it at the start of a round and then saves the model trained
  in that round on that (earlier) score.
* ANGEL computes the gold concept's TF-IDF synonyms for mentions whose gold is
  missing from the top-k but never makes a pair of them; here that is the
  ``gold_fallback`` option, off by default.
* No SFT/NLL term by default: ANGEL's released trainer is TRL's
  ``DPOTrainer`` with its defaults (sigmoid loss, no NLL term) and its
  abstract speaks of direct preference optimization (the full paper could not
  be read here). ``sft_weight`` adds that weight times the mean per-token NLL
  of the chosen name (as RPO, Pang et al. 2024).
* Mentions are de-duplicated before mining (``train.jsonl`` repeats a mention
  once per target when ``top_k_targets`` > 1; ANGEL mined every line, so its
  pairs came in copies).

Why not TRL's ``DPOTrainer`` (not installed here either): it tokenizes
prompt, chosen and rejected *text* itself and, for encoder-decoder models,
built the decoder input by shifting the tokenized labels, so it cannot be
handed the linker's prompt ids, and its log-probabilities cover whatever the
text tokenizes to. Its 2026 refactor targets causal language models: the
KTO part of it (huggingface/trl#4792, done together with the DPO refactor
#3906) removed the encoder-decoder code paths. The loop below is short and
reuses the training engine's optimizer groups, precision, dev evaluation,
best-model bookkeeping, log and export, so the stage leaves the same files as
the others (``model``, ``best``, ``train_log.jsonl``,
``curve.png``) plus ``pairs/round_NNN.jsonl`` for inspection.

The module imports no torch until a function needs it: the command-line app
registers :func:`register_angel_commands` at start-up.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from spacy_genbioel.util import PathLike

import typer  # light; the command's annotations are resolved in this module

from spacy_genbioel.ty import Candidate, Linker, Mention
from spacy_genbioel.training.examples import TrainingExample, mention_from_dict, mention_to_dict

if TYPE_CHECKING:
    import torch

    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.training.engine import EngineConfig, ExampleSource

logger = logging.getLogger(__name__)

PAIRS_DIR = "pairs"


# -- settings ---------------------------------------------------------------------------
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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AngelConfig":
        from spacy_genbioel.training.seq2seq import config_from_dict

        return config_from_dict(cls, data, "[angel]")


# -- preference pairs ---------------------------------------------------------------------
@dataclass(frozen=True)
class PreferencePair:
    """A mention with a preferred (``chosen``) and a dispreferred (``rejected``) KB name."""

    mention: Mention
    chosen: str
    rejected: str
    chosen_rank: Optional[int] = None  # 1-based rank in the model's top-k; None: not predicted
    rejected_rank: Optional[int] = None
    chosen_ids: Tuple[str, ...] = ()
    rejected_ids: Tuple[str, ...] = ()
    kind: str = "mined"  # mined | gold_fallback | kb

    def to_dict(self) -> Dict[str, Any]:
        data = mention_to_dict(self.mention)
        data.update(chosen=self.chosen, rejected=self.rejected, chosen_rank=self.chosen_rank,
                    rejected_rank=self.rejected_rank, chosen_ids=list(self.chosen_ids),
                    rejected_ids=list(self.rejected_ids), kind=self.kind)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "") -> "PreferencePair":
        return cls(mention_from_dict(dict(data), where), data["chosen"], data["rejected"], data.get("chosen_rank"),
                   data.get("rejected_rank"), tuple(data.get("chosen_ids", ())), tuple(data.get("rejected_ids", ())),
                   data.get("kind", "mined"))


def write_pairs_jsonl(pairs: Iterable[PreferencePair], path: PathLike) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf8") as out:
        for pair in pairs:
            out.write(json.dumps(pair.to_dict(), ensure_ascii=False) + "\n")
            count += 1
    return count


def read_pairs_jsonl(path: PathLike) -> List[PreferencePair]:
    path = Path(path)
    with path.open(encoding="utf8") as lines:
        return [PreferencePair.from_dict(json.loads(line), f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()]


def preference_pairs(gold: Iterable[str], candidates: Sequence[Candidate]) -> List[Tuple[int, int]]:
    """ANGEL's pairs over one ranking, as ``(chosen, rejected)`` 0-based ranks.

    A candidate is correct when its IDs meet ``gold``. Every correct candidate
    at rank ``k > 0`` is paired with every wrong candidate ranked above it; a
    correct top-1 with the highest-ranked wrong candidate. No correct candidate
    (or no wrong one): no pair.
    """
    gold_set = frozenset(gold)
    correct = [bool(gold_set.intersection(c.ids)) for c in candidates]
    wrong = [j for j, ok in enumerate(correct) if not ok]
    pairs: List[Tuple[int, int]] = []
    for k, ok in enumerate(correct):
        if not ok:
            continue
        if k == 0:
            pairs.extend((0, j) for j in wrong[:1])
        else:
            pairs.extend((k, j) for j in wrong if j < k)
    return pairs


@dataclass
class MiningStats:
    mentions: int = 0  # mentions with gold IDs that were linked
    no_gold: int = 0  # left out: no gold ID
    top1_correct: int = 0
    gold_in_top_k: int = 0
    gold_missing: int = 0
    mined_pairs: int = 0
    fallback_pairs: int = 0

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = asdict(self)
        data["recall@1"] = self.top1_correct / self.mentions if self.mentions else None
        data["recall@k"] = self.gold_in_top_k / self.mentions if self.mentions else None
        return data


def mine_pairs(
    linker: Linker,
    mentions: Sequence[Mention],
    top_k: int = 5,
    *,
    gold_fallback: bool = False,
    kb: Optional[KnowledgeBase] = None,
    vectorizer=None,
    chunk_size: int = 0,
    progress: bool = False,
) -> Tuple[List[PreferencePair], MiningStats]:
    """Rank ``mentions`` with ``linker`` (top ``top_k``) and turn the rankings into pairs.

    ``gold_fallback`` (needs ``kb``) pairs, for a mention whose gold concept is
    not in the top-k, the gold concept's most similar synonym (TF-IDF, as the
    fine-tuning targets; ``vectorizer`` from
    :func:`~spacy_genbioel.training.targets.fit_name_vectorizer` saves refitting)
    with the top wrong prediction. ``chunk_size`` mentions are linked at a time
    (0: all at once), which is what the progress bar counts.
    """
    from spacy_genbioel.evaluation.report import gold_id_set

    if gold_fallback and kb is None:
        raise ValueError("gold_fallback needs the KB")
    stats = MiningStats()
    usable = [m for m in mentions if gold_id_set(m)]
    stats.no_gold = len(mentions) - len(usable)
    stats.mentions = len(usable)
    rankings: List[List[Candidate]] = []
    step = chunk_size or max(1, len(usable))
    bar = None
    if progress and usable:
        from tqdm import tqdm

        bar = tqdm(total=len(usable), desc="mine", unit="mention", dynamic_ncols=True, leave=False)
    for begin in range(0, len(usable), step):
        rankings.extend(linker.link(usable[begin : begin + step], top_k=top_k))
        if bar is not None:
            bar.update(min(step, len(usable) - begin))
    if bar is not None:
        bar.close()
    pairs: List[PreferencePair] = []
    missing: List[Tuple[Mention, Sequence[Candidate]]] = []
    for mention, candidates in zip(usable, rankings):
        candidates = candidates[:top_k]
        gold = gold_id_set(mention)
        hits = [bool(gold.intersection(c.ids)) for c in candidates]
        stats.top1_correct += bool(hits and hits[0])
        if not any(hits):
            missing.append((mention, candidates))
            continue
        stats.gold_in_top_k += 1
        for k, j in preference_pairs(gold, candidates):
            pairs.append(PreferencePair(mention, candidates[k].name, candidates[j].name, k + 1, j + 1,
                                        tuple(candidates[k].ids), tuple(candidates[j].ids)))
    stats.gold_missing = len(missing)
    stats.mined_pairs = len(pairs)
    if gold_fallback and missing:
        fallback = gold_fallback_pairs(kb, missing, vectorizer)
        stats.fallback_pairs = len(fallback)
        pairs.extend(fallback)
    return pairs, stats


def gold_fallback_pairs(
    kb: KnowledgeBase, missing: Sequence[Tuple[Mention, Sequence[Candidate]]], vectorizer=None
) -> List[PreferencePair]:
    """For mentions whose gold is not among their candidates: the gold concept's
    most similar synonym (char 3-gram TF-IDF) against the top (wrong) candidate.
    Mentions without candidates, composite ones and those whose gold concept
    has no name in the KB give no pair."""
    from spacy_genbioel.training.targets import select_targets

    with_candidates = [(m, c) for m, c in missing if c]
    if not with_candidates:
        return []
    examples, _ = select_targets(kb, [m for m, _ in with_candidates], top_k=1, vectorizer=vectorizer)
    best = {id(e.mention): e.target for e in examples}
    pairs: List[PreferencePair] = []
    for mention, candidates in with_candidates:
        target = best.get(id(mention))
        if target is None:
            continue
        pairs.append(PreferencePair(mention, target, candidates[0].name, None, 1, kb.ids_for_name(target, normalize=False),
                                    tuple(candidates[0].ids), kind="gold_fallback"))
    return pairs


def kb_negative_pairs(
    kb: KnowledgeBase,
    examples: Sequence[TrainingExample],
    *,
    tfidf=None,
    pool: int = 1,
    seed: int = 0,
) -> List[PreferencePair]:
    """Pairs for KB-guided pre-training examples (ANGEL's pre-training variant).

    ``chosen`` is the example's target (a name of its concept); ``rejected`` is
    the name of *another* concept most similar to the target by character
    3-gram TF-IDF (``tfidf``: a :class:`~spacy_genbioel.retrieval.peers.TfidfLinker` on
    ``kb``, built when not given), or one of the ``pool`` most similar, drawn
    with ``seed``. A name the example's concept shares with others is never a
    negative. An example gives no pair when no other concept's name shares a
    character 3-gram with its target, or when its own concept's names crowd
    out every other one among the nearest names.
    """
    from spacy_genbioel.retrieval.peers import TfidfLinker

    if not examples:
        return []
    tfidf = tfidf or TfidfLinker(kb)
    pool = max(1, pool)
    rng = random.Random(seed)
    ranked = tfidf.link([e.target for e in examples], top_k=pool + 32)
    pairs: List[PreferencePair] = []
    for example, candidates in zip(examples, ranked):
        gold = set(example.mention.ids)
        wrong = [c for c in candidates if not gold.intersection(c.ids)][:pool]
        if not wrong:
            continue
        negative = wrong[rng.randrange(len(wrong))]
        pairs.append(PreferencePair(example.mention, example.target, negative.name, None, None,
                                    kb.ids_for_name(example.target, normalize=False), tuple(negative.ids), kind="kb"))
    return pairs


# -- log-probabilities and the loss -----------------------------------------------------------
def encode_pairs(pairs: Sequence[PreferencePair], tokenizer, prompts, inputs, pad_token_id: int,
                 max_source_tokens: int = 256) -> Dict[str, torch.Tensor]:
    """The chosen names (first half of the rows) and the rejected ones (second
    half) after each mention's inference prompt, by
    :func:`~spacy_genbioel.training.seq2seq.encode_examples`."""
    from spacy_genbioel.training.seq2seq import encode_examples

    examples = [TrainingExample(p.mention, p.chosen) for p in pairs] + [TrainingExample(p.mention, p.rejected) for p in pairs]
    return encode_examples(examples, tokenizer, prompts, inputs, pad_token_id, max_source_tokens)


def _label_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    token_nll = F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=-100, reduction="none")
    return -token_nll.sum(dim=-1)


def sequence_logprobs(model, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``log p(name + EOS | source, prompt)`` per row of an
    :func:`~spacy_genbioel.training.seq2seq.encode_examples` batch: the sum of
    the log-probabilities of the labelled tokens, without label smoothing."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"])
    return _label_logprobs(out.logits, batch["labels"])


def pair_logprobs(model, batch: Mapping[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`sequence_logprobs` of an :func:`encode_pairs` batch as (chosen,
    rejected), reading each mention's source once for both names."""
    from transformers.modeling_outputs import BaseModelOutput

    n = batch["decoder_input_ids"].shape[0] // 2
    mask = batch["attention_mask"][:n]
    encoded = model.get_encoder()(input_ids=batch["input_ids"][:n], attention_mask=mask, return_dict=True)
    out = model(encoder_outputs=BaseModelOutput(last_hidden_state=encoded.last_hidden_state.repeat(2, 1, 1)),
                attention_mask=mask.repeat(2, 1), decoder_input_ids=batch["decoder_input_ids"])
    logps = _label_logprobs(out.logits, batch["labels"])
    return logps[:n], logps[n:]


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
    import torch.nn.functional as F

    logits = beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))
    return -F.logsigmoid(logits), logits


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

    ``evaluate(model, tokenizer)`` returns the dev metrics (``config.eval_metric``
    among them), as for the training engine; without it every round runs and
    the last model is exported. ``kb_examples`` (e.g.
    :class:`~spacy_genbioel.training.pretraining.PretrainingExamples`) supplies
    the examples of ``angel.kb_negatives`` KB-negative pairs per round.
    ``out_dir=None`` writes nothing (tests, experiments).
    """

    def __init__(
        self,
        model,
        tokenizer,
        kb: KnowledgeBase,
        config: EngineConfig,
        angel: Optional[AngelConfig] = None,
        *,
        inputs=None,
        out_dir: Optional[PathLike] = None,
        evaluate: Optional[Callable[[Any, Any], Any]] = None,
        device=None,
        kb_examples: Optional[ExampleSource] = None,
    ) -> None:
        from spacy_genbioel.linking.decoder import DecodingConfig, GenerativeLinker
        from spacy_genbioel.training.engine import TrainingEngine

        self.angel = angel or AngelConfig()
        if self.angel.kb_negatives and kb_examples is None:
            raise ValueError("kb_negatives needs kb_examples (KB-guided pre-training examples)")
        # the engine supplies the device, precision, optimizer groups, dev
        # evaluation with best-model bookkeeping, the log and the export
        self.engine = TrainingEngine(model, tokenizer, config, inputs=inputs, out_dir=out_dir, evaluate=evaluate, device=device)
        self.model, self.tokenizer, self.kb, self.config = model, tokenizer, kb, config
        self.inputs = self.engine.inputs
        self.kb_examples = kb_examples
        self.linker = GenerativeLinker(
            model, tokenizer, kb, inputs=self.inputs,
            config=DecodingConfig(num_beams=max(self.angel.num_beams, self.angel.top_k), top_k=self.angel.top_k,
                                  batch_size=self.angel.mine_batch_size, max_source_tokens=config.max_source_tokens),
        )
        # the pairs are scored after the prompt the mining search used, token for token
        self.prompts = self.linker.prompt_tokens
        self._vectorizer = None
        self._tfidf = None

    @property
    def out_dir(self) -> Optional[Path]:
        return self.engine.out_dir

    # -- scoring --------------------------------------------------------------------------
    def _autocast(self):
        import torch

        dtype = self.engine.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.engine.device.type, dtype=dtype)

    def _encode(self, pairs: Sequence[PreferencePair]) -> Dict[str, torch.Tensor]:
        batch = encode_pairs(pairs, self.tokenizer, self.prompts, self.inputs, self.engine.pad_id, self.config.max_source_tokens)
        return {k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()}

    def score_pairs(self, pairs: Sequence[PreferencePair], batch_size: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) sequence log-probabilities of the current model,
        without dropout or gradients, on the CPU."""
        import torch

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
        losses, logits = dpo_loss(chosen, rejected, ref_chosen.to(device), ref_rejected.to(device), self.angel.beta)
        loss = losses.mean()
        if self.angel.sft_weight:
            n_tokens = (tensors["labels"][: len(pairs)] != -100).sum(dim=-1).clamp(min=1)
            loss = loss + self.angel.sft_weight * (-chosen / n_tokens).mean()
        return loss, logits.detach(), (chosen - rejected).detach()

    # -- mining -----------------------------------------------------------------------------
    def mine(self, mentions: Sequence[Mention], round_no: int = 1) -> Tuple[List[PreferencePair], Dict[str, Any]]:
        """This round's pairs: mined from ``mentions`` with the current model, plus
        ``kb_negatives`` KB-negative pairs; returns them with mining statistics."""
        ang = self.angel
        if ang.gold_fallback and self._vectorizer is None:
            from spacy_genbioel.training.targets import fit_name_vectorizer

            self._vectorizer = fit_name_vectorizer(self.kb)
        self.model.eval()
        pairs, stats = mine_pairs(self.linker, mentions, ang.top_k, gold_fallback=ang.gold_fallback, kb=self.kb,
                                  vectorizer=self._vectorizer, chunk_size=4 * ang.mine_batch_size,
                                  progress=self.config.progress)
        info = stats.to_dict()
        if ang.kb_negatives:
            from spacy_genbioel.retrieval.peers import TfidfLinker
            from spacy_genbioel.training.cli_steps import SampledSource

            if self._tfidf is None:
                self._tfidf = TfidfLinker(self.kb)
            examples = SampledSource(self.kb_examples, ang.kb_negatives, self.config.seed).epoch(round_no)
            kb_pairs = kb_negative_pairs(self.kb, list(examples), tfidf=self._tfidf, pool=ang.kb_negative_pool,
                                         seed=1000 * self.config.seed + round_no)
            info["kb_pairs"] = len(kb_pairs)
            pairs = pairs + kb_pairs
        return pairs, info

    # -- training one round ------------------------------------------------------------------------
    def train_round(self, pairs: Sequence[PreferencePair], round_no: int = 1, first_step: int = 0,
                    out_of_time: Callable[[], bool] = lambda: False) -> Dict[str, Any]:
        """DPO on ``pairs`` against the current model as the reference; returns
        the round's training statistics (``steps``, mean ``train_loss``,
        preference accuracy and margin before and after, ...)."""
        import numpy as np
        import torch

        from spacy_genbioel.training.engine import lr_factor

        cfg, ang = self.config, self.angel
        began = time.monotonic()
        ref_chosen, ref_rejected = self.score_pairs(pairs)
        n = len(pairs)
        per_step = cfg.batch_size * cfg.grad_accumulation
        planned = ang.steps_per_round or max(1, math.ceil(n / per_step))
        planned = max(0, min(planned, cfg.max_steps - first_step))
        # a fresh optimizer and schedule each round (ANGEL: a new trainer per round)
        # over the round's steps, or its time when seconds_per_round ends first
        round_cfg = replace(cfg, max_steps=max(1, planned), max_seconds=ang.seconds_per_round)

        def time_fraction() -> float:
            return (time.monotonic() - began) / ang.seconds_per_round if ang.seconds_per_round else 0.0

        optimizer = self.engine._optimizer()
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(round_cfg, s, time_fraction()))
        rng = np.random.default_rng([cfg.seed, round_no])
        order, position = rng.permutation(n), 0
        losses: List[float] = []
        accuracies: List[float] = []
        window: List[float] = []
        bar = None
        if cfg.progress and planned:
            from tqdm import tqdm

            bar = tqdm(total=planned, desc=f"angel round {round_no}", unit="step", dynamic_ncols=True, leave=False)
        self.model.train(not ang.disable_dropout)
        stopped_by = "steps"
        step = 0
        try:
            while step < planned:
                optimizer.zero_grad(set_to_none=True)
                total, correct = 0.0, 0.0
                for _ in range(cfg.grad_accumulation):
                    if position + cfg.batch_size > n and position > 0:
                        order, position = rng.permutation(n), 0
                    idx = order[position : position + cfg.batch_size]
                    position += len(idx)
                    index = torch.as_tensor(idx, dtype=torch.long)
                    loss, logits, _ = self._batch_loss([pairs[i] for i in idx], ref_chosen[index], ref_rejected[index])
                    (loss / cfg.grad_accumulation).backward()
                    total += loss.detach().float().item()
                    correct += (logits > 0).float().mean().item()
                if cfg.max_grad_norm:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                lr = scheduler.get_last_lr()[0]
                optimizer.step()
                scheduler.step()
                step += 1
                losses.append(total / cfg.grad_accumulation)
                accuracies.append(correct / cfg.grad_accumulation)
                window.append(losses[-1])
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(loss=f"{losses[-1]:.4f}", lr=f"{lr:.2e}", refresh=False)
                if cfg.log_every and (step % cfg.log_every == 0 or step == 1):
                    self.engine._log({"round": round_no, "step": first_step + step, "loss": sum(window) / len(window),
                                      "reward_accuracy": accuracies[-1], "lr": lr})
                    window = []
                if out_of_time():
                    stopped_by = "max_seconds"
                    break
                if ang.seconds_per_round is not None and time.monotonic() - began > ang.seconds_per_round:
                    stopped_by = "seconds_per_round"
                    break
        finally:
            if bar is not None:
                bar.close()
            self.model.eval()
        # before (the reference) and after training, on (a sample of) the round's pairs
        sample = torch.as_tensor(np.sort(rng.permutation(n)[: ang.score_after or n]), dtype=torch.long)
        ref_chosen, ref_rejected = ref_chosen[sample], ref_rejected[sample]
        after_chosen, after_rejected = self.score_pairs([pairs[i] for i in sample.tolist()])
        losses_after, logits_after = dpo_loss(after_chosen, after_rejected, ref_chosen, ref_rejected, ang.beta)
        return {
            "steps": step,
            "stopped_by": stopped_by,
            "train_loss": sum(losses) / len(losses) if losses else None,
            "reward_accuracy": sum(accuracies) / len(accuracies) if accuracies else None,
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
        from spacy_genbioel.evaluation.report import gold_id_set
        from spacy_genbioel.training.engine import TrainResult
        from spacy_genbioel.training.seq2seq import set_seed

        cfg, ang, engine = self.config, self.angel, self.engine
        pool = [m for m in dict.fromkeys(mentions) if gold_id_set(m)]
        if not pool:
            raise ValueError("No training mentions with gold IDs to mine")
        set_seed(cfg.seed)
        clock = time.process_time if cfg.budget_clock == "cpu" else time.monotonic
        began, wall_began = clock(), time.monotonic()

        def out_of_time() -> bool:
            return cfg.max_seconds is not None and clock() - began > cfg.max_seconds

        self._fresh_out_dir()
        engine._log({"event": "start", "config": asdict(cfg), "angel": asdict(ang), "device": str(engine.device),
                     "mentions": len(pool)})
        order = random.Random(f"{cfg.seed}/angel").sample(range(len(pool)), len(pool))
        per_round = ang.mentions_per_round or len(pool)
        bookkeeping = TrainResult(step=0)
        result = AngelResult()
        best_metric: Optional[float] = None
        best_step: Optional[int] = None
        if engine.evaluate is not None:
            best_metric, best_step = engine._run_evaluation(0, bookkeeping, None, None)
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
            logger.info("round %d: %d pairs from %d mentions (train recall@1 %s)", round_no, len(pairs),
                        info["mentions"], info["recall@1"])
            trained = {"steps": 0, "stopped_by": "no_pairs"}
            if pairs:
                trained = self.train_round(pairs, round_no, step, out_of_time)
            step += trained["steps"]
            record.update(trained)
            improved = False
            if engine.evaluate is not None and trained["steps"]:
                best_metric, best_step = engine._run_evaluation(step, bookkeeping, best_metric, best_step)
                record["eval"] = bookkeeping.evaluations[-1]["eval"]
                improved = best_step == step
                if improved:
                    result.best_round, result.best_metric = round_no, best_metric
            waiting = 0 if improved else waiting + 1
            record.update(step=step, best=improved, seconds=round(time.monotonic() - round_began, 2))
            engine._log(record)
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
            result.model_dir = engine._export()
            engine._log({"event": "end", **{k: v for k, v in result.to_dict().items() if k != "rounds"}})
            engine.plot()
        return result

    def _fresh_out_dir(self) -> None:
        """A run starts afresh: no older run's best model, export, pairs or log."""
        engine = self.engine
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for stale in (engine.checkpoint_dir, engine.best_dir, self.out_dir / "model", self.out_dir / PAIRS_DIR):
            if stale.exists():
                shutil.rmtree(stale)
        if engine.log_path.exists():
            engine.log_path.unlink()


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
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.training.cli_steps import _evaluator, _load_for_training, _write_json, load_stage_config
    from spacy_genbioel.training.examples import read_mentions_jsonl
    from spacy_genbioel.training.pretraining import PretrainingExamples

    stage = load_stage_config(config_path, overrides)
    settings = AngelConfig.from_dict(stage.sections.get("angel", {}))
    kb = KnowledgeBase.load(kb_path)
    mentions = [m for m, _ in read_mentions_jsonl(train_jsonl)]
    kb_examples = None
    if settings.kb_negatives:
        d = stage.data
        kb_examples = PretrainingExamples(kb, stage.training.seed, max_context_synonyms=int(d["max_context_synonyms"]),
                                          use_definitions=bool(d["use_definitions"]))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, dev = _load_for_training(model_dir, device)
    trainer = AngelTrainer(model, tokenizer, kb, stage.training, settings, inputs=stage.inputs, out_dir=out,
                           evaluate=_evaluator(stage, kb, dev_jsonl), device=dev, kb_examples=kb_examples)
    (out / "config.cfg").write_text(stage.text, encoding="utf8")
    result = trainer.run(mentions)
    _write_json(out / "result.json", result.to_dict())
    return result


def register_angel_commands(app) -> None:
    """Add the ``angel`` command to a typer app (``cli.py``). Extra options
    override the config (``--training.max_seconds 900 --angel.beta 0.2``)."""
    from wasabi import msg

    @app.command("angel", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def angel_cmd(
        ctx: typer.Context,
        model: Path = typer.Option(..., help="Positive-only model to start from (fine-tuned)"),
        train: Path = typer.Option(..., help="Training mentions (corpus output train.jsonl)"),
        kb: Path = typer.Option(..., help="KB the model decodes into"),
        config: Path = typer.Option(..., help="Stage config, e.g. configs/angel_tiny.cfg"),
        out: Path = typer.Option(..., help="Output folder (model, best, pairs, log, curve)"),
        dev: Optional[Path] = typer.Option(None, help="Dev mentions (corpus output dev.jsonl): recall@1 after each round, best model kept"),
        device: str = typer.Option("auto", help="auto | cpu | cuda | cuda:N"),
        kb_negatives: Optional[int] = typer.Option(None, help="KB-guided pre-training pairs (other concepts' most similar names as negatives) mixed into each round (overrides angel.kb_negatives)"),
        verbose: bool = typer.Option(False, "--verbose", "-v"),
    ) -> None:
        """ANGEL negative-aware training: mine the model's own wrong candidates, DPO, rounds until dev recall@1 stops improving."""
        from spacy_genbioel.cli._util import setup_logging as _setup_logging
        from spacy_genbioel.training.cli_steps import parse_overrides

        _setup_logging(verbose)
        overrides = parse_overrides(ctx.args)
        if kb_negatives is not None:
            overrides["angel.kb_negatives"] = kb_negatives
        result = angel(model, train, dev, kb, config, out, overrides=overrides, device=device)
        best = ""
        if result.best_metric is not None:
            best = f", dev {result.best_metric:.4f} at round {result.best_round} (start {result.baseline_metric:.4f})"
        msg.good(f"ANGEL: {len(result.rounds)} rounds, {result.step} steps ({result.stopped_by}, {result.seconds:.0f}s{best}) "
                 f"-> {result.model_dir}")
