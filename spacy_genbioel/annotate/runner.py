"""The annotation job (:func:`annotate`): documents in, linked mentions out,
streaming and resumable.

    annotate(["pubmed24n0001.xml.gz"], "pipeline/", "out/", {"format": "pubtator"}, {"device": "cuda"})

or ``python -m spacy_genbioel annotate INPUT... --pipeline DIR --out OUT``.
The job's options are :class:`~.options.AnnotateOptions`; the genbioel
component's settings a mapping applied when the pipeline is loaded. New
documents from :mod:`.readers` go through ``nlp.pipe`` (in this process, or,
with ``n_process > 1``, a unit of ``chunk_size`` documents at a time in worker
processes forked from it: :mod:`.workers`) and are committed in numbered chunk
files by :mod:`.writers` and :mod:`.checkpoint`.

Guarantees and decisions (``docs/annotate.md`` has the long version):

* An output folder holds one job (:mod:`.job`): a run into a folder of another
  job (other inputs, input formats, output format, pipeline or settings), or
  into a folder where writing changes the job (an input folder, the pipeline
  folder), is refused before anything is written. A read-only folder is an
  error unless it holds this job, finished.
* Rerunning the same command after ``kill -9`` at any moment finishes the job
  (:mod:`.checkpoint` says why), and with ``n_process=1`` the chunk files are
  byte for byte those of an uninterrupted run: a resumed run starts at a chunk
  boundary, and batches restart at each chunk, so batches and chunks line up
  the same way. With ``n_process > 1`` each chunk is one worker's unit, on one
  torch thread: the chunk files of a one-process run with one torch thread.
* Workers die with this process, and a worker's death (kill, out of memory)
  is noticed at once: its unit is annotated again by a new worker, or, when
  that one dies too, the run stops with an error naming the unit (:mod:`.workers`).
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
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from spacy_genbioel.annotate.checkpoint import Checkpoint, ErrorLog, output_lock, provenance, update_provenance
from spacy_genbioel.annotate.job import check_job, check_places, finished_read_only, job_identity, record_job
from spacy_genbioel.annotate.options import (
    AnnotateOptions,
    bound_kernel_cache,
    component_settings,
    run_device,
    worker_device,
)
from spacy_genbioel.annotate.readers import detect_format, expand_inputs, safe_records
from spacy_genbioel.annotate.records import ERRORS, SUMMARY, AnnotateError, InputRecord, RecordError, id_key, named
from spacy_genbioel.annotate.timing import StageClock, clear_caches, path_counts, timed, use_clock
from spacy_genbioel.annotate.units import (
    Committer,
    annotate_unit,
    annotated_or_error,
    first_seen,
    plan_units,
    run_summary,
)
from spacy_genbioel.annotate.units import load_pipeline as _load_pipeline
from spacy_genbioel.annotate.units import run_serial as _run_serial
from spacy_genbioel.annotate.workers import run_forked
from spacy_genbioel.annotate.writers import WRITERS, ChunkWriter
from spacy_genbioel.progress import InputProgress
from spacy_genbioel.util import PathLike, atomic_json

logger = logging.getLogger(__name__)

__all__ = ["AnnotateOptions", "annotate"]


def _genbioel_name(pipeline_dir: Path) -> str:
    """The name of the pipeline's genbioel component, from its config (usually ``genbioel``)."""
    from spacy.util import load_config

    config_path = pipeline_dir / "config.cfg"
    if not config_path.exists():
        raise AnnotateError(f"{named('pipeline_dir')} {pipeline_dir} is not a spaCy pipeline directory (no config.cfg)")
    try:
        components = load_config(config_path, interpolate=False).get("components", {})
    except Exception as err:  # noqa: BLE001  (confection's parse errors)
        raise AnnotateError(f"{config_path} cannot be read ({type(err).__name__}: {err})") from err
    names = [n for n, cfg in components.items() if isinstance(cfg, dict) and cfg.get("factory") == "genbioel"]
    if not names:
        raise AnnotateError(f"the pipeline in {pipeline_dir} has no genbioel component")
    return names[0]


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


def _records(paths: Sequence[Path], formats: Sequence[str], limits: Any) -> Iterator[Any]:
    for path, fmt in zip(paths, formats):
        yield from safe_records(path, fmt, limits)


