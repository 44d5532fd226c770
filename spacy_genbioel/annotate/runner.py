"""The annotation job (:func:`annotate`): documents in, linked mentions out,
streaming and resumable.

    annotate(["pubmed24n0001.xml.gz"], "pipeline/", "out/", format="jsonl")

or ``python -m spacy_genbioel annotate INPUT... --pipeline DIR --out OUT``.
New documents from :mod:`.readers` go through ``nlp.pipe`` (in this process,
or in worker processes with ``n_process > 1``) and are committed in numbered
chunk files by :mod:`.writers` and :mod:`.checkpoint`.

Guarantees and decisions (``docs/annotate.md`` has the long version):

* An output folder holds one job (:mod:`.job`): a run into a folder of another
  job (other inputs, input formats, output format, pipeline or settings) is
  refused before anything is written.
* Rerunning the same command after ``kill -9`` at any moment finishes the job
  (:mod:`.checkpoint` says why), and with ``n_process=1`` the chunk files are
  byte for byte those of an uninterrupted run: a resumed run starts at a chunk
  boundary, and batches restart at each chunk, so batches and chunks line up
  the same way. With ``n_process > 1`` batches follow the workers, so scores
  may differ in the 6th decimal (same documents, mentions, IDs and ranks).
* Duplicate document IDs: the first valid record with an ID is annotated;
  later ones are logged as ``"kind": "duplicate"`` in the errors file and
  counted as skipped. Malformed records never claim an ID.
* The errors file is append-only and de-duplicated by (file, line, record) on
  resume, so a record re-read after a crash is never logged twice.
* A document on which the pipeline raises is retried alone; if it fails alone
  it is logged as an error and the run goes on. Any failure to read or process
  one record goes to the errors file; only failing to write the output ends
  the run.
"""
from __future__ import annotations

import collections
import logging
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

from spacy_genbioel.annotate.checkpoint import Checkpoint, ErrorLog, output_lock, provenance, update_provenance
from spacy_genbioel.annotate.job import check_job, job_identity, record_job
from spacy_genbioel.annotate.readers import check_input_format, detect_format, expand_inputs, safe_records
from spacy_genbioel.annotate.records import ERRORS, SUMMARY, AnnotateError, Annotated, InputRecord, RecordError, doc_mentions, id_key
from spacy_genbioel.annotate.units import first_seen, load_pipeline as _load_pipeline, run_one as _one, run_serial as _run_serial, run_summary
from spacy_genbioel.annotate.writers import OUTPUT_FORMATS, WRITERS, ChunkWriter
from spacy_genbioel.progress import InputProgress
from spacy_genbioel.util import PathLike, atomic_json, resolve_device

logger = logging.getLogger(__name__)

__all__ = ["annotate"]


# -- running the pipeline (in this process: units.run_serial) -----------------------------------------------------
def _run_parallel(nlp: Any, records: Iterable[InputRecord], batch_size: int, n_process: int) -> Iterator[Tuple[InputRecord, Any]]:
    """``nlp.pipe`` with worker processes. Documents a worker failed on never come back;
    they are spotted by their sequence number and retried in this process."""
    inflight: Deque[Tuple[int, InputRecord]] = collections.deque()
    worker_errors: List[BaseException] = []

    def feed() -> Iterator[Tuple[str, int]]:
        for seq, record in enumerate(records):
            inflight.append((seq, record))
            yield record.text, seq

    def on_error(name: Optional[str], proc: Any, docs: Any, err: BaseException) -> None:
        if proc is not None:  # a call in this process (a retry): let it raise
            raise err
        worker_errors.append(err)  # a worker's batch came back empty: spotted below

    nlp.set_error_handler(on_error)
    # torch's OpenMP pool (libgomp) is not fork-safe: a forked worker of a
    # process whose pool has threads hangs. Workers run one thread each
    # anyway, so the parent drops to one thread while they are forked.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for doc, seq in nlp.pipe(feed(), as_tuples=True, batch_size=batch_size, n_process=n_process):
            while inflight and inflight[0][0] < seq:
                _, lost = inflight.popleft()
                logger.warning("%s: a worker failed (%s); retrying the document here", lost.where, worker_errors[-1] if worker_errors else "?")
                yield lost, _one(nlp, lost)
            _, record = inflight.popleft()
            yield record, doc
        while inflight:
            _, lost = inflight.popleft()
            yield lost, _one(nlp, lost)
    finally:
        from spacy.util import raise_error

        nlp.set_error_handler(raise_error)
        torch.set_num_threads(threads)


