"""Issue 31, the annotate job: workers that die with their parent and a lock that goes with it
(item 1), a parent that notices a dead worker (item 2), output folders where writing changes the
job (item 9), read-only output (item 10). The fast tests fork small processes; the ones that
kill real annotate runs are marked slow, as are the command-line ones."""

import errno
import multiprocessing
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from annotate_jobs import (
    CPU,
    N_DOCS,
    RUN,
    assert_same_output,
    children,
    job_input,
    killed_run,
    local_run,
    one_thread,
    read_only_call,
    still_alive,
    written_ids,
)
from fuzz_annotate import build_pipeline

from spacy_genbioel.annotate import AnnotateError, annotate, job, runner, workers
from spacy_genbioel.annotate.checkpoint import output_lock
from spacy_genbioel.annotate.records import ChunkSummary
from spacy_genbioel.annotate.units import Unit, UnitResult

REPO = Path(__file__).resolve().parents[2]
FORK = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def job_files(tmp_path_factory, micro_model, word_tokenizer):
    """(pipeline, input of 60 documents, the one-process one-thread output: 10 chunks of 6)."""
    root = tmp_path_factory.mktemp("workers_job")
    pipeline = build_pipeline(root, micro_model, word_tokenizer)
    docs = job_input(root / "docs.jsonl")
    local_run(docs, pipeline, root / "reference")
    return pipeline, docs, root / "reference"


def units(n):
    return [Unit(i, [], f"in.jsonl:{i + 1}") for i in range(n)]


def result(unit):
    return UnitResult(unit.index, None, ChunkSummary([], 0, 0))


def run_units(work, n_units=10, n_process=2):
    """run_forked over ``n_units`` empty units; (indexes committed in order of commit, counts)."""
    pending, committed, counts = iter(units(n_units)), [], Counter()
    workers.run_forked(work, lambda: next(pending, None), lambda r: committed.append(r.index), n_process, counts)
    return committed, counts


def dies_on(unit_index, marker=None):
    """Work that SIGKILLs its own process on ``unit_index`` (the first time only when ``marker``, a path, is given)."""

    def work(unit):
        if unit.index == unit_index and (marker is None or not marker.exists()):
            if marker is not None:
                marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return result(unit)

    return work


# -- item 1: workers die with their parent; the lock goes with it -------------------------------------------------
def _sleep(ready):
    ready.set()  # (the child closed its copy of the lock at the fork, before it runs anything)
    time.sleep(60)


def test_forked_children_do_not_hold_the_output_lock(tmp_path):
    import fcntl

    with output_lock(tmp_path):
        ready = FORK.Event()
        child = FORK.Process(target=_sleep, args=(ready,))
        child.start()
        assert ready.wait(30)
    try:
        with (tmp_path / ".lock").open("w") as handle:  # another open file: refused while anyone holds the lock
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        with output_lock(tmp_path):
            pass
    finally:
        child.kill()
        child.join()


def _busy_pool_then_die(report, parent_death_signal):
    """A parent: two workers on a unit each (sleeping: not reading their pipe), their pids reported, then kill -9."""
    if not parent_death_signal:
        workers.PR_SET_PDEATHSIG = 0  # prctl(0, ...) does nothing: the watchdog alone
        workers.WATCH_S = 0.05
    pool = workers.ForkPool(2, lambda unit: time.sleep(120))
    for slot, unit in enumerate(units(2)):
        pool.send(slot, (unit, 1))
    report.send(pool.pids)
    time.sleep(0.2)  # the workers are in their unit
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("parent_death_signal", [True, False], ids=["prctl", "watchdog"])
def test_workers_die_with_their_parent(parent_death_signal):
    receive, send = FORK.Pipe(duplex=False)
    parent = FORK.Process(target=_busy_pool_then_die, args=(send, parent_death_signal))
    parent.start()
    pids = receive.recv()
    parent.join()
    assert parent.exitcode == -signal.SIGKILL
    assert still_alive(pids, 30) == [], "workers outlived their parent"


def test_a_run_killed_mid_way_leaves_no_worker_and_a_free_lock(tmp_path, job_files):
    pipeline, docs, reference = job_files
    out = tmp_path / "out"
    report = killed_run(
        lambda: annotate([docs], pipeline, out, {**RUN, "n_process": 2}, CPU), out, "parent", random.Random(0), delay=0
    )
    assert report["killed"] == "parent" and report["strays"] == [] and not (out / "summary.json").exists()
    with one_thread():  # at once: the lock went with the parent
        annotate([docs], pipeline, out, {**RUN, "n_process": 2}, CPU)
    assert_same_output(out, reference)


