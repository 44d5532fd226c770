"""ANGEL's preference pairs: a mention with a preferred (``chosen``) and a
dispreferred (``rejected``) KB name, mined from the model's own rankings
(:func:`mine_pairs`, by ANGEL's rules: :func:`preference_pairs`), from the
gold concept's best synonym when the gold is missing
(:func:`gold_fallback_pairs`), or for KB-guided pre-training examples from
the most similar name of another concept (:func:`kb_negative_pairs`); and
their JSONL files (``pairs/round_NNN.jsonl``)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from spacy_genbioel.evaluation.recall import gold_id_set
from spacy_genbioel.progress import StepProgress
from spacy_genbioel.retrieval.tfidf import TfidfLinker
from spacy_genbioel.training.examples import TrainingExample, mention_from_dict, mention_to_dict
from spacy_genbioel.training.targets import fit_name_vectorizer, select_targets
from spacy_genbioel.ty import Candidate, Linker, Mention
from spacy_genbioel.util import PathLike

if TYPE_CHECKING:
    from spacy_genbioel.kb.base import KnowledgeBase


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
    #: the pair's share of the DPO loss (``angel.deferred_weight`` for mentions retrieval gets wrong)
    weight: float = 1.0

    def to_dict(self) -> Dict[str, Any]:
        data = mention_to_dict(self.mention)
        data.update(
            chosen=self.chosen,
            rejected=self.rejected,
            chosen_rank=self.chosen_rank,
            rejected_rank=self.rejected_rank,
            chosen_ids=list(self.chosen_ids),
            rejected_ids=list(self.rejected_ids),
            kind=self.kind,
            weight=self.weight,
        )
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "") -> "PreferencePair":
        return cls(
            mention_from_dict(dict(data), where),
            data["chosen"],
            data["rejected"],
            data.get("chosen_rank"),
            data.get("rejected_rank"),
            tuple(data.get("chosen_ids", ())),
            tuple(data.get("rejected_ids", ())),
            data.get("kind", "mined"),
            float(data.get("weight", 1.0)),
        )


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
        return [
            PreferencePair.from_dict(json.loads(line), f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()
        ]


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


def listwise_pairs(gold: Iterable[str], candidates: Sequence[Candidate]) -> List[Tuple[int, int]]:
    """The pairs of a listwise loss over one ranking, as ``(chosen, rejected)`` 0-based ranks: the
    highest-ranked correct candidate against every wrong one, wherever they rank (other correct
    candidates take no part). No correct candidate (or no wrong one): no pair."""
    gold_set = frozenset(gold)
    correct = [bool(gold_set.intersection(c.ids)) for c in candidates]
    if True not in correct:
        return []
    first = correct.index(True)
    return [(first, j) for j, ok in enumerate(correct) if not ok]


def group_lists(pairs: Sequence[PreferencePair]) -> List[List[PreferencePair]]:
    """``pairs`` as lists, one per mention and chosen name, in the order each first appears (the
    ``"all"`` pairing gives a mention one list: its gold name against every wrong candidate)."""
    lists: Dict[Tuple[int, str], List[PreferencePair]] = {}
    for pair in pairs:
        lists.setdefault((id(pair.mention), pair.chosen), []).append(pair)
    return list(lists.values())


def rank_priors(retriever: Linker, mentions: Sequence[Mention], top_k: int) -> List[Dict[str, float]]:
    """Per mention, each retrieved name's retrieval prior: over the retriever's parts (a
    :class:`~spacy_genbioel.linking.decoding.candidates.CandidateUnion`'s, else the retriever alone), the sum
    of ``-log rank`` of the name in that part's top ``top_k``, a part that did not propose it counting rank
    ``top_k + 1`` (:func:`prior_floor` for a name no part proposed). Scale-free, so TF-IDF's and a dense
    retriever's lists weigh alike."""
    parts = getattr(retriever, "parts", [retriever])
    floor = -math.log(top_k + 1)
    ranked = [part.link(list(mentions), top_k) for part in parts]
    priors: List[Dict[str, float]] = []
    for per_part in zip(*ranked):
        logs: List[Dict[str, float]] = []
        for found in per_part:
            first: Dict[str, float] = {}
            for rank, candidate in enumerate(found[:top_k], 1):
                first.setdefault(candidate.name, -math.log(rank))
            logs.append(first)
        names = dict.fromkeys(n for first in logs for n in first)
        priors.append({n: sum(first.get(n, floor) for first in logs) for n in names})
    return priors


def prior_floor(retriever: Linker, top_k: int) -> float:
    """The :func:`rank_priors` prior of a name no part of ``retriever`` proposed."""
    return len(getattr(retriever, "parts", [retriever])) * -math.log(top_k + 1)


PAIRINGS = {"angel": preference_pairs, "all": listwise_pairs}


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


@dataclass
class GoldFallback:
    """The gold fallback's means: the KB and the char 3-gram TF-IDF over its names (fitted on first use,
    as the fine-tuning targets' :func:`~spacy_genbioel.training.targets.fit_name_vectorizer`, then kept)."""

    kb: KnowledgeBase
    vectorizer: Any = None

    def targets(self, mentions: Sequence[Mention]) -> Dict[int, str]:
        """``id(mention)`` to its gold concept's most similar synonym (composite mentions and gold
        concepts without a name in the KB left out)."""
        if self.vectorizer is None:
            self.vectorizer = fit_name_vectorizer(self.kb)
        examples, _ = select_targets(self.kb, list(mentions), top_k=1, vectorizer=self.vectorizer)
        return {id(e.mention): e.target for e in examples}


def mine_pairs(
    linker: Linker,
    mentions: Sequence[Mention],
    top_k: int = 5,
    *,
    gold_fallback: Optional[GoldFallback] = None,
    chunk_size: int = 0,
    progress: bool = False,
    pairing: str = "angel",
) -> Tuple[List[PreferencePair], MiningStats]:
    """Rank ``mentions`` with ``linker`` (top ``top_k``) and turn the rankings into pairs.

    ``gold_fallback`` pairs, for a mention whose gold concept is not in the top-k,
    the gold concept's most similar synonym (TF-IDF, as the fine-tuning targets)
    with the top wrong prediction. ``chunk_size`` mentions are linked at a time
    (0: all at once), which is what the progress bar counts. ``pairing``: ``"angel"``
    (:func:`preference_pairs`) or ``"all"`` (:func:`listwise_pairs`: the gold name against every wrong
    candidate, the fallback target too), so a mention's pairs make one list.
    """
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing: one of {sorted(PAIRINGS)} (got {pairing!r})")
    stats = MiningStats()
    usable = [m for m in mentions if gold_id_set(m)]
    stats.no_gold = len(mentions) - len(usable)
    stats.mentions = len(usable)
    rankings: List[List[Candidate]] = []
    step = chunk_size or max(1, len(usable))
    with StepProgress.start("mine", len(usable), unit="mention", enabled=progress and bool(usable), leave=False) as bar:
        for begin in range(0, len(usable), step):
            rankings.extend(linker.link(usable[begin : begin + step], top_k=top_k))
            bar.update(min(step, len(usable) - begin))
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
        for k, j in PAIRINGS[pairing](gold, candidates):
            pairs.append(
                PreferencePair(
                    mention,
                    candidates[k].name,
                    candidates[j].name,
                    k + 1,
                    j + 1,
                    tuple(candidates[k].ids),
                    tuple(candidates[j].ids),
                )
            )
    stats.gold_missing = len(missing)
    stats.mined_pairs = len(pairs)
    if gold_fallback is not None and missing:
        fallback = gold_fallback_pairs(gold_fallback, missing, rejected=top_k if pairing == "all" else 1)
        stats.fallback_pairs = len(fallback)
        pairs.extend(fallback)
    return pairs, stats


def weight_deferred(
    pairs: Sequence[PreferencePair], retrieved: Mapping[int, Sequence[Candidate]], weight: float
) -> List[PreferencePair]:
    """``pairs`` with ``weight`` on those whose mention retrieval ranks wrong at the top.

    ``retrieved`` maps ``id(mention)`` to retrieval's own ranking of the mention (the
    cascade's first look): a mention whose top retrieved concept is not gold is one the
    cascade cannot settle and hands to the generator, so its pairs count ``weight`` times
    (a mention retrieval found nothing for counts as wrong)."""
    if weight == 1.0:
        return list(pairs)
    out: List[PreferencePair] = []
    for pair in pairs:
        ranked = retrieved.get(id(pair.mention), ())
        wrong = not ranked or not gold_id_set(pair.mention).intersection(ranked[0].ids)
        out.append(replace(pair, weight=weight) if wrong else pair)
    return out


def gold_fallback_pairs(
    fallback: GoldFallback, missing: Sequence[Tuple[Mention, Sequence[Candidate]]], rejected: int = 1
) -> List[PreferencePair]:
    """For mentions whose gold is not among their candidates: the gold concept's
    most similar synonym (char 3-gram TF-IDF) against the top (wrong) candidate
    (the top ``rejected`` ones). Mentions without candidates, composite ones and
    those whose gold concept has no name in the KB give no pair."""
    with_candidates = [(m, c) for m, c in missing if c]
    if not with_candidates:
        return []
    best = fallback.targets([m for m, _ in with_candidates])
    pairs: List[PreferencePair] = []
    for mention, candidates in with_candidates:
        target = best.get(id(mention))
        if target is None:
            continue
        target_ids = fallback.kb.ids_for_name(target, normalize=False)
        pairs.extend(
            PreferencePair(mention, target, c.name, None, rank, target_ids, tuple(c.ids), kind="gold_fallback")
            for rank, c in enumerate(candidates[:rejected], 1)
        )
    return pairs


def kb_negative_pairs(
    kb: KnowledgeBase, examples: Sequence[TrainingExample], *, tfidf=None, pool: int = 1, seed: int = 0
) -> List[PreferencePair]:
    """Pairs for KB-guided pre-training examples (ANGEL's pre-training variant).

    ``chosen`` is the example's target (a name of its concept); ``rejected`` is
    the name of *another* concept most similar to the target by character
    3-gram TF-IDF (``tfidf``: a :class:`~spacy_genbioel.retrieval.tfidf.TfidfLinker` on
    ``kb``, built when not given), or one of the ``pool`` most similar, drawn
    with ``seed``. A name the example's concept shares with others is never a
    negative. An example gives no pair when no other concept's name shares a
    character 3-gram with its target, or when its own concept's names crowd
    out every other one among the nearest names.
    """
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
        pairs.append(
            PreferencePair(
                example.mention,
                example.target,
                negative.name,
                None,
                None,
                kb.ids_for_name(example.target, normalize=False),
                tuple(negative.ids),
                kind="kb",
            )
        )
    return pairs
