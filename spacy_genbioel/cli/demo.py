"""``demo`` and ``benchmark``: the embedded demo and the decoder speed benchmark
(:mod:`spacy_genbioel.workflows`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from wasabi import msg

from spacy_genbioel.cli._util import app, setup_logging


@app.command("demo")
def demo_cmd(
    out: Path = typer.Option(Path("demo_pipeline"), help="Where to write the demo pipeline"),
    train_steps: int = typer.Option(
        400,
        min=1,
        help="Training steps: the same model on a busy machine as on a quiet one, only slower "
        "(about 2 minutes on 2 quiet cores)",
    ),
    train_seconds: float = typer.Option(600.0, help="Cap on training: seconds of CPU time per thread"),
    seed: int = typer.Option(0),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Train a tiny linker on the embedded demo KB, save it as a spaCy pipeline, and link sample texts."""
    setup_logging(verbose)
    from spacy_genbioel.progress import wanted
    from spacy_genbioel.workflows.demo import run_demo

    text = f"Training a tiny model on the demo KB for {train_steps} steps..."
    if wanted():  # a spinner on a terminal only (GENBIOEL_PROGRESS=0/1 decides), not frames in a log
        with msg.loading(text):
            result = run_demo(out, train_seconds=train_seconds, seed=seed, train_steps=train_steps)
    else:
        msg.info(text)
        result = run_demo(out, train_seconds=train_seconds, seed=seed, train_steps=train_steps)
    msg.good(
        f"Pipeline saved to {result.pipeline_dir} "
        f"(built in {result.train_seconds:.0f}s, {result.train_steps} training steps)"
    )
    msg.table(
        [(m, label, cid, name, f"{score:.3f}") for m, label, cid, name, score in result.rows],
        header=("mention", "label", "concept ID", "name", "score"),
        divider=True,
    )
    msg.info(f"recall@1 against the demo's gold mentions: {result.recall_at_1:.3f} ({result.n_gold} mentions)")


@app.command("benchmark")
def benchmark_cmd(
    data_dir: Optional[Path] = typer.Option(
        None, envvar="GENBIOEL_DATA", help="Shared data folder (MEDIC, NCBI dev, MeSH)"
    ),
    model: Optional[Path] = typer.Option(None, help="Model directory; default: a tiny model trained here briefly"),
    train_seconds: float = typer.Option(180.0, help="Training budget when no model is given"),
    n_mentions: int = typer.Option(300, help="Mentions to link"),
    num_beams: int = typer.Option(5),
    batch_size: int = typer.Option(64),
    device: str = typer.Option("cpu"),
    context_words: str = typer.Option("0,16,64", help="Context windows (words per side) to compare, comma-separated"),
    skip_mesh: bool = typer.Option(False, help="Skip the full-MeSH trie build measurement"),
    pipeline: Optional[Path] = typer.Option(
        None, help="A packaged pipeline (NER + genbioel): also measure annotation throughput per linker input setting"
    ),
    corpus: Optional[Path] = typer.Option(
        None, help="PubTator abstracts for --pipeline (default: BC5CDR train + dev in the data folder)"
    ),
    n_docs: int = typer.Option(1000, help="Abstracts annotated per setting with --pipeline"),
    settings: str = typer.Option(
        "mention-0,mention-16,mention-64,document",
        help="Linker input settings compared with --pipeline: mention-<context words> or document, "
        "+int8 for dtype int8",
    ),
    threads: str = typer.Option("1", help="Torch thread counts for --pipeline, comma-separated"),
    skip_decoders: bool = typer.Option(False, help="Only the --pipeline annotation benchmark"),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object"),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Batched decoder versus the one-at-a-time dict-trie reference, plus the MeSH trie build."""
    setup_logging(verbose)
    from spacy_genbioel.workflows.benchmark import BenchmarkSettings, run_benchmark
    from spacy_genbioel.workflows.benchmark_annotate import parse_settings

    if skip_decoders and pipeline is None:
        msg.fail("--skip-decoders leaves nothing to measure without --pipeline", exits=1)
    try:
        chosen = parse_settings(settings)
    except ValueError as err:
        msg.fail(str(err), exits=1)
    result = run_benchmark(
        BenchmarkSettings(
            data_dir=data_dir,
            model_dir=model,
            train_seconds=train_seconds,
            n_mentions=n_mentions,
            num_beams=num_beams,
            batch_size=batch_size,
            device=device,
            mesh=not skip_mesh,
            context_words=tuple(int(c) for c in context_words.split(",") if c.strip()),
            pipeline=pipeline,
            corpus=corpus,
            n_docs=n_docs,
            input_settings=tuple(chosen),
            threads=tuple(int(t) for t in threads.split(",") if t.strip()),
            decoders=not skip_decoders,
        )
    )
    if json_out:
        print(json.dumps(result))
        return
    annotation = result.pop("annotation", None)
    runs = result.pop("runs", [])
    msg.table(sorted(result.items()), header=("figure", "value"), divider=True)
    if runs:
        msg.table([tuple(r.values()) for r in runs], header=tuple(runs[0]), divider=True)
    if annotation:
        stages = sorted({k for r in annotation["runs"] for k in r["linker_stage_seconds"]})
        msg.table(
            [
                (
                    r["name"],
                    r["threads"],
                    r["docs_per_s"],
                    r["mentions_per_s"],
                    r["searches"],
                    *(r["linker_stage_seconds"].get(k, 0.0) for k in stages),
                )
                for r in annotation["runs"]
            ],
            header=("setting", "threads", "docs/s", "mentions/s", "searches", *stages),
            divider=True,
        )


@app.command("mesh-trie-memory", hidden=True)
def mesh_trie_memory_cmd(data_dir: Path, tokenizer: Path) -> None:
    """Build the full-MeSH trie in this process and print JSON (run in a subprocess by `benchmark`)."""
    setup_logging(False)
    from spacy_genbioel.workflows.benchmark import measure_mesh_trie

    print(json.dumps(measure_mesh_trie(data_dir, tokenizer)))
