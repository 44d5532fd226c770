"""Abstention calibration (issue 18, item 2): the precision-coverage curve of a
linker's top score, its JSON and plot, `evaluate --calibration`, `calibration-plot`
and `package --calibration`."""

import json
import math
import random

import pytest
import spacy
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.evaluation import evaluate_linker, recall_at_k
from spacy_genbioel.evaluation.calibration import (
    CalibrationError,
    calibrated_threshold,
    calibration_curve,
    compare_calibrations,
    read_calibration,
    write_calibration,
)
from spacy_genbioel.evaluation.plots import plot_calibration
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.ty import Candidate, Mention

runner = CliRunner()


def case(score, right, gold=("G",)):
    """A gold mention and its prediction list: one candidate (right or wrong) of ``score``, or none."""
    mention = Mention("m", tuple(gold))
    if score is None:
        return mention, []
    return mention, [Candidate(("G",) if right else ("W",), "name", score), Candidate(("G",), "second", score - 1)]


cases = st.lists(
    st.tuples(
        st.one_of(st.none(), st.sampled_from([-3.0, -2.5, -1.0, -0.25, 0.0, 0.5, 1.0])),
        st.booleans(),
        st.sampled_from([("G",), ("G",), ("-1",)]),
    ),
    max_size=40,
)


def build(items):
    pairs = [case(s, r, g) for s, r, g in items]
    return [m for m, _ in pairs], [p for _, p in pairs]


@settings(max_examples=200, deadline=None)
@given(items=cases, seed=st.integers(0, 1000))
def test_the_curve_follows_its_definition(items, seed):
    gold, preds = build(items)
    curve = calibration_curve(gold, preds)
    evaluated = [
        (p[0].score if p else None, bool(p) and p[0].ids == ("G",)) for m, p in zip(gold, preds) if m.ids != ("-1",)
    ]
    assert curve.n_mentions == len(evaluated) and curve.n_answered == sum(s is not None for s, _ in evaluated)
    thresholds = [p.threshold for p in curve.points]
    assert thresholds == sorted(set(thresholds), reverse=True)  # one point per distinct score
    coverages = [p.coverage for p in curve.points]
    assert coverages == sorted(coverages)  # coverage never grows with the threshold
    for point in curve.points:  # each point is "link when score >= threshold", counted directly
        linked = [right for s, right in evaluated if s is not None and s >= point.threshold]
        assert (point.n_linked, point.n_correct) == (len(linked), sum(linked))
        assert point.coverage == len(linked) / len(evaluated)
        assert point.precision == sum(linked) / len(linked)
    recall1 = recall_at_k(gold, preds, ks=(1,)).recall[1]
    if curve.points:
        last = curve.points[-1]
        assert math.isclose(last.precision * last.coverage, recall1)
        if curve.n_answered == curve.n_mentions:
            assert last.coverage == 1.0 and math.isclose(last.precision, recall1)
    assert curve.recall_at_1 == pytest.approx(recall1) if recall1 is not None else curve.recall_at_1 is None
    order = list(range(len(gold)))
    random.Random(seed).shuffle(order)
    shuffled = calibration_curve([gold[i] for i in order], [preds[i] for i in order])
    assert shuffled.points == curve.points  # ties and order handled deterministically


@settings(max_examples=200, deadline=None)
@given(items=cases, target=st.floats(0.0, 1.0), coverage=st.floats(0.0, 1.0))
def test_operating_points(items, target, coverage):
    curve = calibration_curve(*build(items))
    chosen = curve.threshold_for(target)
    reaching = [p for p in curve.points if p.precision >= target]
    if chosen is None:
        assert not reaching
    else:
        assert chosen.precision >= target and chosen.coverage == max(p.coverage for p in reaching)
    point = curve.at_coverage(coverage)
    if point is None:
        assert not curve.points or curve.points[-1].coverage < coverage
    else:
        assert point.coverage >= coverage - 1e-9
        earlier = curve.points[: curve.points.index(point)]
        assert all(p.coverage < coverage for p in earlier)  # the highest threshold that reaches it


def test_ties_link_together_and_the_threshold_is_a_written_score():
    gold, preds = build([(-1.0, True, ("G",)), (-1.0, False, ("G",)), (-2.0, True, ("G",))])
    preds[0] = [Candidate(("G",), "n", -1.0000001)]  # the same score once written (6 decimals)
    curve = calibration_curve(gold, preds)
    assert [(p.threshold, p.n_linked, p.n_correct) for p in curve.points] == [(-1.0, 2, 1), (-2.0, 3, 2)]
    assert curve.threshold_for(0.6).threshold == -2.0 and curve.threshold_for(0.7) is None
    assert curve.at_coverage(0.5).threshold == -1.0 and curve.at_coverage(0.9).coverage == 1.0


