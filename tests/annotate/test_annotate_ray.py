"""``annotate --engine ray`` on a real local Ray with two CPUs (marker ``ray``, deselected by default:
``python -m pytest -m ray tests/annotate/test_annotate_ray.py``; skipped without ray): one and two workers
write what the local engine writes, byte for byte; a worker killed mid-unit (by its pid, from
here) and a driver killed mid-run (then the same command again) lose and repeat nothing, and the
killed driver's workers end with it."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from annotate_jobs import CPU, RUN, assert_same_output, job_input, local_run, still_alive  # noqa: E402
from fuzz_annotate import build_pipeline  # noqa: E402

from spacy_genbioel.annotate import annotate  # noqa: E402
from spacy_genbioel.annotate.ray_engine import ACTOR_PREFIX, worker_status  # noqa: E402

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
N_DOCS = 200
JOB = {**RUN, "chunk_size": 20, "batch_size": 8}  # 10 units of 20 documents: a second or two of linking each run


@pytest.fixture(scope="module")
def cluster():
    """A local Ray with two CPUs, as `annotate --engine ray` starts one; its address, for a second driver."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def job(tmp_path_factory, micro_model, word_tokenizer):
    """(pipeline, input, the local engine's output in one process with one torch thread)."""
    root = tmp_path_factory.mktemp("ray_job")
    pipeline = build_pipeline(root, micro_model, word_tokenizer)
    docs = job_input(root / "docs.jsonl", n=N_DOCS)
    local_run(docs, pipeline, root / "local", **JOB)
    return pipeline, docs, root / "local"


def ray_run(job, out, n_process, **options):
    pipeline, docs, _ = job
    return annotate([docs], pipeline, out, {**JOB, "engine": "ray", "n_process": n_process, **options}, CPU)


def test_one_and_two_workers_write_what_the_local_engine_writes(cluster, job, tmp_path):
    for n in (1, 2):
        summary = ray_run(job, tmp_path / f"ray{n}", n)
        assert_same_output(tmp_path / f"ray{n}", job[2])
        run = summary["this_run"]
        assert (run["workers"], run["units"], run["units_annotated"], run["units_retried"]) == (n, 10, 10, 0)
        assert run["documents_annotated"] == N_DOCS and run["documents_per_s"] > 0


def kill_a_worker_mid_unit(deadline: float) -> dict:
    """Find a worker of the run half-way through a unit and SIGKILL its process; its status then."""
    while time.monotonic() < deadline:
        for name in ray.util.list_named_actors():
            if not name.startswith(ACTOR_PREFIX):
                continue
            try:
                status = worker_status(ray, ray.get_actor(name), timeout=5)
            except (ValueError, ray.exceptions.RayError):  # gone, or still loading its pipeline
                continue
            if status["unit"] is not None and 0 < status["documents"] < status["of"]:
                os.kill(status["pid"], signal.SIGKILL)
                return status
        time.sleep(0.005)
    raise AssertionError("no worker was seen in the middle of a unit")


def worker_pids() -> list:
    """The processes of the worker actors on the cluster, of any driver (those whose pipeline is loaded)."""
    pids = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith(ACTOR_PREFIX):
            with contextlib.suppress(ValueError, ray.exceptions.RayError):
                pids.append(
                    worker_status(ray, ray.get_actor(actor["name"], namespace=actor["namespace"]), timeout=5)["pid"]
                )
    return pids


def test_a_worker_killed_mid_unit_is_replaced_and_its_units_sent_again(cluster, job, tmp_path):
    out = tmp_path / "out"
    result = {}

    def run():
        try:
            result["summary"] = ray_run(job, out, 2)
        except BaseException as err:  # noqa: BLE001  (reported below)
            result["error"] = err

    thread = threading.Thread(target=run)
    thread.start()
    try:
        killed = kill_a_worker_mid_unit(time.monotonic() + 120)
    finally:
        thread.join(300)
    assert "error" not in result, result.get("error")
    assert (out / f"part-{killed['unit']:06d}.jsonl").stat().st_size > 0  # the unit it was on, committed once
    assert_same_output(out, job[2])
    run = result["summary"]["this_run"]
    assert run["units_retried"] >= 1 and run["units_annotated"] == 10 and run["documents_annotated"] == N_DOCS


def test_a_driver_killed_mid_run_then_run_again_loses_and_repeats_nothing(cluster, job, tmp_path):
    """The driver is the command line, on this module's Ray (`--ray-address`); killed after its first
    chunk landed, then the same job again (here, on the same Ray) finishes it."""
    pipeline, docs, _ = job
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "spacy_genbioel",
        "annotate",
        str(docs),
        "--pipeline",
        str(pipeline),
        "--out",
        str(out),
        "--engine",
        "ray",
        "--ray-address",
        cluster,
        "--n-process",
        "2",
        "--device",
        "cpu",
        "--no-progress",
        "--chunk-size",
        str(JOB["chunk_size"]),
        "--batch-size",
        str(JOB["batch_size"]),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    with (tmp_path / "driver.log").open("wb") as log:
        driver = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        try:
            while not list(out.glob("part-*.jsonl")):
                assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the driver never committed a unit"
                time.sleep(0.005)
            workers = worker_pids()
            driver.send_signal(signal.SIGKILL)
        finally:
            driver.wait(timeout=60)
    assert driver.returncode == -signal.SIGKILL and not (out / "summary.json").exists()
    assert len(workers) == 2 and still_alive(workers, 60) == []  # the driver's actors died with it
    committed = len(list(out.glob("part-*.jsonl")))
    assert 1 <= committed < 10
    summary = ray_run(job, out, 2)
    assert_same_output(out, job[2])
    run = summary["this_run"]
    assert run["units_resumed"] >= committed >= 1 and run["units_annotated"] == 10 - run["units_resumed"]
    assert run["documents_resumed"] == JOB["chunk_size"] * run["units_resumed"]
