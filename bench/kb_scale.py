"""How the KB, the name trie and a saved pipeline grow with the KB: 100k -> 1M -> 10M names.

For each size, on a synthetic UMLS-like KB (``bench/synth_kb.py``, seeded),
every step runs in its own process, so its peak memory (``ru_maxrss`` of that
process, read with ``os.wait4``) is its own:

1. ``generate``: the synthetic KB as JSONL (``--names`` raw names);
2. ``build-kb``: ``python -m spacy_genbioel build-kb -f jsonl KB --out kb.safetensors``
   (``--kb-format jsonl``: ``--out kb.jsonl``, the dictionary-based KB);
3. ``model``: a BPE tokenizer trained on a sample of the names as the
   workflows train theirs (8k vocabulary) and a micro BART (the model's size
   is not the point here);
4. ``trie``: the name trie built as the linker builds it (``GenerativeLinker``
   with no trie given), then saved: build time, nodes, size in memory and on disk;
5. ``save``: a ``genbioel`` pipeline with that KB, model and trie, ``nlp.to_disk``;
6. ``load``: ``spacy.load`` of the pipeline in a fresh process (imports done
   first, not counted), then linking 40 mentions (KB names in a sentence):
   load time, RSS after loading and after linking, peak RSS.

With ``--scispacy-max N`` the same KB (normalized names, as every linker here
sees them) also goes through scispacy's linker up to N names: its TF-IDF
vectorizer and nmslib HNSW index built and saved as
``scispacy.candidate_generation.create_tfidf_ann_index`` does (see
``scispacy_build``), then loaded and queried as its ``EntityLinker`` does.

    python bench/kb_scale.py --sizes 100000 1000000 --work /tmp/kbscale --out bench_out/kb_scale.json
    python bench/kb_scale.py --sizes 10000000 --work /tmp/kbscale --out bench_out/kb_scale_10m.json

The JSON has one record per size and step; a markdown table goes to stdout
(``--table FILE.json ...`` prints the table of earlier runs). Times are given
as wall time and as CPU time of the process (user + system, all threads): on a
shared machine the wall time grows with the other jobs, the CPU time much less.
``PYTHONPATH=OTHER_CHECKOUT python bench/kb_scale.py --kb-format jsonl ...``
measures another version of the package (the "before" rows of docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MB = 2**20


# -- running one step in its own process ---------------------------------------------------------------------------
def run_step(name: str, args: Dict, log: Optional[Path] = None) -> Dict:
    """Run ``step_<name>(**args)`` in a child process; its JSON result plus wall time and peak RSS."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "step", name, json.dumps(args)]
    return run_command(cmd, log, parse_json=True)


def run_command(cmd: List[str], log: Optional[Path] = None, parse_json: bool = False) -> Dict:
    # an existing PYTHONPATH comes first, so the same script can measure another checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(ROOT)]))}
    began = time.monotonic()
    err = log.open("ab") if log else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - began
    if log:
        err.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} failed with {proc.returncode} (see {log})")
    result = json.loads(out.decode().strip().splitlines()[-1]) if parse_json else {}
    result.update(
        wall_s=round(wall, 2),
        cpu_s=round(usage.ru_utime + usage.ru_stime, 2),
        peak_rss_mb=round(usage.ru_maxrss * 1024 / MB, 1),
    )
    return result


def _rss() -> Dict[str, float]:
    import psutil

    info = psutil.Process().memory_full_info()
    return {"rss_mb": round(info.rss / MB, 1), "uss_mb": round(info.uss / MB, 1)}


def _mapped_mb(folder: str) -> float:
    """RSS of the files under ``folder`` mapped into this process (clean pages the OS can drop)."""
    total, current = 0, ""
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                parts = line.split()
                current = parts[5] if len(parts) > 5 else ""
            elif line.startswith("Rss:") and current.startswith(folder):
                total += int(line.split()[1])
    return round(total / 1024, 1)


def _peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / MB, 1)


