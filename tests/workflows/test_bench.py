"""The benchmark scripts parse, and refuse what they do not know, without running anything heavy."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench_module(script: str, name: str):
    """A bench script imported as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_variants_and_ablations_reject_unknown_names(tmp_path):
    bad = subprocess.run(
        ["bash", str(BENCH / "variants.sh"), "medmentions", str(tmp_path)], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown corpus" in bad.stderr
    usage = subprocess.run(["bash", str(BENCH / "ablations.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "Table 4" in usage.stdout
    bad = subprocess.run(
        ["bash", str(BENCH / "ablations.sh"), "run", "nonsense"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)},
    )
    assert bad.returncode == 2 and "unknown variant" in bad.stderr


def test_ablation_table_reads_results(tmp_path):
    for name, r1 in (("run_tfidf", 0.85), ("run_tfidf_seed1", 0.84), ("run_no-pretrain-no-prompt", 0.1)):
        run = tmp_path / name
        run.mkdir()
        (run / "result.json").write_text(
            '{"step": 400, "seconds": 900.4, "evaluations": '
            f'[{{"step": 400, "eval": {{"recall@1": {r1}, "recall@5": 0.9}}}}]}}'
        )
    out = subprocess.run(
        ["bash", str(BENCH / "ablations.sh"), "table"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"], "OUT": str(tmp_path)},
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "variant" not in line]
    assert rows == [
        "| tfidf | 0 | 400 | 0.8500 | 0.9000 | 900 |",
        "| tfidf | 1 | 400 | 0.8400 | 0.9000 | 900 |",
        "| no-pretrain-no-prompt | 0 | 400 | 0.1000 | 0.9000 | 900 |",
    ]


def test_shortcut_sweep_replays_the_component_rule(tmp_path):
    import sys

    sys.path.insert(0, str(BENCH))
    try:
        import shortcut_sweep
    finally:
        sys.path.remove(str(BENCH))
    from spacy_genbioel.evaluation.report import write_predictions
    from spacy_genbioel.ty import Candidate, Mention

    mentions = [
        Mention("a", ("A",), doc_id="1", start=0, end=1),
        Mention("b", ("B",), doc_id="1", start=2, end=3),
        Mention("c", ("-1",), doc_id="2", start=0, end=1),
    ]
    retrieved = [[Candidate(("A",), "a", 0.95)], [Candidate(("X",), "x", 0.7), Candidate(("B",), "b", 0.6)], []]
    generated = [[Candidate(("Y",), "y", -0.1), Candidate(("A",), "a", -0.5)], [Candidate(("B",), "b", -0.2)], []]
    write_predictions(tmp_path / "r.jsonl", mentions, retrieved)
    write_predictions(tmp_path / "g.jsonl", mentions, generated)
    rows = shortcut_sweep.sweep(tmp_path / "r.jsonl", tmp_path / "g.jsonl", [None, 0.9, 0.5])
    assert [(r["shortcut"], r["recall@1"], r["recall@5"], r["mentions"]) for r in rows] == [
        (0, 0.5, 1.0, 2),
        (1, 1.0, 1.0, 2),
        (2, 0.5, 1.0, 2),
    ]
    assert shortcut_sweep.combine(retrieved[0], generated[0], 0.9)[0] == [retrieved[0][0], generated[0][0]]
    write_predictions(tmp_path / "other.jsonl", mentions[::-1], generated)
    with pytest.raises(ValueError, match="different mentions"):
        shortcut_sweep.sweep(tmp_path / "r.jsonl", tmp_path / "other.jsonl", [None])


def test_annotate_scale_writes_both_formats_repeats_under_new_ids_and_projects_linearly(tmp_path):
    import gzip
    import sys

    sys.path.insert(0, str(BENCH))
    try:
        import annotate_scale
    finally:
        sys.path.remove(str(BENCH))
    (tmp_path / "bc5cdr").mkdir()
    (tmp_path / "ncbi_disease").mkdir()
    splits = (
        ("bc5cdr/CDR_TrainingSet.PubTator.txt", (1, 2)),
        ("bc5cdr/CDR_DevelopmentSet.PubTator.txt", (3,)),
        ("ncbi_disease/NCBItrainset_corpus.txt", (2, 4)),  # PMID 2 is in both: once
    )
    for name, pmids in splits:
        (tmp_path / name).write_text(
            "".join(f"{p}|t|Title {p} & co\n{p}|a|Abstract {p} <b>.\n{p}\t0\t5\tTitle\tDisease\tD1\n\n" for p in pmids)
        )
    docs = annotate_scale.abstracts(annotate_scale.data_dir(str(tmp_path)), 6)
    assert [d[0] for d in docs] == ["1", "2", "3", "4", "90000004", "90000005"]
    assert docs[4][1:] == docs[0][1:] and docs[5][1:] == docs[1][1:]  # repeated in order, under new IDs
    inputs = annotate_scale.write_inputs(docs, tmp_path / "inputs")
    assert [p.name for p in inputs] == ["abstracts.pubtator", "pubmed.xml.gz"]
    from spacy_genbioel.annotate.readers import safe_records

    read = [r for path, fmt in zip(inputs, ("pubtator", "pubmed")) for r in safe_records(path, fmt)]
    assert [(r.doc_id, r.text) for r in read] == [(i, f"{t} {a}") for i, t, a in docs]
    assert "&amp;" in gzip.open(inputs[1], "rt").read()  # escaped in the XML
    command = annotate_scale.run_command("fork-2", inputs, tmp_path / "p", tmp_path / "o", 50, 8)
    assert command[-2:] == ["--n-process", "2"] and annotate_scale.cores("fork-2") == 2
    assert annotate_scale.run_command("ray-2", inputs, tmp_path / "p", tmp_path / "o", 50, 8)[-4:-2] == [
        "--engine",
        "ray",
    ]
    with pytest.raises(SystemExit, match="unknown run"):
        annotate_scale.run_command("threads-4", inputs, tmp_path / "p", tmp_path / "o", 50, 8)
    run = {"run": "fork-2", "cores": 2, "documents": 100, "mentions": 1000, "seconds": 10.0}
    plan = annotate_scale.projection(run, 800.0, 10.0)  # 5 documents/s per core
    assert plan["cpu_hours_by_cores"]["1"] == 2000.0 and plan["cpu_hours_by_cores"]["16"] == 125.0
    assert plan["gpu_hours_by_gpus_linker_only"]["8"] == 15.6  # 36M abstracts x 10 mentions / (8 x 800/s) in hours
    assert annotate_scale.pick([{"run": "local-1t"}, run], "") is run
    with pytest.raises(SystemExit, match="no bc5cdr"):
        annotate_scale.data_dir(str(tmp_path / "nowhere"))


# -- bench/crossfit.sh, bench/aap.sh, bench/folds_report.py, bench/cascade_folds.py: wrappers of the package's commands
# (crossfit, crossfit-folds, folds-report, cascade-folds-report; tests/training/test_crossfit.py tests what they run)
def _wrapper_call(tmp_path, script: str, *args: str, **env) -> list:
    """The one CLI call ``bench/SCRIPT ARGS`` makes, recorded instead of run (the script's ``G``),
    as a list of words."""
    log = tmp_path / "calls.log"
    recorder = tmp_path / "record.sh"
    recorder.write_text('for word in "$@"; do printf "%s\\n" "$word"; done > "$CALLS"\n')
    clean = {
        k: v for k, v in os.environ.items() if k not in ("DATA", "OUT", "K", "FOLD", "FOLDS", "BEAMS", "SEED", "JOBS")
    }
    run = subprocess.run(
        ["bash", str(BENCH / script), *args],
        capture_output=True,
        text=True,
        cwd=BENCH.parent,
        env={**clean, "G": f"bash {recorder}", "CALLS": str(log), **env},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return log.read_text().splitlines()


def _parses(words: list) -> None:
    """The words are a call the package's command line takes (parsed, not run)."""
    import typer.main

    from spacy_genbioel.cli import app

    command = typer.main.get_command(app).commands[words[0]]
    command.make_context(words[0], list(words[1:]))


def test_crossfit_wrapper_passes_the_scripts_arguments_and_environment(tmp_path):
    call = _wrapper_call(
        tmp_path,
        "crossfit.sh",
        "bc5cdr",
        "score",
        "D",
        "-",
        "-",
        "-",
        "2",
        K="3",
        VARIANTS="plain",
        FORCED="0",
        FOLD="0 1",
        OUT="o",
        ANCHOR="genbioel:retrieval",
        L2="0.1",
    )
    assert call == [
        "crossfit",
        "score",
        "--corpus",
        "bc5cdr",
        "--data-dir",
        "D",
        "--beams",
        "2",
        "--k",
        "3",
        "--out",
        "o",
        "--variants",
        "plain",
        "--anchor",
        "genbioel:retrieval",
        "--l2",
        "0.1",
        "--fold",
        "0",
        "--fold",
        "1",
        "--no-forced",
    ]
    _parses(call)
    call = _wrapper_call(tmp_path, "crossfit.sh", "ncbi", "train", "../shared/data", "tiny", "1200", "600")
    assert call == [
        "crossfit",
        "train",
        "--corpus",
        "ncbi",
        "--data-dir",
        "../shared/data",
        "--preset",
        "tiny",
        "--seconds",
        "1200",
        "--rescnn-seconds",
        "600",
    ]
    _parses(call)
    usage = subprocess.run(["bash", str(BENCH / "crossfit.sh"), "ncbi"], capture_output=True, text=True)
    assert usage.returncode != 0 and "usage" in usage.stderr


def test_aap_wrapper_passes_the_scripts_environment(tmp_path):
    call = _wrapper_call(
        tmp_path,
        "aap.sh",
        "cascade",
        "D",
        FOLDS="1 3",
        FOLDS_FIT="0 1 2 3",
        METRICS="m",
        EXTRA_ROWS=",x_loss",
        FINETUNE_STEPS="300",
        JOBS="1",
        ANCHOR="genbioel:retrieval",
        L2="0.1",
    )
    assert call == [
        "crossfit-folds",
        "cascade",
        "--data-dir",
        "D",
        "--folds",
        "1 3",
        "--folds-fit",
        "0 1 2 3",
        "--jobs",
        "1",
        "--finetune-steps",
        "300",
        "--metrics",
        "m",
        "--extra-rows",
        ",x_loss",
        "--anchor",
        "genbioel:retrieval",
        "--l2",
        "0.1",
    ]
    _parses(call)
    # MAX_RECALL_LOSS set but empty: the precision-targeted cascade alone
    call = _wrapper_call(tmp_path, "aap.sh", "cascade", MAX_RECALL_LOSS="")
    assert call == ["crossfit-folds", "cascade", "--max-recall-loss", "none"]
    _parses(call)


@pytest.mark.parametrize(
    "script, command", [("folds_report.py", "folds-report"), ("cascade_folds.py", "cascade-folds-report")]
)
def test_report_wrappers_run_the_package_commands(monkeypatch, script, command):

    module = _bench_module(script, script[:-3])
    calls = []
    monkeypatch.setattr(module, "app", lambda args, prog_name: calls.append(args))
    module.main(["metrics", "--json", "x.json"])
    assert calls == [[command, "metrics", "--json", "x.json"]]
    _parses(calls[0])


# -- bench/bart_large.py: a BART-large linker measured (issue 27, item 4) ---------------------------------------------
def _bart_large():

    module = _bench_module("bart_large.py", "bart_large")
    return module


def _micro_data(root: Path, n_docs: int = 3) -> Path:
    """A data folder of the layout bench/bart_large.py reads: a MEDIC file and NCBI-disease train and dev."""
    from conftest import random_kb

    kb = list(random_kb(0, n_concepts=30))
    (root / "vocab").mkdir(parents=True)
    (root / "vocab" / "medic_06Jul2012.txt").write_text(
        "".join(f"{c.id}||{'|'.join(c.names)}\n" for c in kb), encoding="utf8"
    )
    (root / "ncbi_disease").mkdir()
    for split, offset in (("trainset", 0), ("developset", 10)):
        docs = []
        for d in range(n_docs):
            concepts = [kb[(offset + 3 * d + k) % 30] for k in range(3)]
            title, mentions = "Patients with", []
            for c in concepts:
                start = len(title) + 1
                title = f"{title} {c.names[0]} and"
                mentions.append(f"{100 + d}\t{start}\t{start + len(c.names[0])}\t{c.names[0]}\tDiseaseClass\t{c.id}\n")
            docs.append(f"{100 + d}|t|{title} others.\n{100 + d}|a|They were treated.\n{''.join(mentions)}\n")
        (root / "ncbi_disease" / f"NCBI{split}_corpus.txt").write_text("".join(docs), encoding="utf8")
    return root


def _args_error(module, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit:
        module.parse_args(argv)
    assert exit.value.code == 2
    return capsys.readouterr().err


def test_bart_large_arguments_are_checked_before_anything_runs(tmp_path, capsys):
    from conftest import MICRO

    module = _bart_large()
    data = _micro_data(tmp_path / "data")
    base = ["--data-dir", str(data), "--skip-mesh"]
    args = module.parse_args(base)
    assert (args.routes, args.dtypes, args.threads, args.mentions) == (
        ["component", "annotate"],
        ["fp32", "int8"],
        [1, 2],
        24,
    )
    assert args.preset["d_model"] == 1024 and args.vocab_size == 50265 and args.settings == {}
    assert [(c["route"], c["dtype"], c["threads"]) for c in module.configurations(args)][:3] == [
        ("component", "fp32", 1),
        ("component", "fp32", 2),
        ("component", "int8", 1),
    ]
    micro = json.dumps(dataclasses.asdict(MICRO))
    args = module.parse_args(
        base
        + [
            "--preset",
            micro,
            "--threads",
            "2,1,2",
            "--routes",
            "annotate",
            "--setting",
            "decoding.batch_size=16",
            "--setting",
            "num_beams=3",
        ]
    )
    assert args.preset == dataclasses.asdict(MICRO) and args.vocab_size == MICRO.vocab_size and args.threads == [2, 1]
    assert args.settings == {"decoding.batch_size": 16, "num_beams": 3}
    assert "unknown gpu" in _args_error(module, base + ["--routes", "component,gpu"], capsys)
    assert "choose from fp32, int8, bf16" in _args_error(module, base + ["--dtypes", "fp16"], capsys)
    assert "at least 1" in _args_error(module, base + ["--threads", "0"], capsys)
    assert "at least 1" in _args_error(module, base + ["--mentions", "0"], capsys)
    assert "a preset (tiny, base, large)" in _args_error(module, base + ["--preset", "huge"], capsys)
    assert "sets dtype and device itself" in _args_error(module, base + ["--setting", "dtype=int8"], capsys)
    assert "decoding.beams" in _args_error(module, base + ["--setting", "decoding.beams=3"], capsys)
    assert "KEY=VALUE" in _args_error(module, base + ["--setting", "batch_size"], capsys)
    # without --skip-mesh the CTD and MeSH files must be there; nothing is built before that is known
    err = _args_error(module, ["--data-dir", str(data)], capsys)
    assert "vocab/CTD_diseases_2017.tsv.gz" in err and "--skip-mesh" in err
    assert "ncbi_disease/NCBIdevelopset_corpus.txt" in _args_error(
        module, ["--data-dir", str(tmp_path), "--skip-mesh"], capsys
    )


def test_bart_large_table_shows_failed_configurations():
    module = _bart_large()
    report = {
        "date": "2026-01-01 00:00 UTC",
        "model": {"parameters": 406_291_456, "model_vocab": 50265},
        "machine": {
            "cpu": "CPU",
            "usable_cores": 2,
            "memory_gib": 24.0,
            "versions": {k: "1" for k in ("torch", "transformers", "spacy", "spacy_genbioel", "python")},
        },
        "setup": {"kb_medic": {"wall_s": 1.0, "cpu_s": 1.0, "peak_rss_mb": 300.0, "concepts": 14942, "names": 71884}},
        "tries": {
            "medic": {
                "names": 71884,
                "nodes": 216170,
                "build_s": 0.98,
                "peak_rss_mb": 377.3,
                "build_rss_growth_mb": 34.9,
                "arrays_mb": 5.8,
                "file_mb": 5.8,
            }
        },
        "runs": [
            {
                "route": "component",
                "dtype": "int8",
                "threads": 1,
                "mentions": 24,
                "mentions_per_s": 0.9,
                "load_s": 14.0,
                "genbioel_load_s": 4.0,
                "peak_rss_mb": 3900.0,
                "wall_s": 60.0,
            },
            {
                "route": "annotate",
                "dtype": "fp32",
                "threads": 2,
                "error": "timed out after 1800 s",
                "peak_rss_mb": 3800.0,
                "wall_s": 1800.0,
            },
        ],
    }
    table = module.markdown(report)
    assert "406,291,456 parameters, vocabulary 50,265" in table
    assert "| medic | 71,884 | 216,170 | 0.98 | 377.3 | 34.9 | 5.8 | 5.8 |" in table
    assert "| component | int8 | 1 | 24 | 0.90 | 14.00 (4.00) | 3,900.0 | 60.0 |" in table
    assert "| annotate | fp32 | 2 | timed out after 1800 s |" in table


def test_bart_large_micro_run_measures_both_routes(tmp_path):
    """The whole script end to end on a micro model and KB (the large shape only on request)."""
    from conftest import MICRO

    data = _micro_data(tmp_path / "data")
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bart_large.py"),
            "--data-dir",
            str(data),
            "--work",
            str(tmp_path / "work"),
            "--json",
            str(tmp_path / "report.json"),
            "--preset",
            json.dumps(dataclasses.asdict(MICRO)),
            "--mentions",
            "4",
            "--warmup",
            "1",
            "--routes",
            "component",
            "--dtypes",
            "int8",
            "--threads",
            "1",
            "--skip-mesh",
            "--setting",
            "decoding.batch_size=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["model"]["model_vocab"] == MICRO.vocab_size and report["arguments"]["settings"] == {
        "decoding.batch_size": 2
    }
    assert set(report["setup"]) == {"kb_medic", "model", "package"} and report["setup"]["kb_medic"]["concepts"] == 30
    trie = report["tries"]["medic"]
    assert trie["same_as_pipeline_trie"] and trie["file_mb"] >= 0 and trie["peak_rss_mb"] > 0
    (component,) = report["runs"]
    assert (component["route"], component["dtype"], component["threads"]) == ("component", "int8", 1)
    assert component["mentions"] == 4 and component["with_candidates"] == 4 and component["torch_threads"] == 1
    assert (
        component["mentions_per_s"] > 0
        and component["peak_rss_mb"] > 0
        and component["load_s"] >= component["genbioel_load_s"] > 0
    )
    assert {"encoder", "decoder", "trie"} <= set(component["stages_s"]) and component["decoder_calls"] > 0
    assert "| component | int8 | 1 | 4 |" in out.stdout
    assert "component_int8_1t: " in out.stderr and (tmp_path / "work" / "logs" / "component_int8_1t.log").exists()
    # --reuse keeps what the first run built and runs the linking alone: here through annotate
    again = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bart_large.py"),
            "--data-dir",
            str(data),
            "--work",
            str(tmp_path / "work"),
            "--preset",
            json.dumps(dataclasses.asdict(MICRO)),
            "--mentions",
            "4",
            "--routes",
            "annotate",
            "--dtypes",
            "fp32",
            "--threads",
            "1",
            "--skip-mesh",
            "--reuse",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads(again.stdout[: again.stdout.index("\n}\n") + 2])
    assert all(step["reused"] for step in summary["setup"].values())
    (annotate,) = summary["runs"]
    assert (annotate["route"], annotate["dtype"], annotate["documents"]) == ("annotate", "fp32", 2)
    assert annotate["mentions"] > 0 and annotate["mentions_per_s"] > 0 and annotate["peak_rss_mb"] > 0
    assert "| annotate | fp32 | 1 |" in again.stdout


def test_bart_large_stops_with_a_report_when_a_set_up_step_fails(tmp_path):
    data = _micro_data(tmp_path / "data")
    (data / "vocab" / "medic_06Jul2012.txt").write_text("D0001 no separator here\n", encoding="utf8")
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH / "bart_large.py"),
            "--data-dir",
            str(data),
            "--work",
            str(tmp_path / "work"),
            "--skip-mesh",
            "--json",
            str(tmp_path / "report.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["error"].startswith("kb_medic failed: exit status 1") and "'||'" in report["error"]
    assert report["runs"] == [] and "**Stopped**: kb_medic failed" in out.stdout
    assert (tmp_path / "work" / "logs" / "kb_medic.log").exists() and not (tmp_path / "work" / "model").exists()


def test_rescnn_bench_rows_carry_their_settings():

    module = _bench_module("rescnn.py", "rescnn_bench")
    assert module.parse_row("rescnn") == ("rescnn", {})
    assert module.parse_row("rescnn/sparse_weight=0/index=faiss") == ("rescnn", {"sparse_weight": 0, "index": "faiss"})
    assert module.parse_row("dense/index=faiss/batch_size=64") == ("dense", {"index": "faiss", "batch_size": 64})
    with pytest.raises(SystemExit, match="key=value"):
        module.parse_row("rescnn/faiss")


def test_cascade_bench_variants_name_their_rows():
    import argparse

    module = _bench_module("cascade.py", "cascade_bench")
    assert module.variant("rescnn=f.json,c.json") == ("rescnn", "f.json", "c.json", 0)
    assert module.variant("b2=f.json,c.json,2") == ("b2", "f.json", "c.json", 2)
    for bad in ("rescnn=f.json", "b2=f.json,c.json,two"):
        with pytest.raises(argparse.ArgumentTypeError, match="LABEL=FUSION"):
            module.variant(bad)
    narrow = module.rows("f.json", "c.json", "b2", 2)
    assert narrow["cascade_b2"]["reranker.generator_beams"] == narrow["fusion_b2"]["reranker.generator_beams"] == 2
    base, other = module.rows("f.json", "c.json"), module.rows("g.json", "d.json", "rescnn")
    assert "generator" in base and "generator_rescnn" not in other
    assert sorted(other) == sorted(f"{name}_rescnn" for name in base if not name.startswith("generator"))
    assert other["cascade_rescnn"] == {**base["cascade"], "reranker.fusion": "d.json"}
    # the rows as before mixed prompt batches: the same settings, a decoder batch per prompt length
    assert base["cascade_grouped"] == {**base["cascade"], "decoding.mixed_prompts": False}
    assert other["cascade_grouped_rescnn"] == {**other["cascade_rescnn"], "decoding.mixed_prompts": False}
    assert "generator_grouped" in base and "generator_grouped_rescnn" not in other
    assert other["fusion_rescnn"]["reranker.fusion"] == "g.json"
    # the generator's forced ranking alone: no fusion, no cascade, the retrieved names scored
    alone = base["forced_alone"]
    assert (alone["decoding.search"], alone["reranker.cascade"], alone["reranker.fusion"]) == ("forced", "off", None)


def test_name_cache_bench_encodes_only_the_names_the_derived_kb_adds(tmp_path):

    from spacy_genbioel.kb.base import Concept, KnowledgeBase

    module = _bench_module("name_cache.py", "name_cache_bench")
    base = KnowledgeBase([Concept("D1", ["heart attack", "myocardial infarction"]), Concept("D2", ["renal failure"])])
    derived = KnowledgeBase([*base, Concept("D3", ["lung disease"])])
    base.to_jsonl(tmp_path / "base.jsonl")
    derived.to_jsonl(tmp_path / "derived.jsonl")
    result = module.main(
        [
            "--base",
            str(tmp_path / "base.jsonl"),
            "--derived",
            str(tmp_path / "derived.jsonl"),
            "--full",
            "--out",
            str(tmp_path / "out.json"),
        ]
    )  # MiniLM as installed, offline
    rows = result["rows"]["dense"]
    assert (rows["base"]["rows_encoded"], rows["derived"]["rows_reused"], rows["derived"]["rows_encoded"]) == (3, 3, 1)
    assert rows["derived_full"]["rows_encoded"] == 4 and result["shared_names"] == 3
    assert json.loads((tmp_path / "out.json").read_text())["rows"] == result["rows"]


# -- bench/abbreviation_audit.py: what the character-level short-form pass adds ---------------------------------------
def test_abbreviation_audit_lists_what_the_pass_adds(tmp_path):
    pytest.importorskip("scispacy")

    module = _bench_module("abbreviation_audit.py", "abbreviation_audit")
    title = "Ataxia-telangiectasia (A-T) and cystic fibrosis (CF)."
    abstract = "A-T and CF patients. The disorder. Myotonic dystrophy (MDX) is not here."
    text = f"{title} {abstract}"
    at, cf = text.index("A-T", 30), text.index("CF", 60)
    rows = [f"1\t{at}\t{at + 3}\tA-T\tDisease\tD001260", f"1\t{cf}\t{cf + 2}\tCF\tDisease\tD003550"]
    (tmp_path / "c.txt").write_text(f"1|t|{title}\n1|a|{abstract}\n" + "\n".join(rows) + "\n\n")
    (tmp_path / "kb.jsonl").write_text(json.dumps({"id": "D001260", "names": ["Ataxia Telangiectasia"]}) + "\n")
    report = module.audit(tmp_path / "c.txt", module.first_names(tmp_path / "kb.jsonl"), top=10)
    assert report["mentions"] == 2 and report["expanded_by_detector"] == 1 and report["expanded_now"] == 2
    assert report["added"] == [
        {"count": 1, "mention": "A-T", "long_form": "Ataxia-telangiectasia", "gold": "Ataxia Telangiectasia"}
    ]


# -- bench/generator_ranking_report.py: halves pooled per name, deferred mentions of one cascade -----------------------
def _half(path: Path, cascade_path, cascade_rank, forced_rank, retrieval_rank) -> None:
    def row(ranks, paths=None):
        return {"per_mention": {"rank": ranks, "path": paths or ["forced"] * len(ranks)}, "cpu_seconds": 1.0}

    rows = {
        "cascade": row(cascade_rank, cascade_path),
        "forced_alone": row(forced_rank),
        "retrieval_only": row(retrieval_rank),
    }
    path.write_text(json.dumps({"mentions": len(cascade_rank), "rows": rows}))


def test_generator_ranking_report_pools_every_named_pair(tmp_path):
    # ft defers the second mention of each half; crossfit (a name the script does not know) the first
    for i in (0, 1):
        _half(tmp_path / f"half{i}_ft.json", ["early", "forced"], [1, 0], [1, 1], [1, 2])
        _half(tmp_path / f"half{i}_crossfit.json", ["forced", "early"], [1, 1], [2, 1], [1, 0])
    (tmp_path / "half0_lonely.json").write_text("{}")  # one half only: not pooled
    script = [sys.executable, str(BENCH / "generator_ranking_report.py"), str(tmp_path)]
    out = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "4 mentions, 2 deferred by ft's cascade"
    assert "crossfit cascade" in out and "lonely" not in out
    lines = {tuple(line.split()[:2]): line for line in out.splitlines()[1:]}
    assert "recall@1 1.0000  deferred 1.0000" in lines[("crossfit", "cascade")]
    assert "recall@1 0.5000  deferred 0.0000" in lines[("ft", "cascade")]
    assert "'only forced first': 2" in lines[("ft", "deferred,")]
    by = subprocess.run([*script, "--deferred-by", "crossfit"], capture_output=True, text=True, check=True).stdout
    assert by.splitlines()[0] == "4 mentions, 2 deferred by crossfit's cascade"
    empty = tmp_path / "empty"
    empty.mkdir()
    failed = subprocess.run(script[:2] + [str(empty)], capture_output=True, text=True)
    assert failed.returncode == 2 and "no half0_<name>.json and half1_<name>.json pair" in failed.stderr


def test_generator_ranking_report_classes_the_deferred_errors(tmp_path):
    # every mention deferred; the halves record what each mention was (bench/cascade.py's mention_text)
    texts = [["Ro15-1788", "CY"], ["dilevalol", "heart damage"]]
    golds = [[["D005442"], ["D003520"]], [["D007741"], ["D006331", "D009202"]]]
    for i in (0, 1):
        path = tmp_path / f"half{i}_ft.json"
        _half(path, ["forced", "beam"], [1, 0], [1, 0], [0, 2] if i == 0 else [0, 0])
        report = json.loads(path.read_text())
        path.write_text(json.dumps({**report, "mention_text": texts[i], "mention_gold": golds[i]}))
    module = _bench_module("generator_ranking_report.py", "ranking_report")
    assert [module.error_class(t, g) for t, g in zip(texts[0] + texts[1], golds[0] + golds[1])] == [
        "code or formula (letters and digits)",
        "short form left",
        "one word",
        "composite (several gold IDs)",
    ]
    assert module.error_class("heart damage", ["D006331"]) == "phrase"
    out = subprocess.run(
        [sys.executable, str(BENCH / "generator_ranking_report.py"), str(tmp_path)], capture_output=True, text=True
    ).stdout
    assert "error classes of the 4 deferred (ft)" in out
    lines = {line.split("  {")[0].strip(): line for line in out.splitlines() if line.startswith("  ")}
    assert "'mentions': 1, 'cascade first': 0, 'forced_alone first': 0" in lines["short form left"]
    assert "'retrieval_only first': 0, 'gold in no top 5': 0" in lines["short form left"]  # retrieval ranks it 2nd
    assert "'gold in no top 5': 1" in lines["composite (several gold IDs)"]
    assert "'cascade first': 1" in lines["one word"]
