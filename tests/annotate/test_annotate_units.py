"""The Ray engine without Ray: how the document stream is cut into units, how a unit is committed
(out of order, once), and the driver (retries, resume) on a stand-in for Ray that runs the workers
in this process. The real Ray is tests/annotate/test_annotate_ray.py (marker ``ray``)."""

import collections
import json
import math
import shutil
import sys

import pytest
from annotate_jobs import CPU, N_DOCS, RUN, assert_same_output, job_input, local_run, one_thread, written_ids
from fuzz_annotate import build_pipeline, cached_pipelines
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.annotate import AnnotateError, annotate, checkpoint, ray_engine, records, units, writers
from spacy_genbioel.annotate.records import InputRecord, RecordError


def record(i):
    return InputRecord(f"d{i}", f"text {i}", "in.jsonl", line=i + 1)


# -- the unit rule ----------------------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 60), chunk_size=st.integers(1, 9), done_bits=st.lists(st.booleans(), min_size=60, max_size=60))
def test_units_are_fixed_slices_of_the_document_stream(n, chunk_size, done_bits):
    stream = [record(i) for i in range(n)]
    todo = [r for r, d in zip(stream, done_bits) if not d]
    done = {records.id_key(r.doc_id) for r, d in zip(stream, done_bits) if d}
    n_done = len(done)
    counts = collections.Counter()
    planned = list(units.plan_units(iter(stream), chunk_size, done, counts))
    # unit k holds the documents of slice k not done before, in order; no empty unit is sent
    for unit in planned:
        assert unit.records and unit.where == unit.records[0].where
        assert unit.records == [r for r in stream[unit.index * chunk_size : (unit.index + 1) * chunk_size] if r in todo]
    assert [r for u in planned for r in u.records] == todo
    assert [u.index for u in planned] == sorted({u.index for u in planned})
    assert counts["units"] == math.ceil(n / chunk_size) and counts["resumed"] == n_done
    assert counts["units_resumed"] == counts["units"] - len(planned)
    assert not done  # each committed ID leaves the set as it passes


def test_the_document_stream_leaves_out_bad_records_refused_ids_and_duplicates():
    logged = []

    class Log:
        def log(self, error):
            logged.append(error)

    items = [
        record(0),
        RecordError("in.jsonl", "not JSON", 2),
        InputRecord("a|b", "x", "in.jsonl", 3),
        record(0),
        record(4),
    ]
    counts = collections.Counter()
    writer = writers.PubTatorWriter()
    kept = list(units.first_seen(items, writer.check, Log(), set(), counts))
    assert [r.doc_id for r in kept] == ["d0", "d4"] and counts["read"] == 5
    assert [(e.line, e.kind) for e in logged] == [(2, "error"), (3, "error"), (1, "duplicate")]


# -- committing units ---------------------------------------------------------------------------------------------
def result(index, ids, data=b"x\n"):
    return units.UnitResult(index, data, records.ChunkSummary(list(ids), len(ids), 1))


def test_units_committed_out_of_order_are_one_chunk_each_and_the_checkpoint_ends_in_order(tmp_path):
    writer = writers.JsonlWriter()
    ckpt = checkpoint.Checkpoint(tmp_path, writer, None)
    assert units.commit_unit(ckpt, result(2, ["e", "f"])) == "part-000002.jsonl"
    assert units.commit_unit(ckpt, result(0, ["a", "b"])) == "part-000000.jsonl"
    assert units.commit_unit(ckpt, result(1, [], data=None)) is None  # every document failed: no chunk
    lines = (tmp_path / "checkpoint.jsonl").read_text().splitlines()
    assert [json.loads(line)["chunk"] for line in lines] == ["part-000002.jsonl", "part-000000.jsonl"]
    # a driver that stops here: the next run's checkpoint knows both chunks
    again = checkpoint.Checkpoint(tmp_path, writer, None)
    assert again.done == {"a", "b", "e", "f"} and again.next_number == 3
    ckpt.put_in_order()
    assert (tmp_path / "checkpoint.jsonl").read_text().splitlines() == [lines[1], lines[0]]
    assert [e["chunk"] for e in ckpt.entries] == ["part-000000.jsonl", "part-000002.jsonl"]
    # a unit whose name an earlier run's chunk holds (another chunk size) gets the next free number
    assert units.commit_unit(ckpt, result(0, ["c"])) == "part-000003.jsonl"
    assert sorted(p.name for p in tmp_path.glob("part-*")) == [
        "part-000000.jsonl",
        "part-000002.jsonl",
        "part-000003.jsonl",
    ]
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_chunk_that_landed_without_its_checkpoint_line_is_kept(tmp_path):
    """The driver died between the rename of unit 3's chunk and the checkpoint append: the file is the truth."""
    writer = writers.JsonlWriter()
    ckpt = checkpoint.Checkpoint(tmp_path, writer, None)
    units.commit_unit(ckpt, result(1, ["b"], data=b'{"id": "b", "text": "t", "mentions": []}\n'))
    (tmp_path / "part-000003.jsonl").write_text('{"id": "c", "text": "t", "mentions": []}\n')
    again = checkpoint.Checkpoint(tmp_path, writer, None)
    assert again.done == {"b", "c"}
    assert [json.loads(line)["chunk"] for line in (tmp_path / "checkpoint.jsonl").read_text().splitlines()] == [
        "part-000001.jsonl",
        "part-000003.jsonl",
    ]


