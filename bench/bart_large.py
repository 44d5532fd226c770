"""A BART-large linker on CPU: load time, trie build and linking speed and memory, in one run
(issue 27, item 4).

    python bench/bart_large.py --work /tmp/bart_large --json metrics/bart_large.json     # the full run
    python bench/bart_large.py --mentions 20 --routes component --dtypes int8 --threads 2 # a smoke run (3 min)

At the defaults (24 mentions; component and annotate x fp32 and int8 x 1 and 2
threads: 8 configurations, each loading the pipeline anew) a run takes about 10
minutes on a quiet 2-core EPYC and up to about 20 on a busy one: the set-up
(KBs, a 50k BPE, the model, the pipeline, both tries) about 2.5 minutes, each
``spacy.load`` about 15 s, and linking from about 0.2-0.45 mentions/s (fp32, one
thread) to about 1 (int8, two threads). ``annotate`` links what its entity ruler
finds in the dev documents that hold the first 24 gold mentions (5 documents,
39 mentions). ``--mentions 200`` and more are for a quiet machine and an hour.

The model has random weights of ``facebook/bart-large``'s shape (the ``large``
preset: 12+12 layers, d_model 1024, about 406M parameters with a 50,265-token
vocabulary): the weights matter to speed only through the names the beams follow
(each run records their mean length in tokens and the seconds per stage). Nothing is
downloaded: the data come from ``--data-dir`` (default ``$GENBIOEL_DATA``, else
``../shared/data`` beside the repository). Every step runs in its own process, so
its peak RSS (``ru_maxrss`` of that process, read with ``os.wait4``) is its own:

1. ``kb``: the MEDIC 2012 KB (NCBI-disease's) and the CTD + MeSH descriptor +
   supplementary KB with the legacy-ID crosswalk (BC5CDR's, as
   ``configs/corpora/bc5cdr.vars`` builds it), with ``kb.build.build_kb``, no de-duplication;
2. ``model``: a byte-level BPE tokenizer trained on the names of both KBs and the
   NCBI-disease and BC5CDR training texts (``--vocab-size``, default the preset's
   50,265; a shorter vocabulary leaves the embeddings at that size), and the model,
   saved as safetensors;
3. ``package``: a pipeline over the MEDIC KB (``training.package.package``:
   abbreviation detector when scispacy is there, an entity ruler over the KB
   names, ``genbioel``);
4. ``trie``: the name trie over each KB built as the linker builds it (root: the
   last prompt token) from the 50k-BPE tokenizer, without the model in memory:
   time, peak RSS and its growth, arrays, file size;
5. ``link``: per configuration (``--routes`` x ``--dtypes`` x ``--threads``), in a
   fresh process on that many torch threads: ``spacy.load`` of the pipeline
   (``dtype`` ``int8``: dynamic quantization at load), then the first
   ``--mentions`` NCBI-disease dev mentions through ``component.link`` after
   ``--warmup`` mentions not counted (route ``component``), or the dev documents
   holding those mentions through ``annotate`` into a fresh folder (route
   ``annotate``: its own entity ruler finds the mentions, so their number
   differs; its mentions/s is the summary's, from the pipeline loaded to the
   last chunk written, first batch included).

The JSON summary (``--json``, and on stdout) has the machine, date, versions and
one record per step; a markdown table follows it on stdout. Progress goes to
stderr; each child's own log is ``WORK/logs/STEP.log``. A configuration that
fails or runs past ``--timeout`` is recorded as such and the others still run
(exit status 1). On a shared machine wall times grow with the other jobs: the
records carry CPU time and the load average too. ``--reuse`` keeps the KBs,
model and pipeline an earlier run left in ``--work`` (to rerun the linking alone).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MB = 2**20
ROUTES = ("component", "annotate")
DTYPES = ("fp32", "int8", "bf16")
KBS = ("medic", "mesh_ctd")
#: files under the data folder each KB and the linking need
DATA = {
    "medic": ["vocab/medic_06Jul2012.txt"],
    "mesh_ctd": [
        "vocab/CTD_diseases_2017.tsv.gz",
        "vocab/mesh/mesh_id_label_mappings.tsv",
        "vocab/mesh/mesh_supp_id_label_mappings.tsv",
        "vocab/bc5cdr_legacy_id_crosswalk.tsv",
    ],
    "corpus": ["ncbi_disease/NCBIdevelopset_corpus.txt", "ncbi_disease/NCBItrainset_corpus.txt"],
}
#: training texts of the tokenizer, where present
TEXTS = ["ncbi_disease/NCBItrainset_corpus.txt", "bc5cdr/CDR_TrainingSet.PubTator.txt"]
DEV = "ncbi_disease/NCBIdevelopset_corpus.txt"

logger = logging.getLogger("bart_large")


# -- arguments ------------------------------------------------------------------------------------------------------
def _csv(kind: type, allowed: Optional[tuple] = None):
    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError("give at least one value")
        try:
            values = [kind(item) for item in items]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: not a list of {kind.__name__}") from None
        if allowed is not None:
            unknown = [v for v in values if v not in allowed]
            if unknown:
                raise argparse.ArgumentTypeError(
                    f"unknown {', '.join(map(str, unknown))}; choose from {', '.join(allowed)}"
                )
        if kind is int and min(values) < 1:
            raise argparse.ArgumentTypeError("thread counts must be at least 1")
        return list(dict.fromkeys(values))

    return parse


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def _preset(text: str) -> Dict[str, int]:
    """A preset name of ``spacy_genbioel.models.PRESETS`` or a JSON object of its fields; as a dict of fields."""
    from spacy_genbioel.models.bart import PRESETS, Preset

    if text in PRESETS:
        return dataclasses.asdict(PRESETS[text])
    try:
        fields = json.loads(text)
        return dataclasses.asdict(Preset(**fields))
    except (ValueError, TypeError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a preset ({', '.join(PRESETS)}) or a JSON object of "
            f"{', '.join(f.name for f in dataclasses.fields(Preset))}"
        ) from None


def _setting(text: str) -> tuple:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE (decoding.batch_size=16)")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="shared data (default: $GENBIOEL_DATA, else ../shared/data)"
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="folder for the KBs, model and pipeline (default: a temporary one, removed)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the JSON summary here too")
    parser.add_argument("--mentions", type=_positive, default=24, help="NCBI-disease dev mentions per configuration")
    parser.add_argument(
        "--warmup", type=int, default=2, help="mentions linked before the clock starts (route component)"
    )
    parser.add_argument("--routes", type=_csv(str, ROUTES), default=list(ROUTES), help="component,annotate")
    parser.add_argument("--dtypes", type=_csv(str, DTYPES), default=["fp32", "int8"], help="fp32,int8 (bf16 too)")
    parser.add_argument("--threads", type=_csv(int), default=[1, 2], help="torch threads per configuration: 1,2")
    parser.add_argument(
        "--preset", type=_preset, default="large", help="model shape: a preset name or a JSON object of its fields"
    )
    parser.add_argument(
        "--vocab-size", type=_positive, default=None, help="BPE vocabulary (default: the preset's, 50,265 for large)"
    )
    parser.add_argument(
        "--setting",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a genbioel setting for every configuration (decoding.batch_size=16); repeatable",
    )
    parser.add_argument("--skip-mesh", action="store_true", help="no CTD + MeSH KB and trie")
    parser.add_argument("--timeout", type=_positive, default=1800, help="seconds one step may run")
    parser.add_argument("--reuse", action="store_true", help="keep the KBs, model and pipeline already in --work")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The arguments, checked before anything heavy runs: settings against the component's, data files present."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error("--warmup must be 0 or more")
    args.vocab_size = args.vocab_size or args.preset["vocab_size"]
    settings = dict(args.setting)
    for key in settings:
        if key.rpartition(".")[2] in ("dtype", "device"):
            parser.error(f"--setting {key}: the script sets dtype and device itself (--dtypes; CPU only)")
    from spacy_genbioel.linking.settings import UnknownSettingError, nested_overrides

    try:
        nested_overrides(settings)
    except (UnknownSettingError, ValueError) as err:
        parser.error(f"--setting: {err}")
    args.settings = settings
    env = os.environ.get("GENBIOEL_DATA")
    args.data_dir = args.data_dir or (Path(env) if env else ROOT.parent / "shared" / "data")
    needed = DATA["medic"] + DATA["corpus"] + ([] if args.skip_mesh else DATA["mesh_ctd"])
    missing = [name for name in needed if not (args.data_dir / name).exists()]
    if missing:
        parser.error(
            f"no {', '.join(missing)} under {args.data_dir}: give --data-dir or set GENBIOEL_DATA"
            + ("" if args.skip_mesh else " (--skip-mesh does without the MeSH files)")
        )
    return args


def configurations(args: argparse.Namespace) -> List[Dict[str, Any]]:
    """One record per (route, dtype, threads), in the order they run."""
    return [{"route": r, "dtype": d, "threads": t} for r in args.routes for d in args.dtypes for t in args.threads]


# -- running one step in its own process ----------------------------------------------------------------------------
def run_step(name: str, params: Dict[str, Any], logs: Path, timeout: float) -> Dict[str, Any]:
    """``step_<name>(**params)`` in a child process: its JSON result plus wall and CPU time and peak RSS.
    A failure or a timeout is a result with ``error`` (the child's log says more)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "step", name, json.dumps(params)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))}
    label = params.get("label", name)
    log = logs / f"{label}.log"
    load_before = os.getloadavg()
    began = time.monotonic()
    with log.open("wb") as err, tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        error = None
        deadline = began + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                _, status, usage = os.wait4(proc.pid, 0)
                error = f"timed out after {timeout:.0f} s"
                break
            time.sleep(0.2)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = out.read().decode(errors="replace").strip().splitlines()
    result: Dict[str, Any] = {}
    if error is None and proc.returncode != 0:
        error = f"exit status {proc.returncode}: {_tail(log)}"
    if error is None:
        try:
            result = json.loads(lines[-1])
        except (IndexError, ValueError):
            error = f"no JSON result on stdout: {_tail(log)}"
    if error:
        result["error"] = error
    result.update(
        wall_s=round(time.monotonic() - began, 2),
        cpu_s=round(usage.ru_utime + usage.ru_stime, 2),
        peak_rss_mb=round(usage.ru_maxrss * 1024 / MB, 1),
        load_average_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        log=str(log),
    )
    return result


def _tail(log: Path, lines: int = 5) -> str:
    text = log.read_text(encoding="utf8", errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) or "(no output)"


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return round(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB, 1)


class RssSampler:
    """The highest RSS of this process while the block runs, sampled every ``interval`` seconds
    (``ru_maxrss`` is the process's lifetime peak: imports and loading included)."""

    def __init__(self, interval: float = 0.01) -> None:
        import threading

        self.interval, self.peak_mb = interval, _rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_mb = max(self.peak_mb, _rss_mb())

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, _rss_mb())