def _genbioel_name(pipeline_dir: Path) -> str:
    """The name of the pipeline's genbioel component, from its config (usually ``genbioel``)."""
    from spacy.util import load_config

    config_path = pipeline_dir / "config.cfg"
    if not config_path.exists():
        raise AnnotateError(f"{pipeline_dir} is not a spaCy pipeline directory (no config.cfg)")
    try:
        components = load_config(config_path, interpolate=False).get("components", {})
    except Exception as err:  # noqa: BLE001  (confection's parse errors)
        raise AnnotateError(f"{config_path} cannot be read ({type(err).__name__}: {err})") from err
    names = [n for n, cfg in components.items() if isinstance(cfg, dict) and cfg.get("factory") == "genbioel"]
    if not names:
        raise AnnotateError(f"the pipeline in {pipeline_dir} has no genbioel component")
    return names[0]


def _check_device(device: str) -> None:
    """Refuse a device that is not there before anything is loaded or written."""
    if device == "auto":
        return
    try:
        dev = resolve_device(device)
    except (ValueError, RuntimeError) as err:
        raise AnnotateError(f"--device {device}: {err}") from None
    if dev.type == "cuda" and dev.index is not None:
        import torch

        if dev.index >= torch.cuda.device_count():
            raise AnnotateError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")


def _leave_as_found(out: Path, created: bool) -> None:
    """After a run that could not start (lock held): when the folder holds nothing but the
    lock, remove the lock, and the folder when this run created it."""
    try:
        if {p.name for p in out.iterdir()} <= {".lock"}:
            (out / ".lock").unlink(missing_ok=True)
            if created:
                out.rmdir()
    except OSError:
        pass


def _records(paths: Sequence[Path], formats: Sequence[str]) -> Iterator[Any]:
    for path, fmt in zip(paths, formats):
        yield from safe_records(path, fmt)


