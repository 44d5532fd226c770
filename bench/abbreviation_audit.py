"""Which gold mentions the character-level short-form pass expands beyond scispacy's detector.

    python bench/abbreviation_audit.py ncbi_disease/NCBIdevelopset_corpus.txt bc5cdr/CDR_DevelopmentSet.PubTator.txt

Each corpus (a PubTator file, relative to ``--data``, ``$GENBIOEL_DATA`` or ``../shared/data``) is
read as ``evaluate`` reads it, and its mentions expanded by ``AbbreviationExpander`` twice: with
the detector alone (the pass switched off) and as the package links them now (the detector,
then :func:`~spacy_genbioel.linking.inputs.abbreviations.supplement_long_forms`). The report
counts the mentions each expands and lists every (mention, long form, gold concept's first
name) the pass adds, most frequent first, so a reader can judge each expansion; the gold
name comes from ``--kb`` when given (a KB JSONL), else the gold ID is shown. Whether an
expansion is right is a reader's judgement (docs/results.md records one); this script only
lists them. The detector's long forms that run over a sentence end (dropped now) are listed too.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path
from typing import Dict, Optional

from spacy_genbioel.corpus.load import load_corpus
from spacy_genbioel.linking.inputs import abbreviations


def first_names(kb: Optional[Path]) -> Dict[str, str]:
    names: Dict[str, str] = {}
    if kb is None:
        return names
    with open(kb, encoding="utf8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                names[record["id"]] = (record.get("names") or [record["id"]])[0]
    return names


def audit(path: Path, names: Dict[str, str], top: int) -> dict:
    mentions, texts = load_corpus(path, "pubtator", None)
    expander = abbreviations.AbbreviationExpander()
    now, _ = expander.expand(mentions, texts)
    supplement = abbreviations.supplement_long_forms
    abbreviations.supplement_long_forms = lambda text, by_text: by_text  # the detector alone
    try:
        before, _ = expander.expand(mentions, texts)
    finally:
        abbreviations.supplement_long_forms = supplement
    added: Counter = Counter()
    for m, old, new in zip(mentions, before, now):
        if old.text != new.text:
            added[(m.text, new.text, names.get(m.ids[0], m.ids[0]) if m.ids else "")] += 1
    dropped: Counter = Counter()
    for text in texts.values():
        for short in expander.nlp(text)._.abbreviations:
            if abbreviations.crosses_sentence_end(short._.long_form.text):
                dropped[(short.text, short._.long_form.text)] += 1
    return {
        "corpus": str(path),
        "mentions": len(mentions),
        "expanded_by_detector": sum(o.text != m.text for m, o in zip(mentions, before)),
        "expanded_now": sum(n.text != m.text for m, n in zip(mentions, now)),
        "added": [{"count": c, "mention": k[0], "long_form": k[1], "gold": k[2]} for k, c in added.most_common(top)],
        "detector_long_forms_dropped": [{"count": c, "short": k[0], "long_form": k[1]} for k, c in dropped.items()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpora", nargs="+", help="PubTator files, relative to --data")
    parser.add_argument("--data", type=Path, default=Path(os.environ.get("GENBIOEL_DATA", "../shared/data")))
    parser.add_argument("--kb", type=Path, help="KB JSONL whose first names label the gold concepts")
    parser.add_argument("--top", type=int, default=60, help="list at most this many added expansions")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    names = first_names(args.kb)
    reports = [audit(args.data / corpus, names, args.top) for corpus in args.corpora]
    for r in reports:
        print(
            f"{r['corpus']}: {r['mentions']} mentions, {r['expanded_by_detector']} expanded by the detector alone, "
            f"{r['expanded_now']} now"
        )
        for row in r["added"]:
            print(f"  {row['count']:4d}  {row['mention']!r} -> {row['long_form']!r}  (gold: {row['gold']})")
        for row in r["detector_long_forms_dropped"]:
            print(f"  dropped {row['count']}x  {row['short']!r} -> {row['long_form']!r}")
    if args.json:
        args.json.write_text(json.dumps(reports, indent=2), encoding="utf8")


if __name__ == "__main__":
    main()