def test_edge_cases():
    empty = calibration_curve([], [])
    assert empty.points == [] and empty.recall_at_1 is None and empty.at_coverage(0.9) is None
    unanswered = calibration_curve([Mention("a", ("G",))], [[]])
    assert unanswered.points == [] and unanswered.recall_at_1 == 0.0 and unanswered.threshold_for(0.5) is None
    with pytest.raises(ValueError, match="NaN"):
        calibration_curve([Mention("a", ("G",))], [[Candidate(("G",), "a", float("nan"))]])
    with pytest.raises(ValueError, match="prediction lists"):
        calibration_curve([Mention("a", ("G",))], [])


def test_json_round_trip_plot_and_comparison(tmp_path):
    curve = calibration_curve(
        *build([(-0.5, True, ("G",)), (-1.0, True, ("G",)), (-3.0, False, ("G",)), (None, False, ("G",))]),
        linker="genbioel",
        target_precision=0.9,
    )
    path = write_calibration(tmp_path / "c.json", curve)
    data = json.loads(path.read_text())
    assert data["format"] == "genbioel.calibration.v1" and data["threshold_for_target"]["threshold"] == -1.0
    assert data["at_coverage"]["0.9"] is None and data["at_coverage"]["0.95"] is None  # 3 of 4 answered
    again = read_calibration(path)
    assert again.points == curve.points and again.target_precision == 0.9
    assert calibrated_threshold(path)[0] == -1.0 and calibrated_threshold(path, 0.5)[0] == -3.0
    threshold, source = calibrated_threshold(path, 1.01)
    assert threshold is None and source["dev_precision"] is None
    other = calibration_curve(*build([(0.9, True, ("G",)), (0.2, False, ("G",))]), linker="tfidf")
    rows = compare_calibrations([again, other], 0.9)
    assert [r["linker"] for r in rows] == ["genbioel", "tfidf"] and rows[1]["threshold"] == 0.9
    assert rows[0]["precision@0.9"] is None and rows[1]["precision@0.95"] == 0.5
    png = plot_calibration([again, other], tmp_path / "c.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "bad.json").write_text('{"points": []}')
    with pytest.raises(CalibrationError, match="bad.json"):
        read_calibration(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text('{"format": "genbioel.calibration.v1", "linker": "x"}')
    with pytest.raises(CalibrationError, match="broken.json.*damaged"):
        read_calibration(tmp_path / "broken.json")


class _Fixed:
    def __init__(self, preds):
        self.preds = preds

    def link(self, mentions, top_k=5):
        return self.preds


def test_the_report_carries_the_calibration_summary():
    gold, preds = build([(-0.5, True, ("G",)), (-1.0, False, ("G",))])
    report = evaluate_linker(_Fixed(preds), gold, name="fixed", target_precision=0.9)
    data = json.loads(json.dumps(report.to_dict()))["calibration"]
    assert data["threshold_for_target"]["threshold"] == -0.5 and data["at_coverage"]["0.9"]["precision"] == 0.5
    assert "threshold for precision 0.9" in report.format_table()


# -- command line -----------------------------------------------------------------------------------------
@pytest.fixture()
def corpus(tmp_path):
    kb = KnowledgeBase(
        [Concept("D1", ["renal failure"]), Concept("D2", ["cystic fibrosis"]), Concept("D3", ["lung cancer"])]
    )
    kb.to_jsonl(tmp_path / "kb.jsonl")
    text = "Renal failure, cystic fibrosis and lung tumour."
    (tmp_path / "dev.txt").write_text(
        f"1|t|{text}\n1|a|\n1\t0\t13\tRenal failure\tDisease\tD1\n1\t15\t30\tcystic fibrosis\tDisease\tD2\n"
        f"1\t35\t46\tlung tumour\tDisease\tD9\n\n"
    )
    return tmp_path


def test_evaluate_writes_the_curve_for_any_linker_and_the_curves_compare(corpus):
    for linker in ("exact", "tfidf"):
        result = runner.invoke(
            app,
            [
                "evaluate",
                "--corpus",
                str(corpus / "dev.txt"),
                "--linker",
                linker,
                "--kb",
                str(corpus / "kb.jsonl"),
                "--calibration",
                str(corpus / f"cal_{linker}.json"),
                "--target-precision",
                "0.9",
                "--json",
                str(corpus / f"{linker}.json"),
            ],
        )
        assert result.exit_code == 0, result.output
        assert "precision @90% coverage" in result.output
        assert (corpus / f"cal_{linker}.png").read_bytes()[:4] == b"\x89PNG"
        assert json.loads((corpus / f"{linker}.json").read_text())["calibration"]["target_precision"] == 0.9
    exact = read_calibration(corpus / "cal_exact.json")
    assert (
        exact.n_mentions == 3 and exact.n_answered == 2 and exact.points[-1].precision == 1.0
    )  # exact abstains by itself
    tfidf = read_calibration(corpus / "cal_tfidf.json")
    assert tfidf.n_answered == 3 and tfidf.threshold_for(0.9).coverage == pytest.approx(2 / 3)
    result = runner.invoke(
        app,
        [
            "calibration-plot",
            str(corpus / "cal_exact.json"),
            str(corpus / "cal_tfidf.json"),
            "--out",
            str(corpus / "both.png"),
            "--json",
            str(corpus / "both.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "precision@0.9" in result.output and (corpus / "both.png").exists()
    assert [row["linker"] for row in json.loads((corpus / "both.json").read_text())] == ["exact", "tfidf"]
    bad = runner.invoke(app, ["calibration-plot", str(corpus / "kb.jsonl")])
    assert bad.exit_code == 1 and "kb.jsonl" in bad.output


def test_package_ships_the_calibrated_threshold(corpus, micro_model, word_tokenizer):
    from spacy_genbioel.models import save_model

    save_model(micro_model, word_tokenizer, corpus / "model")
    gold, preds = build([(-0.5, True, ("G",)), (-1.0, True, ("G",)), (-3.0, False, ("G",))])
    write_calibration(corpus / "cal.json", calibration_curve(gold, preds, linker="genbioel", target_precision=0.95))
    common = ["package", "--model", str(corpus / "model"), "--kb", str(corpus / "kb.jsonl"), "--no-abbreviations"]
    result = runner.invoke(app, [*common, "--out", str(corpus / "pipe"), "--calibration", str(corpus / "cal.json")])
    assert result.exit_code == 0, result.output
    nlp = spacy.load(corpus / "pipe")
    assert nlp.get_pipe("genbioel").output.threshold == -1.0
    meta = nlp.meta["genbioel_calibration"]
    assert meta["threshold"] == -1.0 and meta["dev_coverage"] == pytest.approx(2 / 3)  # meta.json keeps ~10 digits
    assert meta["target_precision"] == pytest.approx(0.95) and meta["linker"] == "genbioel"
    result = runner.invoke(app, [*common, "--out", str(corpus / "pipe2"), "--threshold", "-2"])
    assert result.exit_code == 0 and spacy.load(corpus / "pipe2").get_pipe("genbioel").output.threshold == -2.0
    both = runner.invoke(
        app, [*common, "--out", str(corpus / "pipe3"), "--threshold", "-2", "--calibration", str(corpus / "cal.json")]
    )
    assert both.exit_code != 0 and not (corpus / "pipe3").exists()


def test_workflows_produce_the_calibration_before_the_packages_that_read_it():
    from pathlib import Path

    import srsly

    project = srsly.read_yaml(Path(__file__).resolve().parents[2] / "project.yml")
    commands = {c["name"]: c for c in project["commands"]}
    for workflow, steps in project["workflows"].items():
        made = set()
        later = {out for step in steps for out in commands[step].get("outputs", [])}
        for step in steps:
            for dep in commands[step].get("deps", []):
                produced_later = dep in later and dep not in made
                assert not produced_later, f"{workflow}: {step} depends on {dep}, made by a later step"
            made.update(commands[step].get("outputs", []))
    # one package-ner for every corpus: it ships the threshold `evaluate` calibrated on that corpus's dev
    curve = "metrics/${vars.corpus}_calibration_genbioel_${vars.preset}.json"
    ship = " ".join(commands["package-ner"]["script"])
    assert f"--calibration {curve} --target-precision ${{vars.target_precision}}" in ship
    assert curve in commands["evaluate"]["outputs"] and curve in commands["package-ner"]["deps"]
    assert "--calibration" not in " ".join(commands["package"]["script"])  # the package `evaluate` measures has none
