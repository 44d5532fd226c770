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
  linker's own :class:`~spacy_genbioel.linking.decoding.decoder.PromptTokenizer`, so chosen
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
#3906) removed the encoder-decoder code paths. The loop of :mod:`.trainer` is short and
reuses the training engine's optimizer groups, precision, dev evaluation,
best-model bookkeeping, log and export, so the stage leaves the same files as
the others (``model``, ``best``, ``train_log.jsonl``,
``curve.png``) plus ``pairs/round_NNN.jsonl`` for inspection.

For the cascade, ``mining = "forced"`` mines from the model's forced ranking
of the retrieved names, and ``loss`` can be ``"rank"`` (a logistic loss on the
forced scores of each pair) or ``"listwise"`` (each mention's gold name against
every wrong retrieved name in one softmax over their forced scores); neither
uses a reference. These are this package's, not ANGEL's.

Modules: :mod:`.mining` (preference pairs: mined, gold fallback, KB
negatives; their JSONL files; lists), :mod:`.dpo` (sequence log-probabilities after
the inference prompt, the DPO, ranking and listwise losses), :mod:`.trainer` (the rounds and the
``angel`` project step). The settings (:class:`AngelConfig`, the ``[angel]``
section) are read with every other stage's by
:mod:`spacy_genbioel.training.settings`.
"""

from __future__ import annotations

from spacy_genbioel.training.angel.dpo import (
    dpo_loss,
    encode_lists,
    encode_pairs,
    list_logprobs,
    listwise_loss,
    pair_logprobs,
    sequence_logprobs,
)
from spacy_genbioel.training.angel.mining import (
    GoldFallback,
    MiningStats,
    PreferencePair,
    gold_fallback_pairs,
    group_lists,
    kb_negative_pairs,
    listwise_pairs,
    mine_pairs,
    preference_pairs,
    read_pairs_jsonl,
    write_pairs_jsonl,
)
from spacy_genbioel.training.angel.trainer import PAIRS_DIR, AngelResult, AngelTrainer, angel
from spacy_genbioel.training.settings import AngelConfig

__all__ = [
    "PAIRS_DIR",
    "AngelConfig",
    "AngelResult",
    "AngelTrainer",
    "GoldFallback",
    "MiningStats",
    "PreferencePair",
    "angel",
    "dpo_loss",
    "encode_lists",
    "encode_pairs",
    "gold_fallback_pairs",
    "group_lists",
    "kb_negative_pairs",
    "list_logprobs",
    "listwise_loss",
    "listwise_pairs",
    "mine_pairs",
    "pair_logprobs",
    "preference_pairs",
    "read_pairs_jsonl",
    "sequence_logprobs",
    "write_pairs_jsonl",
]
