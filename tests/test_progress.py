"""Progress bars (spacy_genbioel/progress.py and its callers): the arithmetic with a fake
clock, bytes over plain and gzip input, no output when turned off or without a
terminal, and what the annotate, training, KB, TF-IDF and trie bars end on."""

import gzip
import io
import json
import logging
import math
import os
import re

import pytest
from fuzz_annotate import build_pipeline
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.annotate import annotate, checkpoint
from spacy_genbioel.annotate.lines import decoded_lines, read_head
from spacy_genbioel.progress import (
    ENV,
    InputProgress,
    ProgressSettings,
    StepProgress,
    estimate_input,
    estimate_steps,
    format_rate,
    format_seconds,
    wanted,
)
from spacy_genbioel.util import iter_lines, open_text


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self):
        return True


class FakeClock:
    def __init__(self, start=100.0):
        self.now = start

    def __call__(self):
        return self.now

    def tick(self, seconds):
        self.now += seconds


def final_line(text, desc):
    """The last state a tqdm bar drew (lines end in \\r or \\n)."""
    lines = [line.strip() for line in re.split(r"[\r\n]", text) if line.strip().startswith(desc)]
    assert lines, f"no {desc!r} bar in {text!r}"
    return lines[-1]


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


# -- formatting -------------------------------------------------------------------------------------------------
def test_format_seconds_and_rates():
    assert [format_seconds(s) for s in (0, 44.2, 60, 725, 1800, 3600, 11520, 11521)] == [
        "0s",
        "45s",
        "1m",
        "12m05s",
        "30m",
        "1h",
        "3h12m",
        "3h13m",
    ]
    assert [format_rate(r) for r in (1234.4, 56.74, 8.9, 0.1234)] == ["1234", "56.7", "8.90", "0.123"]


# -- steps and the time budget ------------------------------------------------------------------------------------
def test_the_budget_ends_the_run_first():
    # the case: 6000 steps at ~1.9 s a step would take 3h10m; the budget is 30 minutes
    est = estimate_steps(100, 6000, elapsed=190.0, max_seconds=1800)
    assert est.bound == "budget"
    assert est.eta == pytest.approx(1800 - 190)
    assert est.total == 100 + math.ceil((1800 - 190) / 1.9) == 948


def test_the_steps_end_the_run_first():
    est = estimate_steps(100, 600, elapsed=50.0, max_seconds=1800)
    assert (est.bound, est.total, est.eta) == ("steps", 600, pytest.approx(250.0))
    assert estimate_steps(100, 600, elapsed=50.0).bound == "steps"


def test_before_the_first_step_neither_bound_is_known():
    assert estimate_steps(0, 600, max_seconds=60) == estimate_steps(0, 600, max_seconds=60, elapsed=0.0)
    est = estimate_steps(0, 600, max_seconds=60)
    assert (est.total, est.eta, est.bound) == (600, None, "unknown")
    assert estimate_steps(0, 600).bound == "steps"


def test_a_resumed_run_measures_its_own_steps_and_the_whole_budget():
    # 5000 steps were done before (1500 s of the 1800 s budget); this run did 100 steps in 50 s
    est = estimate_steps(5100, 6000, initial=5000, elapsed=50.0, max_seconds=1800, budget_before=1500)
    assert est.rate == pytest.approx(2.0)  # not 5100 / 50
    assert est.bound == "budget" and est.eta == pytest.approx(250.0) and est.total == 5600
    # the budget already spent: stops now
    assert estimate_steps(5100, 6000, initial=5000, elapsed=50.0, max_seconds=1800, budget_before=1800).total == 5100


def test_a_cpu_budget_converts_to_wall_time():
    # the CPU clock runs twice as fast as the wall clock (two busy threads)
    est = estimate_steps(100, 10_000, elapsed=50.0, budget_elapsed=100.0, max_seconds=1000)
    assert est.bound == "budget"
    assert est.total == 100 + 900  # 900 budget seconds left at 1 step per budget second
    assert est.eta == pytest.approx(450.0)  # 900 steps at 2 steps per wall second


