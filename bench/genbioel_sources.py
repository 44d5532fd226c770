"""How close export-sources comes to GenBioEL's own NCBI-disease dev files.

    python bench/genbioel_sources.py [DATA_DIR]      # default: $GENBIOEL_DATA or ../shared/data

Exports the NCBI-disease dev corpus in the ``genbioel-released-ncbi.v1`` style (the
code ``python -m spacy_genbioel export-sources`` runs, KB: GenBioEL's
``target_kb.json``), aligns its lines with ``genbioel_reference/ncbi/dev.*`` by
mention (their files follow their document order, not the corpus order: identical
lines first, then the same context left and right of the markers), and prints the
share of identical ``.source`` lines, each kind of difference with its count and
examples, and the agreement of the prompts, labels and target names.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict, deque
from pathlib import Path
from typing import Dict, List, Optional, Tuple

CORPUS = "ncbi_disease/NCBIdevelopset_corpus.txt"
REFERENCE = "genbioel_reference/ncbi"
STYLE = "genbioel-released-ncbi.v1"


def default_data_dir() -> Path:
    return Path(os.environ.get("GENBIOEL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def split_source(source: str) -> Tuple[str, str, str]:
    """``(left, mention, right)`` of a ``left START mention END right`` line (the text is
    lower-cased, so the upper-case markers are found unambiguously)."""
    start, end = source.index("START"), source.rindex("END")
    return source[:start].rstrip(" "), source[start + 6 : end - 1], source[end + 3 :].lstrip(" ")


def align(ours: List[str], theirs: List[str]) -> Tuple[List[Tuple[int, int]], List[int], List[int]]:
    """``(pairs (our index, their index), our unaligned, their unaligned)``: identical
    lines first (in order), then lines with the same left and right context."""
    by_line: Dict[str, deque] = defaultdict(deque)
    for j, line in enumerate(theirs):
        by_line[line].append(j)
    pairs, rest = [], []
    for i, line in enumerate(ours):
        (pairs.append((i, by_line[line].popleft())) if by_line[line] else rest.append(i))
    used = {j for _, j in pairs}
    by_context: Dict[Tuple[str, str], deque] = defaultdict(deque)
    for j, line in enumerate(theirs):
        if j not in used:
            left, _, right = split_source(line)
            by_context[(left, right)].append(j)
    unaligned = []
    for i in rest:
        left, _, right = split_source(ours[i])
        queue = by_context.get((left, right))
        (pairs.append((i, queue.popleft())) if queue else unaligned.append(i))
    used = {j for _, j in pairs}
    return pairs, unaligned, [j for j in range(len(theirs)) if j not in used]


def difference_kind(ours: str, theirs: str, raw_mention: str, ids: Tuple[str, ...]) -> str:
    """Why two aligned lines differ."""
    from spacy_genbioel.linking.inputs.released_style import RELEASED_STYLES, released_mention

    (our_left, our_mention, our_right), (left, mention, right) = split_source(ours), split_source(theirs)
    if (our_left, our_right) != (left, right):
        return "context (cut or case)"
    if len(ids) > 1:
        return "composite mention split differently"
    unexpanded = released_mention(raw_mention, ids, RELEASED_STYLES[STYLE])
    if our_mention != unexpanded or mention != unexpanded:
        return "abbreviation (Ab3P found another long form, or none)"
    return "mention text (other)"


def compare(data: Path, examples: int = 3) -> Dict[str, object]:
    from spacy_genbioel.corpus.pubtator import read_pubtator
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.linking.inputs.builder import InputBuilder
    from spacy_genbioel.training.export_sources import source_lines

    reference = data / REFERENCE
    theirs = [json.loads(line)[0] for line in (reference / "dev.source").read_text(encoding="utf8").splitlines()]
    their_targets = [json.loads(line) for line in (reference / "dev.target").read_text(encoding="utf8").splitlines()]
    their_labels = (reference / "devlabel.txt").read_text(encoding="utf8").splitlines()
    documents = list(read_pubtator(data / CORPUS))
    counts: Counter = Counter()
    lines = source_lines(
        documents, InputBuilder(style=STYLE), KnowledgeBase.load(reference / "target_kb.json"), stats=counts
    )
    annotations = {(doc.pmid, a.start, a.end): a for doc in documents for a in doc.annotations}
    ours = [line.source for line in lines]
    pairs, our_rest, their_rest = align(ours, theirs)
    kinds: Dict[str, List[str]] = defaultdict(list)
    agree: Counter = Counter()
    for i, j in pairs:
        line = lines[i]
        agree["prompt"] += line.prompt == their_targets[j][0]
        agree["label"] += line.label == their_labels[j]
        agree["name"] += line.name == their_targets[j][1]
        # target_kb.json holds many dev mentions as names of their gold concept; GenBioEL
        # chose the dev targets from its dev KB (train mentions, MEDIC, MeSH entry terms)
        agree["name_is_mention"] += line.name != their_targets[j][1] and line.name == line.prompt[: -len(" is")]
        if ours[i] == theirs[j]:
            agree["source"] += 1
            continue
        ann = annotations[(line.doc_id, line.start, line.end)]
        kinds[difference_kind(ours[i], theirs[j], ann.text, tuple(ann.ids))].append(
            f"PMID {line.doc_id} {ann.text!r}: ours {split_source(ours[i])[1]!r}, "
            f"GenBioEL {split_source(theirs[j])[1]!r}"
        )
    return {
        "reference_lines": len(theirs),
        "exported_lines": len(ours),
        "aligned": len(pairs),
        "identical_source": agree["source"],
        "share_identical": agree["source"] / len(theirs) if theirs else 0.0,
        "identical_prompt": agree["prompt"],
        "identical_label": agree["label"],
        "identical_target_name": agree["name"],
        "target_name_is_the_mention": agree["name_is_mention"],
        "differences": {
            kind: {"count": len(found), "examples": found[:examples]} for kind, found in sorted(kinds.items())
        },
        "unaligned_ours": len(our_rest),
        "unaligned_reference": len(their_rest),
        "export_counts": dict(counts),
    }


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    data = Path(argv[0]) if argv else default_data_dir()
    if not (data / REFERENCE / "dev.source").is_file():
        print(f"no GenBioEL reference files under {data / REFERENCE}", file=sys.stderr)
        return 2
    result = compare(data)
    n = result["reference_lines"]
    print(
        f"NCBI-disease dev, style {STYLE}: {result['exported_lines']} lines exported, {n} in GenBioEL's dev.source, "
        f"{result['aligned']} aligned by mention"
    )
    print(f"identical .source lines: {result['identical_source']} / {n} ({100 * result['share_identical']:.2f}%)")
    for kind, found in result["differences"].items():
        print(f"  {kind}: {found['count']}")
        for example in found["examples"]:
            print(f"    {example}")
    print(f"unaligned: ours {result['unaligned_ours']}, GenBioEL's {result['unaligned_reference']}")
    print(
        f"identical prompts (dev.target[0]): {result['identical_prompt']} / {n}; "
        f"labels: {result['identical_label']} / {n}; "
        f"target names (dev.target[1]): {result['identical_target_name']} / {n}, of the others "
        f"{result['target_name_is_the_mention']} are the mention itself, a name target_kb.json gives its gold concept "
        "(GenBioEL chose dev targets among its dev KB's names, with scispacy's UMLS TF-IDF)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
