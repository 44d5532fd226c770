"""``engine="ray"``: the units of an annotation job (:mod:`.units`) on a pool of
Ray actors, each with the pipeline loaded once, on a local Ray started for the
run or on a cluster (``ray_address``).

    annotate(inputs, "pipeline/", "out/", {"engine": "ray", "n_process": 8, "ray_address": "auto"}, {"device": "cuda"})

How a run goes (``docs/scale.md`` has the long version):

* The driver (this process) does everything but the linking: it checks and
  locks the output folder as the local engine does (:mod:`.runner`), reads the
  inputs, logs bad records and duplicates, cuts the document stream into units
  (:func:`~.units.plan_units`: unit *k* is the local engine's chunk *k*), sends
  each unit's records to a worker, and commits what comes back: the chunk
  file's bytes, atomically, then its checkpoint line, then the errors of the
  unit's documents that failed. Only the driver writes to the output folder,
  so it need not be on storage the workers share; the pipeline must be
  loadable at the same path on every node.
* ``n_process`` workers (actors): with ``device="cuda"``, or ``"auto"`` on a
  cluster with GPUs, one GPU each (``num_gpus=1``); otherwise one CPU each,
  running torch on one thread. Each worker loads the pipeline once and
  annotates the units it is sent, ``nlp.pipe`` batches restarting at each
  unit, so a unit's chunk file is the one the local engine writes in one
  process with one torch thread.
* Units are committed as they finish, so out of order; the checkpoint is put
  back in chunk order when the run finishes. A worker that dies (its process
  killed, its node lost, out of memory) is replaced by a new actor and its
  units are sent again; a unit whose worker dies :data:`MAX_ATTEMPTS` times
  stops the run. Nothing a dead worker did is in the folder: a unit is
  committed by the driver once, or not at all.
* A driver that dies takes its actors with it (they are not detached). The
  same command again skips the committed units and annotates the rest, with
  any number of workers, or with the local engine (which numbers the
  remaining chunks after the last one instead of by unit).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import logging
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Tuple

from spacy_genbioel.annotate.checkpoint import Checkpoint, ErrorLog
from spacy_genbioel.annotate.options import AnnotateOptions
from spacy_genbioel.annotate.readers import safe_records
from spacy_genbioel.annotate.records import ERRORS, PROVENANCE, SUMMARY, AnnotateError, named
from spacy_genbioel.annotate.timing import StageClock
from spacy_genbioel.annotate.units import (
    Committer,
    Unit,
    UnitResult,
    annotate_unit,
    first_seen,
    load_pipeline,
    plan_units,
    run_summary,
)
from spacy_genbioel.annotate.writers import WRITERS
from spacy_genbioel.progress import InputProgress
from spacy_genbioel.util import atomic_json

logger = logging.getLogger(__name__)

__all__ = ["ACTOR_PREFIX", "MAX_ATTEMPTS", "UnitWorker", "import_ray", "run_on_ray", "worker_status"]

ACTOR_PREFIX = "genbioel-annotate"  # worker actors are named f"{ACTOR_PREFIX}-<run>-<slot>.<generation>"
MAX_ATTEMPTS = 3  # a unit is sent this many times at most
QUEUE_DEPTH = 2  # units queued on a worker, so that it never waits for the driver


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise AnnotateError(f"{named('engine')} ray needs Ray: pip install 'spacy_genbioel[ray]' (ray>=2.60)") from None
    return ray


class UnitWorker:
    """A Ray actor (made remote by :class:`WorkerPool`): the pipeline, loaded once, annotating the
    units it is sent one after the other. :meth:`status` runs in a concurrency group of its own,
    so it answers while a unit runs (:func:`worker_status`)."""

    def __init__(
        self, pipeline_dir: str, name: str, overrides: Dict[str, Any], format: str, batch_size: int, threads: int
    ) -> None:
        """The pipeline in ``pipeline_dir``, its genbioel component ``name`` overridden by ``overrides``
        (nested settings, ``device`` among them); ``threads``: torch's."""
        import torch

        torch.set_num_threads(threads)
        device = overrides["device"]
        self.nlp, component = load_pipeline(Path(pipeline_dir), name, overrides)
        component.build_indexes()  # now, not in the first unit: the rates count from every worker ready
        self.writer = WRITERS[format](spans_key=component.spans_key)
        self.spans_key = component.spans_key
        self.batch_size = batch_size
        self.state: Dict[str, Any] = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": device,
            "unit": None,
            "documents": 0,
            "of": 0,
        }

    def ready(self) -> Dict[str, Any]:
        return self.status()

    def status(self) -> Dict[str, Any]:
        """``pid``, ``host``, ``device``, the ``unit`` in progress (None when idle),
        its ``documents`` done ``of`` its size."""
        return dict(self.state)

    def run(self, unit: Unit) -> UnitResult:
        self.state.update(unit=unit.index, documents=0, of=len(unit.records))
        try:
            result = annotate_unit(
                self.nlp,
                self.writer,
                self.spans_key,
                unit,
                self.batch_size,
                progress=lambda done: self.state.update(documents=done),
            )
        finally:
            self.state.update(unit=None)
        return result


