"""Training examples: a mention in context and the KB name the decoder must produce."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, List

from ..kb import KnowledgeBase
from ..mentions import Mention


@dataclass(frozen=True)
class TrainingExample:
    mention: Mention
    target: str  # a normalized KB name


def kb_name_examples(kb: KnowledgeBase, synonyms_per_name: int = 1, seed: int = 0) -> List[TrainingExample]:
    """Examples from the KB alone: each name as a context-free mention that
    generates itself (what the trie must reach) and, for concepts with several
    names, ``synonyms_per_name`` other synonyms (``a is b``, as in GenBioEL's
    KB-guided pre-training)."""
    rng = random.Random(seed)
    examples: List[TrainingExample] = []
    for cid in kb.concept_ids:
        names = kb.names_of(cid)
        for name in names:
            examples.append(TrainingExample(Mention(name, (cid,)), name))
            others = [n for n in names if n != name]
            for other in rng.sample(others, min(synonyms_per_name, len(others))):
                examples.append(TrainingExample(Mention(name, (cid,)), other))
    return examples


def iterate_forever(examples: List[TrainingExample], seed: int = 0) -> Iterator[TrainingExample]:
    """Shuffled epochs without end (the loop decides when to stop)."""
    rng = random.Random(seed)
    order = list(range(len(examples)))
    while True:
        rng.shuffle(order)
        for i in order:
            yield examples[i]
