"""Synonyms-aware target choice for fine-tuning (GenBioEL section 2.3).

A training mention of concept ``c`` is taught to generate the synonym of ``c``
that looks most like it: the name with the highest cosine between character
3-gram TF-IDF vectors (``char_wb``) of the normalized mention and the
normalized names. ANGEL emits the top 3 synonyms as separate targets
(``top_k=3``).

Decisions:

* The vectorizer is fit on the KB's normalized names (GenBioEL loaded a
  vectorizer fit on UMLS by scispacy, with the same analyzer; it is not
  distributed, and the KB's own names are what the trie can generate).
* Ties (equal cosine to 5 decimals) go to the name equal to the normalized
  mention, then to the shorter name, then to KB order. ``char_wb`` n-grams
  ignore word order, so "ovarian cancer" and "cancer ovarian" tie exactly;
  GenBioEL sorted each concept's names (a Python ``set``, so in hash order)
  by length and took the first maximum, which makes its choice among such
  ties arbitrary.
* Composite mentions (several gold IDs), mentions without gold IDs and
  mentions whose gold concept is absent from the KB (or has no name left after
  de-duplication) are left out and counted, never dropped silently.
* Vectorized: all mentions are transformed at once; each is compared with its
  own concept's names only, through one row-wise sparse product over the flat
  list of (mention, name) pairs.

:func:`agreement_with_reference` compares the choice with GenBioEL's own
``train.target``. Its lines do not align with the NCBI train mentions one to
one: GenBioEL trained NCBI on BioSyn's preprocessed *train + dev* documents
(in directory-listing order), with Ab3P abbreviations expanded and composite
mentions removed, and it offered MEDIC names plus MeSH entry terms as
synonyms. The comparison is therefore keyed by (normalized mention, gold ID).
"""

from __future__ import annotations

import json
import logging
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.training.examples import TrainingExample
from spacy_genbioel.ty import Mention
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)


#: gold IDs that mean "no concept" (NCBI-disease and BC5CDR write -1)
_NO_GOLD = frozenset({"", "-1", "CUI-less", "CUI-LESS"})


