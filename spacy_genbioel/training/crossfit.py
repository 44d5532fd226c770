"""Cross-fitting: score fusion fitted on held-out training predictions, never on dev.

:func:`crossfit_stage` (``crossfit``): the training split in ``k`` folds of whole documents. ``train``: per
fold (side by side, each fold's output in ``OUT/train-fold-<i>.log``) a KB with the fold's concept priors, its
corpus, a generator fine-tuned from the pre-trained checkpoint for a time budget and optionally a ResCNN.
``score``: the fold pipeline without entity ruler; held-out predictions of the generator (at ``beams``),
TF-IDF, MiniLM, the fold ResCNN and the generator's forced scores of the retrievers' candidates. ``fit``:
``fit-fusion --cascade --defer dense`` per KB variant (``fusion_<variant>.json``; always refitted), then the
cascade on the forced scores of the retrievers it chose (``cascade_<variant>.json``).
:func:`given_folds_stage` (``crossfit-folds``): a corpus given in folds (AskAPatient's ten): one pre-training
shared by the folds (``prepare``), per fold every linker on its validation split (``folds``), then per fold a
fusion and the cascade fitted on the *other* folds' predictions minus this fold's mention/concept pairs.

Every step is a :class:`Step` (the words after ``python -m spacy_genbioel``), skipped when its output exists
(rerun after a crash to finish), run by a *runner*: :func:`run_subprocess`, or the caller's (the CLI runs
sequential steps in its own process; tests record them)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, Optional, Sequence, Tuple

VARIANTS = ("plain", "aug")  # the fold KBs: the vocabulary with the fold's priors; + the fold's training mentions
CROSSFIT_STAGES = ("train", "score", "fit")
FOLDS_STAGES = ("prepare", "folds", "fusion", "cascade")
DEFER = ("--cascade", "--defer", "dense")  # MiniLM, the costly retriever, runs only where the others do not settle


class StepError(RuntimeError):
    """A step's command failed."""


@dataclass(frozen=True)
class Step:
    """One command: ``argv`` after ``python -m spacy_genbioel`` (``script``: after ``python``, a
    script of the checkout); skipped when ``done_when`` exists (``None``: always run)."""

    argv: Tuple[str, ...]
    done_when: Optional[Path] = None
    script: bool = False

    @property
    def done(self) -> bool:
        return self.done_when is not None and self.done_when.exists()

    @property
    def command(self) -> Tuple[str, ...]:
        return (*(() if self.script else ("-m", "spacy_genbioel")), *self.argv)

    def __str__(self) -> str:
        return shlex.join(("python", *self.command))


def step(*words: object, done_when: Optional[Path] = None, script: bool = False) -> Step:
    return Step(tuple(str(w) for w in words), done_when, script)


Runner = Callable[[Step, Optional[Path]], None]


def run_subprocess(job: Step, log: Optional[Path] = None) -> None:
    """Run ``job`` in a new interpreter (``OMP_NUM_THREADS`` 1 unless set); its output to ``log`` when given."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if log is None:
        code = subprocess.run([sys.executable, *job.command], env=env).returncode
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf8") as out:
            out.write(f"$ {job}\n")
            out.flush()
            code = subprocess.run(
                [sys.executable, *job.command], env=env, stdout=out, stderr=subprocess.STDOUT
            ).returncode
    if code:
        raise StepError(f"`{job}` failed (exit {code})" + (f": see {log}" if log else ""))


def run_steps(steps: Iterable[Step], runner: Runner = run_subprocess, log: Optional[Path] = None) -> int:
    """Run the steps not done yet, in order (``steps`` may be a generator that reads what earlier ones wrote);
    how many ran."""
    ran = 0
    for job in steps:
        if not job.done:  # read as each step is reached: after the ones before it ran
            runner(job, log)
            ran += 1
    return ran


def run_parallel(plans: Dict[int, Iterable[Step]], runner: Runner, jobs: int, log_of: Callable[[int], Path]) -> None:
    """Each fold's steps in order, ``jobs`` folds at a time, each fold's output in ``log_of(fold)``; every
    fold runs to its end or its first failure before a failure is raised."""
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(plans)))) as pool:
        futures = {i: pool.submit(run_steps, plan, runner, log_of(i)) for i, plan in plans.items()}
    failed = [f"fold {i}: {future.exception()}" for i, future in futures.items() if future.exception() is not None]
    if failed:
        raise StepError("; ".join(failed))


def _files(paths: Iterable[Path]) -> str:
    return ",".join(str(p) for p in paths)


def _flag(name: str, on: bool) -> str:
    return f"--{name}" if on else f"--no-{name}"


def _evaluate(path: Path, *words: object, done: str = ".jsonl") -> Step:
    """``evaluate`` writing its report to ``path``.json and the predictions to ``path``.jsonl."""
    json_path, predictions = path.with_suffix(".json"), path.with_suffix(".jsonl")
    return step("evaluate", *words, "--json", json_path, "--predictions", predictions, done_when=path.with_suffix(done))


def _check(what: str, *checks: Tuple[bool, str]) -> None:
    problems = [text for bad, text in checks if bad]
    if problems:
        raise ValueError(f"{what}: " + "; ".join(problems))


# -- crossfit: folds of a training split (NCBI-disease, BC5CDR) -------------------------------------------------------
@dataclass(frozen=True)
class CorpusInputs:
    """A corpus's inputs, ``{data}`` standing for the data folder: training split, KB sources (``FORMAT:PATH``
    for another format), KB format, crosswalk of old -> new IDs, and train-rescnn's refresh pool."""

    train: str
    kb_sources: Tuple[str, ...]
    kb_format: str
    crosswalk: Optional[str] = None
    refresh_pool: int = 0