@settings(max_examples=300, deadline=None)
@given(
    max_steps=st.integers(1, 10**6),
    done=st.integers(0, 10**5),
    initial=st.integers(0, 10**5),
    elapsed=st.floats(0.0, 1e5),
    max_seconds=st.one_of(st.none(), st.floats(0.0, 1e5)),
    before=st.floats(0.0, 1e5),
)
def test_estimates_respect_both_bounds(max_steps, done, initial, elapsed, max_seconds, before):
    initial = min(initial, max_steps)
    step = min(max_steps, initial + done)
    est = estimate_steps(
        step, max_steps, initial=initial, elapsed=elapsed, max_seconds=max_seconds, budget_before=before
    )
    assert step <= est.total <= max_steps
    if est.eta is None or est.rate is None:
        return
    steps_left = (max_steps - step) / est.rate
    assert est.eta <= steps_left * (1 + 1e-9) + 1e-9
    if max_seconds is not None:
        seconds_left = max(0.0, max_seconds - before - elapsed)
        assert est.eta == pytest.approx(min(steps_left, seconds_left), rel=1e-9, abs=1e-9)
        if seconds_left != steps_left:  # a tie goes either way
            assert (est.bound == "budget") == (seconds_left < steps_left)


def test_step_bar_says_which_bound_ends_the_run():
    clock, out = FakeClock(), Terminal()
    bar = StepProgress.start("train", 6000, max_seconds=1800, clock=clock, wall=clock, file=out)
    for _ in range(100):
        clock.tick(1.9)
        bar.update(1, loss="0.5")
    bar.bar.refresh()
    shown = final_line(out.getvalue(), "train")
    assert "/948 " in shown and "26m50s left" in shown and "stops at 30m budget" in shown and "loss=0.5" in shown
    for _ in range(100):
        clock.tick(1.9)
        bar.update(1)
    bar.close(stopped=True)  # say the budget stopped it here
    shown = final_line(out.getvalue(), "train")
    assert "200/200" in shown and "stopped by the 30m budget" in shown

    clock, out = FakeClock(), Terminal()
    with StepProgress.start("train", 6000, max_seconds=1800, clock=clock, wall=clock, file=out) as bar:
        for _ in range(100):
            clock.tick(0.01)
            bar.update(1)
        bar.bar.refresh()
    assert "/6000 " in final_line(out.getvalue(), "train") and "stops at step 6000" in out.getvalue()


def test_wrap_counts_what_goes_through():
    clock, out = FakeClock(), Terminal()
    bar = StepProgress("fit", 10, ProgressSettings(unit="name", clock=clock, wall=clock, file=out))
    assert list(bar.wrap(range(10), every=4)) == list(range(10))
    assert bar.step == 10
    bar.close()
    assert "10/10" in final_line(out.getvalue(), "fit")


def test_start_takes_the_settings_as_keywords():
    bar = StepProgress.start("train", 10, initial=3, max_seconds=60, budget_name="cpu budget", enabled=False)
    assert bar.settings == ProgressSettings(initial=3, max_seconds=60, budget_name="cpu budget", enabled=False)
    assert (bar.step, bar.max_seconds, bar.budget_name, bar.bar) == (3, 60, "cpu budget", None)
    with pytest.raises(TypeError):
        StepProgress.start("train", 10, no_such_setting=1)


# -- turning it off ------------------------------------------------------------------------------------------------
def test_no_output_when_disabled_or_without_a_terminal(monkeypatch, caplog):
    plain, terminal = io.StringIO(), Terminal()
    for stream, flag in ((plain, True), (plain, None), (terminal, False)):
        assert not wanted(flag, stream)
        bar = StepProgress.start("train", 10, file=stream, enabled=flag)
        bar.update(5)
        bar.close(stopped=True)
        assert bar.bar is None and bar.step == 5
        with InputProgress("annotate", [], file=stream, enabled=flag) as ip:
            ip.add(docs=1)
    assert plain.getvalue() == "" and terminal.getvalue() == ""
    assert wanted(True, terminal) and wanted(None, terminal)
    monkeypatch.setenv(ENV, "0")
    assert not wanted(True, terminal)
    monkeypatch.setenv(ENV, "1")
    assert wanted(True, plain) and not wanted(False, plain)
    # logging goes on, with or without a bar
    log = logging.getLogger("spacy_genbioel.test")
    with caplog.at_level(logging.INFO):
        for stream in (plain, terminal):
            with StepProgress.start("train", 10, file=stream):
                log.info("still logged")
    assert [r.message for r in caplog.records].count("still logged") == 2


