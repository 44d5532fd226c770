"""Shared by the tests of the engines (test_annotate_units.py, test_annotate_ray.py,
test_annotate_workers.py) and the fuzz harness (fuzz_annotate.py): a job's input, the local
engine's output as the reference, what "the same output" means; and processes: a run killed
from outside (its parent or one of its workers), liveness, and a folder seen read-only.

As a script it measures the kill table of docs/annotate.md (against this tree, or another
one with ``PYTHONPATH=that/tree``)::

    OMP_NUM_THREADS=1 python tests/annotate_jobs.py --kill-table [--trials 3] [--docs 200]
"""

import argparse
import contextlib
import ctypes
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from conftest import WORDS  # noqa: E402

from spacy_genbioel.annotate import AnnotateError, annotate  # noqa: E402

PHRASES = WORDS + ["renal failure", "cystic fibrosis", "liver", "the", "of", "patients"]
RUN = dict(chunk_size=6, batch_size=4, progress=False)  # annotate()'s options: 10 units of the 60 documents
CPU = {"device": "cpu"}  # its genbioel settings
N_DOCS = 60


def job_input(path: Path, n: int = N_DOCS, seed: int = 0) -> Path:
    """``n`` JSONL documents ``d0``... in order, with a duplicate of ``d3`` and a line that is not JSON among them."""
    rng = random.Random(seed)
    lines = [
        json.dumps({"id": f"d{i}", "text": " ".join(rng.choices(PHRASES, k=rng.randint(4, 14)))}) for i in range(n)
    ]
    lines.insert(n // 2, json.dumps({"id": "d3", "text": "renal failure, again"}))
    lines.insert(2 * n // 3, "{not json")
    path.write_text("\n".join(lines) + "\n", encoding="utf8")
    return path


@contextlib.contextmanager
def one_thread():
    """torch on one thread, as in a worker (forked or Ray): the same kernels, so the same bytes. (Not
    spacy_genbioel.annotate.workers's: the kill table also measures trees without that module.)"""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def local_run(docs: Path, pipeline: Path, out: Path, **options):
    with one_thread():
        return annotate([docs], pipeline, out, {**RUN, **options}, CPU)


def output(out: Path) -> dict:
    """What two runs of a job must agree on: the chunk files byte for byte, the checkpoint, the
    errors file's entries, and the summary's totals."""
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    return {
        "chunks": {p.name: p.read_bytes() for p in sorted(out.glob("part-*"))},
        "checkpoint": (out / "checkpoint.jsonl").read_text(),
        "errors": sorted((out / "errors.jsonl").read_text().splitlines()),
        "summary": {k: v for k, v in summary.items() if k not in ("this_run", "out", "errors_file")},
        "leftovers": sorted(p.name for p in out.glob(".*.tmp")),
    }


def assert_same_output(out: Path, reference: Path) -> None:
    got, want = output(out), output(reference)
    assert list(got["chunks"]) == list(want["chunks"])
    for name in want["chunks"]:
        assert got["chunks"][name] == want["chunks"][name], f"{name} differs"
    assert got == want


def written_ids(out: Path) -> list:
    """Document IDs of the chunk files in chunk order."""
    return [
        json.loads(line)["id"] for p in sorted(Path(out).glob("part-*.jsonl")) for line in p.read_text().splitlines()
    ]


# -- processes ---------------------------------------------------------------------------------------------------
def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def children(pid: int) -> List[int]:
    """The child processes of ``pid`` (Linux: /proc/PID/task/*/children)."""
    found: List[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def still_alive(pids: Sequence[int], seconds: float) -> List[int]:
    """The processes of ``pids`` still alive after waiting up to ``seconds`` for them to end."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def kill_all(pids: Sequence[int]) -> None:
    """SIGKILL processes this test started (directly or through the run it forked), and wait for their end."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    still_alive(pids, 10.0)


def killed_run(
    start: Callable[[], Any], out: Path, target: str, rng: random.Random, hang_s: float = 60.0, delay: float = 0.3
) -> Dict[str, Any]:
    """Run ``start()`` (an annotate call) in a forked child; once its first chunk landed, and a random
    moment more (up to ``delay`` seconds), SIGKILL the child (``target="parent"``) or one of its worker processes
    (``"worker"``). Returns ``killed`` (what was killed, or None when nothing was: the run ended first, or it had no
    worker), ``strays`` (worker processes alive 10 s after their parent was killed; killed then),
    ``hung`` (a run whose worker was killed and that did not end within ``hang_s``; killed then),
    ``exitcode`` of the child and ``committed`` (chunks in the folder when the kill came)."""
    child = multiprocessing.get_context("fork").Process(target=start)  # not daemonic: it forks workers
    with one_thread():  # a child forked while torch's OpenMP pool has threads can hang
        child.start()
    deadline = time.monotonic() + 300
    while not list(out.glob("part-*")) and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(rng.uniform(0, delay))
    report: Dict[str, Any] = {"killed": None, "strays": [], "hung": False, "committed": len(list(out.glob("part-*")))}
    workers = children(child.pid) if child.is_alive() else []
    if target == "parent" and child.is_alive():
        os.kill(child.pid, signal.SIGKILL)
        report["killed"] = "parent"
        child.join()
        report["strays"] = still_alive(workers, 10.0)
        kill_all(report["strays"])
    elif target == "worker" and workers:
        os.kill(rng.choice(workers), signal.SIGKILL)
        report["killed"] = "worker"
        child.join(hang_s)
        if child.is_alive():
            report["hung"] = True
            left = children(child.pid)
            kill_all([child.pid])
            child.join()
            kill_all(still_alive(left, 10.0))
    child.join()
    report["exitcode"] = child.exitcode
    return report


def read_only_call(folders: Sequence[Path], call: Callable[[], Any]) -> Tuple[str, Any]:
    """``call()`` in a forked child that sees ``folders`` read-only (bind mounts in a mount namespace of
    its own: nothing changes for any other process). ("ok", its JSON-able result), ("raised",
    (exception type name, message)), or ("unavailable", why) where no such namespace can be made."""
    read, write = os.pipe()
    with one_thread():  # a child forked while torch's OpenMP pool has threads can hang
        pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            _read_only_view(folders)
        except OSError as err:
            outcome: Tuple[str, Any] = ("unavailable", str(err))
        else:
            try:
                outcome = ("ok", call())
            except BaseException as err:  # noqa: BLE001  (reported to the parent, whatever it is)
                outcome = ("raised", (type(err).__name__, str(err)))
        with os.fdopen(write, "w") as handle:
            json.dump(outcome, handle, default=str)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as handle:
        data = handle.read()
    os.waitpid(pid, 0)
    kind, value = json.loads(data) if data else ("raised", ("crash", "the child died"))
    return kind, tuple(value) if kind == "raised" else value


def _read_only_view(folders: Sequence[Path]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, clone_newuser = 0x20000, 0x10000000
    ms_rdonly, ms_remount, ms_bind, ms_rec, ms_private = 1, 32, 4096, 16384, 1 << 18
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(clone_newns if uid == 0 else clone_newns | clone_newuser) != 0:
        raise OSError(ctypes.get_errno(), "unshare: no mount namespace here")
    if uid != 0:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    if libc.mount(None, b"/", None, ms_rec | ms_private, None) != 0:
        raise OSError(ctypes.get_errno(), "mount: cannot make / private")
    for folder in folders:
        path = str(Path(folder).resolve()).encode()
        if (
            libc.mount(path, path, None, ms_bind, None) != 0
            or libc.mount(None, path, None, ms_remount | ms_bind | ms_rdonly, None) != 0
        ):
            raise OSError(ctypes.get_errno(), f"mount: cannot bind {folder} read-only")
    if os.access(folders[0], os.W_OK):
        raise OSError(0, "the read-only view is writable")


# -- the kill table (docs/annotate.md) -------------------------------------------------------------------------------
def kill_trial(
    pipeline: Path, docs: Path, n_docs: int, out: Path, n_process: int, target: str, seed: int
) -> Dict[str, Any]:
    """One job killed (``target``) and rerun: what the kill left and what the rerun found."""
    options = {**RUN, "chunk_size": 10, "batch_size": 4, "n_process": n_process}
    report = killed_run(lambda: annotate([docs], pipeline, out, options, CPU), out, target, random.Random(seed))
    kept = len(written_ids(out))
    try:
        with one_thread():
            annotate([docs], pipeline, out, options, CPU)
        report["rerun"] = "ok"
    except AnnotateError as err:
        report["rerun"] = f"refused: {err}"
    ids = written_ids(out)
    expected = {f"d{i}" for i in range(n_docs)}
    return {
        **report,
        "kept": kept,
        "written": len(ids),
        "lost": len(expected - set(ids)),
        "duplicated": len(ids) - len(set(ids)),
    }


def kill_table(trials: int, n_docs: int) -> List[Dict[str, Any]]:
    import logging

    from fuzz_annotate import build_pipeline

    logging.disable(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pipeline = build_pipeline(root / "p")
        docs = job_input(root / "docs.jsonl", n=n_docs)
        for n_process in (1, 2, 4):
            for target in ("parent", "worker"):
                if target == "worker" and n_process == 1:
                    continue
                results = [
                    kill_trial(pipeline, docs, n_docs, root / f"out-{n_process}-{target}-{t}", n_process, target, t)
                    for t in range(trials)
                ]
                rows.append(
                    {
                        "n_process": n_process,
                        "killed": target,
                        "trials": trials,
                        **{key: sum(r[key] for r in results) for key in ("kept", "written", "lost", "duplicated")},
                        "strays": sum(len(r["strays"]) for r in results),
                        "hung": sum(r["hung"] for r in results),
                        "rerun_refused": sum(r["rerun"] != "ok" for r in results),
                        "not_killed": sum(r["killed"] is None for r in results),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="annotate killed from outside: the kill table of docs/annotate.md")
    parser.add_argument("--kill-table", action="store_true", help="measure and print the table")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--docs", type=int, default=200)
    args = parser.parse_args(argv)
    import spacy_genbioel

    print(f"spacy_genbioel from {spacy_genbioel.__file__}")
    started = time.monotonic()
    rows = kill_table(args.trials, args.docs)
    print(
        "\n| processes | killed | trials | documents kept at the kill | written after the rerun | lost | duplicated "
        "| workers outliving their parent | runs hung on a dead worker | reruns refused |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n_process']} | {r['killed']} | {r['trials']} | "
            f"{r['kept']} | {r['written']} | {r['lost']} | {r['duplicated']} "
            f"| {r['strays']} | {r['hung']} | {r['rerun_refused']} |"
        )
    print(f"({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