#: the defaults of the corpora the repository has vars for (project.yml's own: ncbi; configs/corpora/bc5cdr.vars);
#: any other corpus names its inputs (CrossfitSettings.train, kb_sources, kb_format, crosswalk)
CORPORA = {
    "ncbi": CorpusInputs("{data}/ncbi_disease/NCBItrainset_corpus.txt", ("{data}/vocab/medic_06Jul2012.txt",), "medic"),
    "bc5cdr": CorpusInputs(
        "{data}/bc5cdr/CDR_TrainingSet.PubTator.txt",
        (
            "{data}/vocab/CTD_diseases_2017.tsv.gz",
            "mesh-tsv:{data}/vocab/mesh/mesh_id_label_mappings.tsv",
            "mesh-tsv:{data}/vocab/mesh/mesh_supp_id_label_mappings.tsv",
        ),
        "ctd",
        crosswalk="{data}/vocab/bc5cdr_legacy_id_crosswalk.tsv",
        refresh_pool=50,
    ),  # 788k names
}


@dataclass(frozen=True)
class CrossfitSettings:
    """What ``crossfit`` reads and writes; ``None`` fields take the defaults below (the corpus's inputs from
    :data:`CORPORA`, paths from corpus and preset)."""

    corpus: str = "ncbi"
    data_dir: Path = Path("../shared/data")
    preset: str = "tiny"
    k: int = 2
    seconds: int = 1200  # each fold generator's fine-tuning budget (the final model's)
    rescnn_seconds: int = 0  # a ResCNN per fold for this long (0: none; score and fit use fold ResCNNs once there)
    # the final model's ANGEL stage, run on each fold generator after fine-tuning with this config, so that
    # the fusion and cascade are fitted on the generator the pipeline links with (None: fine-tuning alone)
    angel_config: Optional[Path] = None
    beams: Optional[int] = None  # the fold generators' beam width and top-k (None: the model config's)
    variants: Tuple[str, ...] = VARIANTS
    forced: bool = True  # the forced-score rows and cascade_<variant>.json (the packages' cascade needs neither)
    # fit: the L2 penalty centred on this fusion's weights (a file or ``genbioel:retrieval``; None: on zero), and
    # its strength (None: fit-fusion's); fit-fusion --anchor, --l2
    anchor: Optional[str] = None
    l2: Optional[float] = None
    out: Optional[Path] = None  # training/<corpus>/<preset>/crossfit
    pretrained: Optional[Path] = None  # training/<corpus>/<preset>/pretrain/model
    config: Optional[Path] = None  # configs/finetune_<preset>.cfg
    rescnn_config: Path = Path("configs/rescnn.cfg")
    rescnn_model: Optional[Path] = None  # the ResCNN the fitted fusion links with: training/<corpus>/rescnn/model
    train: Optional[Path] = None
    dev: Optional[Path] = None  # the fold generators' dev examples: corpus/<corpus>/dev.jsonl
    # the fold generators' dev evaluations read the first N dev mentions (0: all): they only report, and all of
    # BC5CDR's 9,591 take about 9 CPU minutes per evaluation
    eval_mentions: int = 300
    kb_sources: Tuple[str, ...] = ()
    kb_format: Optional[str] = None
    crosswalk: Optional[Path] = None
    refresh_pool: Optional[int] = None
    abbreviations: bool = True
    folds: Tuple[int, ...] = ()  # train and score these folds only (one process per core side by side); () all
    jobs: int = 0  # folds trained side by side (0: all)
    device: str = "cpu"

    def __post_init__(self) -> None:
        inputs = CORPORA.get(self.corpus)
        if inputs is None and not (self.train and self.kb_sources and self.kb_format):
            raise ValueError(
                f"unknown corpus {self.corpus!r} ({' | '.join(CORPORA)}): give its training split, "
                "KB sources and KB format"
            )
        data = str(self.data_dir)
        base = Path("training") / self.corpus / self.preset
        defaults = {
            "out": base / "crossfit",
            "pretrained": base / "pretrain" / "model",
            "config": Path(f"configs/finetune_{self.preset}.cfg"),
            "rescnn_model": Path("training") / self.corpus / "rescnn" / "model",
            "dev": Path("corpus") / self.corpus / "dev.jsonl",
            "refresh_pool": inputs.refresh_pool if inputs else 0,
        }
        if inputs is not None:
            defaults.update(
                train=Path(inputs.train.format(data=data)),
                kb_format=inputs.kb_format,
                kb_sources=tuple(s.format(data=data) for s in inputs.kb_sources),
                crosswalk=Path(inputs.crosswalk.format(data=data)) if inputs.crosswalk else None,
            )
        for name, value in defaults.items():
            if getattr(self, name) in (None, ()):
                object.__setattr__(self, name, value)
        _check(
            "crossfit",
            (self.k < 2, f"k {self.k}: at least 2 folds"),
            (self.seconds < 0 or self.rescnn_seconds < 0, "negative seconds"),
            (self.eval_mentions < 0, "negative --eval-mentions"),
            (self.beams is not None and self.beams < 1, f"beams {self.beams}: at least 1"),
            (
                not self.variants
                or not set(self.variants) <= set(VARIANTS)
                or len(set(self.variants)) < len(self.variants),
                f"variants {' '.join(self.variants)}: some of {' '.join(VARIANTS)}, each once",
            ),
            (any(not 0 <= i < self.k for i in self.folds), f"folds {list(self.folds)}: each in 0..{self.k - 1}"),
            (self.jobs < 0, f"jobs {self.jobs}: 0 (every fold at once) or more"),
            (self.l2 is not None and not self.l2 > 0, f"l2 {self.l2}: above 0"),
        )

    @property
    def fold_indices(self) -> Tuple[int, ...]:
        return self.folds or tuple(range(self.k))

    @property
    def generator_row(self) -> str:
        """The generator's held-out files: ``genbioel``, or ``genbioel_b<N>`` at ``beams``."""
        return "genbioel" if self.beams is None else f"genbioel_b{self.beams}"

    def fold_dir(self, i: int) -> Path:
        return self.out / "folds" / f"fold-{i}"

    def model_dir(self, i: int) -> Path:
        return self.out / "models" / f"fold-{i}"

    def generator_dir(self, i: int) -> Path:
        """Fold ``i``'s generator folder (``model``, ``config.cfg``): the ANGEL stage's when it runs."""
        return self.model_dir(i) / "angel" if self.angel_config else self.model_dir(i)

    def rescnn_on(self) -> bool:
        """The ResCNN is a source: fold ResCNNs are being trained, or were."""
        return self.rescnn_seconds != 0 or (self.model_dir(0) / "rescnn" / "model").is_dir()

    def walk(self) -> Tuple[str, ...]:
        return ("--crosswalk", str(self.crosswalk)) if self.crosswalk else ()

    def penalty(self) -> Tuple[str, ...]:
        return fit_penalty(self.anchor, self.l2)