@contextlib.contextmanager
def connected(ray: Any, address: Optional[str], n_process: int) -> Iterator[str]:
    """Ray for the run: this process's when it has one, else a new local Ray (``address`` None; as many
    CPUs as the machine has, at least ``n_process``) or the cluster at ``address``, shut down after."""
    if ray.is_initialized():
        if address is not None:
            logger.warning("this process is connected to Ray already; ray_address %s is not used", address)
        yield "this process's Ray"
        return
    try:
        if address is None:
            ray.init(
                address="local",
                num_cpus=max(os.cpu_count() or 1, n_process),
                include_dashboard=False,
                logging_level=logging.WARNING,
            )
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except Exception as err:  # noqa: BLE001  (ConnectionError, RuntimeError, ValueError...: Ray's own)
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise AnnotateError(f"cannot start or reach {where} ({type(err).__name__}: {str(err)[:300]})") from err
    try:
        yield address or "a local Ray"
    finally:
        ray.shutdown()


class WorkerPool:
    """``n`` UnitWorker actors; a dead one is replaced under the next generation of its name."""

    def __init__(self, ray: Any, n: int, options: Dict[str, Any], args: Tuple[Any, ...]) -> None:
        self.ray = ray
        # the driver resends the units of a dead worker itself (it counts them and gives up on a unit at last)
        self.remote = ray.remote(concurrency_groups={"status": 1}, max_restarts=0, max_task_retries=0, **options)(
            UnitWorker
        )
        self.args = args
        self.run_id = uuid.uuid4().hex[:8]
        self.generation = [0] * n
        self.actors = [self._start(slot) for slot in range(n)]
        self.load = [0] * n  # units sent to each and not back yet

    def _start(self, slot: int) -> Any:
        name = f"{ACTOR_PREFIX}-{self.run_id}-{slot}.{self.generation[slot]}"
        return self.remote.options(name=name).remote(*self.args)

    def wait_ready(self) -> List[Dict[str, Any]]:
        try:
            return self.ray.get([a.ready.remote() for a in self.actors])
        except self.ray.exceptions.RayError as err:
            raise AnnotateError(f"a Ray worker could not start ({_cause(err)})") from err

    def replace(self, slot: int, dead: Any) -> None:
        """Start a new actor in ``slot`` unless that was done already for this death."""
        if self.actors[slot] is not dead:
            return
        with contextlib.suppress(Exception):
            self.ray.kill(dead, no_restart=True)
        self.generation[slot] += 1
        self.actors[slot] = self._start(slot)
        self.load[slot] = 0  # what was sent to the dead one comes back as errors and is sent again

    def shutdown(self) -> None:
        for actor in self.actors:
            with contextlib.suppress(Exception):
                self.ray.kill(actor, no_restart=True)


