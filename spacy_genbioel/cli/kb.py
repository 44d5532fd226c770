"""``build-kb``: read vocabularies into one KB file."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("build-kb")
def build_kb_cmd(
    sources: List[str] = typer.Argument(..., help="Vocabulary files; FORMAT:PATH reads one with another format"),
    format: str = typer.Option(..., "--format", "-f", help="medic | ctd | mesh-tsv | mesh-xml | umls | obo | genbioel | jsonl | scispacy"),
    out: Path = typer.Option(..., help="Output KB (.jsonl, or .json for GenBioEL's target_kb.json)"),
    dedup: bool = typer.Option(True, "--dedup/--no-dedup", help="GenBioEL's rule: a shared name stays on the concept with the fewest names"),
    crosswalk: Optional[Path] = typer.Option(None, help="TSV of old -> new concept IDs applied to the KB"),
    augment_pubtator: List[Path] = typer.Option([], help="Add the mentions of these PubTator files as names of their gold concepts (training splits only)"),
    prior_pubtator: List[Path] = typer.Option([], help="Count the gold IDs of these PubTator files (training splits only) as concept priors: a name shared by several concepts lists the most frequent answer first"),
    first_names_only: bool = typer.Option(False, "--first-names-only", help="Keep one name per concept, its first (the N-to-1 trie ablation)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Read vocabularies into one KB (with ID clean-up), optionally augmented with training mentions."""
    setup_logging(verbose)
    import time

    import psutil

    from spacy_genbioel.kb.sources import FORMATS, build_kb

    def source(spec: str):
        prefix, _, rest = spec.partition(":")
        return (prefix, rest) if rest and prefix in FORMATS else spec

    began = time.monotonic()
    kb = build_kb(format, [source(s) for s in sources], dedup=dedup, crosswalk=crosswalk, name=out.stem)
    walk = None
    if crosswalk and (augment_pubtator or prior_pubtator):
        from spacy_genbioel.kb.sources import read_crosswalk

        walk = read_crosswalk(crosswalk)
    if augment_pubtator:
        from spacy_genbioel.corpus.readers import mentions_from_pubtator

        pairs = [(cid, m.text) for path in augment_pubtator
                 for m in mentions_from_pubtator(path, context_chars=0, crosswalk=walk)
                 if not m.is_composite for cid in m.ids]
        n_names = kb.n_names
        kb = kb.with_extra_names(pairs)
        msg.info(f"Dictionary augmentation: {len(pairs)} training mentions, {kb.n_names - n_names} new names")
    if prior_pubtator:
        from collections import Counter

        from spacy_genbioel.corpus.readers import mentions_from_pubtator

        counts = Counter(cid for path in prior_pubtator for m in mentions_from_pubtator(path, context_chars=0, crosswalk=walk)
                         for cid in m.ids)
        kb = kb.with_priors(counts)
        msg.info(f"Concept priors from {sum(counts.values())} gold IDs ({len(counts)} concepts)")
    if first_names_only:
        n_names = kb.n_names
        kb = kb.with_first_names_only()
        msg.info(f"One name per concept: {n_names} -> {kb.n_names} names")
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".json":
        kb.to_target_kb_json(out)
    else:
        kb.to_jsonl(out)
    rss = psutil.Process().memory_info().rss / 2**20
    msg.good(f"{len(kb)} concepts, {kb.n_names} names -> {out} ({time.monotonic() - began:.1f}s, RSS {rss:.0f} MB)")
