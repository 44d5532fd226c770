"""``folds``, ``fit-fusion`` and ``fit-retrieval``: cross-fitted score fusion
(:mod:`spacy_genbioel.linking.reranking.fusion`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("folds")
def folds_cmd(
    train: Path = typer.Argument(..., help="Training split (PubTator)"),
    out: Path = typer.Option(
        ..., help="Output folder: fold-<i>/train.txt and fold-<i>/heldout.txt per fold, folds.json"
    ),
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
    source: List[str] = typer.Option(
        [],
        "--source",
        help="NAME=FILE[,FILE...]: `evaluate --predictions` files of a source over held-out folds, fold i's file i-th "
        "(genbioel, tfidf, dense, ...)",
    ),
    model: Optional[Path] = typer.Option(
        None,
        "--model",
        help="Instead of --source: a model not trained here (a model folder: import-checkpoint output; or a pipeline "
        "`package` wrote without --fusion), scored with the retrievers on --corpus, a labelled split it was not "
        "trained on (docs/published.md)",
    ),
    corpus: Optional[Path] = typer.Option(
        None, "--corpus", help="--model: the labelled split to score (never one the model was trained on, never test)"
    ),
    fmt: str = typer.Option(
        "pubtator", "--format", help="--model: the corpus format: pubtator | bioc | jsonl | askapatient"
    ),
    crosswalk: Optional[Path] = typer.Option(None, help="--model: old -> new ID TSV applied to the corpus's gold IDs"),
    abbreviations: bool = typer.Option(
        False, help="--model: expand short forms with scispacy before linking (as evaluate --abbreviations)"
    ),
    labels: List[str] = typer.Option(
        [], help="--model: only gold mentions with these labels (BC5CDR's Disease for a model of diseases)"
    ),
    retrievers: str = typer.Option(
        "tfidf,dense", "--retrievers", help="--model: the retrievers scored and fused with the model (comma-separated)"
    ),
    config: Optional[Path] = typer.Option(
        None,
        help="--model with a model folder trained here: its fine-tuning config (encoder-input settings, as package "
        "--config)",
    ),
    predictions: Optional[Path] = typer.Option(
        None,
        "--predictions",
        help="--model: keep the scoring pipeline and the predictions in this folder (a rerun reuses the sources "
        "scored already); default: a temporary folder",
    ),
    device: str = typer.Option("cpu", help="--model: the device the model scores on (auto | cpu | cuda | cuda:N)"),
    kb: List[Path] = typer.Option(
        [],
        "--kb",
        help="--source: the KB each fold was scored with, in fold order (one for all folds, or one per fold); "
        "--model: the KB a model folder links into (a pipeline's own by default)",
    ),
    out: Path = typer.Option(..., help="Fusion JSON to write (package --fusion, evaluate --fusion)"),
    depth: int = typer.Option(5, help="Candidates read from each source (the predictions' top-k)"),
    l2: float = typer.Option(1e-3, help="L2 penalty on the standardized weights"),
    anchor: Optional[str] = typer.Option(
        None,
        help="A fusion file (or genbioel:retrieval, the shipped one) whose weights the L2 penalty pulls toward "
        "instead of zero: for a fit on a few hundred labelled mentions, with a larger --l2 (docs/results.md)",
    ),
    exclude: List[Path] = typer.Option(
        [],
        help="Prediction files (`evaluate --predictions`) of mentions to keep out of the fit: any example with the "
        "same text and gold concepts is dropped (AskAPatient folds repeat mention/concept pairs across validation "
        "splits)",
    ),
    retriever_model: List[str] = typer.Option(
        [],
        "--retriever-model",
        help="NAME=DIR: the encoder a retriever source uses at linking time (dense: default all-MiniLM-L6-v2)",
    ),
    generator: str = typer.Option(
        "beam",
        help="How the genbioel lists are made: beam (beam search) or forced (evaluate --decoding.search forced: "
        "forced scores of the retrievers' candidates, what the cascade reads); --model makes them so",
    ),
    alternative: List[str] = typer.Option(
        [],
        "--alternative",
        help="NAME[,NAME...]: retriever sources the fusion may read instead of all of them (say twice or more: "
        "tfidf,dense and tfidf,rescnn); the one whose fusion, fitted on the other folds, links each held-out fold "
        "best (recall@1) is kept",
    ),
    generator_beams: Optional[int] = typer.Option(
        None,
        min=1,
        help="The beam width the genbioel files were made with (evaluate --decoding.num_beams; --model: scores at "
        "it), when not the model config's: recorded in the file, and pipelines linking with it search at that width "
        "(reranker.generator_beams)",
    ),
    cascade: bool = typer.Option(
        False,
        "--cascade/--no-cascade",
        help="Also fit the cascade (reranker.cascade on): retrieval-only weights and its thresholds",
    ),
    target_precision: float = typer.Option(
        0.95, help="Cascade: top-1 precision the mentions retrieval settles must reach on these predictions"
    ),
    max_recall_loss: Optional[float] = typer.Option(
        None,
        help="Cascade: instead of --target-precision, settle as many mentions as keep its recall@1 on these "
        "predictions within this of the fusion's (0.002: 0.2 points)",
    ),
    beam_reach: float = typer.Option(
        0.5,
        help="Cascade: retrieval looks weak (beam search runs too) where its candidates hold the gold concept at most "
        "this often",
    ),
    defer: List[str] = typer.Option(
        [],
        "--defer",
        help="Cascade: a costly retriever (dense) that runs only for mentions the fusion's other retrievers do not "
        "settle (an early step with its own threshold, chosen the same way; reranker.early_threshold)",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Fit score fusion on cross-fitted training predictions (--source: the crossfit command's), never on dev; or,
    for a model not trained here (--model: a released checkpoint), on its own predictions over a labelled split it
    was not trained on."""
    setup_logging(verbose)
    from spacy_genbioel.linking.reranking.fusion import GENERATOR
    from spacy_genbioel.training.cascade_fit import CascadeTargets
    from spacy_genbioel.training.model_fit import FitOptions, HeldOutSplit, Packaging, fit_model_fusion, fit_predictions

    if bool(source) == (model is not None):
        raise typer.BadParameter("give --source files (cross-fitted predictions) or --model with --corpus, not both")
    files = {}
    for item in source:
        name, sep, paths = item.partition("=")
        if not sep or not name or not paths:
            raise typer.BadParameter(f"--source {item!r}: expected NAME=FILE[,FILE...]")
        files[name] = [Path(p) for p in paths.split(",") if p]
    from spacy_genbioel.retrieval.registry import resolve_retriever

    names = [n for n in files if n != GENERATOR] if files else [n for n in retrievers.split(",") if n]
    option = "--source" if files else "--retrievers"
    for name in names:
        try:
            resolve_retriever(name)
        except ValueError as err:
            raise typer.BadParameter(f"{option} {name}{'=...' if files else ''}: not a retriever ({err})") from None
    if files:
        folds = {len(paths) for paths in files.values()}
        if len(folds) != 1:
            raise typer.BadParameter(f"every --source needs one file per fold; got {sorted(folds)} files")
        n_folds = folds.pop()
        if len(kb) not in (1, n_folds):
            raise typer.BadParameter(f"--kb: give one KB, or one per fold ({n_folds}); got {len(kb)}")
        if corpus is not None or config is not None or predictions is not None or labels:
            raise typer.BadParameter(
                "--corpus, --labels, --config and --predictions score a --model: not with --source"
            )
    else:
        if corpus is None:
            raise typer.BadParameter("--model needs --corpus: a labelled split the model was not trained on")
        if len(kb) > 1:
            raise typer.BadParameter(f"--model: give one --kb, got {len(kb)}")
        if alternative:
            raise typer.BadParameter(
                "--alternative chooses on folds of --source predictions; with --model name the retrievers "
                "(--retrievers)"
            )
    settings = {}
    for item in retriever_model:
        name, sep, path = item.partition("=")
        if not sep or name not in names:
            raise typer.BadParameter(f"--retriever-model {item!r}: expected NAME=DIR for a {option} name")
        settings[name] = {"model": path}
    choices = [[n for n in item.split(",") if n] for item in alternative]
    if defer and not cascade:
        raise typer.BadParameter("--defer is a step of the cascade: add --cascade")
    for name in defer:
        if name not in names:
            raise typer.BadParameter(f"--defer {name!r}: give a retriever name of {option}")
    for choice in choices:
        unknown = [n for n in choice if n not in names]
        if unknown or not choice:
            raise typer.BadParameter(
                f"--alternative {','.join(choice)!r}: give retriever names of --source ({', '.join(unknown)})"
            )
    try:
        options = FitOptions(
            depth=depth,
            l2=l2,
            generator=generator,
            generator_beams=generator_beams,
            cascade=cascade,
            targets=CascadeTargets(target_precision, beam_reach, max_recall_loss=max_recall_loss),
            defer=tuple(defer),
            retrievers=settings,
            anchor=anchor,
        )
        if files:
            from spacy_genbioel.kb import KnowledgeBase

            fitted = fit_predictions(
                files, [KnowledgeBase.load(path) for path in kb], options, exclude=exclude, alternatives=choices
            )
        else:
            split = HeldOutSplit(corpus, fmt, crosswalk, abbreviations, tuple(labels))
            fitted = fit_model_fusion(
                model,
                split,
                kb=kb[0] if kb else None,
                retrievers=names,
                options=options,
                exclude=exclude,
                packaging=Packaging(config=config, device=device),
                work=predictions,
            )
    except (ValueError, OSError) as err:  # a bad KB, corpus, model or prediction file: the message names it
        msg.fail(f"fit-fusion: {err}")
        raise typer.Exit(1) from None
    if exclude:
        msg.info(
            f"{fitted.dropped} examples dropped: their mention and gold concepts are in {', '.join(map(str, exclude))}"
        )
    if "choice" in fitted.model.fit:
        msg.info(f"Sources chosen on the held-out folds: {', '.join(fitted.sources)} ({fitted.model.fit['choice']})")
    try:
        fitted.model.save(out)
    except OSError as err:
        msg.fail(f"fit-fusion: {out}: cannot write the fusion file ({err.strerror or err})")
        raise typer.Exit(1) from None
    fusion, fit = fitted.model, fitted.model.fit
    msg.good(
        f"Fusion of {', '.join(fitted.sources)} fitted on {fit['reachable']} of {fit['mentions']} mentions -> {out}"
    )
    for name, recall in fit["recall"].items():
        msg.text(f"  {name:10s} {recall}")
    for name, weight in fit["standardized_weights"].items():
        msg.text(f"  weight {name:18s} {weight:+.3f} (standardized)")
    if fusion.cascade:
        c = fusion.cascade
        msg.text(
            f"  cascade: settle at p >= {c['settle_threshold']}, beam below p < {c['beam_threshold']}; {c['report']}"
        )
        if "early" in c:
            msg.text(
                f"  early step: {', '.join(c['early']['defer'])} deferred, settle at p >= {c['early']['threshold']}"
            )