def fit_name_vectorizer(kb: KnowledgeBase):
    """Character 3-gram TF-IDF (``char_wb``) fit on the KB's normalized names."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 3), lowercase=False, dtype=np.float32)
    vectorizer.fit(kb.names)
    return vectorizer


def _gold_ids(mention: Mention) -> Tuple[str, ...]:
    return tuple(dict.fromkeys(i.strip() for i in mention.ids if i.strip() not in _NO_GOLD))


#: how a training mention's target synonym is chosen (GenBioEL's Table 4
#: compares the first three): ``tfidf`` the most similar by char 3-gram TF-IDF
#: (synonyms-aware fine-tuning), ``shortest`` the shortest name, ``random`` a
#: random name (seeded), ``first`` the concept's first name in the KB (its
#: preferred name unless de-duplication moved it)
TARGET_STRATEGIES = ("tfidf", "shortest", "random", "first")


def select_targets(
    kb: KnowledgeBase,
    mentions: Sequence[Mention],
    top_k: int = 1,
    vectorizer=None,
    strategy: str = "tfidf",
    seed: int = 0,
) -> Tuple[List[TrainingExample], Dict[str, int]]:
    """Training examples whose targets are the gold concept's most similar synonyms
    (or, for ablations, chosen by another ``strategy``: see :data:`TARGET_STRATEGIES`).

    Returns the examples (up to ``top_k`` per usable mention, best first, in
    mention order) and counts: ``mentions``, ``used`` (mentions with at least
    one example), ``examples``, ``composite``, ``no_gold``, ``not_in_kb``
    (gold concept absent or without names), ``exact`` (best target equal to
    the normalized mention).
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if strategy not in TARGET_STRATEGIES:
        raise ValueError(f"Unknown target strategy {strategy!r}; choose from {', '.join(TARGET_STRATEGIES)}")
    stats = {
        "mentions": len(mentions),
        "used": 0,
        "examples": 0,
        "composite": 0,
        "no_gold": 0,
        "not_in_kb": 0,
        "exact": 0,
    }
    kept: List[int] = []
    kept_cid: List[str] = []
    for i, mention in enumerate(mentions):
        ids = _gold_ids(mention)
        if not ids:
            stats["no_gold"] += 1
        elif len(ids) > 1 or mention.is_composite:
            stats["composite"] += 1
        elif ids[0] not in kb or not kb.names_of(ids[0]):
            stats["not_in_kb"] += 1
        else:
            kept.append(i)
            kept_cid.append(ids[0])
    if not kept:
        return [], stats
    texts = [kb.normalize(mentions[i].text) for i in kept]

    # the flat list of (kept mention, candidate name) pairs
    names_per_concept = {cid: kb.names_of(cid) for cid in dict.fromkeys(kept_cid)}
    owner: List[int] = []
    cand_names: List[str] = []
    for row, cid in enumerate(kept_cid):
        names = names_per_concept[cid]
        owner.extend([row] * len(names))
        cand_names.extend(names)
    owner_arr = np.asarray(owner, dtype=np.int64)
    lengths = np.fromiter((len(n) for n in cand_names), dtype=np.int64, count=len(cand_names))
    order_in_kb = np.arange(len(cand_names))
    if strategy == "tfidf":
        vectorizer = vectorizer or fit_name_vectorizer(kb)
        mention_vectors = vectorizer.transform(texts).tocsr()
        # names repeat across mentions of the same concept: embed each once
        unique_names = list(dict.fromkeys(cand_names))
        position = {name: j for j, name in enumerate(unique_names)}
        name_rows = np.fromiter((position[n] for n in cand_names), dtype=np.int64, count=len(cand_names))
        name_vectors = vectorizer.transform(unique_names).tocsr()
        sims = np.asarray(mention_vectors[owner_arr].multiply(name_vectors[name_rows]).sum(axis=1)).ravel()
        # char_wb n-grams ignore word order ("ovarian cancer" and "cancer ovarian"
        # tie exactly): among equal scores the mention's own string goes first
        not_exact = np.fromiter(
            (n != texts[r] for n, r in zip(cand_names, owner)), dtype=np.int8, count=len(cand_names)
        )
        # by mention, then similarity (desc), then the exact string, then shorter name, then KB order
        order = np.lexsort((order_in_kb, lengths, not_exact, -np.round(sims, 5), owner_arr))
    elif strategy == "shortest":
        order = np.lexsort((order_in_kb, lengths, owner_arr))
    elif strategy == "first":
        order = np.lexsort((order_in_kb, owner_arr))
    else:  # random, reproducible
        order = np.lexsort((np.random.default_rng(seed).random(len(cand_names)), owner_arr))
    starts = np.searchsorted(owner_arr[order], np.arange(len(kept)))

    examples: List[TrainingExample] = []
    for row, i in enumerate(kept):
        lo = starts[row]
        hi = starts[row + 1] if row + 1 < len(kept) else len(order)
        chosen = order[lo : min(hi, lo + top_k)]
        if len(chosen) == 0:
            continue
        stats["used"] += 1
        if cand_names[chosen[0]] == texts[row]:
            stats["exact"] += 1
        for j in chosen:
            examples.append(TrainingExample(mentions[i], cand_names[j]))
    stats["examples"] = len(examples)
    logger.info(
        "Targets: %d examples from %d of %d mentions (composite %d, no gold %d, gold not in KB %d)",
        stats["examples"],
        stats["used"],
        stats["mentions"],
        stats["composite"],
        stats["no_gold"],
        stats["not_in_kb"],
    )
    return examples, stats


# -- comparison with GenBioEL's own choices ----------------------------------------
def read_reference_targets(
    train_target_path: PathLike, label_path: Optional[PathLike] = None
) -> Dict[Tuple[str, str], Counter]:
    """GenBioEL's ``train.target`` (``["mention is", "synonym"]`` per line) and
    ``trainlabel.txt`` as ``{(normalized mention, gold ID): Counter(targets)}``.

    Without a label file the gold ID is ``""``.
    """
    from spacy_genbioel.kb.normalizers import genbioel_normalize

    train_target_path = Path(train_target_path)
    if label_path is None:
        guess = train_target_path.with_name("trainlabel.txt")
        label_path = guess if guess.exists() else None
    lines = train_target_path.read_text(encoding="utf8").splitlines()
    labels = Path(label_path).read_text(encoding="utf8").splitlines() if label_path else [""] * len(lines)
    if len(labels) != len(lines):
        raise ValueError(f"{train_target_path}: {len(lines)} lines but {len(labels)} labels in {label_path}")
    table: Dict[Tuple[str, str], Counter] = defaultdict(Counter)
    for lineno, (line, label) in enumerate(zip(lines, labels), start=1):
        if not line.strip():
            continue
        try:
            prompt, target = json.loads(line)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{train_target_path}:{lineno}: expected a JSON pair [prompt, target]") from err
        mention = prompt[: -len(" is")] if prompt.endswith(" is") else prompt
        table[(genbioel_normalize(mention), label.strip())][genbioel_normalize(target)] += 1
    return dict(table)


