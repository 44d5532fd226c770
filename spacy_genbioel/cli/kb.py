"""``build-kb``: read vocabularies into one KB file (docs/kbs.md: the filters of each format)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("build-kb")
def build_kb_cmd(
    sources: List[str] = typer.Argument(..., help="Vocabulary files; FORMAT:PATH reads one with another format"),
    format: str = typer.Option(
        ...,
        "--format",
        "-f",
        help="medic | ctd | mesh-tsv | mesh-xml | umls | rxnorm | obo | genbioel | jsonl | scispacy | askapatient",
    ),
    out: Path = typer.Option(
        ...,
        help="Output KB (.jsonl; .json for GenBioEL's target_kb.json; .safetensors for a compact KB, built in a "
        "fraction of the memory and loaded memory-mapped: UMLS-sized KBs)",
    ),
    dedup: bool = typer.Option(
        False,
        "--dedup/--no-dedup",
        help="GenBioEL's rule: a shared name stays only on the concept with the fewest names (the others lose it; "
        "what it took is reported). Default: every name kept, as the component and workflows use",
    ),
    sab: List[str] = typer.Option(
        [],
        "--sab",
        help="umls/rxnorm: keep names of these source vocabularies (MSH,SNOMEDCT_US; rxnorm's default: RXNORM)",
    ),
    lang: List[str] = typer.Option(
        [], "--lang", help="umls: keep names in these languages (default ENG; ALL: every language)"
    ),
    tty: List[str] = typer.Option(
        [], "--tty", help="umls/rxnorm: keep names of these term types (PT,SY; rxnorm: IN,SCD,BN...)"
    ),
    semantic_types: List[str] = typer.Option(
        [],
        "--semantic-types",
        help="umls/rxnorm: keep concepts of these semantic types, TUIs (T047,T191) or names "
        "('Disease or Syndrome'); needs MRSTY",
    ),
    suppressed: bool = typer.Option(
        False,
        "--suppressed/--no-suppressed",
        help="umls/rxnorm: keep obsolete and suppressed names (SUPPRESS O, E, Y) too",
    ),
    mrsty: Optional[Path] = typer.Option(
        None,
        "--mrsty",
        help="umls/rxnorm: MRSTY.RRF (RXNSTY.RRF): semantic types (TUIs) as concept types; read from a META folder "
        "source by itself",
    ),
    mrdef: Optional[Path] = typer.Option(
        None, "--mrdef", help="umls: MRDEF.RRF: definitions; read from a META folder source by itself"
    ),
    prefix: List[str] = typer.Option(
        [],
        "--prefix",
        help="obo: keep terms with these ID prefixes (HP,GO); default: the ontology's own (its header's ontology: "
        "tag); ALL: every term",
    ),
    obsolete: bool = typer.Option(False, "--obsolete/--no-obsolete", help="obo: keep obsolete terms too"),
    synonym_scopes: List[str] = typer.Option(
        [], "--synonym-scopes", help="obo: synonym scopes that become names (default EXACT,RELATED; also BROAD, NARROW)"
    ),
    crosswalk: Optional[Path] = typer.Option(None, help="TSV of old -> new concept IDs applied to the KB"),
    augment_pubtator: List[Path] = typer.Option(
        [], help="Add the mentions of these PubTator files as names of their gold concepts (training splits only)"
    ),
    prior_pubtator: List[Path] = typer.Option(
        [],
        help="Count the gold IDs of these PubTator files (training splits only) as concept priors: a name shared by "
        "several concepts lists the most frequent answer first",
    ),
    mentions_format: str = typer.Option(
        "pubtator",
        "--mentions-format",
        help="Format of the --augment-pubtator / --prior-pubtator files: pubtator | askapatient",
    ),
    first_names_only: bool = typer.Option(
        False, "--first-names-only", help="Keep one name per concept, its first (the N-to-1 trie ablation)"
    ),
    progress: bool = typer.Option(
        True, "--progress/--no-progress", help="Bytes read and concepts/s on stderr (on a terminal)"
    ),
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
        options = reader_options(
            format,
            sab=sab,
            lang=lang,
            tty=tty,
            semantic_types=semantic_types,
            suppressed=suppressed,
            mrsty=mrsty,
            mrdef=mrdef,
            prefix=prefix,
            obsolete=obsolete,
            synonym_scopes=synonym_scopes,
        )
        kb = build_kb(
            format,
            [parse_source(s) for s in sources],
            dedup=dedup,
            crosswalk=crosswalk,
            name=out.stem,
            progress=progress,
            compact=out.suffix == ".safetensors",
            **options,
        )
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

        kb, report = augment_kb(
            kb,
            augment_mentions=gold_mentions(augment_pubtator),
            prior_mentions=gold_mentions(prior_pubtator),
            first_names_only=first_names_only,
        )
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
    msg.good(
        f"{len(kb)} concepts, {kb.n_names} names -> {out} ({time.monotonic() - began:.1f}s, peak RSS {peak:.0f} MB)"
    )


#: build-kb's reader options: (the formats that take them, the reader's keyword)
_READER_OPTIONS = {
    "sab": (("umls", "rxnorm"), "sabs"),
    "lang": (("umls",), "languages"),
    "tty": (("umls", "rxnorm"), "term_types"),
    "semantic_types": (("umls", "rxnorm"), "semantic_types"),
    "suppressed": (("umls", "rxnorm"), "include_suppressed"),
    "mrsty": (("umls", "rxnorm"), "mrsty"),
    "mrdef": (("umls",), "mrdef"),
    "prefix": (("obo",), "prefix"),
    "obsolete": (("obo",), "obsolete"),
    "synonym_scopes": (("obo",), "synonym_scopes"),
}


def _values(option: str, given: List[str]) -> List[str]:
    """Repeated and comma-separated values; a semantic type name keeps its commas
    ("Amino Acid, Peptide, or Protein") unless every piece is a TUI."""
    from spacy_genbioel.kb.umls import TUI

    out: List[str] = []
    for value in given:
        pieces = [p.strip() for p in value.split(",")]
        if option == "semantic_types" and not all(TUI.match(p) for p in pieces if p):
            pieces = [value.strip()]
        out.extend(p for p in pieces if p)
    return out


def reader_options(format: str, **given: Any) -> Dict[str, Any]:
    """The reader keywords of the options the user set; an option the format does not take is a
    one-line error naming it."""
    options: Dict[str, Any] = {}
    for option, value in given.items():
        if value in (None, False, [], ()):
            continue
        formats, keyword = _READER_OPTIONS[option]
        flag = "--" + option.replace("_", "-")
        if format not in formats:
            raise ValueError(f"{flag} applies to -f {' or -f '.join(formats)}, not -f {format}")
        if isinstance(value, list):
            value = _values(option, value)
            if [v.upper() for v in value] == ["ALL"] and option in ("lang", "prefix"):
                value = None
        if option == "mrsty" and format == "rxnorm":
            keyword = "rxnsty"
        options[keyword] = value
    return options
