"""Document folds of a training split, for cross-fitting.

Score fusion (:mod:`spacy_genbioel.linking.reranking.fusion`) is fitted on training
mentions scored by models that never saw them: the training split is cut into
``k`` folds of whole documents; for each fold a model trained on the other
folds scores the held-out one. :func:`split_pubtator` writes, per fold,
``fold-<i>/train.txt`` (the other folds) and ``fold-<i>/heldout.txt`` (this
fold), both PubTator, so that every existing step (``corpus``, ``build-kb``,
``evaluate``) runs on a fold as it runs on a split. Document blocks are copied
byte for byte; the assignment of documents to folds depends on their IDs and
the seed only, not on file order.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Dict, List, Tuple

from spacy_genbioel.corpus.pubtator import CorpusFormatError
from spacy_genbioel.util import PathLike, read_bytes

__all__ = ["pubtator_blocks", "assign_folds", "split_pubtator"]


def pubtator_blocks(path: PathLike) -> List[Tuple[str, str]]:
    """``(document ID, block text)`` per document of a PubTator file, in file order.

    A block is the lines up to the next blank line; its ID is the text before the
    first ``|`` or tab of its first line. Two blocks may share an ID (a repeated PMID):
    :func:`split_pubtator` puts both in the same fold, so no document is on both sides."""
    text = read_bytes(path, CorpusFormatError).decode("utf-8-sig")
    blocks: List[Tuple[str, str]] = []
    lineno = 0
    current: List[str] = []
    start = 1
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if not current:
                start = lineno
            current.append(line)
            continue
        if current:
            blocks.append(_block(path, start, current))
            current = []
    if current:
        blocks.append(_block(path, start, current))
    return blocks


def _block(path: PathLike, start: int, lines: List[str]) -> Tuple[str, str]:
    first = lines[0]
    cut = min((i for i in (first.find("|"), first.find("\t")) if i > 0), default=-1)
    if cut <= 0:
        raise CorpusFormatError(f"{path}:{start}: expected 'PMID|t|title' or 'PMID<TAB>...' to start a document")
    return first[:cut], "\n".join(lines) + "\n"


def assign_folds(doc_ids: List[str], k: int, seed: int = 0) -> Dict[str, int]:
    """Fold of each document: documents ordered by a seeded hash of their ID, dealt round-robin,
    so folds differ in size by one document at most and do not depend on file order."""
    if k < 2:
        raise ValueError(f"k must be at least 2, got {k}")
    if len(doc_ids) < k:
        raise ValueError(f"{len(doc_ids)} documents cannot make {k} folds")
    order = sorted(doc_ids, key=lambda d: hashlib.sha256(f"{seed}:{d}".encode()).hexdigest())
    return {doc: i % k for i, doc in enumerate(order)}


def split_pubtator(path: PathLike, out_dir: PathLike, k: int = 2, seed: int = 0) -> Dict[str, object]:
    """Write ``out_dir/fold-<i>/{train,heldout}.txt`` for ``i < k`` and ``out_dir/folds.json``
    (documents per fold); returns that summary."""
    blocks = pubtator_blocks(path)
    fold_of = assign_folds(list(dict.fromkeys(doc for doc, _ in blocks)), k, seed)
    out = Path(out_dir)
    summary: Dict[str, object] = {"source": str(path), "k": k, "seed": seed, "documents": []}
    for i in range(k):
        folder = out / f"fold-{i}"
        folder.mkdir(parents=True, exist_ok=True)
        held = [b for d, b in blocks if fold_of[d] == i]
        rest = [b for d, b in blocks if fold_of[d] != i]
        (folder / "heldout.txt").write_text("\n".join(held), encoding="utf8")
        (folder / "train.txt").write_text("\n".join(rest), encoding="utf8")
        summary["documents"].append(len(held))  # type: ignore[union-attr]
    (out / "folds.json").write_text(json.dumps(summary, indent=2), encoding="utf8")
    return summary
