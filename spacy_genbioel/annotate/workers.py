"""``n_process > 1`` with the local engine: the units of the job (:mod:`.units`)
on worker processes forked from this one, each annotating whole units with
the pipeline this process loaded (shared copy-on-write), on one torch thread.

Why not ``nlp.pipe(n_process=...)``: spaCy's workers outlive a killed parent
(blocked on their input queue, holding what they inherited, the output
folder's lock among it), and its parent waits for ever on a worker that died
(a ``recv`` on a pipe the other workers keep open). Here:

* **Workers die with their parent.** Each worker asks the kernel for SIGKILL
  when its parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux) and, as a fallback
  (other systems, a parent that died before that call), a thread watches the
  parent's pid (:data:`WATCH_S`). The output folder's lock is closed in every
  forked child (:func:`~.checkpoint.output_lock`), so it goes with the parent
  alone.
* **The parent notices a dead worker.** It waits on the workers' result pipes
  and their process sentinels together, so a worker's death (killed, out of
  memory) wakes it at once. The unit the worker was on is annotated again by
  a fresh worker; a unit whose worker dies :data:`MAX_ATTEMPTS` times stops
  the run with a one-line error naming the unit. Nothing a dead worker did is
  in the folder: only the parent commits, and a unit once.
* Unit *k* is chunk ``part-k`` of a one-process run (:mod:`.units`), written
  by one worker on one torch thread with batches starting at the unit, so the
  chunk files are byte for byte those of ``n_process=1`` with
  ``OMP_NUM_THREADS=1``. Units are committed as they come back, so out of
  order; the checkpoint is put back in chunk order at the end.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import logging
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Deque, Iterator, List, Optional, Tuple

from spacy_genbioel.annotate.records import AnnotateError, named
from spacy_genbioel.annotate.units import Unit, UnitResult

logger = logging.getLogger(__name__)

__all__ = ["MAX_ATTEMPTS", "WATCH_S", "ForkPool", "die_with_parent", "exit_reason", "run_forked"]

MAX_ATTEMPTS = 2  # a unit is annotated this many times at most (once, then once more by a fresh worker)
WATCH_S = 1.0  # how often a worker's watchdog looks at its parent's pid, and the parent at its workers
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

Work = Callable[[Unit], UnitResult]
Sent = Tuple[Unit, int]  # a unit and its attempt (1, 2...)


def die_with_parent(parent: int) -> None:
    """In a worker forked by ``parent``: be killed when the parent dies (SIGKILL from the kernel on
    Linux, else this process's watchdog thread); exit now if the parent is gone already."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux (no prctl): the watchdog alone
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl call
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), name="genbioel-parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(WATCH_S)
    os._exit(1)


