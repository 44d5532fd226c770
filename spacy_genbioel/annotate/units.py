"""The unit of work of an annotation job and what both engines share: running
the pipeline over records (:func:`run_serial`), loading it
(:func:`load_pipeline`), the document stream (:func:`first_seen`), the run's
summary (:func:`run_summary`); and, for the Ray engine (:mod:`.ray_engine`),
cutting the stream into units (:func:`plan_units`), annotating one unit into
the bytes of its chunk file (:func:`annotate_unit`) and committing it
(:func:`commit_unit`).

**The unit rule.** Unit *k* is the *k*-th run of ``chunk_size`` documents of
the job's document stream: the valid, first-seen records of the inputs in
order (a bad record or a duplicate ID is an entry in the errors file, not a
document), counted from the start of the first input whether annotated before
or not. So the units depend on the inputs and ``chunk_size`` alone, and unit
*k* is chunk ``part-k`` of the local engine's one-process run (it restarts
``nlp.pipe`` batches at each chunk, as :func:`annotate_unit` does at each unit).

**Commit.** A unit is committed once, by the driver alone: its chunk file is
written to a temporary file, fsync'd and renamed into place, then its line is
appended to ``checkpoint.jsonl`` (:meth:`~.checkpoint.Checkpoint.commit_file`).
A unit whose documents are all in committed chunks is skipped on a rerun; one
with documents in no committed chunk is annotated again (only those documents:
a chunk written with another ``chunk_size`` may hold some of them) and
committed as ``part-k``, or under the next free number where ``part-k`` is
taken by such an earlier chunk.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any,
    Callable,
    Counter,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from spacy_genbioel.annotate.records import (
    Annotated,
    AnnotateError,
    ChunkSummary,
    InputRecord,
    Item,
    RecordError,
    chunk_summary,
    doc_mentions,
    id_key,
)
from spacy_genbioel.annotate.timing import (
    StageClock,
    clear_caches,
    memory_now,
    path_counts,
    pipe_timed,
    stage_groups,
    use_clock,
    worker_memory,
)
from spacy_genbioel.linking.settings import load_overrides

logger = logging.getLogger(__name__)

__all__ = [
    "Committer",
    "Unit",
    "UnitResult",
    "annotate_unit",
    "commit_unit",
    "first_seen",
    "genbioel_component",
    "load_pipeline",
    "plan_units",
    "run_one",
    "run_serial",
    "run_summary",
]


# -- running the pipeline ------------------------------------------------------------------------------------------
def run_serial(
    nlp: Any, records: Sequence[InputRecord], batch_size: int, clock: Optional[StageClock] = None
) -> Iterator[Tuple[InputRecord, Any]]:
    """(record, doc or the exception) in order; a failing batch is retried one document at a time.
    Each component's time goes to ``clock`` (:func:`~.timing.pipe_timed`)."""
    clock = clock if clock is not None else StageClock()
    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        try:
            docs: List[Any] = pipe_timed(nlp, [r.text for r in batch], clock)
        except Exception as err:  # noqa: BLE001  (any component may fail; find the document)
            logger.warning("pipeline failed on a batch (%s); retrying its %d documents one by one", err, len(batch))
            docs = [run_one(nlp, r) for r in batch]
        yield from zip(batch, docs)


def run_one(nlp: Any, record: InputRecord) -> Any:
    try:
        return nlp(record.text)
    except Exception as err:  # noqa: BLE001
        return err


def genbioel_component(nlp: Any) -> Any:
    from spacy_genbioel.linking.component import GenBioELLinker

    for _, proc in nlp.pipeline:
        if isinstance(proc, GenBioELLinker):
            return proc
    raise AnnotateError(f"the pipeline has no genbioel component (components: {', '.join(nlp.pipe_names)})")


def load_pipeline(pipeline_dir: Path, name: str, overrides: Dict[str, Any]) -> Tuple[Any, Any]:
    """``(nlp, genbioel component)`` with its linker loaded, the ``name`` component's config overridden
    by ``overrides`` (nested: ``{"device": "cpu", "decoding": {"batch_size": 16}}``);
    any failure is an AnnotateError."""
    import spacy

    try:
        nlp = spacy.load(pipeline_dir, config={"components": {name: load_overrides(overrides)}})
        component = genbioel_component(nlp)
        component.linker  # noqa: B018  (load the model now, not at the first document)
    except AnnotateError:
        raise
    except Exception as err:  # noqa: BLE001  (whatever loading a damaged pipeline raises)
        raise AnnotateError(f"the pipeline in {pipeline_dir} cannot be loaded ({type(err).__name__}: {err})") from err
    return nlp, component