def fit_penalty(anchor: Optional[str], l2: Optional[float]) -> Tuple[str, ...]:
    """fit-fusion's options for the fits' L2 penalty (``--anchor``, ``--l2``), where set."""
    return (*(("--anchor", anchor) if anchor else ()), *(("--l2", l2) if l2 is not None else ()))


def retriever_sets(rescnn: bool) -> Tuple[str, ...]:
    """The retriever sets a fusion may read (``+``-joined)."""
    return ("tfidf+dense", "tfidf+rescnn", "tfidf+dense+rescnn") if rescnn else ("tfidf+dense",)


def forced_row(retrievers: str) -> str:
    """The row of the generator's forced scores over the candidates of a retriever set."""
    return "forced" if retrievers == "tfidf+dense" else "forced_" + retrievers.replace("+", "_")


def _build_fold_kb(s: CrossfitSettings, *words: object) -> Tuple[object, ...]:
    return ("build-kb", *s.kb_sources, "--format", s.kb_format, *s.walk(), "--no-dedup", *words)


def folds_step(s: CrossfitSettings) -> Step:
    return step("folds", s.train, "--out", s.out / "folds", "--k", s.k, done_when=s.out / "folds" / "folds.json")


def fold_train_steps(s: CrossfitSettings, i: int) -> Iterator[Step]:
    """A fold's KB (concept priors from its own training documents only), corpus, generator and ResCNN."""
    fold, models = s.fold_dir(i), s.model_dir(i)
    kb, train = fold / "kb_plain.jsonl", fold / "corpus" / "train.jsonl"
    yield step(*_build_fold_kb(s, "--prior-pubtator", fold / "train.txt", "--out", kb), done_when=kb)
    yield step(
        "corpus",
        "--train",
        fold / "train.txt",
        "--dev",
        fold / "heldout.txt",
        "--kb",
        kb,
        "--out",
        fold / "corpus",
        *s.walk(),
        _flag("abbreviations", s.abbreviations),
        done_when=train,
    )
    # fine-tuning, then (angel_config) the final model's ANGEL stage: the same data, device and seed
    stage = ("--train", train, "--dev", s.dev, "--kb", kb, "--device", s.device, "--training.seed", i)
    stage += ("--data.eval_mentions", s.eval_mentions)
    yield step(
        "finetune",
        *("--model", s.pretrained, "--config", s.config, "--out", models, *stage),
        *("--training.max_seconds", s.seconds),
        done_when=models / "result.json",
    )
    if s.angel_config:
        yield step(
            "angel",
            *("--model", models / "model", "--config", s.angel_config, "--out", models / "angel", *stage),
            done_when=models / "angel" / "result.json",
        )
    if s.rescnn_seconds:
        yield step(
            "train-rescnn",
            "--kb",
            kb,
            "--train",
            train,
            "--config",
            s.rescnn_config,
            "--out",
            models / "rescnn",
            "--training.max_seconds",
            s.rescnn_seconds,
            "--training.seed",
            i,
            "--data.refresh_pool",
            s.refresh_pool,
            done_when=models / "rescnn" / "model",
        )


