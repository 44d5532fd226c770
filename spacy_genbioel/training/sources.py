"""Where the training engine's examples come from: sources that give the
examples of an epoch, and the seeded sampler that shuffles each epoch and
remembers its position (saved in checkpoints, so a resumed run sees the same
batches as an uninterrupted one)."""

from __future__ import annotations

import random
from typing import List, Protocol, Sequence, Union

import numpy as np

from spacy_genbioel.training.examples import TrainingExample


class ExampleSource(Protocol):
    """Examples per epoch; the engine shuffles each epoch itself."""

    def epoch(self, epoch: int) -> Sequence[TrainingExample]: ...


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


class SampledSource:
    """``n`` examples of another source per epoch, a new seeded sample each epoch."""

    def __init__(self, source: ExampleSource, n: int, seed: int = 0) -> None:
        self.source, self.n, self.seed = source, n, seed

    def epoch(self, epoch: int) -> Sequence[TrainingExample]:
        full = self.source.epoch(epoch)
        if self.n >= len(full):
            return full
        picks = random.Random(f"{self.seed}/{epoch}/sample").sample(range(len(full)), self.n)
        return [full[i] for i in picks]


def as_source(examples: Union[ExampleSource, Sequence[TrainingExample]]) -> ExampleSource:
    return examples if hasattr(examples, "epoch") else FixedExamples(examples)  # type: ignore[arg-type]


class EpochSampler:
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
