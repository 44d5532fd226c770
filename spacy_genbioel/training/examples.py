"""Training examples: a mention in context and the KB name the decoder must produce.

Examples travel between project steps as JSONL, one per line: the mention's
fields (``text``, ``ids``, ``left``, ``right``, ``doc_id``, ``start``, ``end``,
``label``, ``composite``) and ``target`` (a normalized KB name; absent or
null for evaluation-only mentions, e.g. composite dev mentions).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.ty import Mention
from spacy_genbioel.util import PathLike


@dataclass(frozen=True)
class TrainingExample:
    mention: Mention
    target: str  # a normalized KB name
    # where the example comes from, e.g. "pretrain/definition/is defined as"; for logs and tests
    kind: str = ""


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


# -- JSONL ------------------------------------------------------------------------
_MENTION_FIELDS = ("text", "ids", "left", "right", "doc_id", "start", "end", "label", "composite")


def mention_to_dict(mention: Mention) -> Dict[str, Any]:
    data = {name: getattr(mention, name) for name in _MENTION_FIELDS}
    data["ids"] = list(mention.ids)
    return data


def mention_from_dict(data: Dict[str, Any], where: str = "") -> Mention:
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise ValueError(f"{where}: expected an object with a 'text' string")
    ids = data.get("ids", ())
    if isinstance(ids, str):
        ids = [ids]
    kwargs = {name: data[name] for name in _MENTION_FIELDS if name in data and name != "ids"}
    return Mention(ids=tuple(str(i) for i in ids), **kwargs)


def write_examples_jsonl(records: Iterable[Tuple[Mention, Optional[str]]], path: PathLike) -> int:
    """Write ``(mention, target or None)`` pairs; returns the number of lines."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf8") as out:
        for mention, target in records:
            data = mention_to_dict(mention)
            data["target"] = target
            out.write(json.dumps(data, ensure_ascii=False) + "\n")
            count += 1
    return count


def read_mentions_jsonl(path: PathLike) -> Iterator[Tuple[Mention, Optional[str]]]:
    """``(mention, target or None)`` per line of an example JSONL file."""
    path = Path(path)
    with path.open(encoding="utf8") as lines:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from err
            yield mention_from_dict(data, where), data.get("target")


def read_examples_jsonl(path: PathLike) -> List[TrainingExample]:
    """The lines of an example JSONL file that have a target."""
    return [TrainingExample(m, t) for m, t in read_mentions_jsonl(path) if t]