def fold_score_steps(s: CrossfitSettings, i: int) -> Iterator[Step]:
    """A fold's pipelines and held-out predictions (``OUT/fold-<i>/<variant>_<row>.jsonl``)."""
    fold, models, rows = s.fold_dir(i), s.model_dir(i), s.out / f"fold-{i}"
    train = fold / "train.txt"
    yield step(
        *_build_fold_kb(s, "--prior-pubtator", train, "--augment-pubtator", train, "--out", fold / "kb_aug.jsonl"),
        done_when=fold / "kb_aug.jsonl",
    )
    rescnn, model = s.rescnn_on(), models / "rescnn" / "model"
    width = ("--decoding.num_beams", s.beams, "--decoding.top_k", s.beams) if s.beams is not None else ()
    for variant in s.variants:
        kb, pipeline = fold / f"kb_{variant}.jsonl", models / f"pipeline_{variant}"
        # scored on gold mentions: no NER, and no ruler over 788k names to build
        yield step(
            "package",
            "--model",
            s.generator_dir(i) / "model",
            "--kb",
            kb,
            "--config",
            s.generator_dir(i) / "config.cfg",
            "--out",
            pipeline,
            "--no-entity-ruler",
            done_when=pipeline,
        )
        rows.mkdir(parents=True, exist_ok=True)
        evaluate = ("--corpus", fold / "heldout.txt", *s.walk(), _flag("abbreviations", s.abbreviations))
        generator = ("--linker", "genbioel", "--pipeline", pipeline, "--device", s.device)

        def row(name: str, *words: object, variant: str = variant, evaluate: Tuple[object, ...] = evaluate) -> Step:
            return _evaluate(rows / f"{variant}_{name}", *evaluate, *words)

        yield row(
            s.generator_row, *generator, "--candidates.retriever", "none", "--decoding.exact_match", "false", *width
        )
        yield row("tfidf", "--linker", "tfidf", "--kb", kb)
        yield row("dense", "--linker", "dense", "--kb", kb)
        if rescnn:
            yield row("rescnn", "--linker", "rescnn", "--kb", kb, "--model", model)
        for retrievers in retriever_sets(rescnn) if s.forced else ():  # what the forced-score cascade reads
            yield row(
                forced_row(retrievers),
                *generator,
                "--decoding.search",
                "forced",
                "--candidates.retriever",
                retrievers,
                "--candidates.model",
                f"rescnn={model}",
                "--candidates.num_candidates",
                5,
                "--decoding.exact_match",
                "false",
            )