def _named(items: List[str], option: str) -> Dict[str, List[str]]:
    """``NAME=VALUE`` options (repeatable) grouped by name."""
    out: Dict[str, List[str]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise typer.BadParameter(f"{option} {item!r}: expected NAME=VALUE")
        out.setdefault(name, []).append(value)
    return out


@app.command("fit-retrieval")
def fit_retrieval_cmd(
    splits: Optional[Path] = typer.Option(
        None,
        "--splits",
        help="A config of [splits.<name>] blocks (train, format, kb or kb_sources + kb_format, crosswalk, exclude): "
        "configs/retrieval/default.cfg made the package's default",
    ),
    data_dir: Optional[Path] = typer.Option(None, help="With --splits: the data folder its ${paths.data} names"),
    train: List[str] = typer.Option(
        [], "--train", help="NAME=FILE: a training split (one per corpus; never dev or test); instead of --splits"
    ),
    kb: List[str] = typer.Option(
        [], "--kb", help="NAME=KB: the vocabulary's KB (build-kb, no training names or priors) the split links into"
    ),
    fmt: List[str] = typer.Option(
        [], "--format", help="NAME=FORMAT of a split: pubtator (default), bioc, jsonl, askapatient"
    ),
    crosswalk: List[str] = typer.Option(
        [], "--crosswalk", help="NAME=TSV: old -> new IDs of the split's gold (BC5CDR's)"
    ),
    exclude: List[str] = typer.Option(
        [],
        "--exclude",
        help="NAME=FILE (repeatable): a corpus file, in the split's format, whose (mention, gold) pairs are kept out "
        "of the fit (AskAPatient's validation folds)",
    ),
    out: Path = typer.Option(
        ..., help="Retrieval-only fusion JSON to write (package/add_pipe without a model: reranker.fusion)"
    ),
    sources: str = typer.Option(
        "tfidf,dense", help="Retrievers to fuse, comma-separated (the exact-match feature is always there)"
    ),
    defer: str = typer.Option(
        "dense", help="Retrievers that run only where the others are unsure (comma-separated; empty: none)"
    ),
    max_recall_loss: float = typer.Option(
        0.002,
        help="The early step settles as many mentions as keep recall@1 on the fit data within this of the full "
        "fusion's",
    ),
    k: int = typer.Option(2, "--k", help="Folds of each split for the KB + training mentions variant"),
    abbreviations: bool = typer.Option(
        True, help="Expand short forms with scispacy first (as evaluate --abbreviations)"
    ),
    seed: int = typer.Option(0),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Fit the retrieval-only fusion a pipeline without a model links with, on cross-fitted predictions over
    training splits (spacy_genbioel.training.retrieval_fit): the package's default was made by this command."""
    setup_logging(verbose)
    import platform
    from datetime import date

    from spacy_genbioel.training.cascade_fit import CascadeTargets
    from spacy_genbioel.training.retrieval_fit import (
        SplitSpec,
        crossfit_retrieval,
        fit_retrieval_fusion,
        read_fit_corpus,
        read_splits,
    )

    if (splits is None) == (not train):
        raise typer.BadParameter("give --splits FILE, or --train and --kb per corpus")
    if splits is not None:
        specs = read_splits(splits, data_dir)
    else:
        trains, kbs = _named(train, "--train"), _named(kb, "--kb")
        fmts, walks, excluded = _named(fmt, "--format"), _named(crosswalk, "--crosswalk"), _named(exclude, "--exclude")
        if sorted(trains) != sorted(kbs) or any(len(v) != 1 for v in (*trains.values(), *kbs.values())):
            raise typer.BadParameter("give one --train and one --kb per corpus name")
        specs = [
            SplitSpec(
                name,
                trains[name][0],
                (fmts.get(name) or ["pubtator"])[0],
                kb=kbs[name][0],
                crosswalk=(walks.get(name) or [None])[0],
                exclude=tuple(excluded.get(name, ())),
            )
            for name in trains
        ]
    names = [s for s in sources.split(",") if s]
    deferred = [s for s in defer.split(",") if s]
    retrievers: Dict[Any, Any] = {}

    def retrieve(source: str, knowledge_base: Any) -> Any:
        from spacy_genbioel.retrieval.registry import get_retriever

        key = (source, id(knowledge_base))
        if key not in retrievers:
            if any(other != id(knowledge_base) for _, other in retrievers):
                retrievers.clear()  # one KB's retrievers at a time: BC5CDR's MiniLM matrix alone is 600 MB
            retrievers[key] = get_retriever(source, knowledge_base)
        return retrievers[key]

    groups = {}
    for spec in specs:
        corpus = read_fit_corpus(spec, abbreviations=abbreviations)
        msg.info(
            f"{spec.name}: {len(corpus.mentions)} training mentions, {len(corpus.exclude)} pairs excluded, "
            f"{corpus.kb.n_names} KB names"
        )
        for variant, examples in crossfit_retrieval(corpus, names, retrieve, k=k, seed=seed).items():
            groups[f"{spec.name}/{variant}"] = examples
    provenance = {
        "command": "python -m spacy_genbioel fit-retrieval " + " ".join(sys.argv[2:]),
        "date": date.today().isoformat(),
        "machine": platform.platform(),
        "splits": {spec.name: spec.train for spec in specs},
        "excluded": {spec.name: list(spec.exclude) for spec in specs},
        "k": k,
        "seed": seed,
        "abbreviations": abbreviations,
    }
    model = fit_retrieval_fusion(
        groups, names, defer=deferred, targets=CascadeTargets(max_recall_loss=max_recall_loss), provenance=provenance
    )
    model.save(out)
    msg.good(f"Retrieval fusion of {', '.join(names)} fitted on {model.fit['mentions']} mentions -> {out}")
    for group, report in model.fit["groups"].items():
        msg.text(
            f"  {group:18s} "
            + "  ".join(
                f"{s} {r['recall@1']:.4f}/{r['recall@5']:.4f}"
                for s, r in report.items()
                if isinstance(r, dict) and "recall@1" in r
            )
        )
    if "early" in model.cascade:
        c = model.cascade
        msg.text(f"  early step: {', '.join(c['early']['defer'])} deferred, settle at p >= {c['early']['threshold']}")
        for group, report in c["report"].items():
            msg.text(
                f"    {group:18s} {report['early_share']:.4f} settled early, recall@1 {report['recall@1']:.4f} -> "
                f"{report['recall@1_with_early']:.4f}"
            )