# -- a unit is the local engine's chunk -----------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def load_once():
    """Each worker loads the pipeline: here from a cache (the runs stay end to end)."""
    with cached_pipelines():
        yield


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, micro_model, word_tokenizer):
    return build_pipeline(tmp_path_factory.mktemp("units_pipeline"), micro_model, word_tokenizer)


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    return job_input(tmp_path_factory.mktemp("units_inputs") / "docs.jsonl")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, pipeline, docs):
    out = tmp_path_factory.mktemp("units_reference") / "out"
    local_run(docs, pipeline, out)
    return out


def test_a_unit_annotated_alone_is_the_local_engines_chunk(pipeline, docs, reference):
    from spacy_genbioel.annotate.readers import safe_records

    nlp, component = units.load_pipeline(pipeline, "genbioel", CPU)
    writer = writers.JsonlWriter(spans_key=component.spans_key)
    counts = collections.Counter()
    stream = units.first_seen(
        safe_records(docs, "jsonl"), writer.check, type("Log", (), {"log": lambda self, e: None})(), set(), counts
    )
    planned = list(units.plan_units(stream, RUN["chunk_size"], set(), counts))
    assert len(planned) == N_DOCS // RUN["chunk_size"]
    seen = []
    with one_thread():
        for unit in (planned[0], planned[7]):
            done = units.annotate_unit(nlp, writer, component.spans_key, unit, RUN["batch_size"], progress=seen.append)
            assert done.data == (reference / f"part-{unit.index:06d}.jsonl").read_bytes()
            assert done.summary.ids == [r.doc_id for r in unit.records] and not done.errors
    assert seen[:2] == [RUN["batch_size"], RUN["chunk_size"]]  # after each batch


# -- the driver, on a stand-in for Ray -------------------------------------------------------------------------------
class FakeRay:
    """Enough of Ray for :func:`ray_engine.run_on_ray`, in this process: a method runs when its result
    is fetched; results come back newest first (so units are committed out of order); the first run
    of a unit in ``kills`` kills its worker (and what was queued on it), one in ``always`` every time."""

    class exceptions:
        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

        class ActorDiedError(RayError):
            pass

    def __init__(self, kills=(), always=()):
        self.kills, self.always = set(kills), set(always)
        self.started, self.killed = [], []

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return {"CPU": 2.0}

    def remote(self, **options):
        return lambda cls: FakeActorClass(self, cls)

    def wait(self, refs, num_returns=1):
        return refs[-1:], refs[:-1]

    def get(self, ref):
        return [r() for r in ref] if isinstance(ref, list) else ref()

    def kill(self, actor, no_restart=True):
        actor.dead = True
        self.killed.append(actor.name)


class FakeActorClass:
    def __init__(self, ray, cls, name=None):
        self.ray, self.cls, self.name = ray, cls, name

    def options(self, name):
        return FakeActorClass(self.ray, self.cls, name)

    def remote(self, *args):
        self.ray.started.append(self.name)
        return FakeActor(self.ray, self.cls(*args), self.name)


