"""What decoding shares and measures: which mentions are one search
(:func:`distinct_searches`), blocks of whole encoder inputs
(:func:`blocks_of_inputs`), the encoded windows every mention reading them
decodes from (:class:`EncodedWindows`), and the seconds spent per stage when a
benchmark asks (:class:`StageClock`)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch


def distinct_searches(
    sources: Sequence[Sequence[int]],
    prompts: Sequence[Sequence[int]],
    name_sets: Optional[Sequence[Optional[np.ndarray]]] = None,
) -> Tuple[List[int], List[int]]:
    """Mentions with the same encoder input, prompt and allowed names are one
    search (within a document: the same text in the same window). Returns the
    position of each search's first mention, and each mention's search."""
    jobs: Dict[tuple, int] = {}
    job_of: List[int] = []
    firsts: List[int] = []
    for pos in range(len(sources)):
        allowed = None if name_sets is None else name_sets[pos]
        names = None if allowed is None else allowed.tobytes()
        key = (tuple(sources[pos]), tuple(prompts[pos]), names)
        if key not in jobs:
            jobs[key] = len(firsts)
            firsts.append(pos)
        job_of.append(jobs[key])
    return firsts, job_of


def blocks_of_inputs(sources: Sequence[Sequence[int]], keys: Sequence[int], size: int) -> Iterator[List[int]]:
    """Positions in blocks of about ``size``, shortest inputs first, never
    splitting the mentions of one input (``keys``: an id per distinct input)."""
    order = sorted(range(len(sources)), key=lambda i: (len(sources[i]), keys[i]))
    begin = 0
    while begin < len(order):
        end = min(begin + size, len(order))
        while end < len(order) and keys[order[end]] == keys[order[end - 1]]:
            end += 1
        yield order[begin:end]
        begin = end


def mention_inputs(
    linker: Any, mentions: Sequence[Any], todo: Sequence[int]
) -> Tuple[List[List[int]], List[List[int]]]:
    """Encoder and prompt token ids of the mentions in ``todo`` (in document mode every mention
    is marked in its document, linked or not)."""
    with linker._stage("tokenize"):
        if linker.inputs.input_mode == "document":
            every = linker.encode_sources(mentions)
            sources = [every[i] for i in todo]
        else:
            sources = linker.encode_sources([mentions[i] for i in todo])
        prompts = linker.prompt_tokens.prompts([linker.inputs.prompt(mentions[i]) for i in todo])
    return sources, prompts


def encoded_blocks(
    linker: Any, sources: List[List[int]], prompts: List[List[int]]
) -> Iterator[Tuple["EncodedWindows", Dict[int, int], Dict[int, List[int]]]]:
    """Per block of whole encoder inputs (:func:`blocks_of_inputs`; a document window is never
    split): the block's distinct inputs encoded once (:meth:`GenerativeLinker.encode_windows`), the
    window row of each position, and the positions grouped by prompt length (shortest first; BART's
    positions are absolute: :func:`.prompt_batch.prompt_batches` merges the groups where they can be shifted)."""
    window_of: Dict[Tuple[int, ...], int] = {}
    keys = [window_of.setdefault(tuple(src), len(window_of)) for src in sources]
    for block in blocks_of_inputs(sources, keys, linker.decoding.block_batches * linker.decoding.batch_size):
        local: Dict[int, int] = {}
        rows = [local.setdefault(keys[i], len(local)) for i in block]
        firsts: Dict[int, int] = {}
        for i in block:
            firsts.setdefault(keys[i], i)
        enc = linker.sources.pad([sources[firsts[k]] for k in local])
        linker.stats["encoder_inputs"] += len(local)
        linker.stats["encoder_tokens"] += int(enc["attention_mask"].sum())
        windows = linker.encode_windows(enc["input_ids"], enc["attention_mask"])
        groups: Dict[int, List[int]] = defaultdict(list)
        for i in block:
            groups[len(prompts[i])].append(i)
        yield windows, dict(zip(block, rows)), dict(sorted(groups.items()))


def length_chunks(mask: torch.Tensor, rows: int = 16) -> Optional[List[Tuple[torch.Tensor, int]]]:
    """Rows of a right-padded batch in chunks of about ``rows`` inputs of similar
    length, each with its own width: ``[(row indices, width), ...]``, or ``None``
    when chunking would not pay (a small batch, little padding, or left padding,
    where BART's absolute positions would change with the width).

    A block's inputs run from the shortest mention context to the longest, so one
    batch pads a third of its tokens (NCBI-disease dev); the encoder's cost is
    per token, padded or not, and chunks pad little."""
    n, width = mask.shape
    if n <= rows:
        return None
    lengths = mask.sum(dim=1)
    prefix = torch.arange(width, device=mask.device)[None, :] < lengths[:, None]
    if not bool((prefix == mask.bool()).all()):
        return None
    order = torch.argsort(lengths, stable=True)
    chunks = [(order[s : s + rows], int(lengths[order[s : s + rows]].max())) for s in range(0, n, rows)]
    if sum(len(r) * w for r, w in chunks) > 0.9 * n * width:
        return None
    return chunks


@dataclass
class EncodedWindows:
    """Distinct encoder inputs, encoded once: per decoder layer the
    cross-attention keys and values (batch first: one row per input), the
    encoder attention mask, and the encoder states' shape and dtype (the
    decoder reads those, never the states themselves, once the keys and values
    are cached)."""

    kv: List[Tuple[torch.Tensor, torch.Tensor]]
    mask: torch.Tensor
    shape: Tuple[int, ...]
    dtype: torch.dtype

    def __len__(self) -> int:
        return int(self.mask.shape[0])


class StageClock:
    """Seconds and calls per named stage, each stage's own: a stage entered
    inside another pauses the outer one (so ``beam`` around a search counts the
    bookkeeping, not the ``decoder`` and ``trie`` calls inside it). On a GPU each
    stage synchronizes before and after, so the seconds are the stage's own (and
    the whole run a little slower): time a benchmark with it, not production."""

    def __init__(self, device: Optional[torch.device] = None) -> None:
        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()
        self._sync = device is not None and torch.device(device).type == "cuda"
        self._stack: List[List] = []  # [name, time the stage last resumed]

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self._sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        if self._stack:  # pause the enclosing stage
            outer = self._stack[-1]
            self.seconds[outer[0]] += now - outer[1]
        self._stack.append([name, now])
        try:
            yield
        finally:
            if self._sync:
                torch.cuda.synchronize()
            now = time.perf_counter()
            _, resumed = self._stack.pop()
            self.seconds[name] += now - resumed
            self.calls[name] += 1
            if self._stack:
                self._stack[-1][1] = now

    def report(self) -> Dict[str, Dict[str, float]]:
        """``{stage: {"seconds": s, "calls": n}}``, stages by time spent."""
        return {
            name: {"seconds": round(sec, 4), "calls": int(self.calls[name])} for name, sec in self.seconds.most_common()
        }