def annotated_or_error(record: InputRecord, doc: Any, spans_key: Optional[str]) -> Union[Annotated, RecordError]:
    """The annotated document, or the errors-file entry of a document the pipeline failed on or that cannot be read."""
    if isinstance(doc, BaseException):
        return RecordError(
            record.file,
            f"pipeline failed on the document ({type(doc).__name__}: {doc})",
            record.line,
            record.record,
            record.doc_id,
        )
    try:
        return Annotated(record, doc, doc_mentions(doc, spans_key))
    except Exception as err:  # noqa: BLE001  (one odd document is that document's error)
        return RecordError(
            record.file,
            f"the annotated document cannot be read ({type(err).__name__}: {err})",
            record.line,
            record.record,
            record.doc_id,
        )


# -- units ---------------------------------------------------------------------------------------------------------
@dataclass
class Unit:
    """Unit ``index``: the records of its slice still to annotate (all of them unless a chunk of
    an earlier run with another chunk size holds some); ``where`` names its first record."""

    index: int
    records: List[InputRecord]
    where: str = ""


@dataclass
class UnitResult:
    """A unit annotated by a worker: its chunk file's bytes (``None`` when every document failed),
    what the checkpoint records of it, and the errors-file entries of the documents that failed."""

    index: int
    data: Optional[bytes]
    summary: ChunkSummary
    errors: List[RecordError] = field(default_factory=list)
    seconds: float = 0.0  # the worker's time on the unit
    stages: Dict[str, float] = field(default_factory=dict)  # its seconds per stage (:mod:`.timing`)
    paths: Dict[str, int] = field(default_factory=dict)  # its mentions by path, as ``path:<name>``
    memory: Dict[str, Any] = field(
        default_factory=dict
    )  # the worker's memory after the unit (:func:`~.timing.memory_now`)


def first_seen(
    items: Iterable[Item],
    check: Callable[[InputRecord], Optional[str]],
    errors: Any,
    seen: Set[Union[int, str]],
    counts: Counter,
) -> Iterator[InputRecord]:
    """The job's document stream: valid records whose ID was not seen before (``seen`` grows);
    a bad record (or one ``check``, the writer's, refuses) and a duplicate go to ``errors``.
    ``counts["read"]`` counts every item."""
    for item in items:
        counts["read"] += 1
        if isinstance(item, RecordError):
            errors.log(item)
            continue
        reason = check(item)
        if reason:
            errors.log(RecordError(item.file, reason, item.line, item.record, item.doc_id))
            continue
        key = id_key(item.doc_id)
        if key in seen:
            errors.log(
                RecordError(
                    item.file,
                    f"duplicate document ID {item.doc_id!r}: the first one is kept",
                    item.line,
                    item.record,
                    item.doc_id,
                    kind="duplicate",
                )
            )
            continue
        seen.add(key)
        yield item


def plan_units(
    records: Iterable[InputRecord], chunk_size: int, done: Set[Union[int, str]], counts: Counter
) -> Iterator[Unit]:
    """Units of ``chunk_size`` documents of the document stream (see the module docstring), without
    the units whose documents are all in ``done`` (committed; their IDs leave ``done`` as they pass, to
    keep one copy of each in memory). ``counts``: ``resumed`` documents, ``units`` and ``units_resumed``."""
    index, slice_, todo = 0, 0, []
    for record in records:
        key = id_key(record.doc_id)
        if key in done:
            done.discard(key)
            counts["resumed"] += 1
        else:
            todo.append(record)
        slice_ += 1
        if slice_ == chunk_size:
            yield from _unit(index, todo, counts)
            index, slice_, todo = index + 1, 0, []
    if slice_:
        yield from _unit(index, todo, counts)


def _unit(index: int, todo: List[InputRecord], counts: Counter) -> Iterator[Unit]:
    counts["units"] += 1
    if todo:
        yield Unit(index, todo, todo[0].where)
    else:
        counts["units_resumed"] += 1


def annotate_unit(
    nlp: Any,
    writer: Any,
    spans_key: Optional[str],
    unit: Unit,
    batch_size: int,
    progress: Optional[Callable[[int], None]] = None,
) -> UnitResult:
    """Annotate one unit (``nlp.pipe`` batches start at the unit's first document) and write its chunk
    file to bytes with ``writer``; ``progress(documents done)`` is called after each batch."""
    began = time.monotonic()
    clock = StageClock()
    use_clock(nlp, clock)
    clear_caches(nlp)
    paths_before = path_counts(nlp)
    items: List[Annotated] = []
    failed: List[RecordError] = []
    for number, (record, doc) in enumerate(run_serial(nlp, unit.records, batch_size, clock), start=1):
        result = annotated_or_error(record, doc, spans_key)
        (items if isinstance(result, Annotated) else failed).append(result)  # type: ignore[arg-type]
        if progress is not None and (number % batch_size == 0 or number == len(unit.records)):
            progress(number)
    data = None
    if items:
        with clock.stage("writing"), tempfile.TemporaryDirectory(prefix="genbioel-unit-") as tmp:
            path = Path(tmp) / f"unit{writer.suffix}"
            writer.write(items, path)
            data = path.read_bytes()
    use_clock(nlp, None)
    stages = {name: round(value, 4) for name, value in clock.seconds.items()}
    paths = dict(path_counts(nlp) - paths_before)
    seconds = time.monotonic() - began
    return UnitResult(unit.index, data, chunk_summary(items), failed, seconds, stages, paths, memory_now())


