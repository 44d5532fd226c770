"""KB-guided pre-training examples (GenBioEL section 2.2, Table 10).

For every concept and every one of its synonyms ``b``, another synonym ``a``
is marked in a short sentence built from the KB, and the decoder, prompted
with ``a is``, must generate ``b``:

* concepts with a definition: ``START a END is defined as <definition>``,
  ``START a END is described as ...``, ``<definition> are the definitions of
  START a END``, ``<definition> describe START a END``;
* without a definition, with other synonyms: ``<syns> are the synonyms of
  START a END``, ``<syns> indicate the same concept as START a END``,
  ``START a END has synonyms such as <syns>``, ``START a END refers to the
  same concepts as <syns>``;
* single-name concepts without a definition (``a`` = ``b``): ``b is START b
  END``, ``b is the same as START b END``, ``START b END is b``, ``START b END
  is the same as b``.

The sides follow GenBioEL's released data generator. An example is a
:class:`~spacy_genbioel.training.examples.TrainingExample` whose mention has
``text=a`` and ``left``/``right`` holding the template text on either side,
so the shared :class:`~spacy_genbioel.linking.decoding.decoder.InputBuilder` renders exactly
``left START a END right`` and the prompt ``a is``, as in fine-tuning and at
inference.

Decisions:

* ``a`` is drawn uniformly from the other synonyms (GenBioEL's ``random``
  scheme); a single-name concept uses its name on both sides.
* The listed synonyms (at most ``max_context_synonyms``, shuffled) never
  include the target ``b``, and include ``a`` only when nothing else is left
  (a two-name concept), so the encoder never sees the answer in plain sight
  unless the concept has nothing else to say.
* Each epoch draws new pairs and templates from ``(seed, epoch, position)``,
  so an epoch is reproducible on its own (a resumed run sees the same data)
  and needs no materialized list: :class:`PretrainingExamples` is a lazy
  sequence over (concept, synonym) pairs, light even for MeSH-sized KBs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.training.examples import TrainingExample
from spacy_genbioel.ty import Mention


@dataclass(frozen=True)
class Template:
    """A phrase joining the marked name and its context, and which side the name is on."""

    family: str  # "definition" | "synonyms" | "self"
    phrase: str
    mention_first: bool

    def sides(self, context: str) -> Tuple[str, str]:
        """``(left, right)`` text around ``START a END``."""
        if self.mention_first:
            return "", f"{self.phrase} {context}".strip()
        return f"{context} {self.phrase}".strip(), ""

    @property
    def name(self) -> str:
        return f"{self.family}/{self.phrase}/{'mention-first' if self.mention_first else 'context-first'}"


DEFINITION_TEMPLATES: Tuple[Template, ...] = (
    Template("definition", "is defined as", True),
    Template("definition", "is described as", True),
    Template("definition", "are the definitions of", False),
    Template("definition", "describe", False),
)
SYNONYM_TEMPLATES: Tuple[Template, ...] = (
    Template("synonyms", "are the synonyms of", False),
    Template("synonyms", "indicate the same concept as", False),
    Template("synonyms", "has synonyms such as", True),
    Template("synonyms", "refers to the same concepts as", True),
)
SELF_TEMPLATES: Tuple[Template, ...] = (
    Template("self", "is", False),
    Template("self", "is the same as", False),
    Template("self", "is", True),
    Template("self", "is the same as", True),
)


def pretraining_example(
    kb: KnowledgeBase,
    concept_id: str,
    target: str,
    rng: random.Random,
    max_context_synonyms: int = 3,
    use_definitions: bool = True,
) -> TrainingExample:
    """One example whose decoder must produce ``target`` (a normalized name of the concept)."""
    names = kb.names_of(concept_id)
    others = [n for n in names if n != target]
    source = rng.choice(others) if others else target
    definition = (kb[concept_id].definition or "").strip() if use_definitions else ""
    if definition:
        template = rng.choice(DEFINITION_TEMPLATES)
        context = definition
    elif others:
        template = rng.choice(SYNONYM_TEMPLATES)
        pool = [n for n in others if n != source] or [source]
        rng.shuffle(pool)
        context = ", ".join(pool[: max(1, max_context_synonyms)])
    else:
        template = rng.choice(SELF_TEMPLATES)
        context = target
    left, right = template.sides(context)
    mention = Mention(text=source, ids=(concept_id,), left=left, right=right, label="KB")
    return TrainingExample(mention, target, kind=f"pretrain/{template.name}")


class PretrainingExamples:
    """Every (concept, synonym) pair of a KB as pre-training examples, epoch by epoch.

    ``epoch(e)`` is a lazy sequence whose item ``i`` is built from the
    ``i``-th pair with a random generator seeded by ``(seed, e, i)``: the same
    run always sees the same examples, and different epochs see new pairs and
    templates. ``max_synonyms_per_concept`` caps the targets per concept (None:
    all, as in GenBioEL), chosen per epoch.
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        seed: int = 0,
        *,
        max_context_synonyms: int = 3,
        use_definitions: bool = True,
        max_synonyms_per_concept: Optional[int] = None,
    ) -> None:
        self.kb = kb
        self.seed = seed
        self.max_context_synonyms = max_context_synonyms
        self.use_definitions = use_definitions
        self.max_synonyms_per_concept = max_synonyms_per_concept
        self._pairs: List[Tuple[str, str]] = [(cid, name) for cid in kb.concept_ids for name in kb.names_of(cid)]

    def __len__(self) -> int:
        return len(self._pairs)

    def _pairs_for(self, epoch: int) -> Sequence[Tuple[str, str]]:
        cap = self.max_synonyms_per_concept
        if cap is None:
            return self._pairs
        rng = random.Random(f"{self.seed}/{epoch}/cap")
        pairs: List[Tuple[str, str]] = []
        for cid in self.kb.concept_ids:
            names = self.kb.names_of(cid)
            pairs.extend((cid, n) for n in (rng.sample(names, cap) if len(names) > cap else names))
        return pairs

    def epoch(self, epoch: int) -> "_EpochView":
        return _EpochView(self, epoch, self._pairs_for(epoch))

    def __iter__(self) -> Iterator[TrainingExample]:
        """Shuffled epochs without end (for simple loops; the engine uses :meth:`epoch`)."""
        e = 0
        while True:
            view = self.epoch(e)
            order = list(range(len(view)))
            random.Random(f"{self.seed}/{e}/order").shuffle(order)
            for i in order:
                yield view[i]
            e += 1


class _EpochView(Sequence):
    def __init__(self, source: PretrainingExamples, epoch: int, pairs: Sequence[Tuple[str, str]]) -> None:
        self.source = source
        self.epoch = epoch
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        cid, target = self.pairs[index]
        src = self.source
        rng = random.Random(f"{src.seed}/{self.epoch}/{index}")
        return pretraining_example(src.kb, cid, target, rng, src.max_context_synonyms, src.use_definitions)


def pretraining_examples(kb: KnowledgeBase, seed: int = 0, epoch: int = 0, **kwargs) -> List[TrainingExample]:
    """One epoch of pre-training examples as a list (every concept, every synonym)."""
    return list(PretrainingExamples(kb, seed, **kwargs).epoch(epoch))


def iterate_pretraining(kb: KnowledgeBase, seed: int = 0, **kwargs) -> Iterator[TrainingExample]:
    """Shuffled pre-training epochs without end, each with new pairs and templates."""
    return iter(PretrainingExamples(kb, seed, **kwargs))