def worker_status(ray: Any, actor: Any, timeout: Optional[float] = None) -> Dict[str, Any]:
    """:meth:`UnitWorker.status` of a worker, also while it annotates a unit (not before its pipeline is loaded)."""
    return ray.get(actor.status.options(concurrency_group="status").remote(), timeout=timeout)


def _cause(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return " ".join(line.strip() for line in text[:6])[:600] if text else type(err).__name__


def worker_options(ray: Any, device: str, n_process: int) -> Tuple[str, Dict[str, Any]]:
    """The workers' device and actor resources, checked against the cluster's."""
    resources = ray.cluster_resources()
    gpus, cpus = resources.get("GPU", 0), resources.get("CPU", 0)
    if device == "cuda" and gpus < 1:
        raise AnnotateError(f"{named('device')} cuda, but the Ray cluster has no GPU")
    if device == "cuda" or (device == "auto" and gpus >= 1):
        if gpus < n_process:
            raise AnnotateError(
                f"{named('n_process')} {n_process} Ray workers with a GPU each, but the cluster has {gpus:g} GPUs"
            )
        return "cuda", {"num_gpus": 1, "num_cpus": 1}
    if cpus < n_process:
        logger.warning(
            "%d CPU workers asked for, the cluster has %g CPUs now: the others wait for CPUs", n_process, cpus
        )
    return "cpu", {"num_cpus": 1}


def _record_run(out: Path, info: Dict[str, Any]) -> None:
    """Add the Ray side of this run (address, workers, their device) to its ``runs`` entry in provenance.json."""
    path = out / PROVENANCE
    data = json.loads(path.read_text(encoding="utf8"))
    if data.get("runs"):
        data["runs"][-1].update(info)
    atomic_json(path, data)


def run_on_ray(
    nlp: Any,
    component: Any,
    inputs: Sequence[Tuple[Path, str]],
    out: Path,
    options: AnnotateOptions,
    *,
    pipeline_dir: Path,
    overrides: Dict[str, Any],
) -> Dict[str, Any]:
    """The job on Ray, in a locked output folder whose job is checked and recorded (called by
    :func:`~.runner.annotate` with ``engine="ray"``): ``inputs`` as (path, format), the workers'
    pipeline ``pipeline_dir`` with ``overrides`` (the job's nested genbioel settings; their ``device``
    is the workers', :func:`worker_options`). Returns the summary, as the local engine's plus the
    Ray figures in ``this_run``."""
    ray = import_ray()
    paths, formats = [p for p, _ in inputs], [f for _, f in inputs]
    format, n_process, errors_path = options.format, options.n_process, options.errors_path
    writer = WRITERS[format](spans_key=component.spans_key)
    checkpoint = Checkpoint(out, writer, nlp.vocab)
    errors = ErrorLog(Path(errors_path) if errors_path else out / ERRORS)
    counts: collections.Counter = collections.Counter()
    clock = StageClock()  # the driver's reading and committing, and the workers' stages
    memory: List[Dict[str, Any]] = []  # the workers' reports
    started = time.monotonic()
    try:
        with connected(ray, options.ray_address, n_process) as where:
            worker_device, resources = worker_options(ray, overrides["device"], n_process)
            pool = WorkerPool(
                ray,
                n_process,
                resources,
                (
                    str(Path(pipeline_dir).resolve()),
                    component.name,
                    {**overrides, "device": worker_device},
                    format,
                    options.batch_size,
                    1,
                ),
            )
            try:
                workers = pool.wait_ready()
                began = time.monotonic()  # rates count from here, as the local engine's from its pipeline loaded
                logger.info(
                    "%d Ray workers on %s: %s",
                    len(workers),
                    where,
                    ", ".join(f"{w['host']}:{w['pid']}" for w in workers),
                )
                _record_run(
                    out,
                    {
                        "engine": "ray",
                        "ray": where,
                        "workers": n_process,
                        "worker_device": worker_device,
                        "worker_resources": resources,
                    },
                )
                # input bytes as the total, as the local engine's bar; committed documents are skipped, not in the rates
                bar = InputProgress("annotate (ray)", paths, counts=("docs", "mentions"), enabled=options.progress)
                try:
                    items = bar.read(
                        itertools.chain.from_iterable(
                            safe_records(p, f, options.read_limits) for p, f in zip(paths, formats)
                        )
                    )
                    units = plan_units(
                        first_seen(items, writer.check, errors, set(), counts),
                        options.chunk_size,
                        checkpoint.done,
                        counts,
                    )
                    _drive(ray, pool, Committer(units, checkpoint, errors, counts, bar, clock, memory))
                finally:
                    bar.close()
            finally:
                pool.shutdown()
        checkpoint.put_in_order()
    finally:
        errors.close()
    seconds = time.monotonic() - began
    summary = run_summary(checkpoint, errors, counts, out, format, seconds, clock, memory)
    summary["this_run"].update(
        {
            "engine": "ray",
            "workers": n_process,
            "worker_device": worker_device,
            "start_seconds": round(began - started, 3),  # Ray up and every worker's pipeline loaded
            "units": counts["units"],
            "units_resumed": counts["units_resumed"],
            "units_annotated": counts["units_annotated"],
            "units_retried": counts["units_retried"],
            # the workers' time on the units committed: documents / worker_seconds is the per-worker rate
            "worker_seconds": round(counts["worker_ms"] / 1000, 3),
        }
    )
    atomic_json(out / SUMMARY, summary)
    return summary


def _drive(ray: Any, pool: WorkerPool, committer: Committer) -> None:
    """Keep every worker :data:`QUEUE_DEPTH` units busy; commit what comes back, resend what a dead worker had."""
    retry: Deque[Tuple[Unit, int]] = collections.deque()
    inflight: Dict[Any, Tuple[int, Any, Unit, int]] = {}  # result ref -> (slot, actor, unit, attempt)
    counts = committer.counts

    def next_unit() -> Optional[Tuple[Unit, int]]:
        if retry:
            return retry.popleft()
        unit = committer.next_unit()
        return None if unit is None else (unit, 1)

    while True:
        for slot in range(len(pool.actors)):
            while pool.load[slot] < QUEUE_DEPTH:
                sent = next_unit()
                if sent is None:
                    break
                actor = pool.actors[slot]
                inflight[actor.run.remote(sent[0])] = (slot, actor, *sent)
                pool.load[slot] += 1
        if not inflight:
            return
        ready, _ = ray.wait(list(inflight), num_returns=1)
        for ref in ready:
            slot, actor, unit, attempt = inflight.pop(ref)
            try:
                result: UnitResult = ray.get(ref)
            except ray.exceptions.RayTaskError as err:  # the worker's code raised: not a lost worker
                raise AnnotateError(
                    f"a Ray worker failed on unit {unit.index} (from {unit.where}): {_cause(err)}; "
                    "what was committed is kept: rerun the same command to resume"
                ) from err
            except ray.exceptions.RayError as err:  # the worker (or its node) is gone
                counts["units_retried"] += 1
                if attempt >= MAX_ATTEMPTS:
                    raise AnnotateError(
                        f"unit {unit.index} (from {unit.where}): its Ray worker died {attempt} times "
                        f"({_cause(err)}); what was committed is kept: rerun the same command to resume"
                    ) from err
                logger.warning(
                    "unit %d: its Ray worker died (%s); starting another and sending the unit again",
                    unit.index,
                    type(err).__name__,
                )
                pool.replace(slot, actor)
                retry.append((unit, attempt + 1))
                continue
            if pool.actors[slot] is actor:
                pool.load[slot] -= 1
            committer.commit(result)