def commit_unit(checkpoint: Any, result: UnitResult) -> Optional[str]:
    """Commit a unit's chunk as ``part-<index>`` (the next free number where an earlier run's chunk
    holds that name); the chunk's name, or None for a unit without a document to write."""
    if result.data is None:
        return None
    data = result.data
    number = result.index
    if (
        checkpoint.out / f"part-{number:06d}{checkpoint.writer.suffix}"
    ).exists():  # the folder's chunks are the committed ones
        number = checkpoint.next_number
        logger.warning(
            "unit %d: its chunk name is taken by a chunk of an earlier run with another chunk size; "
            "committing it as chunk %d",
            result.index,
            number,
        )
    entry = checkpoint.commit_file(number, lambda p: p.write_bytes(data), result.summary)
    return entry["chunk"]


@dataclass
class Committer:
    """The driver's side of an engine that runs units (the forked workers, :mod:`.workers`; Ray,
    :mod:`.ray_engine`): the next unit of the document stream (documents found committed are skipped
    on the progress ``bar``), and a unit's result committed (:func:`commit_unit`), then the errors of
    its documents that failed, counted in ``counts``."""

    units: Iterator[Unit]
    checkpoint: Any
    errors: Any
    counts: Counter
    bar: Any
    clock: StageClock = field(default_factory=StageClock)  # the driver's reading and committing, the workers' stages
    memory: List[Dict[str, Any]] = field(default_factory=list)  # what the workers reported

    def next_unit(self) -> Optional[Unit]:
        resumed = self.counts["resumed"]
        with self.clock.stage("reading"):
            unit = next(self.units, None)  # the driver reads the inputs up to the next unit
        if self.counts["resumed"] > resumed:
            self.bar.skip(self.counts["resumed"] - resumed)
        return unit

    def commit(self, result: UnitResult) -> None:
        with self.clock.stage("writing"):
            commit_unit(self.checkpoint, result)
        self.clock.seconds.update(result.stages)
        self.counts.update(result.paths)
        if result.memory:
            self.memory.append(result.memory)
        for error in result.errors:
            self.errors.log(error)
        self.counts["units_annotated"] += 1
        self.counts["run_docs"] += len(result.summary.ids)
        self.counts["run_mentions"] += result.summary.mentions
        self.counts["worker_ms"] += round(result.seconds * 1000)
        self.bar.add(docs=len(result.summary.ids), mentions=result.summary.mentions)


def run_summary(
    checkpoint: Any,
    errors: Any,
    counts: Counter,
    out: Path,
    format: str,
    seconds: float,
    clock: Optional[StageClock] = None,
    workers: Sequence[Mapping[str, Any]] = (),
) -> Dict[str, Any]:
    """What ``summary.json`` says of a finished run: the folder's totals, and ``this_run``'s figures
    from ``counts`` (``read``, ``resumed``, ``run_docs``, ``run_mentions``) over ``seconds``; with the
    run's ``clock``, its seconds per stage, and its memory (the driver's, the ``workers``' reports)."""
    totals = checkpoint.totals
    return {
        "documents_read": counts["read"],
        "documents_written": totals["documents_written"],
        "documents_skipped": errors.counts["duplicate"],
        "errors": errors.counts["error"],
        "mentions": totals["mentions"],
        "mentions_linked": totals["mentions_linked"],
        "chunks": totals["chunks"],
        "complete": True,
        "out": str(out),
        "format": format,
        "errors_file": str(errors.path),
        "this_run": {
            "documents_resumed": counts["resumed"],
            "documents_annotated": counts["run_docs"],
            "mentions": counts["run_mentions"],
            "seconds": round(seconds, 3),
            "documents_per_s": round(counts["run_docs"] / seconds, 2) if seconds > 0 else None,
            "mentions_per_s": round(counts["run_mentions"] / seconds, 2) if seconds > 0 else None,
            **run_accounts(clock, workers, counts),
        },
    }


def run_accounts(clock: Optional[StageClock], workers: Sequence[Mapping[str, Any]], counts: Counter) -> Dict[str, Any]:
    """``stages`` (seconds per group, summed over processes: :func:`~.timing.stage_groups`),
    ``stage_seconds`` (per stage), ``paths`` (mentions by how they were linked, from ``counts``'
    ``path:<name>``) and ``memory`` (the driver's now, each worker's largest report)."""
    out: Dict[str, Any] = {"paths": {k[5:]: v for k, v in sorted(counts.items()) if k.startswith("path:")}}
    if clock is not None:
        seconds = {name: round(value, 3) for name, value in clock.seconds.most_common()}
        out["stages"] = stage_groups(seconds)
        out["stage_seconds"] = seconds
    out["memory"] = {"driver": memory_now(), "workers": worker_memory(workers)}
    return out
