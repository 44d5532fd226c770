"""Fuzzed ``annotate`` inputs (the cases and generators of ``tests/fuzz_annotate.py``):
every malformed input of every format, run end to end, is either refused with
``AnnotateError`` or annotated with each document written once or reported in
the errors file with its file and line; no other exception escapes. Job
mix-ups are refused, the same job resumes; output where writing changes the job,
and read-only output, are refused (a finished job on a read-only mount is done);
runs killed from outside lose, duplicate and leave behind nothing. The readers alone are fuzzed with
hypothesis (deterministic: ``derandomize=True``)."""

import json
from pathlib import Path

import pytest
from fuzz_annotate import (
    build_pipeline,
    cached_pipelines,
    cases,
    check_reader,
    edited_pipeline,
    job_scenarios,
    mutate,
    mutated_cases,
    reliability_scenarios,
    run_case,
    samples,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.annotate import INPUT_FORMATS, InputRecord, RecordError, read_records

CASES = cases()
MUTATED = mutated_cases(seed=0, per_format=3)
SCENARIOS = [name for name, _ in job_scenarios(*[None] * 3)]
# issue 31: the kills start real runs with 1 to 4 workers (a few seconds each): slow;
# test_annotate_workers.py has fast ones
RELIABILITY = [
    pytest.param(name, marks=[pytest.mark.slow] if name.startswith("kill/") else [])
    for name, _ in reliability_scenarios(Path("."))
]
SAMPLES = samples()
FUZZ = settings(max_examples=250, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory, micro_model, word_tokenizer):
    """The micro pipeline, one with other weights, one with another genbioel setting; each loaded once."""
    root = tmp_path_factory.mktemp("fuzz_pipelines")
    main = build_pipeline(root / "p0", micro_model, word_tokenizer)
    other = build_pipeline(root / "p1", tokenizer=word_tokenizer, seed=1)
    config = edited_pipeline(main, root / "p2", "num_beams = 3", "num_beams = 4")
    with cached_pipelines():
        yield main, other, config


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_malformed_input_is_reported_or_refused(case, pipelines, tmp_path):
    outcome, detail = run_case(case, pipelines[0], tmp_path)
    assert outcome == "ok", detail


@pytest.mark.parametrize("case", MUTATED, ids=[c.name for c in MUTATED])
def test_damaged_input_loses_and_duplicates_nothing(case, pipelines, tmp_path):
    outcome, detail = run_case(case, pipelines[0], tmp_path)
    assert outcome == "ok", detail


@pytest.mark.parametrize("name", SCENARIOS)
def test_an_output_folder_holds_one_job(name, pipelines, tmp_path):
    outcome, detail = dict(job_scenarios(*pipelines))[name](tmp_path)
    assert outcome == "ok", detail


@pytest.mark.parametrize("name", RELIABILITY)
def test_where_a_job_writes_read_only_output_and_kills(name, pipelines, tmp_path):
    outcome, detail = dict(reliability_scenarios(pipelines[0]))[name](tmp_path / "work")
    if outcome == "skipped":
        pytest.skip(detail)
    assert outcome == "ok", detail


@FUZZ
@given(
    name=st.sampled_from(sorted(SAMPLES)),
    rnd=st.randoms(use_true_random=False),
    fmt=st.sampled_from([None, *INPUT_FORMATS]),
)
def test_readers_on_damaged_files(tmp_path_factory, name, rnd, fmt):
    path = tmp_path_factory.mktemp("readers") / name
    path.write_bytes(mutate(SAMPLES[name], rnd))
    outcome, detail = check_reader(path, fmt)
    assert outcome == "ok", detail


@FUZZ
@given(data=st.binary(max_size=300), fmt=st.sampled_from([None, *INPUT_FORMATS]))
def test_readers_on_arbitrary_bytes(tmp_path_factory, data, fmt):
    path = tmp_path_factory.mktemp("bytes") / "input.txt"
    path.write_bytes(data)
    outcome, detail = check_reader(path, fmt)
    assert outcome == "ok", detail


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


@FUZZ
@given(value=JSON_VALUES, key=st.sampled_from(["id", "pmid", "doc_id"]))
def test_jsonl_ids_are_strings_or_integers(tmp_path_factory, value, key):
    path = tmp_path_factory.mktemp("ids") / "in.jsonl"
    path.write_text(json.dumps({key: value, "text": "the liver"}) + "\n", encoding="utf8")
    [item] = list(read_records(path, "jsonl"))
    usable = isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip()
    if usable:
        assert isinstance(item, InputRecord) and item.doc_id == str(value).strip()
    else:
        assert isinstance(item, RecordError) and item.line == 1 and item.file == str(path)