# -- item 2: the parent notices a dead worker ---------------------------------------------------------------------
def test_a_dead_workers_unit_is_annotated_again_by_a_new_worker(tmp_path):
    committed, counts = run_units(dies_on(3, tmp_path / "died"))
    assert sorted(committed) == list(range(10)) and counts["units_retried"] == 1
    assert multiprocessing.active_children() == []


def test_a_unit_whose_worker_dies_twice_stops_the_run_naming_it():
    with pytest.raises(
        AnnotateError,
        match=r"^unit 4 \(from in\.jsonl:5\): its worker process died 2 times "
        r"\(killed by SIGKILL: out of memory, or kill -9\); what was committed is kept",
    ):
        run_units(dies_on(4))
    assert multiprocessing.active_children() == []


def test_a_worker_dead_while_idle_is_replaced():
    pool = workers.ForkPool(1, result)
    try:
        pool.workers[0].process.kill()
        pool.workers[0].process.join()
        pool.send(0, (units(1)[0], 1))
        assert pool.workers[0].conn.recv()[0] == "done"
    finally:
        pool.workers[0].sent = None
        pool.close(graceful=True)


def test_an_error_in_a_workers_code_stops_the_run():
    def work(unit):
        if unit.index == 2:
            raise OSError("no space left in the worker")
        return result(unit)

    with pytest.raises(AnnotateError, match=r"^a worker failed on unit 2 \(from in\.jsonl:3\): OSError: no space left"):
        run_units(work)
    assert multiprocessing.active_children() == []


def test_each_worker_runs_start_with_its_slot_before_its_units(tmp_path):
    """``start(slot)`` runs once per worker, first; a replacement worker runs it for the same slot."""

    def start(slot):
        (tmp_path / f"{slot}-{os.getpid()}").write_text("")

    def work(unit):
        started = [p.name for p in tmp_path.iterdir() if p.name.endswith(f"-{os.getpid()}")]
        assert len(started) == 1, started
        if unit.index == 3 and not (tmp_path / "died").exists():
            (tmp_path / "died").touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return result(unit)

    pending, committed, counts = iter(units(8)), [], Counter()
    workers.run_forked(work, lambda: next(pending, None), lambda r: committed.append(r.index), 2, counts, start)
    assert sorted(committed) == list(range(8)) and counts["units_retried"] == 1
    slots = sorted(p.name.split("-")[0] for p in tmp_path.iterdir() if p.name != "died")
    assert slots in (["0", "0", "1"], ["0", "1", "1"])  # two workers, and the one that died started again


def test_a_worker_whose_start_fails_stops_the_run():
    def start(slot):
        if slot == 1:
            raise RuntimeError("CUDA out of memory")

    pending, counts = iter(units(6)), Counter()
    with pytest.raises(AnnotateError, match=r"could not start \(RuntimeError: CUDA out of memory\)"):
        workers.run_forked(result, lambda: next(pending, None), lambda r: None, 2, counts, start)
    assert multiprocessing.active_children() == []