def annotate(
    inputs: Union[PathLike, Sequence[PathLike]],
    pipeline_dir: PathLike,
    out: PathLike,
    options: Union[AnnotateOptions, Mapping[str, Any], None] = None,
    settings: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """Annotate every document of ``inputs`` with the pipeline in ``pipeline_dir``; resumable.

    ``out`` is the folder of one job: ``job.json`` (the job's identity: a
    folder of another job is refused, see :mod:`.job`), ``part-NNNNNN.<ext>``
    chunk files of ``chunk_size`` documents in input order,
    ``checkpoint.jsonl``, ``errors.jsonl`` (or ``errors_path``),
    ``provenance.json`` and ``summary.json``. Rerunning the same call continues
    where an interrupted one stopped.

    ``options``: :class:`~.options.AnnotateOptions` (or a mapping of their
    fields; None: the defaults): output ``format``, ``input_format``,
    ``batch_size`` (documents per ``nlp.pipe`` batch), ``n_process`` (forked
    worker processes, one CPU core each; with ``device`` ``cuda`` their generators
    share the machine's GPUs), ``chunk_size``, ``errors_path``, ``progress``,
    ``command``, ``engine`` (``"ray"``: the units of the job on ``n_process``
    Ray workers, a local Ray or the cluster at ``ray_address``; :mod:`.ray_engine`).

    ``settings``: genbioel component settings applied when the pipeline is
    loaded, dotted or bare (``{"device": "cuda", "decoding.batch_size": 64,
    "candidates.retriever": "tfidf"}``; an unknown one is refused). ``device``
    (``auto``, ``cpu``, ``cuda``, ``cuda:N``; default ``auto``) also decides where
    the job may run (:func:`~.options.run_device`). Settings that change what is
    computed are part of the job, as the pipeline's own config is; ``device``
    and ``decoding.batch_size`` are not. Each run's settings are in provenance.json.

    Returns the summary written to ``summary.json``: ``documents_read``
    (records seen, valid or not), ``documents_written``, ``documents_skipped``
    (duplicate IDs), ``errors``, ``mentions``, ``mentions_linked`` (with a
    ``kb_id``), ``chunks``, and ``this_run`` figures (speed, documents found
    already done).
    """
    from spacy_genbioel.linking import component as _pipeline  # noqa: F401  (registers the factory)

    bound_kernel_cache()  # in time unless this process ran torch on the CPU already
    options = AnnotateOptions.of(options)
    overrides = component_settings(settings)
    pipeline_dir = Path(pipeline_dir)
    out = Path(out)
    paths = expand_inputs(inputs)
    if not paths:
        raise AnnotateError(f"no input files in {named('inputs')}")
    formats = [
        options.input_format or detect_format(p) for p in paths
    ]  # fail on an unknown file before loading the model
    device = overrides["device"]
    load_device = run_device(options, device)
    if options.engine == "ray":
        from spacy_genbioel.annotate.ray_engine import import_ray

        import_ray()  # installed? (the cluster is reached, and its GPUs checked, when the job runs)
    command = options.command or shlex.join(sys.argv)
    if out.exists() and not out.is_dir():
        raise AnnotateError(f"{named('out')} {out} is a file; it must be a folder")
    check_places(out, Path(options.errors_path) if options.errors_path else None, inputs, pipeline_dir)
    name = _genbioel_name(pipeline_dir)
    try:
        identity = job_identity(paths, formats, options.input_format, options.format, pipeline_dir, name, overrides)
    except OSError as err:
        raise AnnotateError(f"cannot read an input or pipeline file ({err})") from err
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AnnotateError(f"{named('out')} {out} cannot be made ({err})") from err
    finished = finished_read_only(out, identity)  # a read-only folder: an error, unless this job is done there
    if finished is not None:
        return finished
    try:
        with output_lock(out):
            try:
                new_job = check_job(out, identity)  # before anything in the folder changes
                # Ray: the workers link; the driver's pipeline (on CPU) only reads and writes
                driver_device = "cpu" if options.engine == "ray" else load_device
                nlp, component = _load_pipeline(pipeline_dir, name, {**overrides, "device": driver_device})
                if options.engine != "ray":  # built once here: forked workers share them (copy-on-write)
                    component.build_indexes()
                if new_job:
                    record_job(out, identity)
            except BaseException:
                _leave_as_found(out, created)  # no empty output folder with a .lock left by a run that could not start
                raise
            (out / SUMMARY).unlink(missing_ok=True)  # present only after a run that finished
            job = {
                "format": options.format,
                "inputs": [{"path": str(p), "format": f} for p, f in zip(paths, formats)],
                "input_format": options.input_format,
                "chunk_size": options.chunk_size,
                "batch_size": options.batch_size,
                "n_process": options.n_process,
                "engine": options.engine,
                "settings": overrides,
            }
            record = provenance(nlp, pipeline_dir, component, load_device, job, command)
            if options.engine != "ray" and load_device != device and device not in ("auto", "cpu"):
                # loaded here on the CPU; each forked worker moves its generator to a GPU
                record["device"] = record["runs"][0]["device"] = f"{device} (each worker's generator)"
            update_provenance(out, record, options.format, options.chunk_size)
            inputs_read = list(zip(paths, formats))
            if options.engine == "ray":
                from spacy_genbioel.annotate.ray_engine import run_on_ray

                return run_on_ray(
                    nlp, component, inputs_read, out, options, pipeline_dir=pipeline_dir, overrides=overrides
                )
            return _run(nlp, component, inputs_read, out, options, device)
    except OSError as err:  # reading is guarded record by record: this is the output that cannot be written
        raise AnnotateError(
            f"cannot write the output ({err}); what was committed is kept: rerun the same command to resume"
        ) from err


def _run(
    nlp: Any,
    component: Any,
    inputs: Sequence[Tuple[Path, str]],
    out: Path,
    options: AnnotateOptions,
    device: str = "cpu",
) -> Dict[str, Any]:
    """The job proper, in a locked output folder whose job is checked and recorded; ``device``: the job's
    (forked workers on ``cuda``/``cuda:N`` each take a GPU, :func:`~.options.worker_device`)."""
    from spacy.util import minibatch

    paths, formats = [p for p, _ in inputs], [f for _, f in inputs]
    format, batch_size, n_process, chunk_size = (
        options.format,
        options.batch_size,
        options.n_process,
        options.chunk_size,
    )
    errors_path = options.errors_path

    writer: ChunkWriter = WRITERS[format](spans_key=component.spans_key)
    checkpoint = Checkpoint(out, writer, nlp.vocab)
    errors = ErrorLog(Path(errors_path) if errors_path else out / ERRORS)
    counts = collections.Counter()
    seen: Set[Union[int, str]] = set()  # IDs claimed in this pass over the inputs
    # input bytes (compressed, for .gz) as the total; documents found committed are skipped, not in the rates
    bar = InputProgress("annotate", paths, counts=("docs", "mentions"), enabled=options.progress)

    def pending() -> Iterator[InputRecord]:
        """Valid, first-seen records not yet in a committed chunk; the rest goes to the errors file."""
        for item in first_seen(
            bar.read(_records(paths, formats, options.read_limits)), writer.check, errors, seen, counts
        ):
            key = id_key(item.doc_id)
            if key in checkpoint.done:
                checkpoint.done.discard(key)  # now in `seen`: keep one copy
                counts["resumed"] += 1
                bar.skip()
                continue
            yield item

    spans_key = component.spans_key
    clock = StageClock()
    workers: List[Dict[str, Any]] = []
    began = time.monotonic()
    try:
        if n_process == 1:
            use_clock(nlp, clock)
            paths_before = path_counts(nlp)
            # batches restart at each chunk, so a resumed run batches exactly as an uninterrupted one
            for chunk_records in minibatch(timed(pending(), clock, "reading"), chunk_size):
                clear_caches(nlp)  # a chunk's links never depend on the chunks before it: as a worker's unit
                items = []
                for record, doc in _run_serial(nlp, list(chunk_records), batch_size, clock):
                    result = annotated_or_error(record, doc, spans_key)
                    if isinstance(result, RecordError):
                        errors.log(result)
                        continue
                    counts["run_docs"] += 1
                    counts["run_mentions"] += len(result.mentions)
                    bar.add(docs=1, mentions=len(result.mentions))
                    items.append(result)
                if items:
                    with clock.stage("writing"):
                        checkpoint.commit(items)
            counts.update(path_counts(nlp) - paths_before)
        else:
            # the job's units (chunk k of a one-process run) on forked workers, committed as they come back
            units = plan_units(
                first_seen(bar.read(_records(paths, formats, options.read_limits)), writer.check, errors, seen, counts),
                chunk_size,
                checkpoint.done,
                counts,
            )
            committer = Committer(units, checkpoint, errors, counts, bar, clock, workers)
            on_gpu = device not in ("auto", "cpu")
            run_forked(
                lambda unit: annotate_unit(nlp, writer, spans_key, unit, batch_size),
                committer.next_unit,
                committer.commit,
                n_process,
                counts,
                (lambda slot: component.to_device(worker_device(device, slot))) if on_gpu else None,
            )
            checkpoint.put_in_order()
    finally:
        use_clock(nlp, None)
        bar.close()
        errors.close()

    summary = run_summary(checkpoint, errors, counts, out, format, time.monotonic() - began, clock, workers)
    if n_process > 1:
        summary["this_run"].update(
            {
                "workers": n_process,
                "units": counts["units"],
                "units_resumed": counts["units_resumed"],
                "units_annotated": counts["units_annotated"],
                "units_retried": counts["units_retried"],
            }
        )
    atomic_json(out / SUMMARY, summary)
    return summary