def fit_steps(s: CrossfitSettings) -> Iterator[Step]:
    """Per variant the packages' fusion with the cascade's retrieval-only weights and thresholds, then (``forced``)
    the cascade judged by forced scores of the chosen retrievers' candidates."""
    rescnn = s.rescnn_on()
    for variant in s.variants:

        def files(row: str, variant: str = variant) -> str:
            return _files(s.out / f"fold-{i}" / f"{variant}_{row}.jsonl" for i in range(s.k))

        kbs = [w for i in range(s.k) for w in ("--kb", s.fold_dir(i) / f"kb_{variant}.jsonl")]
        retrievers = [
            w
            for name in ("tfidf", "dense", *(("rescnn",) if rescnn else ()))
            for w in ("--source", f"{name}={files(name)}")
        ]
        choose = []
        if rescnn:
            retrievers += ["--retriever-model", f"rescnn={s.rescnn_model}"]
            choose = [w for sources in retriever_sets(True) for w in ("--alternative", sources.replace("+", ","))]
        fusion = s.out / f"fusion_{variant}.json"
        width = ("--generator-beams", s.beams) if s.beams is not None else ()
        yield step(
            "fit-fusion",
            "--source",
            f"genbioel={files(s.generator_row)}",
            *retrievers,
            *kbs,
            *choose,
            *width,
            *DEFER,
            *s.penalty(),
            "--out",
            fusion,
        )
        if s.forced:
            chosen = "+".join(json.loads(fusion.read_text(encoding="utf8"))["sources"][1:])
            yield step(
                "fit-fusion",
                "--source",
                f"genbioel={files(forced_row(chosen))}",
                *retrievers,
                *kbs,
                "--alternative",
                chosen.replace("+", ","),
                "--generator",
                "forced",
                *DEFER,
                *s.penalty(),
                "--out",
                s.out / f"cascade_{variant}.json",
            )


def _stages(stage: str, known: Sequence[str]) -> Sequence[str]:
    if stage == "all":
        return known
    if stage not in known:
        raise ValueError(f"unknown stage {stage!r} ({' | '.join(known)} | all)")
    return (stage,)


def crossfit_stage(settings: CrossfitSettings, stage: str, runner: Runner = run_subprocess) -> None:
    """Run ``stage`` (train | score | fit | all) of cross-fitting; the folds are cut first if they are not yet."""
    s, stages = settings, _stages(stage, CROSSFIT_STAGES)
    s.out.mkdir(parents=True, exist_ok=True)
    run_steps([folds_step(s)], runner)
    for name in stages:
        if name == "train":
            run_parallel(
                {i: fold_train_steps(s, i) for i in s.fold_indices},
                runner,
                s.jobs or s.k,
                lambda i: s.out / f"train-fold-{i}.log",
            )
        elif name == "score":
            for i in s.fold_indices:
                run_steps(fold_score_steps(s, i), runner)
        else:
            run_steps(fit_steps(s), runner)