# -- bytes of input files --------------------------------------------------------------------------------------------
@pytest.fixture()
def inputs(tmp_path):
    """A gzip JSONL file (incompressible enough to span many reads) and a plain text file."""
    rng = __import__("random").Random(0)
    lines = [json.dumps({"id": i, "text": " ".join(f"{rng.random():.12f}" for _ in range(40))}) for i in range(3000)]
    gz = tmp_path / "a.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf8") as handle:
        handle.write("\n".join(lines) + "\n")
    txt = tmp_path / "b.txt"
    txt.write_text("\n".join(f"document {i} about the liver" for i in range(2000)) + "\n", encoding="utf8")
    return gz, txt


def test_bytes_over_gzip_and_plain_files_are_bytes_on_disk(inputs, tmp_path):
    gz, txt = inputs
    side = tmp_path / "side.txt"
    side.write_text("x\n" * 100, encoding="utf8")
    sizes = [os.path.getsize(gz), os.path.getsize(txt)]
    bar = InputProgress("read", [gz, txt], enabled=False)
    assert bar.meter.total == sum(sizes)
    seen = []
    with bar.metering():
        read_head(side)  # a file that is not one of the inputs: not counted
        for i, _ in enumerate(decoded_lines(gz)):  # annotate's reader: inflates the raw file itself
            if i % 500 == 0:
                seen.append(bar.meter.position())
        assert 0 < seen[1] < seen[-1] <= sizes[0]  # compressed bytes, growing as the file is read
        middle = bar.meter.position()
        for _ in iter_lines(txt):  # the corpus and KB readers: util's openers
            pass
        assert bar.meter.position() == sum(sizes)
    assert middle == sizes[0]
    # util.open_text on a .gz: the compressed file's position
    bar = InputProgress("read", [gz], enabled=False)
    with bar.metering(), open_text(gz) as handle:
        handle.readline()
        assert 0 < bar.meter.position() < sizes[0]
        handle.read()
        assert bar.meter.position() == sizes[0]
    # a file opened outside the block is not seen
    with open_text(gz) as handle:
        handle.read()
    assert InputProgress("read", [gz], enabled=False).meter.position() == 0


def test_rates_leave_out_skipped_work():
    est = estimate_input(600, 1000, start=400, seconds=10.0, counts={"docs": 20})
    assert est.eta == pytest.approx(400 / 20) and est.rates == {"docs": 2.0}
    assert estimate_input(400, 1000, start=400, seconds=0.0).eta is None
    assert estimate_input(1000, 1000, start=0, seconds=3.0).eta == 0


@settings(max_examples=200, deadline=None)
@given(total=st.integers(1, 10**12), start_frac=st.floats(0, 1), pos_frac=st.floats(0, 1), seconds=st.floats(1e-3, 1e6))
def test_input_eta_is_bytes_left_at_the_measured_rate(total, start_frac, pos_frac, seconds):
    start = int(total * start_frac)
    position = start + int((total - start) * pos_frac)
    est = estimate_input(position, total, start=start, seconds=seconds)
    if position == start:
        assert est.eta is None
    else:
        assert est.eta == pytest.approx((total - position) * seconds / (position - start))


def test_input_progress_with_a_fake_clock(inputs):
    gz, txt = inputs
    clock, out = FakeClock(), Terminal()
    bar = InputProgress("annotate", [gz, txt], counts=("docs", "mentions"), clock=clock, file=out)
    from spacy_genbioel.annotate.readers import read_records

    for n, _ in enumerate(bar.read(read_records([gz, txt])), start=1):
        if n <= 3000:  # the whole first file was done before: skipped in no time
            bar.skip()
            continue
        clock.tick(0.5)
        bar.add(docs=1, mentions=2)
        if n == 4000:
            est = bar.estimate()
            assert est.rates == {"docs": pytest.approx(2.0), "mentions": pytest.approx(4.0)}  # not 4000 / 500 s
            done = est.position - os.path.getsize(gz)
            assert est.eta == pytest.approx((est.total - est.position) / (done / 500.0))
    bar.close()
    shown = final_line(out.getvalue(), "annotate")
    assert "100%" in shown and "2,000 docs" in shown and "3,000 resumed" in shown and "2.00 docs/s" in shown


# -- the callers ----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, micro_model, word_tokenizer):
    return build_pipeline(tmp_path_factory.mktemp("progress_pipeline"), micro_model, word_tokenizer)