def _serve(conn: Any, parent: int, work: Work, others: List[Any], start: Optional[Callable[[], None]] = None) -> None:
    """A worker: run ``start`` once (a failure goes back as the reply to the first unit), then annotate the
    units the parent sends, one at a time, until ``None`` or the pipe closes."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the workers
    for other in others:  # the other workers' pipes, inherited: not ours to hold open
        other.close()
    if start is not None:
        try:
            start()
        except Exception as err:  # noqa: BLE001  (no GPU for this worker, say: the parent stops the run)
            work = _failing(f"the worker could not start ({type(err).__name__}: {err})")
    while True:
        try:
            unit = conn.recv()
        except (EOFError, OSError):
            return
        if unit is None:
            return
        try:
            reply: Tuple[str, Any] = ("done", work(unit))
        except Exception as err:  # noqa: BLE001  (the worker's own code failed: the parent stops the run)
            reply = ("failed", f"{type(err).__name__}: {err}")
        try:
            conn.send(reply)
        except OSError:  # the parent is gone
            return


def _failing(message: str) -> Work:
    def work(unit: Unit) -> UnitResult:
        raise RuntimeError(message)

    return work


def exit_reason(exitcode: Optional[int]) -> str:
    """How a worker process ended, in words (``killed by SIGKILL``: the out-of-memory killer, or kill -9)."""
    if exitcode is None:
        return "its pipe closed"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by {name}" + (": out of memory, or kill -9" if -exitcode == signal.SIGKILL else "")
    return f"exit code {exitcode}"


@dataclass
class _Worker:
    process: Any
    conn: Any
    sent: Optional[Sent] = None  # the unit it is on


class ForkPool:
    """``n`` worker processes forked from this one, each running ``work`` on the units it is sent;
    ``start(slot)``, if given, runs once in each worker of ``slot`` (0..n-1) before its first unit (a
    replacement worker runs it for the same slot): its own GPU, say."""

    def __init__(self, n: int, work: Work, start: Optional[Callable[[int], None]] = None) -> None:
        self.context = multiprocessing.get_context("fork")
        self.work = work
        self.start = start
        self.workers: List[_Worker] = []
        for slot in range(n):
            self.workers.append(self._start(slot))

    def _start(self, slot: int) -> _Worker:
        parent_end, child_end = self.context.Pipe()
        others = [w.conn for i, w in enumerate(self.workers) if i != slot]
        start = None if self.start is None else functools.partial(self.start, slot)
        process = self.context.Process(
            target=_serve,
            args=(child_end, os.getpid(), self.work, others, start),
            name="genbioel-annotate-worker",
            daemon=True,
        )
        process.start()
        child_end.close()  # the worker holds the only copy: its death closes the pipe
        return _Worker(process, parent_end)

    @property
    def pids(self) -> List[int]:
        return [w.process.pid for w in self.workers]

    def replace(self, slot: int) -> None:
        old = self.workers[slot]
        with contextlib.suppress(OSError):
            old.process.kill()
        old.process.join()
        old.conn.close()
        self.workers[slot] = self._start(slot)

    def send(self, slot: int, sent: Sent) -> None:
        """Send a unit to the worker in ``slot``; a worker found dead (idle, so it had no unit) is replaced first."""
        for _ in range(2):
            worker = self.workers[slot]
            if worker.process.is_alive():
                try:
                    worker.conn.send(sent[0])
                    worker.sent = sent
                    return
                except OSError:
                    pass
            logger.warning(
                "worker process %d died while idle (%s); starting another",
                worker.process.pid,
                exit_reason(worker.process.exitcode),
            )
            self.replace(slot)
        raise AnnotateError(
            "a new worker process died before it took a unit; what was committed is kept: "
            "rerun the same command to resume"
        )

    def close(self, graceful: bool) -> None:
        """Stop the workers: ask them to finish (``graceful``, all idle), else kill them."""
        for worker in self.workers:
            if graceful:
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
            else:
                with contextlib.suppress(OSError):
                    worker.process.kill()
        for worker in self.workers:
            worker.process.join(timeout=10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """torch's OpenMP pool (libgomp) is not fork-safe: a worker forked while the pool has threads can hang.
    The workers run one thread each anyway, so this process runs on one while it forks them."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_forked(
    work: Work,
    next_unit: Callable[[], Optional[Unit]],
    commit: Callable[[UnitResult], None],
    n_process: int,
    counts: collections.Counter,
    start: Optional[Callable[[int], None]] = None,
) -> None:
    """Run ``work`` on every unit ``next_unit()`` gives (None: no more) in ``n_process`` forked workers,
    handing each result to ``commit`` as it comes back; ``counts["units_retried"]``: units sent again
    because their worker died; ``start(slot)`` runs once in each worker first (:class:`ForkPool`).
    Raises :class:`AnnotateError` when a unit's worker died :data:`MAX_ATTEMPTS` times, or the worker's
    code (``start`` included) raised."""
    with _one_torch_thread():
        pool = ForkPool(n_process, work, start)
        graceful = False
        try:
            _drive(pool, next_unit, commit, counts)
            graceful = True
        finally:
            pool.close(graceful)


def _drive(
    pool: ForkPool,
    next_unit: Callable[[], Optional[Unit]],
    commit: Callable[[UnitResult], None],
    counts: collections.Counter,
) -> None:
    retry: Deque[Sent] = collections.deque()
    exhausted = False
    while True:
        for slot, worker in enumerate(pool.workers):
            if worker.sent is None and (retry or not exhausted):
                unit = retry.popleft() if retry else _first(next_unit())
                if unit is None:
                    exhausted = True
                    continue
                pool.send(slot, unit)
        busy = [w for w in pool.workers if w.sent is not None]
        if not busy:
            return
        wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=WATCH_S)
        for slot, worker in enumerate(pool.workers):
            if worker.sent is not None:
                _collect(pool, slot, commit, retry, counts)


def _first(unit: Optional[Unit]) -> Optional[Sent]:
    return None if unit is None else (unit, 1)


def _collect(
    pool: ForkPool, slot: int, commit: Callable[[UnitResult], None], retry: Deque[Sent], counts: collections.Counter
) -> None:
    """Take the reply of the worker in ``slot`` if there is one; if it died instead, send its unit again."""
    worker = pool.workers[slot]
    unit, attempt = worker.sent  # type: ignore[misc]
    try:
        reply = worker.conn.recv() if worker.conn.poll() else None
    except (EOFError, OSError):  # its pipe closed under a message: it died
        reply = None
    if reply is not None:
        worker.sent = None
        kind, value = reply
        if kind == "failed":
            raise AnnotateError(
                f"a worker failed on unit {unit.index} (from {unit.where}): {value}; "
                "what was committed is kept: rerun the same command to resume"
            )
        commit(value)
        return
    if worker.process.is_alive():
        return
    how = exit_reason(worker.process.exitcode)
    counts["units_retried"] += 1
    if attempt >= MAX_ATTEMPTS:
        raise AnnotateError(
            f"unit {unit.index} (from {unit.where}): its worker process died {attempt} times ({how}); what was "
            f"committed is kept: rerun the same command to resume (with a smaller {named('n_process')} or "
            f"{named('chunk_size')} if memory ran out)"
        )
    logger.warning(
        "unit %d (from %s): its worker process %d died (%s); annotating the unit again in a new worker",
        unit.index,
        unit.where,
        worker.process.pid,
        how,
    )
    worker.sent = None
    pool.replace(slot)
    retry.append((unit, attempt + 1))