def _peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB, 1)


def _size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return round(sum(p.stat().st_size for p in files) / MB, 1)


# -- steps (each runs in a child process) ---------------------------------------------------------------------------
def step_kb(kind: str, data_dir: str, out: str, **_: Any) -> Dict[str, Any]:
    from spacy_genbioel.kb.build import build_kb

    data = Path(data_dir)
    began = time.monotonic()
    if kind == "medic":
        kb = build_kb("medic", data / DATA["medic"][0], dedup=False, name="medic", progress=False)
    else:
        ctd, desc, supp, walk = (data / name for name in DATA["mesh_ctd"])
        kb = build_kb(
            "ctd",
            [ctd, ("mesh-tsv", desc), ("mesh-tsv", supp)],
            dedup=False,
            crosswalk=walk,
            name="mesh_ctd",
            progress=False,
        )
    build_s = time.monotonic() - began
    kb.save(out)
    return {"concepts": len(kb), "names": kb.n_names, "build_s": round(build_s, 2), "file_mb": _size_mb(Path(out))}


def step_model(
    kbs: List[str], data_dir: str, preset: Dict[str, int], vocab_size: int, seed: int, out: str, **_: Any
) -> Dict[str, Any]:
    from spacy_genbioel.corpus.pubtator import read_pubtator
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.models import Preset, build_model, save_model, train_tokenizer

    names = [name for path in kbs for name in KnowledgeBase.load(path).names]
    texts = [
        doc.text for rel in TEXTS if (Path(data_dir) / rel).exists() for doc in read_pubtator(Path(data_dir) / rel)
    ]
    began = time.monotonic()
    tokenizer = train_tokenizer(names, texts, vocab_size=vocab_size)
    tokenizer_s = time.monotonic() - began
    began = time.monotonic()
    model = build_model(Preset(**preset), tokenizer, seed=seed, dropout=0.0)
    if model.get_input_embeddings().num_embeddings < vocab_size:  # too little text for the vocabulary: keep the shape
        model.resize_token_embeddings(vocab_size)
    build_s = time.monotonic() - began
    began = time.monotonic()
    save_model(model, tokenizer, out)
    return {
        "tokenizer_texts": len(texts),
        "tokenizer_names": len(names),
        "tokenizer_vocab": len(tokenizer),
        "model_vocab": model.get_input_embeddings().num_embeddings,
        "tokenizer_s": round(tokenizer_s, 2),
        "parameters": sum(p.numel() for p in model.parameters()),
        "build_s": round(build_s, 2),
        "save_s": round(time.monotonic() - began, 2),
        "model_mb": _size_mb(Path(out)),
    }