# -- crossfit-folds: a corpus given in folds (AskAPatient) ------------------------------------------------------------
@dataclass(frozen=True)
class FoldsSettings:
    """What ``crossfit-folds`` reads and writes. Step budgets, so that folds trained side by side get the same
    training whatever else runs; the seconds are a cap."""

    data_dir: Path = Path("../shared/data")
    out: Path = Path("training/aap/tiny")
    folds: Tuple[int, ...] = tuple(range(10))  # the folds this run trains, fits and scores
    folds_fit: Tuple[int, ...] = tuple(range(10))  # the folds whose predictions fit each fold's fusion (all, always)
    jobs: int = 2  # folds trained side by side
    pretrain_steps: int = 1500
    pretrain_seconds: int = 900
    finetune_steps: int = 1500
    finetune_seconds: int = 1800
    rescnn_seconds: int = 1200
    seed: int = 0
    preset: str = "tiny"
    kb_source: str = "{data}/askapatient/askapatient.json"
    kb_format: str = "askapatient"
    splits: str = "{data}/askapatient/AskAPatient.fold-{fold}.{split}.txt"  # split: train | validation
    corpus_format: str = "askapatient"
    metrics: Path = Path("metrics")  # where `cascade` writes its benches
    report_prefix: str = "cascade_aap"  # METRICS/<prefix>_fold<k>_<kb>[_loss].json
    max_recall_loss: Optional[float] = 0.002  # also fit and bench a cascade for this recall budget (None: no)
    extra_rows: Tuple[str, ...] = ()  # more bench rows (cascade_grouped_loss, ...)
    cascade_bench: Path = Path("bench/cascade.py")
    device: str = "cpu"
    rescnn_config: Path = Path("configs/rescnn.cfg")
    # fusion and cascade: the fits' L2 penalty centred on this fusion (``genbioel:retrieval``; None: on zero) and its
    # strength (None: fit-fusion's), as crossfit's
    anchor: Optional[str] = None
    l2: Optional[float] = None

    def __post_init__(self) -> None:
        _check(
            "crossfit-folds",
            (not self.folds, "no folds"),
            (self.jobs < 1, f"jobs {self.jobs}: at least 1"),
            (len(self.folds_fit) < 2, "a fusion needs the predictions of two folds at least (folds_fit)"),
            (self.max_recall_loss is not None and self.max_recall_loss < 0, "max_recall_loss below 0"),
            (self.l2 is not None and not self.l2 > 0, f"l2 {self.l2}: above 0"),
        )

    def fold_dir(self, i: int) -> Path:
        return self.out / "folds" / f"fold-{i}"

    def split(self, i: int, split: str) -> Path:
        return Path(self.splits.format(data=self.data_dir, fold=i, split=split))

    def source(self) -> str:
        return self.kb_source.format(data=self.data_dir)


def prepare_steps(s: FoldsSettings) -> Iterator[Step]:
    """The KB, a tokenizer on its names only (no fold's mentions), the model and its KB-guided pre-training."""
    kb, tokenizer, init, pretrain = s.out / "kb.jsonl", s.out / "tokenizer", s.out / "init", s.out / "pretrain"
    yield step("build-kb", s.source(), "--format", s.kb_format, "--no-dedup", "--out", kb, done_when=kb)
    yield step(
        "tokenizer", "--kb", kb, "--preset", s.preset, "--out", tokenizer, done_when=tokenizer / "tokenizer.json"
    )
    yield step(
        "init-model", "--tokenizer", tokenizer, "--preset", s.preset, "--seed", s.seed, "--out", init, done_when=init
    )
    yield step(
        "pretrain",
        "--model",
        init,
        "--kb",
        kb,
        "--config",
        f"configs/pretrain_{s.preset}.cfg",
        "--out",
        pretrain,
        "--device",
        s.device,
        "--training.max_steps",
        s.pretrain_steps,
        "--training.max_seconds",
        s.pretrain_seconds,
        "--training.seed",
        s.seed,
        "--training.eval_every",
        100000,
        done_when=pretrain / "result.json",
    )