# -- steps (each runs in a child process) ------------------------------------------------------------------------
def step_generate(stats: str, names: int, seed: int, out: str) -> Dict:
    sys.path.insert(0, str(HERE))
    import synth_kb

    return synth_kb.generate(json.loads(Path(stats).read_text(encoding="utf8")), names, seed, Path(out))


def step_model(kb: str, out: str, sample: int = 200_000) -> Dict:
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.models import Preset, build_model, save_model, train_tokenizer

    base = KnowledgeBase.load(kb)
    names = base.names
    step = max(1, len(names) // sample)
    tokenizer = train_tokenizer((names[i] for i in range(0, len(names), step)), vocab_size=8000)
    micro = Preset(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        attention_heads=2,
        ffn_dim=64,
        max_position_embeddings=512,
        vocab_size=len(tokenizer),
    )
    model = build_model(micro, tokenizer, seed=0, dropout=0.0)
    save_model(model, tokenizer, Path(out))
    return {"vocab": len(tokenizer), "parameters": sum(p.numel() for p in model.parameters())}


def step_trie(kb: str, model: str, out: str) -> Dict:
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
    from spacy_genbioel.models import load_model

    began = time.monotonic()
    base = KnowledgeBase.load(kb)
    kb_s = time.monotonic() - began
    hf_model, tokenizer = load_model(model, device="cpu")
    before = _rss()
    began, cpu = time.monotonic(), time.process_time()
    linker = GenerativeLinker(hf_model, tokenizer, base)  # builds the trie as the component does
    build_s, build_cpu = time.monotonic() - began, time.process_time() - cpu
    trie = linker.trie
    began = time.monotonic()
    trie.to_disk(out)
    return {
        "kb_names": base.n_names,
        "kb_concepts": len(base),
        "kb_load_s": round(kb_s, 2),
        "trie_build_s": round(build_s, 2),
        "trie_build_cpu_s": round(build_cpu, 2),
        "trie_save_s": round(time.monotonic() - began, 2),
        "trie_names": trie.n_names,
        "trie_nodes": trie.n_nodes,
        "trie_depth": trie.max_depth,
        "trie_memory_mb": round(trie.nbytes() / MB, 1),
        "trie_file_mb": round(Path(out).stat().st_size / MB, 1),
        "rss_before_build_mb": before["rss_mb"],
        "peak_in_process_mb": _peak_mb(),
    }


def step_save(kb: str, model: str, trie: str, out: str) -> Dict:
    import spacy

    import spacy_genbioel  # noqa: F401
    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.linking.trie.name_trie import NameTrie
    from spacy_genbioel.models import load_model

    hf_model, tokenizer = load_model(model, device="cpu")
    base = KnowledgeBase.load(kb)
    nlp = spacy.blank("en")
    component = nlp.add_pipe("genbioel", config={"model": model, "kb": kb, "device": "cpu"})
    component.set_model(hf_model, tokenizer, base, NameTrie.from_disk(trie))
    began = time.monotonic()
    nlp.to_disk(out)
    sizes = {p.name: round(p.stat().st_size / MB, 1) for p in (Path(out) / "genbioel").iterdir() if p.is_file()}
    return {"save_s": round(time.monotonic() - began, 2), "files_mb": sizes}


def _mention_docs(nlp, names: Sequence[str], n: int = 40, seed: int = 0):
    import random

    from spacy.tokens import Span

    rng = random.Random(seed)
    docs = []
    for _ in range(n // 2):
        a, b = rng.choice(names), rng.choice(names)
        left, middle, right = "Patients with", "and", "were treated ."
        doc = nlp.make_doc(f"{left} {a} {middle} {b} {right}")
        start_a = len(left.split())
        end_a = start_a + len(nlp.make_doc(a))
        start_b = end_a + 1
        end_b = start_b + len(nlp.make_doc(b))
        doc.ents = [Span(doc, start_a, end_a, "Disease"), Span(doc, start_b, end_b, "Disease")]
        docs.append(doc)
    return docs


def step_load(pipeline: str, n_mentions: int = 40) -> Dict:
    began = time.monotonic()
    import spacy
    import torch  # noqa: F401  (imports are timed apart from loading)
    from transformers import BartForConditionalGeneration, PreTrainedTokenizerFast  # noqa: F401

    import spacy_genbioel  # noqa: F401

    import_s = time.monotonic() - began

    before = _rss()
    began, cpu = time.monotonic(), time.process_time()
    nlp = spacy.load(pipeline)
    component = nlp.get_pipe("genbioel")
    linker = component.linker
    load_s, load_cpu = time.monotonic() - began, time.process_time() - cpu
    loaded = _rss()
    mapped_loaded = _mapped_mb(str(Path(pipeline).resolve()))
    kb = linker.kb
    step = max(1, kb.n_names // 1000)
    names = [kb.names[i] for i in range(0, kb.n_names, step)]
    docs = _mention_docs(nlp, names, n_mentions)
    began = time.monotonic()
    linked = [e._.kb_id for doc in nlp.pipe(docs) for e in doc.ents]
    link_s = time.monotonic() - began
    after = _rss()
    return {
        "import_s": round(import_s, 2),
        "load_s": round(load_s, 2),
        "load_cpu_s": round(load_cpu, 2),
        "link_s": round(link_s, 2),
        "mentions": len(linked),
        "linked": sum(1 for x in linked if x is not None),
        "rss_before_load_mb": before["rss_mb"],
        "rss_loaded_mb": loaded["rss_mb"],
        "uss_loaded_mb": loaded["uss_mb"],
        "rss_linked_mb": after["rss_mb"],
        "uss_linked_mb": after["uss_mb"],
        "mapped_loaded_mb": mapped_loaded,
        "mapped_linked_mb": _mapped_mb(str(Path(pipeline).resolve())),
        "kb_type": type(kb).__name__,
        "peak_in_process_mb": _peak_mb(),
    }


def step_scispacy_build(kb: str, out: str, m: int = 16, ef_construction: int = 200, threads: int = 2) -> Dict:
    """scispacy's ``create_tfidf_ann_index`` step by step (it refuses to run with scipy >= 1.11, and its
    M=100, efConstruction=2000 take hours on 2 cores): the same vectorizer, the same empty-vector
    removal, an nmslib HNSW index with nmslib's default M and efConstruction, saved as its files are
    (the vectorizer as JSON, vocabulary and idf, rather than joblib's pickle; the vectors as float32,
    as scipy >= 1.11 cannot store float16)."""
    import nmslib
    import numpy as np
    import scipy.sparse
    from scispacy.linking_utils import KnowledgeBase as ScispacyKB
    from sklearn.feature_extraction.text import TfidfVectorizer

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    aliases = list(ScispacyKB(kb).alias_to_cuis.keys())
    vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 3), min_df=10, dtype=np.float32)
    vectors = vectorizer.fit_transform(aliases)
    keep = np.asarray(vectors.sum(axis=1)).ravel() != 0
    aliases = [a for a, k in zip(aliases, keep) if k]
    vectors = vectors[keep]
    fit_s = time.monotonic() - began
    (out_dir / "tfidf_vectorizer.json").write_text(
        json.dumps(
            {"vocabulary": {k: int(v) for k, v in vectorizer.vocabulary_.items()}, "idf": vectorizer.idf_.tolist()}
        )
    )
    (out_dir / "concept_aliases.json").write_text(json.dumps(aliases))
    scipy.sparse.save_npz(out_dir / "tfidf_vectors_sparse.npz", vectors.astype(np.float32))
    began = time.monotonic()
    index = nmslib.init(method="hnsw", space="cosinesimil_sparse", data_type=nmslib.DataType.SPARSE_VECTOR)
    index.addDataPointBatch(vectors)
    index.createIndex({"M": m, "indexThreadQty": threads, "efConstruction": ef_construction, "post": 0})
    index.saveIndex(str(out_dir / "nmslib_index.bin"))
    sizes = {p.name: round(p.stat().st_size / MB, 1) for p in out_dir.iterdir()}
    return {
        "aliases": len(aliases),
        "vectorizer_s": round(fit_s, 2),
        "index_s": round(time.monotonic() - began, 2),
        "files_mb": sizes,
        "peak_in_process_mb": _peak_mb(),
    }


def step_scispacy_load(kb: str, index_dir: str, n_mentions: int = 40) -> Dict:
    """What scispacy's ``EntityLinker`` does on load (``CandidateGenerator`` with the KB and the index
    files), then candidates for the same kind of mentions as ``step_load``."""
    began = time.monotonic()
    import random

    import nmslib
    import numpy as np
    import scipy.sparse
    from scispacy.candidate_generation import CandidateGenerator
    from scispacy.linking_utils import KnowledgeBase as ScispacyKB
    from sklearn.feature_extraction.text import TfidfVectorizer

    import_s = time.monotonic() - began
    folder = Path(index_dir)
    before = _rss()
    began, cpu = time.monotonic(), time.process_time()
    saved = json.loads((folder / "tfidf_vectorizer.json").read_text())
    vectorizer = TfidfVectorizer(
        analyzer="char_wb", ngram_range=(3, 3), min_df=10, dtype=np.float32, vocabulary=saved["vocabulary"]
    )
    vectorizer.idf_ = np.asarray(saved["idf"], dtype=np.float64)
    aliases = json.loads((folder / "concept_aliases.json").read_text())
    vectors = scipy.sparse.load_npz(folder / "tfidf_vectors_sparse.npz").astype(np.float32)
    index = nmslib.init(method="hnsw", space="cosinesimil_sparse", data_type=nmslib.DataType.SPARSE_VECTOR)
    index.addDataPointBatch(vectors)
    index.loadIndex(str(folder / "nmslib_index.bin"))
    index.setQueryTimeParams({"efSearch": 200})
    generator = CandidateGenerator(
        ann_index=index, tfidf_vectorizer=vectorizer, ann_concept_aliases_list=aliases, kb=ScispacyKB(kb)
    )
    load_s, load_cpu = time.monotonic() - began, time.process_time() - cpu
    loaded = _rss()
    rng = random.Random(0)
    mentions = [rng.choice(aliases) for _ in range(n_mentions)]
    began = time.monotonic()
    found = generator(mentions, 30)
    link_s = time.monotonic() - began
    after = _rss()
    return {
        "import_s": round(import_s, 2),
        "load_s": round(load_s, 2),
        "load_cpu_s": round(load_cpu, 2),
        "link_s": round(link_s, 2),
        "mentions": len(found),
        "rss_before_load_mb": before["rss_mb"],
        "rss_loaded_mb": loaded["rss_mb"],
        "uss_loaded_mb": loaded["uss_mb"],
        "rss_linked_mb": after["rss_mb"],
        "peak_in_process_mb": _peak_mb(),
    }


def step_scispacy_kb(kb: str, out: str) -> Dict:
    """Our KB in scispacy's JSONL format, over the normalized names (what the linkers see)."""
    from spacy_genbioel.kb.base import KnowledgeBase

    base = KnowledgeBase.load(kb)
    n = 0
    with Path(out).open("w", encoding="utf8") as handle:
        for concept in base:
            names = base.names_of(concept.id)
            if names:
                handle.write(
                    json.dumps(
                        {
                            "concept_id": concept.id,
                            "canonical_name": names[0],
                            "aliases": names[1:],
                            "types": list(concept.types),
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
                n += 1
    return {"concepts": n}


STEPS = {name[5:]: fn for name, fn in globals().items() if name.startswith("step_")}


# -- the measurement -----------------------------------------------------------------------------------------------
def measure(
    size: int,
    work: Path,
    stats: Path,
    seed: int,
    kb_format: str,
    scispacy: bool,
    log: Path,
    only_load: Optional[Dict] = None,
) -> Dict:
    tag = _tag(size)
    folder = work / tag
    folder.mkdir(parents=True, exist_ok=True)
    if (
        only_load is not None
    ):  # --load-only: measure loading again (scispacy's too), keep the rest of the earlier record
        record = {**only_load, "load": run_step("load", {"pipeline": str(folder / f"pipeline_{kb_format}")}, log)}
        if "scispacy_load" in only_load:
            record["scispacy_load"] = run_step(
                "scispacy_load", {"kb": str(folder / "scispacy_kb.jsonl"), "index_dir": str(folder / "scispacy")}, log
            )
        return record
    source = folder / "source.jsonl"
    record: Dict = {"names_generated": size, "kb_format": kb_format}
    if not source.exists():
        record["generate"] = run_step(
            "generate", {"stats": str(stats), "names": size, "seed": seed, "out": str(source)}, log
        )
    kb = folder / f"kb.{kb_format}"
    cmd = [sys.executable, "-m", "spacy_genbioel", "build-kb", "-f", "jsonl", str(source), "--out", str(kb)]
    record["build_kb"] = run_command(cmd, log)
    record["build_kb"]["kb_file_mb"] = round(kb.stat().st_size / MB, 1)
    model = folder / "model"
    if not (model / "config.json").exists():
        record["model"] = run_step("model", {"kb": str(kb), "out": str(model)}, log)
    trie = folder / f"trie_for_{kb_format}_kb.safetensors"
    record["trie"] = run_step("trie", {"kb": str(kb), "model": str(model), "out": str(trie)}, log)
    pipeline = folder / f"pipeline_{kb_format}"
    record["save"] = run_step(
        "save", {"kb": str(kb), "model": str(model), "trie": str(trie), "out": str(pipeline)}, log
    )
    record["load"] = run_step("load", {"pipeline": str(pipeline)}, log)
    if scispacy:
        sci_kb = folder / "scispacy_kb.jsonl"
        record["scispacy_kb"] = run_step("scispacy_kb", {"kb": str(kb), "out": str(sci_kb)}, log)
        record["scispacy_build"] = run_step("scispacy_build", {"kb": str(sci_kb), "out": str(folder / "scispacy")}, log)
        record["scispacy_load"] = run_step(
            "scispacy_load", {"kb": str(sci_kb), "index_dir": str(folder / "scispacy")}, log
        )
    return record


def _tag(size: int) -> str:
    for unit, div in (("m", 1_000_000), ("k", 1_000)):
        if size >= div and size % div == 0:
            return f"{size // div}{unit}"
    return str(size)


def table(records: Sequence[Dict]) -> str:
    """The markdown table of the runs (one column per size and KB format)."""

    def get(r: Dict, path: Sequence[str]):
        value = r
        for key in path:
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return value

    def cell(r: Dict, *path: str, unit: str = "") -> str:
        if path[0] == "added":  # ("added", step): RSS after loading minus before (the imports)
            after, before = get(r, (path[1], "rss_loaded_mb")), get(r, (path[1], "rss_before_load_mb"))
            value = None if after is None or before is None else round(after - before, 1)
        else:
            value = get(r, path)
        if value is None:
            return "-"
        return f"{value:,}{unit}" if isinstance(value, int) else f"{value}{unit}"

    rows = [
        ("names generated (raw)", ("names_generated",), ""),
        ("unique normalized names (trie)", ("trie", "kb_names"), ""),
        ("concepts", ("trie", "kb_concepts"), ""),
        ("`build-kb` wall time", ("build_kb", "wall_s"), " s"),
        ("`build-kb` CPU time", ("build_kb", "cpu_s"), " s"),
        ("`build-kb` peak RSS", ("build_kb", "peak_rss_mb"), " MB"),
        ("KB file", ("build_kb", "kb_file_mb"), " MB"),
        ("trie build (wall)", ("trie", "trie_build_s"), " s"),
        ("trie build (CPU)", ("trie", "trie_build_cpu_s"), " s"),
        ("trie-building process peak RSS", ("trie", "peak_rss_mb"), " MB"),
        ("trie nodes", ("trie", "trie_nodes"), ""),
        ("trie arrays in memory", ("trie", "trie_memory_mb"), " MB"),
        ("trie file", ("trie", "trie_file_mb"), " MB"),
        ("pipeline save (`nlp.to_disk`)", ("save", "save_s"), " s"),
        ("pipeline load, `spacy.load` (wall)", ("load", "load_s"), " s"),
        ("pipeline load (CPU)", ("load", "load_cpu_s"), " s"),
        ("imports before loading (wall)", ("load", "import_s"), " s"),
        ("RSS after load", ("load", "rss_loaded_mb"), " MB"),
        ("RSS added by loading (after load - before)", ("added", "load"), " MB"),
        ("of which pages of the mapped KB and trie files", ("load", "mapped_loaded_mb"), " MB"),
        ("RSS after linking 40 mentions", ("load", "rss_linked_mb"), " MB"),
        ("of which pages of the mapped files", ("load", "mapped_linked_mb"), " MB"),
        ("peak RSS, load + link process", ("load", "peak_rss_mb"), " MB"),
        ("scispacy: index build (vectorizer + HNSW, wall)", ("scispacy_build", "wall_s"), " s"),
        ("scispacy: index build (CPU)", ("scispacy_build", "cpu_s"), " s"),
        ("scispacy: build peak RSS", ("scispacy_build", "peak_rss_mb"), " MB"),
        ("scispacy: load (wall)", ("scispacy_load", "load_s"), " s"),
        ("scispacy: load (CPU)", ("scispacy_load", "load_cpu_s"), " s"),
        ("scispacy: imports before loading (wall)", ("scispacy_load", "import_s"), " s"),
        ("scispacy: RSS after load", ("scispacy_load", "rss_loaded_mb"), " MB"),
        ("scispacy: RSS added by loading", ("added", "scispacy_load"), " MB"),
        ("scispacy: peak RSS, load + link process", ("scispacy_load", "peak_rss_mb"), " MB"),
    ]
    head = "| figure | " + " | ".join(f"{_tag(r['names_generated'])} ({r['kb_format']})" for r in records) + " |"
    lines = [head, "|---|" + "---|" * len(records)]
    for label, path, unit in rows:
        if any(cell(r, *path) != "-" for r in records):
            lines.append(f"| {label} | " + " | ".join(cell(r, *path, unit=unit) for r in records) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["step"]:
        result = STEPS[argv[1]](**json.loads(argv[2]))
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--work", type=Path, default=Path("/tmp/kbscale"))
    parser.add_argument("--stats", type=Path, help="synth_kb.py fit output (fitted into --work when absent)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kb-format", choices=["safetensors", "jsonl"], default="safetensors")
    parser.add_argument(
        "--scispacy-max", type=int, default=0, help="also measure scispacy's linker up to this many names"
    )
    parser.add_argument("--out", type=Path, help="JSON results")
    parser.add_argument("--table", type=Path, nargs="+", help="only print the table of earlier JSON results")
    parser.add_argument("--load-only", action="store_true", help="measure loading the pipelines of --out's runs again")
    args = parser.parse_args(argv)
    if args.table:
        records = [r for path in args.table for r in json.loads(path.read_text())["runs"]]
        print(table(records))
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    stats = args.stats or args.work / "umls_like.json"
    log = args.work / "kb_scale.log"
    if not stats.exists():
        run_command([sys.executable, str(HERE / "synth_kb.py"), "fit", "--out", str(stats)], log)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB",
        "seed": args.seed,
        "runs": [],
    }
    earlier = {r["names_generated"]: r for r in json.loads(args.out.read_text())["runs"]} if args.load_only else {}
    for size in args.sizes:
        record = measure(
            size,
            args.work,
            stats,
            args.seed,
            args.kb_format,
            size <= args.scispacy_max,
            log,
            only_load=earlier.get(size, {"names_generated": size, "kb_format": args.kb_format})
            if args.load_only
            else None,
        )
        result["runs"].append(record)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2))
        print(json.dumps(record), file=sys.stderr)
    print(table(result["runs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