class FakeActor:
    def __init__(self, ray, worker, name):
        self.ray, self.worker, self.name, self.dead = ray, worker, name, False

    def __getattr__(self, method):
        actor = self

        class Method:
            @staticmethod
            def remote(*args):
                def ref():
                    index = args[0].index if args else None
                    if not actor.dead and (index in actor.ray.always or index in actor.ray.kills):
                        actor.ray.kills.discard(index)
                        actor.dead = True
                    if actor.dead:
                        raise FakeRay.exceptions.ActorDiedError(f"{actor.name} died")
                    try:
                        return getattr(actor.worker, method)(*args)
                    except Exception as err:  # noqa: BLE001
                        raise FakeRay.exceptions.RayTaskError(f"{type(err).__name__}: {err}") from err

                return ref

        return Method


@pytest.fixture()
def fake_ray(monkeypatch):
    def install(**kwargs):
        fake = FakeRay(**kwargs)
        monkeypatch.setattr(ray_engine, "import_ray", lambda: fake)
        return fake

    with one_thread():  # a worker sets torch to one thread: keep this process's setting
        yield install


def ray_run(docs, pipeline, out, n_process=2, settings=CPU, **options):
    return annotate([docs], pipeline, out, {**RUN, "engine": "ray", "n_process": n_process, **options}, settings)


def test_the_driver_writes_what_the_local_engine_writes(tmp_path, pipeline, docs, reference, fake_ray):
    fake = fake_ray()
    summary = ray_run(docs, pipeline, tmp_path / "out")
    assert_same_output(tmp_path / "out", reference)
    run = summary["this_run"]
    assert (run["engine"], run["workers"], run["units"], run["units_annotated"], run["units_retried"]) == (
        "ray",
        2,
        10,
        10,
        0,
    )
    assert len(fake.started) == 2  # each worker loaded the pipeline once
    provenance = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert provenance["runs"][-1]["engine"] == "ray" and provenance["runs"][-1]["worker_device"] == "cpu"


def test_the_workers_load_the_pipeline_with_the_jobs_settings(tmp_path, pipeline, docs, fake_ray, monkeypatch):
    loaded = []
    original = ray_engine.load_pipeline

    def load(pipeline_dir, name, overrides):
        loaded.append(overrides)
        return original(pipeline_dir, name, overrides)

    monkeypatch.setattr(ray_engine, "load_pipeline", load)
    fake_ray()
    ray_run(docs, pipeline, tmp_path / "out", n_process=1, settings={"device": "auto", "output.threshold": 0.999})
    # auto on a cluster without GPUs: CPU workers
    assert loaded == [{"device": "cpu", "output": {"threshold": 0.999}}]
    mentions = [
        m
        for part in (tmp_path / "out").glob("part-*")
        for line in part.read_text().splitlines()
        for m in json.loads(line)["mentions"]
    ]
    assert mentions and not any(m["kb_id"] for m in mentions)  # every score is below the threshold


@pytest.mark.parametrize("format", ["pubtator", "bioc", "docbin"])
def test_every_output_format_is_the_local_engines(tmp_path, pipeline, docs, fake_ray, format):
    local_run(docs, pipeline, tmp_path / "local", format=format)
    fake_ray()
    ray_run(docs, pipeline, tmp_path / "ray", format=format)
    assert_same_output(tmp_path / "ray", tmp_path / "local")


def test_a_document_the_pipeline_fails_on_is_an_error_and_the_run_goes_on(tmp_path, pipeline, fake_ray, monkeypatch):
    from test_annotate import poison

    path = job_input(tmp_path / "in.jsonl", n=20)
    lines = path.read_text().splitlines()
    lines[7] = json.dumps({"id": "bad", "text": "POISON renal failure"})
    path.write_text("\n".join(lines) + "\n")
    poison(monkeypatch)
    local = local_run(path, pipeline, tmp_path / "local")
    fake_ray()
    summary = ray_run(path, pipeline, tmp_path / "ray")
    assert_same_output(tmp_path / "ray", tmp_path / "local")
    assert summary["errors"] == local["errors"] == 2  # the poisoned document and the line that is not JSON
    assert any(
        json.loads(line).get("id") == "bad" and "poisoned" in line
        for line in (tmp_path / "ray" / "errors.jsonl").read_text().splitlines()
    )


def test_a_dead_workers_units_are_sent_again(tmp_path, pipeline, docs, reference, fake_ray):
    fake = fake_ray(kills={3, 6})
    summary = ray_run(docs, pipeline, tmp_path / "out")
    assert_same_output(tmp_path / "out", reference)
    assert summary["this_run"]["units_retried"] >= 2 and len(fake.started) >= 4
    assert len(fake.started) == len(set(fake.started))  # a new name for each new actor