def fold_steps(s: FoldsSettings, i: int) -> Iterator[Step]:
    """A fold's KBs, corpus, generator and ResCNN; every linker on its validation split (``<variant>_<row>.json``)."""
    fold, train, valid = s.fold_dir(i), s.split(i, "train"), s.split(i, "validation")
    fold.mkdir(parents=True, exist_ok=True)
    kb, examples = fold / "kb_plain.jsonl", fold / "corpus" / "train.jsonl"
    build = ("build-kb", s.source(), "--format", s.kb_format, "--no-dedup", "--prior-pubtator", train)
    yield step(*build, "--mentions-format", s.corpus_format, "--out", kb, done_when=kb)
    yield step(
        *build,
        "--augment-pubtator",
        train,
        "--mentions-format",
        s.corpus_format,
        "--out",
        fold / "kb_aug.jsonl",
        done_when=fold / "kb_aug.jsonl",
    )
    yield step(
        "corpus",
        "--format",
        s.corpus_format,
        "--train",
        train,
        "--dev",
        valid,
        "--kb",
        kb,
        "--out",
        fold / "corpus",
        done_when=examples,
    )
    yield step(
        "finetune",
        "--model",
        s.out / "pretrain" / "model",
        "--train",
        examples,
        "--dev",
        fold / "corpus" / "dev.jsonl",
        "--kb",
        kb,
        "--config",
        f"configs/finetune_{s.preset}.cfg",
        "--out",
        fold / "finetune",
        "--device",
        s.device,
        "--training.max_steps",
        s.finetune_steps,
        "--training.max_seconds",
        s.finetune_seconds,
        "--training.seed",
        s.seed,
        "--training.eval_every",
        100000,
        done_when=fold / "finetune" / "result.json",
    )
    yield step(
        "train-rescnn",
        "--kb",
        kb,
        "--train",
        examples,
        "--config",
        s.rescnn_config,
        "--out",
        fold / "rescnn",
        "--no-index",
        "--training.max_seconds",
        s.rescnn_seconds,
        "--training.seed",
        s.seed,
        "--training.progress",
        "false",
        done_when=fold / "rescnn" / "result.json",
    )
    for variant in VARIANTS:
        kb, pipeline = fold / f"kb_{variant}.jsonl", fold / f"pipeline_{variant}"
        yield step(
            "package",
            "--model",
            fold / "finetune" / "model",
            "--kb",
            kb,
            "--config",
            fold / "finetune" / "config.cfg",
            "--out",
            pipeline,
            "--no-entity-ruler",
            "--no-abbreviations",
            done_when=pipeline,
        )
        generator = (
            "--linker",
            "genbioel",
            "--pipeline",
            pipeline,
            "--device",
            s.device,
            "--candidates.retriever",
            "none",
            "--decoding.exact_match",
            "false",
        )
        for name, words in (
            ("exact", ("--linker", "exact", "--kb", kb)),
            ("tfidf", ("--linker", "tfidf", "--kb", kb)),
            ("dense", ("--linker", "dense", "--kb", kb)),
            ("rescnn", ("--linker", "rescnn", "--kb", kb, "--model", fold / "rescnn" / "model")),
            ("genbioel", generator),  # and the 2-beam lists the cascade's fusion is fitted on
            ("genbioel_b2", (*generator, "--decoding.num_beams", 2, "--decoding.top_k", 2)),
        ):
            yield _evaluate(
                fold / f"{variant}_{name}", "--corpus", valid, "--format", s.corpus_format, *words, done=".json"
            )


def _others(s: FoldsSettings, i: int, variant: str, row: str) -> Tuple[str, Tuple[str, ...]]:
    """The other fitting folds' ``row`` files (comma-joined) and their KBs (``--kb`` options)."""
    others = [j for j in s.folds_fit if j != i]
    kbs = tuple(w for j in others for w in ("--kb", str(s.fold_dir(j) / f"kb_{variant}.jsonl")))
    return _files(s.fold_dir(j) / f"{variant}_{row}.jsonl" for j in others), kbs


def fusion_steps(s: FoldsSettings, i: int) -> Iterator[Step]:
    """A fold's fusion, fitted on the other folds' validation predictions minus this fold's pairs,
    evaluated on the fold."""
    fold = s.fold_dir(i)
    for variant in VARIANTS:
        fusion = fold / f"fusion_{variant}.json"
        sources = [
            w for row in ("genbioel", "tfidf", "dense") for w in ("--source", f"{row}={_others(s, i, variant, row)[0]}")
        ]
        yield step(
            "fit-fusion",
            *sources,
            *_others(s, i, variant, "genbioel")[1],
            "--exclude",
            fold / f"{variant}_genbioel.jsonl",
            *fit_penalty(s.anchor, s.l2),
            "--out",
            fusion,
            done_when=fusion,
        )
        yield _evaluate(
            fold / f"{variant}_fusion",
            "--corpus",
            s.split(i, "validation"),
            "--format",
            s.corpus_format,
            "--device",
            s.device,
            "--linker",
            "genbioel",
            "--pipeline",
            fold / f"pipeline_{variant}",
            "--candidates.retriever",
            "none",
            "--decoding.exact_match",
            "false",
            "--fusion",
            fusion,
            done=".json",
        )