def test_a_resumed_annotate_run_reports_its_own_documents(tmp_path, pipeline, monkeypatch, capsys):
    texts = [f"patients with {w} disease and renal failure" for w in ("acute", "chronic", "cystic", "lung")] * 4
    gz = tmp_path / "docs.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf8") as handle:
        handle.writelines(json.dumps({"id": f"g{i}", "text": t}) + "\n" for i, t in enumerate(texts[:10]))
    txt = tmp_path / "more.txt"
    txt.write_text("\n".join(texts[10:]) + "\n", encoding="utf8")
    run, cpu = dict(chunk_size=4, batch_size=2), {"device": "cpu"}
    original, calls = checkpoint.Checkpoint.commit, []

    def crash_on_third(self, items):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, items)

    monkeypatch.setattr(checkpoint.Checkpoint, "commit", crash_on_third)
    monkeypatch.setenv(ENV, "1")  # a bar even without a terminal, unless turned off
    with pytest.raises(KeyboardInterrupt):
        annotate([gz, txt], pipeline, tmp_path / "out", {**run, "progress": False}, cpu)
    assert "annotate" not in capsys.readouterr().err  # --no-progress
    monkeypatch.setattr(checkpoint.Checkpoint, "commit", original)
    summary = annotate([gz, txt], pipeline, tmp_path / "out", {**run, "progress": True}, cpu)
    shown = final_line(capsys.readouterr().err, "annotate")
    assert summary["this_run"]["documents_resumed"] == 8 and summary["this_run"]["documents_annotated"] == 8
    assert (
        "100%" in shown and "8 docs" in shown and "8 resumed" in shown and "docs/s" in shown and "mentions/s" in shown
    )


def test_training_bar_ends_on_the_budget(tmp_path, word_tokenizer, small_kb, monkeypatch, capsys):
    from conftest import MICRO

    from spacy_genbioel.models import build_model
    from spacy_genbioel.training import EngineConfig, TrainingEngine, kb_name_examples

    monkeypatch.setenv(ENV, "1")
    examples = kb_name_examples(small_kb, synonyms_per_name=1)
    config = EngineConfig(max_steps=1000, max_seconds=0.0, batch_size=4, warmup_steps=0, log_every=0, progress=True)
    result = TrainingEngine(build_model(MICRO, word_tokenizer, seed=0), word_tokenizer, config).train(examples)
    shown = final_line(capsys.readouterr().err, "train")
    assert result.stopped_by == "max_seconds" and result.step == 1
    assert "1/1 " in shown and "stopped by the 0s budget" in shown
    config = EngineConfig(max_steps=2, batch_size=4, warmup_steps=0, log_every=0, progress=False)
    TrainingEngine(build_model(MICRO, word_tokenizer, seed=0), word_tokenizer, config).train(examples)
    assert "train" not in capsys.readouterr().err


def test_kb_tfidf_and_trie_bars(tmp_path, small_kb, word_tokenizer, monkeypatch, capsys):
    import numpy as np

    from spacy_genbioel.kb.build import build_kb
    from spacy_genbioel.linking.trie.name_trie import NameTrie
    from spacy_genbioel.retrieval.tfidf import TfidfLinker

    path = tmp_path / "kb.jsonl.gz"
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    path.write_bytes(gzip.compress((tmp_path / "kb.jsonl").read_bytes()))
    monkeypatch.setenv(ENV, "1")
    kb = build_kb("jsonl", path, progress=True)
    shown = final_line(capsys.readouterr().err, "build-kb")
    assert "100%" in shown and f"{len(small_kb)} concepts" in shown
    assert build_kb("jsonl", path, progress=False).names == kb.names and capsys.readouterr().err == ""

    shown_tfidf = TfidfLinker(kb, progress=True)
    assert f"{kb.n_names}/{kb.n_names}" in final_line(capsys.readouterr().err, "tfidf index")
    quiet = TfidfLinker(kb)  # under 100,000 names: no bar unless asked
    assert capsys.readouterr().err == ""
    assert (shown_tfidf.transform(kb.names) != quiet.transform(kb.names)).nnz == 0

    ids = dict(eos_token_id=word_tokenizer.eos_token_id, root_token_id=5)
    trie = NameTrie.from_names(kb.names, word_tokenizer, chunk_size=7, progress=True, **ids)
    assert f"{kb.n_names}/{kb.n_names}" in final_line(capsys.readouterr().err, "trie")
    assert np.array_equal(trie.edge_keys, NameTrie.from_names(kb.names, word_tokenizer, **ids).edge_keys)
    assert capsys.readouterr().err == ""