def annotate(
    inputs: Union[PathLike, Sequence[PathLike]],
    pipeline_dir: PathLike,
    out: PathLike,
    format: str = "jsonl",
    input_format: Optional[str] = None,
    batch_size: int = 64,
    n_process: int = 1,
    device: str = "auto",
    chunk_size: int = 500,
    errors_path: Optional[PathLike] = None,
    progress: bool = True,
    command: Optional[str] = None,
    engine: str = "local",
    ray_address: Optional[str] = None,
) -> Dict[str, Any]:
    """Annotate every document of ``inputs`` with the pipeline in ``pipeline_dir``; resumable.

    ``out`` is the folder of one job: ``job.json`` (the job's identity: a
    folder of another job is refused, see :mod:`.job`), ``part-NNNNNN.<ext>``
    chunk files of ``chunk_size`` documents in input order,
    ``checkpoint.jsonl``, ``errors.jsonl`` (or ``errors_path``),
    ``provenance.json`` and ``summary.json``. Rerunning the same call continues
    where an interrupted one stopped. ``batch_size`` is the
    number of documents per ``nlp.pipe`` batch; ``n_process > 1`` runs
    ``nlp.pipe`` in worker processes (CPU only); ``device`` (``auto``,
    ``cpu``, ``cuda``, ``cuda:N``) is set on the genbioel component.
    ``engine="ray"`` runs the units of the job on ``n_process`` Ray workers
    (a local Ray, or the cluster at ``ray_address``): :mod:`.ray_engine`.

    Returns the summary written to ``summary.json``: ``documents_read``
    (records seen, valid or not), ``documents_written``, ``documents_skipped``
    (duplicate IDs), ``errors``, ``mentions``, ``mentions_linked`` (with a
    ``kb_id``), ``chunks``, and ``this_run`` figures (speed, documents found
    already done).
    """
    from spacy_genbioel.linking import component as _pipeline  # noqa: F401  (registers the factory)

    if format not in WRITERS:
        raise AnnotateError(f"unknown output format {format!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    if chunk_size < 1 or batch_size < 1 or n_process < 1:
        raise AnnotateError("chunk_size, batch_size and n_process must be at least 1")
    pipeline_dir = Path(pipeline_dir)
    out = Path(out)
    paths = expand_inputs(inputs)
    if not paths:
        raise AnnotateError("no input files")
    check_input_format(input_format)
    formats = [input_format or detect_format(p) for p in paths]  # fail on an unknown file before loading the model
    if engine not in ("local", "ray"):
        raise AnnotateError(f"unknown engine {engine!r}; use local or ray")
    if engine == "ray":  # the workers' devices are the cluster's: checked when it is reached
        from spacy_genbioel.annotate.ray_engine import check_ray_options

        check_ray_options(device)
    elif ray_address is not None:
        raise AnnotateError("--ray-address needs --engine ray")
    else:
        _check_device(device)
    if n_process > 1 and engine == "local":
        if device == "auto":
            device = "cpu"
        elif resolve_device(device).type != "cpu":
            raise AnnotateError("--n-process > 1 runs on CPU only; use one process with --device cuda")
    command = command or shlex.join(sys.argv)
    if out.exists() and not out.is_dir():
        raise AnnotateError(f"--out {out} is a file; it must be a folder")
    name = _genbioel_name(pipeline_dir)
    try:
        identity = job_identity(paths, formats, input_format, format, pipeline_dir, name)
    except OSError as err:
        raise AnnotateError(f"cannot read an input or pipeline file ({err})") from err
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AnnotateError(f"--out {out} cannot be made ({err})") from err
    with output_lock(out):
        try:
            new_job = check_job(out, identity)  # before anything in the folder changes
            nlp, component = _load_pipeline(pipeline_dir, name, "cpu" if engine == "ray" else device)  # Ray: the workers link
            if new_job:
                record_job(out, identity)
        except BaseException:
            _leave_as_found(out, created)  # no empty --out with a .lock left by a run that could not start
            raise
        (out / SUMMARY).unlink(missing_ok=True)  # present only after a run that finished
        settings = {"format": format, "inputs": [{"path": str(p), "format": f} for p, f in zip(paths, formats)],
                    "input_format": input_format, "chunk_size": chunk_size, "batch_size": batch_size, "n_process": n_process, "engine": engine}
        try:
            update_provenance(out, provenance(nlp, pipeline_dir, component, device, settings, command), format, chunk_size)
            if engine == "ray":
                from spacy_genbioel.annotate.ray_engine import run_on_ray

                return run_on_ray(nlp, component, paths, formats, out, format, batch_size, n_process, chunk_size, errors_path,
                                  progress, pipeline_dir=pipeline_dir, device=device, address=ray_address)
            return _run(nlp, component, paths, formats, out, format, batch_size, n_process, chunk_size, errors_path, progress)
        except OSError as err:  # reading is guarded record by record: this is the output that cannot be written
            raise AnnotateError(f"cannot write the output ({err}); what was committed is kept: "
                                "rerun the same command to resume") from err


def _run(nlp: Any, component: Any, paths: Sequence[Path], formats: Sequence[str], out: Path, format: str, batch_size: int,
         n_process: int, chunk_size: int, errors_path: Optional[PathLike], progress: bool) -> Dict[str, Any]:
    """The job proper, in a locked output folder whose job is checked and recorded."""
    from spacy.util import minibatch

    writer: ChunkWriter = WRITERS[format](spans_key=component.spans_key)
    checkpoint = Checkpoint(out, writer, nlp.vocab)
    errors = ErrorLog(Path(errors_path) if errors_path else out / ERRORS)
    counts = collections.Counter()
    seen: Set[Union[int, str]] = set()  # IDs claimed in this pass over the inputs
    # input bytes (compressed, for .gz) as the total; documents found committed are skipped, not in the rates
    bar = InputProgress("annotate", paths, counts=("docs", "mentions"), enabled=progress)

    def pending() -> Iterator[InputRecord]:
        """Valid, first-seen records not yet in a committed chunk; the rest goes to the errors file."""
        for item in first_seen(bar.read(_records(paths, formats)), writer.check, errors, seen, counts):
            key = id_key(item.doc_id)
            if key in checkpoint.done:
                checkpoint.done.discard(key)  # now in `seen`: keep one copy
                counts["resumed"] += 1
                bar.skip()
                continue
            yield item

    spans_key = component.spans_key
    began = time.monotonic()

    def annotated(pairs: Iterable[Tuple[InputRecord, Any]]) -> Iterator[Annotated]:
        for record, doc in pairs:
            if isinstance(doc, BaseException):
                errors.log(RecordError(record.file, f"pipeline failed on the document ({type(doc).__name__}: {doc})",
                                       record.line, record.record, record.doc_id))
                continue
            try:
                item = Annotated(record, doc, doc_mentions(doc, spans_key))
            except Exception as err:  # noqa: BLE001  (one odd document is that document's error)
                errors.log(RecordError(record.file, f"the annotated document cannot be read ({type(err).__name__}: {err})",
                                       record.line, record.record, record.doc_id))
                continue
            counts["run_docs"] += 1
            counts["run_mentions"] += len(item.mentions)
            bar.add(docs=1, mentions=len(item.mentions))
            yield item

    try:
        if n_process == 1:
            # batches restart at each chunk, so a resumed run batches exactly as an uninterrupted one
            for chunk_records in minibatch(pending(), chunk_size):
                items = list(annotated(_run_serial(nlp, list(chunk_records), batch_size)))
                if items:
                    checkpoint.commit(items)
        else:
            for items in minibatch(annotated(_run_parallel(nlp, pending(), batch_size, n_process)), chunk_size):
                checkpoint.commit(list(items))
    finally:
        bar.close()
        errors.close()

    summary = run_summary(checkpoint, errors, counts, out, format, time.monotonic() - began)
    atomic_json(out / SUMMARY, summary)
    return summary