def cascade_steps(s: FoldsSettings, i: int) -> Iterator[Step]:
    """A fold's cascade over the generator's 2-beam lists and the retrievers the other folds prefer,
    fitted as the fusion (and, with ``max_recall_loss``, one for that recall budget),
    benched on the fold beside generator and fusion."""
    fold = s.fold_dir(i)
    for variant in VARIANTS:
        generator, kbs = _others(s, i, variant, "genbioel_b2")
        sources = [
            "--source",
            f"genbioel={generator}",
            *(
                w
                for row in ("tfidf", "dense", "rescnn")
                for w in ("--source", f"{row}={_others(s, i, variant, row)[0]}")
            ),
        ]

        def fit(
            out: Path,
            *words: object,
            sources: Sequence[str] = sources,
            kbs: Tuple[str, ...] = kbs,
            variant: str = variant,
        ) -> Step:
            return step(
                "fit-fusion",
                *sources,
                *kbs,
                "--retriever-model",
                f"rescnn={fold / 'rescnn' / 'model'}",
                "--alternative",
                "tfidf,dense",
                "--alternative",
                "tfidf,rescnn",
                "--alternative",
                "tfidf,dense,rescnn",
                "--generator-beams",
                2,
                *DEFER,
                "--exclude",
                fold / f"{variant}_genbioel.jsonl",
                *fit_penalty(s.anchor, s.l2),
                *words,
                "--out",
                out,
                done_when=out,
            )

        cascade = fold / f"beamcascade_b2_{variant}.json"
        yield fit(cascade)
        bench = (
            s.cascade_bench,
            "--pipeline",
            fold / f"pipeline_{variant}",
            "--corpus",
            s.split(i, "validation"),
            "--format",
            s.corpus_format,
            "--no-abbreviations",
            "--fusion",
            fold / f"fusion_{variant}.json",
            "--cascade",
            cascade,
            "--variant",
            f"b2={cascade},{cascade},2",
        )
        rows = ("generator", "fusion", "fusion_b2", "cascade_b2", "cascade_int8_b2")
        report, tag = s.metrics / f"{s.report_prefix}_fold{i}_{variant}.json", ()
        if (
            s.max_recall_loss is not None
        ):  # as many settled mentions as keep the cross-fitted recall@1 within the budget
            budget = fold / f"beamcascade_b2_{variant}_loss.json"
            yield fit(budget, "--max-recall-loss", s.max_recall_loss)
            rows = ("generator", "fusion", "cascade_b2", "cascade_loss", "cascade_int8_loss")
            report, tag = report.with_name(report.stem + "_loss.json"), ("--variant", f"loss={budget},{budget},2")
        if not report.exists() and not s.cascade_bench.is_file():
            raise FileNotFoundError(
                f"{s.cascade_bench}: the cascade stage benches each fold with bench/cascade.py of a "
                "repository checkout (run it from the checkout, or give its path)"
            )
        yield step(
            *bench, *tag, "--rows", ",".join((*rows, *s.extra_rows)), "--out", report, done_when=report, script=True
        )


def given_folds_stage(settings: FoldsSettings, stage: str, runner: Runner = run_subprocess) -> None:
    """Run ``stage`` (prepare | folds | fusion | cascade | all) over a corpus given in folds."""
    s = settings
    for name in _stages(stage, FOLDS_STAGES):
        if name == "prepare":
            s.out.mkdir(parents=True, exist_ok=True)
            run_steps(prepare_steps(s), runner)
        elif name == "folds":
            run_parallel({i: fold_steps(s, i) for i in s.folds}, runner, s.jobs, lambda i: s.out / f"fold-{i}.log")
        else:
            for i in s.folds:
                run_steps((fusion_steps if name == "fusion" else cascade_steps)(s, i), runner)