def step_package(model: str, kb: str, out: str, **_: Any) -> Dict[str, Any]:
    from spacy_genbioel.training.package import package

    began = time.monotonic()
    package(model, kb, out, settings={})
    folder = Path(out)
    component = folder / "genbioel"
    return {
        "package_s": round(time.monotonic() - began, 2),
        "pipeline_mb": _size_mb(folder),
        "pipes": json.loads((folder / "meta.json").read_text(encoding="utf8")).get("pipeline", []),
        "trie_file_mb": _size_mb(component / "trie.safetensors") if (component / "trie.safetensors").exists() else None,
    }


def step_trie(kb: str, model: str, out: str, pipeline_trie: Optional[str] = None, **_: Any) -> Dict[str, Any]:
    """The trie as :class:`GenerativeLinker` builds it, from the tokenizer and the model's config alone."""
    from transformers import AutoConfig

    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.linking.inputs.builder import InputBuilder, PromptTokenizer
    from spacy_genbioel.linking.trie.name_trie import NameTrie
    from spacy_genbioel.models import load_tokenizer

    began = time.monotonic()
    base = KnowledgeBase.load(kb)
    kb_load_s = time.monotonic() - began
    tokenizer = load_tokenizer(model)
    config = AutoConfig.from_pretrained(model, local_files_only=True)
    prompts = PromptTokenizer(
        tokenizer,
        config.decoder_start_token_id,
        config.eos_token_id,
        max_prompt_tokens=min(48, config.max_position_embeddings // 4),
    )
    inputs = InputBuilder()
    root = prompts.root_token_id(inputs.prompt_suffix if inputs.decoder_prompt else None)
    before = _rss_mb()
    began, cpu = time.monotonic(), time.process_time()
    with RssSampler() as sampler:
        trie = NameTrie.from_names(
            base.names,
            tokenizer,
            eos_token_id=config.eos_token_id,
            root_token_id=root,
            vocab_size=config.vocab_size,
            progress=False,
            max_name_tokens=min(128, config.max_position_embeddings - prompts.max_prompt_tokens),
        )
    build_s, build_cpu = time.monotonic() - began, time.process_time() - cpu
    trie.to_disk(out)
    result = {
        "concepts": len(base),
        "names": base.n_names,
        "kb_load_s": round(kb_load_s, 2),
        "build_s": round(build_s, 2),
        "build_cpu_s": round(build_cpu, 2),
        "trie_names": trie.n_names,
        "nodes": trie.n_nodes,
        "depth": trie.max_depth,
        "root_token_id": root,
        "arrays_mb": round(trie.nbytes() / MB, 1),
        "file_mb": _size_mb(Path(out)),
        "rss_before_build_mb": before,
        "peak_during_build_mb": sampler.peak_mb,
        "build_rss_growth_mb": round(sampler.peak_mb - before, 1),
    }
    if pipeline_trie and Path(pipeline_trie).exists():  # the pipeline's own trie: the same one?
        saved = NameTrie.from_disk(pipeline_trie)
        result["same_as_pipeline_trie"] = (saved.n_nodes, saved.n_names, saved.root_token_id) == (
            trie.n_nodes,
            trie.n_names,
            root,
        )
    return result


def dev_mentions(data_dir: str, n: int):
    from spacy_genbioel.corpus.pubtator import mentions_from_pubtator

    return list(mentions_from_pubtator(Path(data_dir) / DEV, context_chars=1000))[:n]


def _time_component_load() -> List[float]:
    """Seconds the ``genbioel`` component's ``from_disk`` takes (model, KB, trie; the rest of
    ``spacy.load`` is the other pipes), appended to the list returned."""
    from spacy_genbioel.linking.component import GenBioELLinker

    seconds: List[float] = []
    original = GenBioELLinker.from_disk

    def from_disk(self, *args: Any, **kwargs: Any):
        began = time.monotonic()
        try:
            return original(self, *args, **kwargs)
        finally:
            seconds.append(time.monotonic() - began)

    GenBioELLinker.from_disk = from_disk  # type: ignore[method-assign]
    return seconds


def step_link(
    pipeline: str,
    data_dir: str,
    mentions: int,
    warmup: int,
    dtype: str,
    threads: int,
    settings: Dict[str, Any],
    **_: Any,
) -> Dict[str, Any]:
    from collections import Counter

    import torch

    torch.set_num_threads(threads)
    import spacy  # noqa: F401  (imports before the clock)

    from spacy_genbioel.annotate.options import component_settings
    from spacy_genbioel.annotate.units import load_pipeline
    from spacy_genbioel.linking.decoding.stages import StageClock

    every = dev_mentions(data_dir, max(mentions, warmup))
    measured = every[:mentions]
    overrides = component_settings({**settings, "device": "cpu", "dtype": dtype})
    component_s = _time_component_load()
    before = _rss_mb()
    began = time.monotonic()
    nlp, component = load_pipeline(Path(pipeline), "genbioel", overrides)  # spacy.load, then the linker made ready
    load_s = time.monotonic() - began
    after_load = _rss_mb()
    if warmup:
        component.link(every[:warmup])
    linker = component.linker
    linker.clock, linker.stats = StageClock(), Counter()  # stage seconds: encoder, decoder, trie, beam bookkeeping
    began, cpu = time.monotonic(), time.process_time()
    results = component.link(measured)
    seconds, cpu_s = time.monotonic() - began, time.process_time() - cpu
    top = [r[0].name for r in results if r]
    top_tokens = sum(len(linker.tokenizer(" " + name, add_special_tokens=False)["input_ids"]) for name in top)
    return {
        "mentions": len(measured),
        "mean_top_name_tokens": round(top_tokens / max(1, len(top)), 2),
        "with_candidates": sum(1 for r in results if r),
        "load_s": round(load_s, 2),
        "genbioel_load_s": round(sum(component_s), 2),
        "rss_before_load_mb": before,
        "seconds": round(seconds, 2),
        "link_cpu_s": round(cpu_s, 2),
        "mentions_per_s": round(len(measured) / seconds, 3),
        "rss_after_load_mb": after_load,
        "rss_after_link_mb": _rss_mb(),
        "torch_threads": torch.get_num_threads(),
        "pipes": nlp.pipe_names,
        "warmup": min(warmup, len(every)),
        "stages_s": {k: round(v, 3) for k, v in linker.clock.seconds.items()},
        "decoder_calls": linker.clock.calls["decoder"],
        "encoder_tokens": linker.stats["encoder_tokens"],
    }


def dev_documents(data_dir: str, n_mentions: int, target: Path) -> Dict[str, int]:
    """The NCBI-disease dev documents, in order, until they hold ``n_mentions`` gold mentions, as JSONL."""
    from spacy_genbioel.corpus.pubtator import read_pubtator

    lines, gold = [], 0
    for doc in read_pubtator(Path(data_dir) / DEV):
        if gold >= n_mentions:
            break
        lines.append(json.dumps({"id": doc.pmid, "title": doc.title, "abstract": doc.abstract}))
        gold += len(doc.annotations)
    target.write_text("\n".join(lines) + "\n", encoding="utf8")
    return {"documents": len(lines), "gold_mentions": gold}


def step_annotate(
    pipeline: str, data_dir: str, mentions: int, dtype: str, threads: int, settings: Dict[str, Any], out: str, **_: Any
) -> Dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from spacy_genbioel.annotate import annotate

    folder = Path(out)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    docs = folder.parent / f"{folder.name}.docs.jsonl"
    chosen = dev_documents(data_dir, mentions, docs)
    began = time.monotonic()
    summary = annotate(
        [docs],
        pipeline,
        folder / "job",
        {"progress": False, "chunk_size": 100_000},
        {**settings, "device": "cpu", "dtype": dtype},
    )
    wall = time.monotonic() - began
    run = summary["this_run"]
    return {
        **chosen,
        "mentions": run["mentions"],
        "mentions_linked": summary["mentions_linked"],
        "seconds": run["seconds"],
        "mentions_per_s": run["mentions_per_s"],
        "documents_per_s": run["documents_per_s"],
        "load_s": round(wall - run["seconds"], 2),
        "torch_threads": torch.get_num_threads(),
    }


STEPS = {
    "kb": step_kb,
    "model": step_model,
    "package": step_package,
    "trie": step_trie,
    "link": step_link,
    "annotate": step_annotate,
}


# -- the machine and the report -------------------------------------------------------------------------------------
def machine() -> Dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo") as info:
            memory = round(int(info.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    versions = {"python": platform.python_version()}
    for package in ("torch", "transformers", "tokenizers", "spacy", "spacy_genbioel", "scispacy", "psutil"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": memory,
        "platform": platform.platform(),
        "versions": versions,
    }


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown(report: Dict[str, Any]) -> str:
    m = report["machine"]
    v = m["versions"]
    out = [
        f"BART-large linker (random weights, {_fmt(report['model'].get('parameters'))} parameters, vocabulary "
        f"{_fmt(report['model'].get('model_vocab'))}), {report['date']}",
        f"Machine: {m['cpu']}, {m['usable_cores']} cores, {_fmt(m['memory_gib'])} GiB; "
        f"torch {v['torch']}, transformers {v['transformers']}, spaCy {v['spacy']}, "
        f"spacy_genbioel {v['spacy_genbioel']}, Python {v['python']}",
        "",
        *([f"**Stopped**: {report['error']}", ""] if report.get("error") else []),
        "| step | wall s | CPU s | peak RSS MB | what |",
        "|---|---|---|---|---|",
    ]
    for name, step in report["setup"].items():
        what = {
            k: step[k]
            for k in (
                "concepts",
                "names",
                "tokenizer_vocab",
                "parameters",
                "model_mb",
                "pipeline_mb",
                "trie_file_mb",
                "build_s",
                "tokenizer_s",
                "package_s",
            )
            if k in step
        }
        out.append(
            f"| {name} | {_fmt(step['wall_s'])} | {_fmt(step['cpu_s'])} | {_fmt(step['peak_rss_mb'])} | "
            f"{step.get('error') or ', '.join(f'{k} {_fmt(x)}' for k, x in what.items())} |"
        )
    out += [
        "",
        "| trie | names | nodes | build s | peak RSS MB | RSS growth MB | arrays MB | file MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in report["tries"].items():
        if "error" in t:
            out.append(f"| {name} | {t['error']} | | | | | | |")
            continue
        out.append(
            f"| {name} | {_fmt(t['names'])} | {_fmt(t['nodes'])} | {_fmt(t['build_s'], 2)} | {_fmt(t['peak_rss_mb'])} "
            f"| {_fmt(t['build_rss_growth_mb'])} | {_fmt(t['arrays_mb'])} | {_fmt(t['file_mb'])} |"
        )
    out += [
        "",
        "| route | dtype | threads | mentions | mentions/s | load s (genbioel) | peak RSS MB | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        if "error" in r:
            out.append(
                f"| {r['route']} | {r['dtype']} | {r['threads']} | {r['error']} | | | {_fmt(r['peak_rss_mb'])} | "
                f"{_fmt(r['wall_s'])} |"
            )
            continue
        own = f" ({_fmt(r['genbioel_load_s'], 2)})" if "genbioel_load_s" in r else ""
        out.append(
            f"| {r['route']} | {r['dtype']} | {r['threads']} | {_fmt(r['mentions'])} | {_fmt(r['mentions_per_s'], 2)} "
            f"| {_fmt(r['load_s'], 2)}{own} | {_fmt(r['peak_rss_mb'])} | {_fmt(r['wall_s'])} |"
        )
    return "\n".join(out)


# -- the run --------------------------------------------------------------------------------------------------------
def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    temporary = args.work is None
    work = Path(tempfile.mkdtemp(prefix="bart_large_")) if temporary else args.work
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "results").mkdir(exist_ok=True)
    data = str(args.data_dir.resolve())
    report: Dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "arguments": {
            "data_dir": data,
            "work": str(work),
            "mentions": args.mentions,
            "warmup": args.warmup,
            "routes": args.routes,
            "dtypes": args.dtypes,
            "threads": args.threads,
            "preset": args.preset,
            "vocab_size": args.vocab_size,
            "settings": args.settings,
            "skip_mesh": args.skip_mesh,
        },
        "command": shlex.join(["python", "bench/bart_large.py", *(argv if argv is not None else sys.argv[1:])]),
        "setup": {},
        "model": {},
        "tries": {},
        "runs": [],
    }
    began = time.monotonic()
    try:
        ok = Run(args, work, report)()
    finally:
        report["total_s"] = round(time.monotonic() - began, 1)
        text = json.dumps(report, indent=2)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(text + "\n", encoding="utf8")
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
    print(text)
    print()
    print(markdown(report))
    return 0 if ok else 1


class SetupFailed(Exception):
    """A step every measurement needs (a KB, the model, the pipeline) failed."""


class Run:
    """One benchmark run in ``work``: the set-up steps, then the tries and configurations, into ``report``."""

    def __init__(self, args: argparse.Namespace, work: Path, report: Dict[str, Any]) -> None:
        self.args, self.work, self.report = args, work, report
        self.data = str(args.data_dir.resolve())
        self.logs, self.results = work / "logs", work / "results"
        self.kbs = {kind: work / f"kb_{kind}.jsonl" for kind in KBS if kind == "medic" or not args.skip_mesh}
        self.model, self.pipeline = work / "model", work / "pipeline"

    def __call__(self) -> bool:
        """Whether every step succeeded (a failed set-up step stops the run; a failed measurement does not)."""
        try:
            self.build()
        except SetupFailed as err:
            logger.error("%s", err)
            self.report["error"] = str(err)
            return False
        return self.measure()

    def setup_step(self, label: str, name: str, params: Dict[str, Any], output: Path) -> Dict[str, Any]:
        saved = self.results / f"{label}.json"
        if self.args.reuse and saved.exists() and output.exists():
            result = {**json.loads(saved.read_text(encoding="utf8")), "reused": True}
            logger.info("%s: reused from %s", label, saved)
        else:
            logger.info("%s ...", label)
            result = run_step(name, {**params, "label": label}, self.logs, self.args.timeout)
            if "error" not in result:
                saved.write_text(json.dumps(result), encoding="utf8")
        self.report["setup"][label] = result
        if "error" in result:
            raise SetupFailed(f"{label} failed: {result['error']}")
        logger.info("%s: %.1f s, peak RSS %.0f MB", label, result["wall_s"], result["peak_rss_mb"])
        return result

    def build(self) -> None:
        args = self.args
        for kind, path in self.kbs.items():
            self.setup_step(f"kb_{kind}", "kb", {"kind": kind, "data_dir": self.data, "out": str(path)}, path)
        self.report["model"] = self.setup_step(
            "model",
            "model",
            {
                "kbs": [str(p) for p in self.kbs.values()],
                "data_dir": self.data,
                "preset": args.preset,
                "vocab_size": args.vocab_size,
                "seed": args.seed,
                "out": str(self.model),
            },
            self.model,
        )
        self.setup_step(
            "package",
            "package",
            {"model": str(self.model), "kb": str(self.kbs["medic"]), "out": str(self.pipeline)},
            self.pipeline,
        )

    def measure(self) -> bool:
        ok = True
        for kind, path in self.kbs.items():
            label = f"trie_{kind}"
            logger.info("%s ...", label)
            params = {
                "kb": str(path),
                "model": str(self.model),
                "out": str(self.work / f"{label}.safetensors"),
                "label": label,
            }
            if kind == "medic":
                params["pipeline_trie"] = str(self.pipeline / "genbioel" / "trie.safetensors")
            trie = self.report["tries"][kind] = run_step("trie", params, self.logs, self.args.timeout)
            ok = ok and "error" not in trie
            logger.info(
                "%s: %s", label, trie.get("error") or f"{trie['build_s']} s, peak RSS {trie['peak_rss_mb']:.0f} MB"
            )
        for config in configurations(self.args):
            label = f"{config['route']}_{config['dtype']}_{config['threads']}t"
            logger.info("%s: %d mentions ...", label, self.args.mentions)
            params = {
                **config,
                "label": label,
                "pipeline": str(self.pipeline),
                "data_dir": self.data,
                "mentions": self.args.mentions,
                "warmup": self.args.warmup,
                "settings": self.args.settings,
                "out": str(self.work / "annotate" / label),
            }
            step = "link" if config["route"] == "component" else "annotate"
            result = {**config, **run_step(step, params, self.logs, self.args.timeout)}
            self.report["runs"].append(result)
            ok = ok and "error" not in result
            logger.info(
                "%s: %s",
                label,
                result.get("error")
                or f"{result['mentions_per_s']} mentions/s, "
                f"load {result['load_s']} s, peak RSS {result['peak_rss_mb']:.0f} MB",
            )
        return ok


def _child(name: str, params: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    result = STEPS[name](**json.loads(params))
    result["peak_in_step_mb"] = _peak_mb()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "step":
        _child(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
