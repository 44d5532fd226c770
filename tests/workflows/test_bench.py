"""The benchmark scripts parse, and refuse what they do not know, without running anything heavy."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", sorted(BENCH.glob("*.sh")), ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_variants_and_ablations_reject_unknown_names(tmp_path):
    bad = subprocess.run(["bash", str(BENCH / "variants.sh"), "medmentions", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown corpus" in bad.stderr
    usage = subprocess.run(["bash", str(BENCH / "ablations.sh")], capture_output=True, text=True)
    assert usage.returncode == 2 and "Table 4" in usage.stdout
    bad = subprocess.run(["bash", str(BENCH / "ablations.sh"), "run", "nonsense"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert bad.returncode == 2 and "unknown variant" in bad.stderr


def test_ablation_table_reads_results(tmp_path):
    for name, r1 in (("run_tfidf", 0.85), ("run_tfidf_seed1", 0.84), ("run_no-pretrain-no-prompt", 0.1)):
        run = tmp_path / name
        run.mkdir()
        (run / "result.json").write_text('{"step": 400, "seconds": 900.4, "evaluations": '
                                         f'[{{"step": 400, "eval": {{"recall@1": {r1}, "recall@5": 0.9}}}}]}}')
    out = subprocess.run(["bash", str(BENCH / "ablations.sh"), "table"], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "OUT": str(tmp_path)})
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "variant" not in line]
    assert rows == ["| tfidf | 0 | 400 | 0.8500 | 0.9000 | 900 |", "| tfidf | 1 | 400 | 0.8400 | 0.9000 | 900 |",
                    "| no-pretrain-no-prompt | 0 | 400 | 0.1000 | 0.9000 | 900 |"]


def test_shortcut_sweep_replays_the_component_rule(tmp_path):
    import sys

    sys.path.insert(0, str(BENCH))
    try:
        import shortcut_sweep
    finally:
        sys.path.remove(str(BENCH))
    from spacy_genbioel.evaluation.report import write_predictions
    from spacy_genbioel.ty import Candidate, Mention

    mentions = [Mention("a", ("A",), doc_id="1", start=0, end=1), Mention("b", ("B",), doc_id="1", start=2, end=3),
                Mention("c", ("-1",), doc_id="2", start=0, end=1)]
    retrieved = [[Candidate(("A",), "a", 0.95)], [Candidate(("X",), "x", 0.7), Candidate(("B",), "b", 0.6)], []]
    generated = [[Candidate(("Y",), "y", -0.1), Candidate(("A",), "a", -0.5)], [Candidate(("B",), "b", -0.2)], []]
    write_predictions(tmp_path / "r.jsonl", mentions, retrieved)
    write_predictions(tmp_path / "g.jsonl", mentions, generated)
    rows = shortcut_sweep.sweep(tmp_path / "r.jsonl", tmp_path / "g.jsonl", [None, 0.9, 0.5])
    assert [(r["shortcut"], r["recall@1"], r["recall@5"], r["mentions"]) for r in rows] == [
        (0, 0.5, 1.0, 2), (1, 1.0, 1.0, 2), (2, 0.5, 1.0, 2)]
    assert shortcut_sweep.combine(retrieved[0], generated[0], 0.9)[0] == [retrieved[0][0], generated[0][0]]
    write_predictions(tmp_path / "other.jsonl", mentions[::-1], generated)
    with pytest.raises(ValueError, match="different mentions"):
        shortcut_sweep.sweep(tmp_path / "r.jsonl", tmp_path / "other.jsonl", [None])


def test_annotate_scale_reads_bc5cdr_in_order_and_projects_linearly(tmp_path):
    import sys

    sys.path.insert(0, str(BENCH))
    try:
        import annotate_scale
    finally:
        sys.path.remove(str(BENCH))
    (tmp_path / "bc5cdr").mkdir()
    for name, pmids in (("CDR_TrainingSet.PubTator.txt", (1, 2)), ("CDR_DevelopmentSet.PubTator.txt", (3, 4))):
        (tmp_path / "bc5cdr" / name).write_text("".join(f"{p}|t|Title {p}\n{p}|a|Abstract {p}.\n{p}\t0\t5\tTitle\tDisease\tD1\n\n"
                                                        for p in pmids))
    n = annotate_scale.write_abstracts(annotate_scale.data_dir(str(tmp_path)), 3, tmp_path / "a.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert n == 3 and lines == [{"id": str(p), "title": f"Title {p}", "abstract": f"Abstract {p}."} for p in (1, 2, 3)]
    run = {"run": "ray-1", "documents": 100, "mentions": 2000, "seconds": 100.0, "documents_per_s": 1.0}
    plan = annotate_scale.projection(run, 800.0, 10.0)  # 20 mentions/s per CPU worker
    assert plan["cpu_hours_by_workers"]["1"] == 5000.0 and plan["cpu_hours_by_workers"]["16"] == 312.5
    assert plan["gpu_hours_by_workers_decoder_only"]["8"] == 15.6  # 36M abstracts x 10 mentions / (8 x 800/s) in hours
    with pytest.raises(SystemExit, match="no bc5cdr"):
        annotate_scale.data_dir(str(tmp_path / "nowhere"))


def test_crossfit_and_aap_scripts_reject_unknown_stages(tmp_path):
    bad = subprocess.run(["bash", str(BENCH / "crossfit.sh"), "medmentions", "train"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown corpus" in bad.stderr
    bad = subprocess.run(["bash", str(BENCH / "aap.sh"), "nonsense"], capture_output=True, text=True,
                         env={**os.environ, "OUT": str(tmp_path)})
    assert bad.returncode == 2 and "unknown stage" in bad.stderr


def _aap_calls(tmp_path, stage: str, **env) -> list:
    """The CLI calls ``bench/aap.sh STAGE`` makes, recorded instead of run (the script's ``G``), one list of words each."""
    log = tmp_path / "calls.log"
    recorder = tmp_path / "record.sh"
    recorder.write_text('printf "%s\\n" "$*" >> "$CALLS"\n')
    run = subprocess.run(["bash", str(BENCH / "aap.sh"), stage, str(tmp_path / "data")], capture_output=True, text=True,
                         cwd=BENCH.parent, env={**os.environ, "G": f"bash {recorder}", "CALLS": str(log),
                                                "OUT": str(tmp_path / "aap"), "JOBS": "1", **env})
    assert run.returncode == 0, run.stdout + run.stderr
    return [line.split() for line in log.read_text().splitlines()]


def test_aap_folds_give_the_device_to_the_generator_rows_only(tmp_path):
    """``evaluate`` refuses component settings (``--device``) for a retriever: the fold rows must not pass it."""
    calls = _aap_calls(tmp_path, "folds", FOLDS="3")
    rows = {c[c.index("--json") + 1].rsplit("/", 1)[1]: c for c in calls if c[0] == "evaluate"}
    assert sorted(rows) == sorted(f"{kb}_{name}.json" for kb in ("plain", "aug")
                                  for name in ("exact", "tfidf", "dense", "rescnn", "genbioel", "genbioel_b2"))
    for name, call in rows.items():
        assert ("--device" in call) == ("genbioel" in name), call
        assert "AskAPatient.fold-3.validation.txt" in call[call.index("--corpus") + 1]
    b2 = rows["plain_genbioel_b2.json"]
    assert b2[b2.index("--decoding.num_beams") + 1] == b2[b2.index("--decoding.top_k") + 1] == "2"
    assert "--decoding.num_beams" not in rows["plain_genbioel.json"]


def test_aap_cascade_is_fitted_on_the_other_folds_at_two_beams(tmp_path):
    """``aap.sh cascade``: each fold's cascade fusion reads the other folds' held-out lists (the generator's at 2
    beams), leaves out the fold's own mention/concept pairs, and may choose among the retriever sets."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for kb in ("plain", "aug"):  # the benchmark tables exist: only the fits run
        (metrics / f"cascade_aap_fold1_{kb}.json").write_text("{}")
    calls = _aap_calls(tmp_path, "cascade", FOLDS="1", FOLDS_FIT="0 1 2", METRICS=str(metrics), MAX_RECALL_LOSS="")
    assert [c[0] for c in calls] == ["fit-fusion", "fit-fusion"]
    fit = calls[0]
    options = {fit[i]: fit[i + 1] for i in range(1, len(fit) - 1) if fit[i].startswith("--")}
    folds = tmp_path / "aap" / "folds"
    assert options["--source"].startswith("rescnn=")  # the last of each repeated option
    sources = [fit[i + 1] for i in range(len(fit) - 1) if fit[i] == "--source"]
    assert sources[0] == f"genbioel={folds}/fold-0/plain_genbioel_b2.jsonl,{folds}/fold-2/plain_genbioel_b2.jsonl"
    assert sources[1:] == [f"{name}={folds}/fold-0/plain_{name}.jsonl,{folds}/fold-2/plain_{name}.jsonl"
                           for name in ("tfidf", "dense", "rescnn")]
    assert [fit[i + 1] for i in range(len(fit) - 1) if fit[i] == "--alternative"] == [
        "tfidf,dense", "tfidf,rescnn", "tfidf,dense,rescnn"]
    assert options["--exclude"] == f"{folds}/fold-1/plain_genbioel.jsonl" and options["--generator-beams"] == "2"
    assert "--cascade" in fit and options["--out"] == f"{folds}/fold-1/beamcascade_b2_plain.json"
    assert options["--defer"] == "dense"  # MiniLM runs only where TF-IDF and ResCNN do not settle
    assert calls[1][calls[1].index("--out") + 1] == f"{folds}/fold-1/beamcascade_b2_aug.json"


def test_aap_cascade_with_a_recall_budget_fits_both_cascades(tmp_path):
    """``MAX_RECALL_LOSS``: each KB's precision-targeted cascade, then one fitted for the recall budget."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for kb in ("plain", "aug"):
        (metrics / f"cascade_aap_fold1_{kb}_loss.json").write_text("{}")
    calls = _aap_calls(tmp_path, "cascade", FOLDS="1", FOLDS_FIT="0 1 2", METRICS=str(metrics))  # the default budget
    folds = tmp_path / "aap" / "folds"
    outs = [c[c.index("--out") + 1] for c in calls]
    assert [c[0] for c in calls] == ["fit-fusion"] * 4
    assert outs == [f"{folds}/fold-1/beamcascade_b2_{kb}{tag}.json" for kb in ("plain", "aug") for tag in ("", "_loss")]
    budget = [c[c.index("--max-recall-loss") + 1] if "--max-recall-loss" in c else None for c in calls]
    assert budget == [None, "0.002", None, "0.002"]


def test_aap_fusion_of_a_fold_reads_every_other_fold_whichever_folds_this_process_takes(tmp_path):
    calls = _aap_calls(tmp_path, "fusion", FOLDS="1", FOLDS_FIT="0 1 2")
    fits = [c for c in calls if c[0] == "fit-fusion"]
    folds = tmp_path / "aap" / "folds"
    assert len(fits) == 2 and [c[0] for c in calls].count("evaluate") == 2
    sources = [fits[0][i + 1] for i in range(len(fits[0]) - 1) if fits[0][i] == "--source"]
    assert sources[0] == f"genbioel={folds}/fold-0/plain_genbioel.jsonl,{folds}/fold-2/plain_genbioel.jsonl"
    assert fits[0][fits[0].index("--exclude") + 1] == f"{folds}/fold-1/plain_genbioel.jsonl"


def test_folds_report_gives_mean_and_spread_per_kb_and_linker(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("folds_report", BENCH / "folds_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    values = {"fold-0": (0.80, 0.90), "fold-1": (0.84, 0.94), "fold-10": (0.82, 0.92)}
    for fold, (r1, r5) in values.items():
        (tmp_path / fold).mkdir()
        (tmp_path / fold / "plain_tfidf.json").write_text(json.dumps({"recall": {"recall": {"recall@1": r1, "recall@5": r5}}}))
        # fitted fusion weights sit beside the reports and are not one
        (tmp_path / fold / "fusion_plain.json").write_text(json.dumps({"version": 1, "weights": {}}))
    (tmp_path / "fold-0" / "aug_fusion.json").write_text(json.dumps({"recall": {"recall": {"recall@1": 0.9, "recall@5": 0.95}}}))
    report.main([str(tmp_path), "--json", str(tmp_path / "summary.json")])
    summary = json.loads((tmp_path / "summary.json").read_text())
    tfidf = summary["plain"]["tfidf"]
    assert tfidf["folds"] == 3 and set(summary) == {"plain", "aug"}
    assert tfidf["recall@1"]["mean"] == pytest.approx(0.82) and tfidf["recall@1"]["sd"] == pytest.approx(0.02)
    assert (tfidf["recall@1"]["min"], tfidf["recall@1"]["max"]) == (0.80, 0.84)
    assert summary["aug"]["fusion"]["folds"] == 1
    assert "1 of 3" in capsys.readouterr().out  # a linker missing on some folds says so



def test_cascade_folds_sums_up_the_cascade_against_the_fusion_per_fold(tmp_path, capsys):
    """``bench/cascade_folds.py``: per KB and row, recall and speed over the folds, ratios taken per fold."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cascade_folds", BENCH / "cascade_folds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def row(r1, speed, **paths):
        return {"recall@1": r1, "recall@5": r1 + 0.05, "mentions_per_cpu_second": speed, "paths": paths}

    folds = {0: (0.80, 0.81, 100, 600), 1: (0.84, 0.837, 200, 800), 10: (0.82, 0.815, 100, 300)}
    for k, (fusion, cascade, slow, fast) in folds.items():
        rows = {"generator": row(0.7, slow * 1.5, beam=1.0), "fusion": row(fusion, slow, beam=1.0),
                "cascade_loss": row(cascade, fast, early=0.9, beam=0.1)}
        (tmp_path / f"cascade_aap_fold{k}_plain_loss.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "cascade_aap_fold2_plain.json").write_text("{}")  # another run's report: not read
    module.main([str(tmp_path), "--json", str(tmp_path / "summary.json")])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"plain"}
    cascade = summary["plain"]["cascade_loss"]
    assert cascade["folds"] == 3 and cascade["recall@1"] == pytest.approx((0.81 + 0.837 + 0.815) / 3)
    assert cascade["x_fusion"] == pytest.approx({"mean": (6 + 4 + 3) / 3, "min": 3, "max": 6})
    assert cascade["folds_at_speed_goal"] == 1  # only fold 0 reaches 5x
    gap = cascade["points_vs_fusion"]
    assert gap["mean"] == pytest.approx((1 - 0.3 - 0.5) / 3) and gap["folds_within"] == 1
    assert cascade["x_generator"]["mean"] == pytest.approx((4 + 8 / 3 + 2) / 3)
    assert cascade["paths"] == pytest.approx({"beam": 0.1, "early": 0.9})
    assert "| plain | cascade_loss | 0.8207" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no cascade_aap_fold"):
        module.main([str(tmp_path / "empty")])

# -- bench/bart_large.py: a BART-large linker measured (issue 27, item 4) ---------------------------------------------
def _bart_large():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bart_large", BENCH / "bart_large.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _micro_data(root: Path, n_docs: int = 3) -> Path:
    """A data folder of the layout bench/bart_large.py reads: a MEDIC file and NCBI-disease train and dev."""
    from conftest import random_kb

    kb = list(random_kb(0, n_concepts=30))
    (root / "vocab").mkdir(parents=True)
    (root / "vocab" / "medic_06Jul2012.txt").write_text(
        "".join(f"{c.id}||{'|'.join(c.names)}\n" for c in kb), encoding="utf8")
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
    assert (args.routes, args.dtypes, args.threads, args.mentions) == (["component", "annotate"], ["fp32", "int8"], [1, 2], 24)
    assert args.preset["d_model"] == 1024 and args.vocab_size == 50265 and args.settings == {}
    assert [(c["route"], c["dtype"], c["threads"]) for c in module.configurations(args)][:3] == [
        ("component", "fp32", 1), ("component", "fp32", 2), ("component", "int8", 1)]
    micro = json.dumps(dataclasses.asdict(MICRO))
    args = module.parse_args(base + ["--preset", micro, "--threads", "2,1,2", "--routes", "annotate",
                                     "--setting", "decoding.batch_size=16", "--setting", "num_beams=3"])
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
    assert "ncbi_disease/NCBIdevelopset_corpus.txt" in _args_error(module, ["--data-dir", str(tmp_path), "--skip-mesh"], capsys)


def test_bart_large_table_shows_failed_configurations():
    module = _bart_large()
    report = {"date": "2026-01-01 00:00 UTC", "model": {"parameters": 406_291_456, "model_vocab": 50265},
              "machine": {"cpu": "CPU", "usable_cores": 2, "memory_gib": 24.0,
                          "versions": {k: "1" for k in ("torch", "transformers", "spacy", "spacy_genbioel", "python")}},
              "setup": {"kb_medic": {"wall_s": 1.0, "cpu_s": 1.0, "peak_rss_mb": 300.0, "concepts": 14942, "names": 71884}},
              "tries": {"medic": {"names": 71884, "nodes": 216170, "build_s": 0.98, "peak_rss_mb": 377.3,
                                  "build_rss_growth_mb": 34.9, "arrays_mb": 5.8, "file_mb": 5.8}},
              "runs": [{"route": "component", "dtype": "int8", "threads": 1, "mentions": 24, "mentions_per_s": 0.9,
                        "load_s": 14.0, "genbioel_load_s": 4.0, "peak_rss_mb": 3900.0, "wall_s": 60.0},
                       {"route": "annotate", "dtype": "fp32", "threads": 2, "error": "timed out after 1800 s",
                        "peak_rss_mb": 3800.0, "wall_s": 1800.0}]}
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
        [sys.executable, str(BENCH / "bart_large.py"), "--data-dir", str(data), "--work", str(tmp_path / "work"),
         "--json", str(tmp_path / "report.json"), "--preset", json.dumps(dataclasses.asdict(MICRO)), "--mentions", "4",
         "--warmup", "1", "--routes", "component", "--dtypes", "int8", "--threads", "1", "--skip-mesh",
         "--setting", "decoding.batch_size=2"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["model"]["model_vocab"] == MICRO.vocab_size and report["arguments"]["settings"] == {"decoding.batch_size": 2}
    assert set(report["setup"]) == {"kb_medic", "model", "package"} and report["setup"]["kb_medic"]["concepts"] == 30
    trie = report["tries"]["medic"]
    assert trie["same_as_pipeline_trie"] and trie["file_mb"] >= 0 and trie["peak_rss_mb"] > 0
    (component,) = report["runs"]
    assert (component["route"], component["dtype"], component["threads"]) == ("component", "int8", 1)
    assert component["mentions"] == 4 and component["with_candidates"] == 4 and component["torch_threads"] == 1
    assert component["mentions_per_s"] > 0 and component["peak_rss_mb"] > 0 and component["load_s"] >= component["genbioel_load_s"] > 0
    assert {"encoder", "decoder", "trie"} <= set(component["stages_s"]) and component["decoder_calls"] > 0
    assert "| component | int8 | 1 | 4 |" in out.stdout
    assert "component_int8_1t: " in out.stderr and (tmp_path / "work" / "logs" / "component_int8_1t.log").exists()
    # --reuse keeps what the first run built and runs the linking alone: here through annotate
    again = subprocess.run(
        [sys.executable, str(BENCH / "bart_large.py"), "--data-dir", str(data), "--work", str(tmp_path / "work"),
         "--preset", json.dumps(dataclasses.asdict(MICRO)), "--mentions", "4", "--routes", "annotate",
         "--dtypes", "fp32", "--threads", "1", "--skip-mesh", "--reuse"], capture_output=True, text=True, timeout=600)
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
    out = subprocess.run([sys.executable, str(BENCH / "bart_large.py"), "--data-dir", str(data), "--work", str(tmp_path / "work"),
                          "--skip-mesh", "--json", str(tmp_path / "report.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["error"].startswith("kb_medic failed: exit status 1") and "'||'" in report["error"]
    assert report["runs"] == [] and "**Stopped**: kb_medic failed" in out.stdout
    assert (tmp_path / "work" / "logs" / "kb_medic.log").exists() and not (tmp_path / "work" / "model").exists()


def test_rescnn_bench_rows_carry_their_settings():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rescnn_bench", BENCH / "rescnn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.parse_row("rescnn") == ("rescnn", {})
    assert module.parse_row("rescnn/sparse_weight=0/index=faiss") == ("rescnn", {"sparse_weight": 0, "index": "faiss"})
    assert module.parse_row("dense/index=faiss/batch_size=64") == ("dense", {"index": "faiss", "batch_size": 64})
    with pytest.raises(SystemExit, match="key=value"):
        module.parse_row("rescnn/faiss")


def test_cascade_bench_variants_name_their_rows():
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("cascade_bench", BENCH / "cascade.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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


def test_crossfit_fit_chooses_the_retrievers_and_fits_the_cascade_on_their_forced_scores(tmp_path):
    """``crossfit.sh fit`` with fold ResCNNs: the fusion keeps the retriever set that links the held-out folds
    best, and the cascade is fitted on the forced scores of that set's candidates."""
    import random

    from spacy_genbioel.kb.base import Concept, KnowledgeBase

    rng = random.Random(0)
    kb = KnowledgeBase([Concept(f"C{i}", [f"concept {i} name"]) for i in range(20)])
    out = tmp_path / "crossfit"
    (out / "folds").mkdir(parents=True)
    (out / "folds" / "folds.json").write_text("{}")

    def cand(cid, score):
        return [[cid], kb.preferred_name(cid), score]

    for fold in range(2):
        (out / "folds" / f"fold-{fold}").mkdir()
        kb.to_jsonl(out / "folds" / f"fold-{fold}" / "kb_plain.jsonl")
        rows = {name: [] for name in ("genbioel", "tfidf", "dense", "rescnn", "forced", "forced_tfidf_rescnn", "forced_tfidf_dense_rescnn")}
        for i in range(40):
            gold, wrong, other, far = (f"C{j}" for j in rng.sample(range(20), 4))
            first, second = rng.sample([gold, wrong], 2)  # the generator: a coin toss between two
            lists = {"genbioel": [cand(first, -0.2), cand(second, -0.5)],
                     "tfidf": [cand(other, 0.9), cand(rng.choice([gold, far]), 0.6)],
                     "dense": [cand(other, 0.8), cand(far, 0.7)],  # never the gold concept: useless
                     "rescnn": [cand(gold, 0.9), cand(other, 0.5)] if i % 5 else [cand(other, 0.9), cand(gold, 0.5)]}
            lists.update({name: [cand(gold, -0.3), cand(other, -0.9)] for name in rows if name.startswith("forced")})
            for name, found in lists.items():
                rows[name].append({"doc_id": f"d{fold}-{i}", "start": 0, "end": 4, "text": f"m {i}", "gold": [gold],
                                   "hit_rank": None, "candidates": found})
        (out / f"fold-{fold}").mkdir()
        for name, records in rows.items():
            (out / f"fold-{fold}" / f"plain_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    env = {**os.environ, "OUT": str(out), "VARIANTS": "plain", "RESCNN_SECONDS": "60", "RESCNN_MODEL": "models/rescnn"}
    run = subprocess.run(["bash", str(BENCH / "crossfit.sh"), "ncbi", "fit", str(tmp_path / "data"), "tiny"],
                         capture_output=True, text=True, env=env, cwd=BENCH.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    fusion = json.loads((out / "fusion_plain.json").read_text())
    assert fusion["sources"] == ["genbioel", "tfidf", "rescnn"], fusion["fit"]
    assert set(fusion["fit"]["choice"]) == {"tfidf+dense", "tfidf+rescnn", "tfidf+dense+rescnn"}
    assert fusion["retrievers"] == {"tfidf": {}, "rescnn": {"model": "models/rescnn"}}
    assert fusion["generator"] == "beam" and fusion["cascade"]["settle_weights"]  # the packages' cascade (beam-judged)
    assert "early" not in fusion["cascade"]  # dense is deferred (--defer dense), but this fusion does not read it
    cascade = json.loads((out / "cascade_plain.json").read_text())
    assert cascade["sources"] == fusion["sources"] and cascade["generator"] == "forced" and cascade["cascade"]
    assert "generator_beams" not in fusion["fit"] and fusion["fit"]["generator_width"] == 2
    # BEAMS (the 7th argument): the fold generators' files at that width, recorded in the fusion file
    for fold in range(2):
        (out / f"fold-{fold}" / "plain_genbioel.jsonl").rename(out / f"fold-{fold}" / "plain_genbioel_b2.jsonl")
    run = subprocess.run(["bash", str(BENCH / "crossfit.sh"), "ncbi", "fit", str(tmp_path / "data"), "tiny", "-", "-", "2"],
                         capture_output=True, text=True, env=env, cwd=BENCH.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((out / "fusion_plain.json").read_text())["fit"]["generator_beams"] == 2
    # FORCED=0: without the forced-score rows, the packages' (beam-judged) cascade is still fitted
    (out / "cascade_plain.json").unlink()
    for fold in range(2):
        for forced in (out / f"fold-{fold}").glob("plain_forced*.jsonl"):
            forced.unlink()
    run = subprocess.run(["bash", str(BENCH / "crossfit.sh"), "ncbi", "fit", str(tmp_path / "data"), "tiny", "-", "-", "2"],
                         capture_output=True, text=True, env={**env, "FORCED": "0"}, cwd=BENCH.parent)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads((out / "fusion_plain.json").read_text())["cascade"]["settle_weights"]
    assert not (out / "cascade_plain.json").exists()


def test_name_cache_bench_encodes_only_the_names_the_derived_kb_adds(tmp_path):
    import importlib.util

    from spacy_genbioel.kb.base import Concept, KnowledgeBase

    spec = importlib.util.spec_from_file_location("name_cache_bench", BENCH / "name_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = KnowledgeBase([Concept("D1", ["heart attack", "myocardial infarction"]), Concept("D2", ["renal failure"])])
    derived = KnowledgeBase([*base, Concept("D3", ["lung disease"])])
    base.to_jsonl(tmp_path / "base.jsonl")
    derived.to_jsonl(tmp_path / "derived.jsonl")
    result = module.main(["--base", str(tmp_path / "base.jsonl"), "--derived", str(tmp_path / "derived.jsonl"), "--full",
                          "--out", str(tmp_path / "out.json")])  # MiniLM as installed, offline
    rows = result["rows"]["dense"]
    assert (rows["base"]["rows_encoded"], rows["derived"]["rows_reused"], rows["derived"]["rows_encoded"]) == (3, 3, 1)
    assert rows["derived_full"]["rows_encoded"] == 4 and result["shared_names"] == 3
    assert json.loads((tmp_path / "out.json").read_text())["rows"] == result["rows"]
