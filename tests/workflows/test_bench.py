"""The benchmark scripts parse, and refuse what they do not know, without running anything heavy."""
import json
import os
import subprocess
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