def test_worker_devices(monkeypatch):
    import torch

    from spacy_genbioel.annotate.options import worker_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [worker_device("cuda", slot) for slot in range(5)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert worker_device("cuda:1", 0) == worker_device("cuda:1", 3) == "cuda:1"
    with pytest.raises(AnnotateError, match="^device cuda:2: there are 2 CUDA devices"):
        worker_device("cuda:2", 0)
    for wrong in ("cpu", "tpu", "cuda:x"):
        with pytest.raises(AnnotateError, match=f"^device {wrong}: "):
            worker_device(wrong, 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(AnnotateError, match="^device cuda: no CUDA device is available"):
        worker_device("cuda", 0)


def test_exit_reasons():
    assert workers.exit_reason(-signal.SIGKILL) == "killed by SIGKILL: out of memory, or kill -9"
    assert workers.exit_reason(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert workers.exit_reason(3) == "exit code 3"


def test_a_worker_killed_mid_job_costs_nothing(tmp_path, job_files, monkeypatch):
    """The job's own run: a worker dies on unit 5; a new one annotates it; the folder is a one-process run's."""
    pipeline, docs, reference = job_files
    original, marker = runner.annotate_unit, tmp_path / "died"

    def annotate_unit(nlp, writer, spans_key, unit, batch_size):
        dies_on(5, marker)(unit)
        return original(nlp, writer, spans_key, unit, batch_size)

    monkeypatch.setattr(runner, "annotate_unit", annotate_unit)
    summary = annotate([docs], pipeline, tmp_path / "out", {**RUN, "n_process": 2}, CPU)
    assert_same_output(tmp_path / "out", reference)
    assert summary["this_run"]["units_retried"] == 1 and summary["this_run"]["units_annotated"] == 10


# -- item 9: folders where writing changes the job ------------------------------------------------------------------
def test_an_output_folder_that_is_an_input_folder_or_in_the_pipeline_is_refused(tmp_path, job_files):
    pipeline, docs, _ = job_files
    folder = tmp_path / "in"
    folder.mkdir()
    job_input(folder / "docs.jsonl", n=8)
    before = sorted(p.name for p in folder.iterdir())
    cases = [
        (dict(out=folder), r"^out .* is in the input folder .*; give another out$"),
        (dict(out=pipeline / "annotated"), r"^out .* is in the pipeline folder .*; give another out$"),
        (dict(out=pipeline), r"^out .* is in the pipeline folder"),
        (dict(out=tmp_path / "out", errors_path=folder / "errors.jsonl"), r"^errors_path .* is in the input folder"),
        (dict(out=tmp_path / "out", errors_path=docs, inputs=[docs]), r"^errors_path .* is an input file"),
    ]
    for where, message in cases:
        with pytest.raises(AnnotateError, match=message):
            annotate(
                where.get("inputs", [folder]),
                pipeline,
                where["out"],
                {**RUN, "errors_path": where.get("errors_path")},
                CPU,
            )
    assert sorted(p.name for p in folder.iterdir()) == before and not (pipeline / "annotated").exists()
    assert not (tmp_path / "out").exists()


def test_an_output_folder_beside_an_input_file_or_inside_an_input_folder_is_refused_naming_both(tmp_path, job_files):
    pipeline, docs, _ = job_files
    folder = tmp_path / "in"
    (folder / "sub").mkdir(parents=True)
    job_input(folder / "docs.jsonl", n=8)
    before = sorted(p.name for p in folder.rglob("*"))
    cases = [  # (inputs, out, errors_path, the paths the message names)
        ([folder / "docs.jsonl"], folder, None, ["out", str(folder), str(folder / "docs.jsonl")]),
        ([folder / "docs.jsonl"], tmp_path / "o", folder / "e.jsonl", ["errors_path", str(folder / "docs.jsonl")]),
        ([folder], folder / "out", None, ["out", str(folder / "out"), str(folder)]),
        ([folder], folder / "sub" / "deeper", None, ["out", str(folder / "sub" / "deeper"), str(folder)]),
    ]
    for inputs, out, errors_path, words in cases:
        with pytest.raises(AnnotateError) as refused:
            annotate(inputs, pipeline, out, {**RUN, "errors_path": errors_path}, CPU)
        assert all(word in str(refused.value) for word in words), str(refused.value)
        assert "give another" in str(refused.value)
    assert sorted(p.name for p in folder.rglob("*")) == before and not (tmp_path / "o").exists()
    # beside the input folder, not in it: fine
    summary = annotate([folder / "docs.jsonl"], pipeline, tmp_path / "out", RUN, CPU)
    assert summary["documents_written"] == 8


# -- item 10: read-only output ----------------------------------------------------------------------------------------
def writable_except(monkeypatch, folder):
    """Make :func:`os.access` answer as a read-only mount would for ``folder``."""
    original = os.access
    monkeypatch.setattr(job.os, "access", lambda path, mode: False if Path(path) == folder else original(path, mode))


def test_a_read_only_output_folder_is_an_error_unless_its_job_is_done(tmp_path, job_files, monkeypatch):
    pipeline, docs, reference = job_files
    out = tmp_path / "out"
    out.mkdir()
    writable_except(monkeypatch, out)
    with pytest.raises(
        AnnotateError, match=r"^out .* is not writable .* and is where a new job would be written; give a writable out$"
    ):
        annotate([docs], pipeline, out, RUN, CPU)
    assert list(out.iterdir()) == []
    monkeypatch.undo()
    local_run(docs, pipeline, out)
    state = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()}
    writable_except(monkeypatch, out)
    summary = annotate([docs], pipeline, out, RUN, CPU)  # finished: nothing to do, nothing written
    assert summary["documents_written"] == N_DOCS and summary["this_run"]["read_only"] is True
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.iterdir()} == state
    (out / "summary.json").unlink()  # as after a kill
    with pytest.raises(AnnotateError, match=r"^out .* is not writable .* holds this job, unfinished: copy it"):
        annotate([docs], pipeline, out, RUN, CPU)


def test_a_write_that_fails_is_an_error_not_a_traceback(tmp_path, job_files, monkeypatch):
    pipeline, docs, _ = job_files

    def read_only(*args):
        raise OSError(errno.EROFS, "Read-only file system", str(args[0]))

    monkeypatch.setattr(runner, "record_job", read_only)
    with pytest.raises(AnnotateError, match=r"^cannot write the output \(\[Errno 30\] Read-only file system"):
        annotate([docs], pipeline, tmp_path / "out", RUN, CPU)


def test_a_real_read_only_mount(tmp_path, job_files):
    """The folder bind-mounted read-only in a mount namespace of a forked child (skipped where none can be made)."""
    pipeline, docs, _ = job_files
    out, fresh, errors = tmp_path / "out", tmp_path / "fresh", tmp_path / "errors"
    fresh.mkdir()
    errors.mkdir()
    local_run(docs, pipeline, out)
    kind, value = read_only_call([out], lambda: annotate([docs], pipeline, out, RUN, CPU)["this_run"])
    if kind == "unavailable":
        pytest.skip(f"no read-only mount can be made here ({value})")
    assert (kind, value["read_only"], value["documents_annotated"]) == ("ok", True, 0)
    kind, value = read_only_call([fresh], lambda: annotate([docs], pipeline, fresh, RUN, CPU))
    assert kind == "raised" and value[0] == "AnnotateError" and "is not writable" in value[1]
    # an errors file that cannot be written: the run stops with one line, and nothing is left half-done
    kind, value = read_only_call(
        [errors], lambda: annotate([docs], pipeline, tmp_path / "o2", {**RUN, "errors_path": errors / "e.jsonl"}, CPU)
    )
    assert kind == "raised" and value[0] == "AnnotateError" and value[1].startswith("cannot write the output")


# -- the command line, killed for real (slow: a process start is several seconds) --------------------------------------
def command(docs, pipeline, out, n_process):
    return [
        sys.executable,
        "-m",
        "spacy_genbioel",
        "annotate",
        str(docs),
        "--pipeline",
        str(pipeline),
        "--out",
        str(out),
        "--n-process",
        str(n_process),
        "--device",
        "cpu",
        "--no-progress",
        "--chunk-size",
        "6",
        "--batch-size",
        "4",
    ]


def start(argv, log):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["parent", "worker"])
def test_the_command_killed_then_run_again(tmp_path, job_files, target):
    """``annotate --n-process 2``: the parent killed (its workers end, the same command runs at once), or one
    worker killed (the run finishes by itself); the folder is then a one-process run's."""
    pipeline, docs, reference = job_files
    out = tmp_path / "out"
    with (tmp_path / "log").open("wb") as log:
        proc = start(command(docs, pipeline, out, 2), log)
        deadline = time.monotonic() + 120
        while not list(out.glob("part-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        pids = children(proc.pid)
        assert proc.poll() is None and len(pids) == 2, (tmp_path / "log").read_text()[-2000:]
        os.kill(proc.pid if target == "parent" else pids[0], signal.SIGKILL)
        proc.wait(timeout=120)
        assert still_alive(pids, 30) == []
        if target == "parent":
            assert proc.returncode == -signal.SIGKILL
            rerun = start(command(docs, pipeline, out, 2), log)
            assert rerun.wait(timeout=300) == 0, (tmp_path / "log").read_text()[-2000:]
        else:
            assert proc.returncode == 0, (tmp_path / "log").read_text()[-2000:]
            assert "died (killed by SIGKILL" in (tmp_path / "log").read_text()
    assert_same_output(out, reference)
    assert sorted(written_ids(out)) == sorted(f"d{i}" for i in range(N_DOCS))


@pytest.mark.slow
def test_the_command_on_a_read_only_output_is_one_line(tmp_path, job_files):
    pipeline, docs, _ = job_files
    out = tmp_path / "out"
    out.mkdir()
    argv = command(docs, pipeline, out, 1)
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no unshare here")
    script = f'mount --bind -o ro {out} {out} && exec "$@"'
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    said = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", done.stdout).split())  # (wasabi colours and wraps long lines)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert said.startswith("✘ --out ") and "is not writable" in said, said
