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
    out: Path = typer.Option(..., help="Output KB (.jsonl; .json for GenBioEL's target_kb.json; .safetensors for a compact KB, built in a fraction of the memory and loaded memory-mapped: UMLS-sized KBs)"),
    dedup: bool = typer.Option(True, "--dedup/--no-dedup", help="GenBioEL's rule: a shared name stays on the concept with the fewest names"),
    crosswalk: Optional[Path] = typer.Option(None, help="TSV of old -> new concept IDs applied to the KB"),
    augment_pubtator: List[Path] = typer.Option([], help="Add the mentions of these PubTator files as names of their gold concepts (training splits only)"),
    prior_pubtator: List[Path] = typer.Option([], help="Count the gold IDs of these PubTator files (training splits only) as concept priors: a name shared by several concepts lists the most frequent answer first"),
    mentions_format: str = typer.Option("pubtator", "--mentions-format", help="Format of the --augment-pubtator / --prior-pubtator files: pubtator | askapatient"),
    first_names_only: bool = typer.Option(False, "--first-names-only", help="Keep one name per concept, its first (the N-to-1 trie ablation)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Bytes read and concepts/s on stderr (on a terminal)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Read vocabularies into one KB (with ID clean-up), optionally augmented with training mentions."""
    setup_logging(verbose)
    import resource
    import time

    from spacy_genbioel.corpus.askapatient import read_askapatient
    from spacy_genbioel.corpus.pubtator import mentions_from_pubtator
    from spacy_genbioel.kb.build import augment_kb, build_kb, parse_source
    from spacy_genbioel.kb.crosswalk import read_crosswalk

    began = time.monotonic()
    try:
        kb = build_kb(format, [parse_source(s) for s in sources], dedup=dedup, crosswalk=crosswalk, name=out.stem,
                      progress=progress, compact=out.suffix == ".safetensors")
        drops = kb.drops
        walk = read_crosswalk(crosswalk) if crosswalk and (augment_pubtator or prior_pubtator) else None

        def gold_mentions(paths: List[Path]):
            if not paths:
                return None
            if mentions_format == "askapatient":
                return (m for path in paths for m in read_askapatient(path))
            if mentions_format != "pubtator":
                raise ValueError(f"--mentions-format {mentions_format!r}: pubtator or askapatient")
            return (m for path in paths for m in mentions_from_pubtator(path, context_chars=0, crosswalk=walk))

        kb, report = augment_kb(kb, augment_mentions=gold_mentions(augment_pubtator), prior_mentions=gold_mentions(prior_pubtator),
                                first_names_only=first_names_only)
    except (ValueError, OSError) as err:  # KBFormatError, CorpusFormatError, a missing file, an unknown format
        msg.fail(f"build-kb: {err}")
        raise typer.Exit(1) from None
    if drops.summary():
        msg.warn(f"Sources: {drops.summary()}")
    if report.mentions_added is not None:
        msg.info(f"Dictionary augmentation: {report.mentions_added} training mentions, {report.new_names} new names")
    if report.prior_ids is not None:
        msg.info(f"Concept priors from {report.prior_ids} gold IDs ({report.prior_concepts} concepts)")
    if report.names_before_first_only is not None:
        msg.info(f"One name per concept: {report.names_before_first_only} -> {kb.n_names} names")
    out.parent.mkdir(parents=True, exist_ok=True)
    kb.save(out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    msg.good(f"{len(kb)} concepts, {kb.n_names} names -> {out} ({time.monotonic() - began:.1f}s, peak RSS {peak:.0f} MB)")