def agreement_with_reference(
    examples: Sequence[TrainingExample],
    train_target_path: PathLike,
    label_path: Optional[PathLike] = None,
    kb: Optional[KnowledgeBase] = None,
    n_examples: int = 10,
    vectorizer=None,
) -> Dict[str, object]:
    """How often our target equals GenBioEL's for the same (mention, gold ID).

    Only the first (best) example of each mention counts. ``matched`` examples
    have a reference line with the same normalized mention and gold ID
    (abbreviations and the dev documents GenBioEL added make the rest); among
    them, ``agree`` equals the reference's most frequent target and
    ``agree_any`` any of its targets. With ``kb``, ``reference_in_kb`` counts
    the matched examples whose reference target is one of the concept's names
    in our KB (GenBioEL also offered MeSH entry terms),
    ``agreement_when_reachable`` is the agreement among those, and
    ``tied`` counts the disagreements where the reference target has exactly
    our target's cosine (a tie that GenBioEL broke arbitrarily), so
    ``agreement_up_to_ties`` = (agree + tied) / matched.
    """
    reference = read_reference_targets(train_target_path, label_path)
    with_labels = any(label for _, label in reference)
    firsts: List[TrainingExample] = []
    seen: set = set()
    for ex in examples:
        key = id(ex.mention)
        if key in seen:
            continue
        seen.add(key)
        firsts.append(ex)
    matched = agree = agree_any = in_kb = agree_in_kb = tied = 0
    disagreements: List[Dict[str, str]] = []
    pending_ties: List[Tuple[str, str, str]] = []
    for ex in firsts:
        cid = _gold_ids(ex.mention)[0] if _gold_ids(ex.mention) else ""
        norm = (kb.normalize if kb is not None else _default_normalize())(ex.mention.text)
        counts = reference.get((norm, _reference_id(cid) if with_labels else ""))
        if not counts:
            continue
        matched += 1
        best = counts.most_common(1)[0][0]
        hit = ex.target == best
        agree += hit
        agree_any += ex.target in counts
        if kb is not None and best in kb.names_of(cid):
            in_kb += 1
            agree_in_kb += hit
        if not hit and kb is not None and best in kb.names_of(cid):
            pending_ties.append((norm, ex.target, best))
        if not hit and len(disagreements) < n_examples:
            disagreements.append({"mention": norm, "id": cid, "ours": ex.target, "genbioel": best})
    if pending_ties:
        vectorizer = vectorizer or fit_name_vectorizer(kb)
        mention_vecs = vectorizer.transform([m for m, _, _ in pending_ties])
        ours_vecs = vectorizer.transform([o for _, o, _ in pending_ties])
        ref_vecs = vectorizer.transform([r for _, _, r in pending_ties])
        ours_sim = np.asarray(mention_vecs.multiply(ours_vecs).sum(axis=1)).ravel()
        ref_sim = np.asarray(mention_vecs.multiply(ref_vecs).sum(axis=1)).ravel()
        tied = int(np.sum(np.round(ours_sim, 5) == np.round(ref_sim, 5)))
    return {
        "examples": len(firsts),
        "reference_lines": sum(sum(c.values()) for c in reference.values()),
        "matched": matched,
        "agree": agree,
        "agree_any": agree_any,
        "agreement": agree / matched if matched else None,
        "agreement_any": agree_any / matched if matched else None,
        "reference_in_kb": in_kb if kb is not None else None,
        "agreement_when_reachable": (agree_in_kb / in_kb) if kb is not None and in_kb else None,
        "tied": tied if kb is not None else None,
        "agreement_up_to_ties": (agree + tied) / matched if kb is not None and matched else None,
        "disagreements": disagreements,
    }


def _default_normalize():
    from spacy_genbioel.kb.normalizers import genbioel_normalize

    return genbioel_normalize


def _reference_id(cid: str) -> str:
    # GenBioEL's labels write OMIM IDs bare, as MEDIC does
    return cid[len("OMIM:") :] if cid.startswith("OMIM:") else cid
