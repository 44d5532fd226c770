"""``folds`` and ``fit-fusion``: cross-fitted score fusion (:mod:`spacy_genbioel.linking.fusion`)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("folds")
def folds_cmd(
    train: Path = typer.Argument(..., help="Training split (PubTator)"),
    out: Path = typer.Option(..., help="Output folder: fold-<i>/train.txt and fold-<i>/heldout.txt per fold, folds.json"),
    k: int = typer.Option(2, "--k", help="Number of folds"),
    seed: int = typer.Option(0, help="Seed of the document-to-fold assignment"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Cut a training split into k folds of whole documents (for cross-fitting score fusion)."""
    setup_logging(verbose)
    from spacy_genbioel.corpus import CorpusFormatError
    from spacy_genbioel.corpus.folds import split_pubtator

    try:
        summary = split_pubtator(train, out, k=k, seed=seed)
    except (CorpusFormatError, ValueError, OSError) as err:
        msg.fail(f"folds: {err}")
        raise typer.Exit(1) from None
    msg.good(f"{k} folds of {summary['documents']} documents -> {out}")


@app.command("fit-fusion")
def fit_fusion_cmd(
    source: List[str] = typer.Option(..., "--source", help="NAME=FILE[,FILE...]: `evaluate --predictions` files of a source over held-out folds, fold i's file i-th (genbioel, tfidf, dense, ...)"),
    kb: List[Path] = typer.Option(..., "--kb", help="The KB each fold was scored with, in fold order (one for all folds, or one per fold)"),
    out: Path = typer.Option(..., help="Fusion JSON to write (package --fusion, evaluate --fusion)"),
    depth: int = typer.Option(5, help="Candidates read from each source (the predictions' top-k)"),
    l2: float = typer.Option(1e-3, help="L2 penalty on the standardized weights"),
    exclude: List[Path] = typer.Option([], help="Prediction files (`evaluate --predictions`) of mentions to keep out of the fit: any example with the same text and gold concepts is dropped (AskAPatient folds repeat mention/concept pairs across validation splits)"),
    retriever_model: List[str] = typer.Option([], "--retriever-model", help="NAME=DIR: the encoder a retriever source uses at linking time (dense: default all-MiniLM-L6-v2)"),
    generator: str = typer.Option("beam", help="How the genbioel files were made: beam (beam search) or forced (evaluate --decoding.search forced: forced scores of the retrievers' candidates, what the cascade reads)"),
    alternative: List[str] = typer.Option([], "--alternative", help="NAME[,NAME...]: retriever sources the fusion may read instead of all of them (say twice or more: tfidf,dense and tfidf,rescnn); the one whose fusion, fitted on the other folds, links each held-out fold best (recall@1) is kept"),
    generator_beams: Optional[int] = typer.Option(None, min=1, help="The beam width the genbioel files were made with (evaluate --decoding.num_beams), when not the model config's: recorded in the file, and pipelines linking with it search at that width (reranker.generator_beams)"),
    cascade: bool = typer.Option(False, "--cascade/--no-cascade", help="Also fit the cascade (reranker.cascade on): retrieval-only weights and its thresholds"),
    target_precision: float = typer.Option(0.95, help="Cascade: top-1 precision the mentions retrieval settles must reach on these predictions"),
    max_recall_loss: Optional[float] = typer.Option(None, help="Cascade: instead of --target-precision, settle as many mentions as keep its recall@1 on these predictions within this of the fusion's (0.002: 0.2 points)"),
    beam_reach: float = typer.Option(0.5, help="Cascade: retrieval looks weak (beam search runs too) where its candidates hold the gold concept at most this often"),
    defer: List[str] = typer.Option([], "--defer", help="Cascade: a costly retriever (dense) that runs only for mentions the fusion's other retrievers do not settle (an early step with its own threshold, chosen the same way; reranker.early_threshold)"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Fit score fusion on cross-fitted training predictions (bench/crossfit.sh), never on dev."""
    setup_logging(verbose)
    from spacy_genbioel.kb import KBFormatError, KnowledgeBase
    from spacy_genbioel.linking.fusion import GENERATOR
    from spacy_genbioel.training.cascade_fit import CascadeTargets, fit_cascade
    from spacy_genbioel.training.fusion_fit import choose_sources, drop_examples, fit_fusion, read_fusion_examples

    files = {}
    for item in source:
        name, sep, paths = item.partition("=")
        if not sep or not name or not paths:
            raise typer.BadParameter(f"--source {item!r}: expected NAME=FILE[,FILE...]")
        files[name] = [Path(p) for p in paths.split(",") if p]
    from spacy_genbioel.retrieval.registry import resolve_retriever

    for name in (n for n in files if n != GENERATOR):
        try:
            resolve_retriever(name)
        except ValueError as err:
            raise typer.BadParameter(f"--source {name}=...: not a retriever ({err})") from None
    folds = {len(paths) for paths in files.values()}
    if len(folds) != 1:
        raise typer.BadParameter(f"every --source needs one file per fold; got {sorted(folds)} files")
    n_folds = folds.pop()
    if len(kb) not in (1, n_folds):
        raise typer.BadParameter(f"--kb: give one KB, or one per fold ({n_folds}); got {len(kb)}")
    settings = {}
    for item in retriever_model:
        name, sep, path = item.partition("=")
        if not sep or name not in files:
            raise typer.BadParameter(f"--retriever-model {item!r}: expected NAME=DIR for a --source name")
        settings[name] = {"model": path}
    choices = [[n for n in item.split(",") if n] for item in alternative]
    if defer and not cascade:
        raise typer.BadParameter("--defer is a step of the cascade: add --cascade")
    for name in defer:
        if name not in files or name == GENERATOR:
            raise typer.BadParameter(f"--defer {name!r}: give a retriever name of --source")
    for names in choices:
        unknown = [n for n in names if n not in files or n == GENERATOR]
        if unknown or not names:
            raise typer.BadParameter(f"--alternative {','.join(names)!r}: give retriever names of --source ({', '.join(unknown)})")
    try:
        kbs = [KnowledgeBase.load(path) for path in kb]
        folds = [read_fusion_examples({s: [paths[i]] for s, paths in files.items()}, kbs[min(i, len(kbs) - 1)])
                 for i in range(n_folds)]
        if exclude:
            kept = [drop_examples(fold, exclude) for fold in folds]
            folds = [fold for fold, _ in kept]
            msg.info(f"{sum(n for _, n in kept)} examples dropped: their mention and gold concepts are in {', '.join(map(str, exclude))}")
        examples = [ex for fold in folds for ex in fold]
        sources = [GENERATOR, *(s for s in files if s != GENERATOR)]
        choice = None
        if choices:
            sources, choice = choose_sources(folds, kbs[0], choices, depth=depth, l2=l2)
            msg.info(f"Sources chosen on the held-out folds: {', '.join(sources)} ({choice})")
        model = fit_fusion(examples, kbs[0], sources, depth=depth, l2=l2,
                           retrievers={s: settings.get(s, {}) for s in sources[1:]})
        model = dataclasses.replace(model, generator=generator)
        if choice is not None:
            model.fit["choice"] = choice
        if generator_beams is not None:
            model.fit["generator_beams"] = generator_beams
        if cascade:
            model = fit_cascade(model, examples, kbs[0], CascadeTargets(target_precision, beam_reach, max_recall_loss=max_recall_loss),
                                l2=l2, defer=defer)
    except (KBFormatError, ValueError, OSError) as err:
        msg.fail(f"fit-fusion: {err}")
        raise typer.Exit(1) from None
    try:
        model.save(out)
    except OSError as err:
        msg.fail(f"fit-fusion: {out}: cannot write the fusion file ({err.strerror or err})")
        raise typer.Exit(1) from None
    fit = model.fit
    msg.good(f"Fusion of {', '.join(sources)} fitted on {fit['reachable']} of {fit['mentions']} mentions -> {out}")
    for name, recall in fit["recall"].items():
        msg.text(f"  {name:10s} {recall}")
    for name, weight in fit["standardized_weights"].items():
        msg.text(f"  weight {name:18s} {weight:+.3f} (standardized)")
    if model.cascade:
        c = model.cascade
        msg.text(f"  cascade: settle at p >= {c['settle_threshold']}, beam below p < {c['beam_threshold']}; {c['report']}")
        if "early" in c:
            msg.text(f"  early step: {', '.join(c['early']['defer'])} deferred, settle at p >= {c['early']['threshold']}")