def test_a_unit_that_kills_every_worker_stops_the_run_and_a_rerun_finishes(
    tmp_path, pipeline, docs, reference, fake_ray
):
    fake_ray(always={4})
    with pytest.raises(AnnotateError, match=r"unit 4 \(from .*docs.jsonl:\d+\): its Ray worker died 3 times"):
        ray_run(docs, pipeline, tmp_path / "out")
    assert not (tmp_path / "out" / "summary.json").exists() and not (tmp_path / "out" / "part-000004.jsonl").exists()
    fake_ray()
    summary = ray_run(docs, pipeline, tmp_path / "out", n_process=1)
    assert_same_output(tmp_path / "out", reference)
    assert summary["this_run"]["units_annotated"] < 10


def test_an_error_in_a_workers_code_stops_the_run(tmp_path, pipeline, docs, fake_ray, monkeypatch):
    fake_ray()

    def broken(self, items, path):
        raise OSError("no space left on the worker")

    monkeypatch.setattr(writers.JsonlWriter, "write", broken)
    with pytest.raises(AnnotateError, match="a Ray worker failed on unit .*no space left"):
        ray_run(docs, pipeline, tmp_path / "out")


def test_a_rerun_after_the_driver_died_annotates_only_the_missing_units(tmp_path, pipeline, docs, reference, fake_ray):
    fake_ray()
    out = tmp_path / "out"
    shutil.copytree(reference, out)
    for name in ("part-000002.jsonl", "part-000007.jsonl", "summary.json"):  # units 2 and 7 never came back
        (out / name).unlink()
    summary = ray_run(docs, pipeline, out)
    assert_same_output(out, reference)
    run = summary["this_run"]
    assert (run["units_annotated"], run["units_resumed"], run["documents_annotated"]) == (2, 8, 2 * RUN["chunk_size"])


@pytest.mark.parametrize(
    "earlier_chunk_size,kept", [(9, ["part-000000.jsonl", "part-000002.jsonl"]), (4, ["part-000001.jsonl"])]
)
def test_a_rerun_with_another_chunk_size_loses_and_repeats_nothing(
    tmp_path, pipeline, docs, fake_ray, earlier_chunk_size, kept
):
    out = tmp_path / "out"
    local_run(docs, pipeline, out, chunk_size=earlier_chunk_size)
    for chunk in out.glob("part-*"):
        if chunk.name not in kept:
            chunk.unlink()
    (out / "summary.json").unlink()
    fake_ray()
    summary = ray_run(docs, pipeline, out)
    ids = written_ids(out)
    assert sorted(ids) == sorted(f"d{i}" for i in range(N_DOCS)) and summary["documents_written"] == N_DOCS


def test_options_that_cannot_run_on_ray_are_refused_before_anything_is_written(tmp_path, docs, monkeypatch):
    cases = [
        (dict(engine="spark"), None, "^engine 'spark': unknown engine"),
        (dict(ray_address="auto"), None, "^ray_address needs engine ray$"),
        (dict(engine="ray"), {"device": "cuda:1"}, "^device cuda:1 with engine ray: .*; use device cuda$"),
        (dict(engine="ray"), {"device": "tpu"}, "^device tpu: use auto, cpu or cuda with engine ray$"),
    ]
    for options, genbioel_settings, message in cases:
        with pytest.raises(AnnotateError, match=message):
            annotate([docs], tmp_path / "no_pipeline", tmp_path / "out", options, genbioel_settings)
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    with pytest.raises(AnnotateError, match=r"^engine ray needs Ray: pip install 'spacy_genbioel\[ray\]'"):
        annotate([docs], tmp_path / "no_pipeline", tmp_path / "out", {"engine": "ray"})
    assert not (tmp_path / "out").exists()


def test_the_command_line_takes_the_engine_options(tmp_path, docs):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    result = CliRunner().invoke(
        app,
        [
            "annotate",
            str(docs),
            "--pipeline",
            str(tmp_path / "p"),
            "--out",
            str(tmp_path / "out"),
            "--ray-address",
            "auto",
        ],
    )
    assert result.exit_code == 1 and "--ray-address needs --engine ray" in result.output
    result = CliRunner().invoke(
        app,
        [
            "annotate",
            str(docs),
            "--pipeline",
            str(tmp_path / "p"),
            "--out",
            str(tmp_path / "out"),
            "--engine",
            "ray",
            "--device",
            "cuda:0",
        ],
    )
    assert result.exit_code == 1 and "use --device cuda" in result.output
