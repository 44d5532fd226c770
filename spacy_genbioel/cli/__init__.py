"""Command line: ``python -m spacy_genbioel COMMAND``."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import typer
from wasabi import msg

app = typer.Typer(help="Generative biomedical entity linking for spaCy.", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


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
    _setup_logging(verbose)
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
    _setup_logging(verbose)
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


@app.command("init-model")
def init_model_cmd(
    out: Path = typer.Option(..., help="Output model directory"),
    kb: Optional[Path] = typer.Option(None, help="KB file (.jsonl or target_kb.json) to train a tokenizer on"),
    tokenizer: Optional[Path] = typer.Option(None, help="Use this trained tokenizer directory instead of training one"),
    preset: str = typer.Option("tiny", help="tiny | base | large (from scratch) | minilm (BERT2BERT warm start)"),
    base_model: Optional[Path] = typer.Option(None, help="Warm-start a BERT2BERT from this local BERT-like directory"),
    texts: Optional[Path] = typer.Option(None, help="Extra text for the tokenizer, one document per line"),
    vocab_size: Optional[int] = typer.Option(None, help="Tokenizer vocabulary (default: the preset's)"),
    seed: int = typer.Option(0),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Train a byte-level BPE tokenizer on KB names (+ texts), or take one, and build a from-scratch BART;
    or warm-start a BERT2BERT from pretrained weights (--preset minilm, --base-model DIR)."""
    _setup_logging(verbose)
    from spacy_genbioel.models.bert2bert import is_warm_start

    if base_model is not None or is_warm_start(preset):
        from spacy_genbioel.models.bert2bert import init_warm_start

        source = base_model if base_model is not None else preset
        model, tok = init_warm_start(source, out, tokenizer_dir=tokenizer, seed=seed)
        n_params = sum(p.numel() for p in model.parameters())
        msg.good(f"BERT2BERT from {source} ({n_params / 1e6:.1f}M parameters, vocabulary {len(tok)}) saved to {out}")
        return
    if tokenizer is not None:
        from spacy_genbioel.training.cli_steps import init_model_step

        init_model_step(tokenizer, out, preset=preset, seed=seed)
        msg.good(f"{preset} model with the tokenizer of {tokenizer} saved to {out}")
        return
    if kb is None:
        raise typer.BadParameter("give --kb (to train a tokenizer) or --tokenizer")
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.models.bart import init_model

    knowledge_base = KnowledgeBase.load(kb)
    lines = (line.strip() for line in texts.open(encoding="utf8")) if texts else ()
    model, tokenizer = init_model(preset, knowledge_base.names, out, texts=lines, vocab_size=vocab_size, seed=seed)
    n_params = sum(p.numel() for p in model.parameters())
    msg.good(f"{preset} model ({n_params / 1e6:.1f}M parameters, vocabulary {len(tokenizer)}) saved to {out}")


@app.command("demo")
def demo_cmd(
    out: Path = typer.Option(Path("demo_pipeline"), help="Where to write the demo pipeline"),
    train_seconds: float = typer.Option(120.0, help="CPU training budget"),
    seed: int = typer.Option(0),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Train a tiny linker on the embedded demo KB, save it as a spaCy pipeline, and link sample texts."""
    _setup_logging(verbose)
    from spacy_genbioel.demo import run_demo

    with msg.loading(f"Training a tiny model on the demo KB for {train_seconds:.0f}s..."):
        result = run_demo(out, train_seconds=train_seconds, seed=seed)
    msg.good(f"Pipeline saved to {result.pipeline_dir} (built in {result.train_seconds:.0f}s)")
    msg.table(
        [(m, label, cid, name, f"{score:.3f}") for m, label, cid, name, score in result.rows],
        header=("mention", "label", "concept ID", "name", "score"),
        divider=True,
    )
    msg.info(f"recall@1 against the demo's gold mentions: {result.recall_at_1:.3f} ({result.n_gold} mentions)")


@app.command("benchmark")
def benchmark_cmd(
    data_dir: Optional[Path] = typer.Option(None, envvar="GENBIOEL_DATA", help="Shared data folder (MEDIC, NCBI dev, MeSH)"),
    model: Optional[Path] = typer.Option(None, help="Model directory; default: a tiny model trained here briefly"),
    train_seconds: float = typer.Option(180.0, help="Training budget when no model is given"),
    n_mentions: int = typer.Option(300, help="Mentions to link"),
    num_beams: int = typer.Option(5),
    batch_size: int = typer.Option(64),
    device: str = typer.Option("cpu"),
    context_words: str = typer.Option("0,16,64", help="Context windows (words per side) to compare, comma-separated"),
    skip_mesh: bool = typer.Option(False, help="Skip the full-MeSH trie build measurement"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Batched decoder versus the one-at-a-time dict-trie reference, plus the MeSH trie build."""
    _setup_logging(verbose)
    from spacy_genbioel.benchmark import run_benchmark

    result = run_benchmark(
        data_dir=data_dir, model_dir=model, train_seconds=train_seconds, n_mentions=n_mentions,
        num_beams=num_beams, batch_size=batch_size, device=device, mesh=not skip_mesh,
        context_words=[int(c) for c in context_words.split(",") if c.strip()],
    )
    if json_out:
        print(json.dumps(result))
    else:
        runs = result.pop("runs")
        msg.table(sorted(result.items()), header=("figure", "value"), divider=True)
        msg.table([tuple(r.values()) for r in runs], header=tuple(runs[0]), divider=True)


@app.command("mesh-trie-memory", hidden=True)
def mesh_trie_memory_cmd(data_dir: Path, tokenizer: Path) -> None:
    """Build the full-MeSH trie in this process and print JSON (run in a subprocess by `benchmark`)."""
    _setup_logging(False)
    from spacy_genbioel.benchmark import measure_mesh_trie

    print(json.dumps(measure_mesh_trie(data_dir, tokenizer)))


from spacy_genbioel.training.cli_steps import register_commands  # noqa: E402  (corpus, tokenizer, pretrain, finetune, package)

register_commands(app)

from spacy_genbioel.annotate.runner import register_annotate  # noqa: E402

register_annotate(app)

from spacy_genbioel.ner import register_ner_commands  # noqa: E402

register_ner_commands(app)

from spacy_genbioel.training.angel import register_angel_commands  # noqa: E402

register_angel_commands(app)

from spacy_genbioel.training.sapbert import register_dense_commands  # noqa: E402  (train-dense)

register_dense_commands(app)


def main(argv: Optional[List[str]] = None) -> None:
    app(args=argv)


if __name__ == "__main__":
    main()
