"""``evaluate``: recall@k of the generative linker or a peer retriever on a corpus, or end to end."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


def load_corpus(path: Path, fmt: str, crosswalk: Optional[Path] = None):
    """Gold mentions (with context) and document texts of a corpus file."""
    from spacy_genbioel.corpus import readers as corpus
    from spacy_genbioel.kb.sources import read_crosswalk

    walk = read_crosswalk(crosswalk) if crosswalk else None
    if fmt == "askapatient":
        return list(corpus.read_askapatient(path)), {}
    readers = {"pubtator": lambda p: corpus.read_pubtator(p, crosswalk=walk), "bioc": corpus.read_bioc, "jsonl": corpus.read_jsonl_corpus}
    if fmt not in readers:
        raise typer.BadParameter(f"unknown corpus format {fmt!r}; use pubtator, bioc, jsonl or askapatient")
    documents = list(readers[fmt](path))
    mentions = [m for doc in documents for m in corpus.document_mentions(doc)]
    return mentions, {doc.pmid: doc.text for doc in documents}


def _linking_overrides(device: Optional[str], candidates: Optional[str], num_candidates: Optional[int], exact_match: Optional[bool],
                       restrict: Optional[bool], shortcut_threshold: Optional[float]) -> Dict[str, Any]:
    """The genbioel component settings given on the command line (None: keep the pipeline's)."""
    if candidates == "none" and shortcut_threshold is not None:
        raise typer.BadParameter("--shortcut-threshold needs a retriever: --candidates tfidf | dense")
    given = {"device": device, "candidates": candidates, "num_candidates": num_candidates, "exact_match": exact_match,
             "restrict_to_candidates": restrict, "shortcut_threshold": shortcut_threshold}
    return {k: v for k, v in given.items() if v is not None}


@app.command("evaluate")
def evaluate_cmd(
    corpus_path: Path = typer.Option(..., "--corpus", help="Evaluation corpus (dev split)"),
    fmt: str = typer.Option("pubtator", "--format", help="pubtator | bioc | jsonl | askapatient"),
    linker: str = typer.Option("genbioel", help="genbioel | exact | tfidf | scispacy | dense"),
    dense_model: Optional[Path] = typer.Option(None, "--model", help="--linker dense (or genbioel --candidates dense): encoder directory (default: the installed all-MiniLM-L6-v2)"),
    pipeline: Optional[Path] = typer.Option(None, help="spaCy pipeline directory with a genbioel component"),
    candidates: Optional[str] = typer.Option(None, help="genbioel: decode only names of retrieved concepts: none | tfidf | dense (default: the pipeline's config)"),
    num_candidates: Optional[int] = typer.Option(None, help="genbioel: concepts retrieved per mention (default: the pipeline's config)"),
    exact_match: Optional[bool] = typer.Option(None, "--exact-match/--no-exact-match", help="genbioel: a KB name equal to the mention comes first (default: the pipeline's config)"),
    restrict: Optional[bool] = typer.Option(None, "--restrict/--no-restrict", help="genbioel with --candidates: decode only the retrieved concepts' names; --no-restrict: the retriever serves --shortcut-threshold only (default: the pipeline's config)"),
    shortcut_threshold: Optional[float] = typer.Option(None, help="genbioel with --candidates: a mention whose top retrieved candidate scores at least this takes it without generating (default: the pipeline's config)"),
    kb: Optional[Path] = typer.Option(None, help="KB for the peers (genbioel uses the pipeline's)"),
    train: Optional[Path] = typer.Option(None, help="Training split, for GenBioEL's sub-population table"),
    labels: List[str] = typer.Option([], help="Only gold mentions with these labels"),
    abbreviations: bool = typer.Option(False, help="Expand short forms with scispacy before linking"),
    crosswalk: Optional[Path] = typer.Option(None, help="Old -> new ID TSV applied to gold IDs"),
    top_k: int = typer.Option(5),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON"),
    predictions_path: Optional[Path] = typer.Option(None, "--predictions", help="Write each mention's gold IDs, hit rank and ranked candidates as JSON lines"),
    plots: Optional[Path] = typer.Option(None, help="Folder for the similarity-bin plot"),
    device: str = typer.Option("auto"),
    end_to_end: bool = typer.Option(False, "--end-to-end", help="Score the pipeline's own entities: NER + linking P/R/F1, strict and partial (a peer --linker links the pipeline's NER entities)"),
    label_map: Optional[str] = typer.Option(None, help="--end-to-end: gold labels -> NER labels: ncbi or FROM=TO,FROM=TO"),
    single_label: Optional[str] = typer.Option(None, help="--end-to-end: every gold label becomes this one"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Recall@1/@5 with GenBioEL's rules, KB coverage, sub-populations and similarity bins
    (or, with --end-to-end, NER + linking P/R/F1 on the pipeline's own entities)."""
    setup_logging(verbose)
    if end_to_end:
        from spacy_genbioel.evaluation.end_to_end import run_end_to_end

        if predictions_path:
            raise typer.BadParameter("--predictions lists gold mentions' candidates: not with --end-to-end")

        e2e = run_end_to_end(
            corpus_path, pipeline=pipeline, fmt=fmt, linker=linker, kb=kb, labels=labels, abbreviations=abbreviations,
            crosswalk=crosswalk, label_map=label_map, single_label=single_label,
            component_config=_linking_overrides(device, candidates, num_candidates, exact_match, restrict, shortcut_threshold),
            linker_options={"model": dense_model} if dense_model else {},
        )
        print(e2e.format_table())
        if json_path:
            json_path.write_text(json.dumps(e2e.to_dict(), indent=2), encoding="utf8")
        return
    from spacy_genbioel.evaluation.report import evaluate_linker, plot_similarity_bins, write_predictions
    from spacy_genbioel.kb.base import KnowledgeBase

    mentions, texts = load_corpus(corpus_path, fmt, crosswalk)
    if labels:
        mentions = [m for m in mentions if m.label in labels]
    train_mentions = load_corpus(train, fmt, crosswalk)[0] if train else None
    if abbreviations:
        from spacy_genbioel.linking.abbreviations import AbbreviationExpander

        mentions, n_expanded = AbbreviationExpander().expand(mentions, texts)
        msg.info(f"{n_expanded} mentions expanded from abbreviations")
    if linker == "genbioel":
        if pipeline is None:
            raise typer.BadParameter("--pipeline is required for --linker genbioel")
        import spacy

        overrides = _linking_overrides(device, candidates, num_candidates, exact_match, restrict, shortcut_threshold)
        if dense_model and candidates == "dense":
            overrides["candidates_model"] = str(dense_model)
        nlp = spacy.load(pipeline, config={"components": {"genbioel": overrides}})
        model = nlp.get_pipe("genbioel").linker
        knowledge_base = model.kb
        getattr(model.candidate_generator, "generator", None)  # fit a lazy retriever before the clock starts
        component_cfg = nlp.config["components"]["genbioel"]
        run_meta = {k: component_cfg.get(k) for k in ("candidates", "num_candidates", "candidates_model", "exact_match",
                                                       "restrict_to_candidates", "shortcut_threshold")}
    else:
        if kb is None:
            raise typer.BadParameter(f"--kb is required for --linker {linker}")
        from spacy_genbioel.retrieval.peers import get_linker

        knowledge_base = KnowledgeBase.load(kb)
        model = get_linker(linker, knowledge_base, **({"model": dense_model} if dense_model else {}))
        run_meta = {}
    report = evaluate_linker(model, mentions, top_k=top_k, train_mentions=train_mentions, kb=knowledge_base, name=linker)
    report.meta.update({"corpus": str(corpus_path), "abbreviations": abbreviations, "kb_names": knowledge_base.n_names, **run_meta})
    print(report.format_table())
    if json_path:
        json_path.write_text(json.dumps(report.to_dict(), indent=2), encoding="utf8")
    if predictions_path:
        msg.info(f"{write_predictions(predictions_path, mentions, report.predictions)} predictions written to {predictions_path}")
    if plots and report.similarity is not None:
        plots.mkdir(parents=True, exist_ok=True)
        plot_similarity_bins(report.similarity, plots / f"similarity_bins_{linker}.png")
