"""The durable files of an annotation output folder besides the chunks:
``checkpoint.jsonl`` (which chunk holds which documents, reconciled with the
chunk files on disk when a run starts), the append-only errors file, the lock
that allows one run per folder, and ``provenance.json`` (which package,
model, KB and settings wrote the folder, and every run's command). Which job
the folder holds is :mod:`.job`'s (``job.json``, checked before any of these
is touched).

Why a rerun after ``kill -9`` at any moment finishes the job: a chunk is written
to a temporary file, fsync'd and renamed into place
(:func:`spacy_genbioel.util.atomic_write`); only then is a line with its
document IDs appended (and fsync'd) to the checkpoint. On start, the chunk
files present are the truth: temporary files are removed, a checkpoint line
whose chunk is missing is dropped, and a chunk without a checkpoint line (a
crash between rename and append) gets one, read from the chunk itself.

The lock (:func:`output_lock`) is a ``flock`` of our own rather than the
``filelock`` package's because only filelock's newest releases (checked: 4.3.1)
close the lock's descriptor in forked children -- the older ones that torch and
huggingface_hub accept leave it held by workers that outlive a killed parent,
the very bug the lock must not have -- and by default it falls back to a soft
lock, which outlives a killed holder, where ``flock`` is missing.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as _dt
import json
import logging
import os
import re
import sys
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterator, List, Sequence, Set, Tuple, Union

from spacy_genbioel.annotate.records import (
    CHECKPOINT,
    PROVENANCE,
    Annotated,
    AnnotateError,
    ChunkSummary,
    RecordError,
    chunk_summary,
    id_key,
    named,
)
from spacy_genbioel.annotate.writers import ChunkWriter
from spacy_genbioel.util import atomic_json, atomic_write

logger = logging.getLogger(__name__)

__all__ = ["Checkpoint", "ErrorLog", "output_lock", "provenance", "update_provenance"]

CHUNK_NAME = re.compile(r"^part-(\d{6,})(\.[A-Za-z.]+)$")


def _complete_lines(path: Path) -> List[str]:
    """The complete lines of an append-only file; a torn last line (a crash mid-append) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    try:
        text = data[:end].decode("utf8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise AnnotateError(
            f"{path}:{line}: not UTF-8 text; this file is written by annotate and was changed since"
        ) from err
    if end < len(data):
        logger.warning("%s: dropping an incomplete last line (interrupted write)", path)
        with path.open("r+b") as handle:
            handle.truncate(end)
            handle.flush()
            os.fsync(handle.fileno())
    return text.split("\n")[:-1] if text else []


class ErrorLog:
    """Append-only errors JSONL, de-duplicated against what an earlier run already wrote."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: Set[Tuple[str, str, str]] = set()
        self.counts = collections.Counter()
        for number, line in enumerate(_complete_lines(path), start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                key = (data["file"], str(data.get("line")), str(data.get("record")))
            except (ValueError, KeyError, TypeError) as err:
                raise AnnotateError(
                    f"{path}:{number}: not an errors-file entry ({type(err).__name__}: {err}); "
                    f"give another errors file ({named('errors_path')}) or remove this one"
                ) from err
            if key not in self.seen:
                self.seen.add(key)
                self.counts[data.get("kind", "error")] += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle: IO[str] = path.open("a", encoding="utf8", newline="\n")

    def log(self, error: RecordError) -> None:
        if error.key in self.seen:
            return
        self.seen.add(error.key)
        self.counts[error.kind] += 1
        self.handle.write(json.dumps(error.to_dict(), ensure_ascii=False) + "\n")
        self.handle.flush()

    def close(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()


class Checkpoint:
    """Committed chunks of an output folder, reconciled with the chunk files present."""

    def __init__(self, out: Path, writer: ChunkWriter, vocab: Any) -> None:
        self.out = out
        self.path = out / CHECKPOINT
        self.writer = writer
        for tmp in out.glob(".*.tmp"):
            logger.info("removing %s left by an interrupted run", tmp)
            tmp.unlink()
        present = {p.name: p for p in out.iterdir() if CHUNK_NAME.match(p.name)}
        foreign = [n for n in present if CHUNK_NAME.match(n).group(2) != writer.suffix]  # type: ignore[union-attr]
        if foreign:
            raise AnnotateError(
                f"{out} holds chunks of another output format ({foreign[0]}); use another output folder "
                f"({named('out')})"
            )
        entries: Dict[str, Dict[str, Any]] = {}
        lines = _complete_lines(self.path)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                name = entry["chunk"]
                if not isinstance(name, str) or not CHUNK_NAME.match(name) or not isinstance(entry.get("ids"), list):
                    raise ValueError("not a chunk entry")
            except (ValueError, KeyError, TypeError, AttributeError) as err:
                raise AnnotateError(
                    f"{self.path}:{number}: corrupt checkpoint line ({err}); "
                    "delete the checkpoint to rebuild it from the chunk files"
                ) from err
            entries[name] = entry
        changed = False
        for name in [n for n in entries if n not in present]:
            logger.warning(
                "%s: chunk %s is in the checkpoint but not on disk; its documents will be annotated again", out, name
            )
            del entries[name]
            changed = True
        for name in sorted(set(present) - set(entries)):
            # committed (renamed) but the checkpoint append did not happen: the file is the truth
            logger.info("%s: chunk %s was not in the checkpoint; reading its IDs from the file", out, name)
            try:
                summary = writer.read_back(present[name], vocab)
            except Exception as err:  # noqa: BLE001  (whatever the format's reader raises)
                raise AnnotateError(
                    f"{present[name]} cannot be read ({err}); delete it to annotate its documents again"
                ) from err
            entries[name] = {"chunk": name, "ids": summary.ids, "mentions": summary.mentions, "linked": summary.linked}
            changed = True
        ordered = [entries[n] for n in sorted(entries, key=lambda n: int(CHUNK_NAME.match(n).group(1)))]  # type: ignore[union-attr]
        if changed or len(lines) != len(ordered):
            atomic_write(
                self.path,
                lambda p: p.write_text(
                    "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in ordered), encoding="utf8"
                ),
            )
        # IDs of committed documents; the entries keep only counts (memory: one set, not two copies)
        self.done: Set[Union[int, str]] = {id_key(doc_id) for e in ordered for doc_id in e["ids"]}
        self.entries = [{k: v for k, v in e.items() if k != "ids"} | {"documents": len(e["ids"])} for e in ordered]
        numbers = [int(CHUNK_NAME.match(e["chunk"]).group(1)) for e in ordered]  # type: ignore[union-attr]
        self.next_number = max(numbers) + 1 if numbers else 0

    def commit(self, items: Sequence[Annotated]) -> Dict[str, Any]:
        return self.commit_file(self.next_number, lambda p: self.writer.write(items, p), chunk_summary(items))

    def commit_file(self, number: int, write: Callable[[Path], None], summary: ChunkSummary) -> Dict[str, Any]:
        """Commit chunk ``number``, written by ``write(path)``: the chunk file lands (atomically),
        then its checkpoint line. The Ray engine commits units as they finish, so out of order."""
        name = f"part-{number:06d}{self.writer.suffix}"
        atomic_write(self.out / name, write)
        entry = {"chunk": name, "ids": summary.ids, "mentions": summary.mentions, "linked": summary.linked}
        self._append(entry)
        self.entries.append(
            {"chunk": name, "mentions": summary.mentions, "linked": summary.linked, "documents": len(summary.ids)}
        )
        self.next_number = max(self.next_number, number + 1)
        return entry

    def put_in_order(self) -> None:
        """Rewrite ``checkpoint.jsonl`` in chunk order where chunks were committed out of order."""
        lines = _complete_lines(self.path)
        ordered = sorted(lines, key=lambda line: int(CHUNK_NAME.match(json.loads(line)["chunk"]).group(1)))  # type: ignore[union-attr]
        if ordered != lines:
            atomic_write(self.path, lambda p: p.write_text("".join(line + "\n" for line in ordered), encoding="utf8"))
        self.entries.sort(key=lambda e: int(CHUNK_NAME.match(e["chunk"]).group(1)))  # type: ignore[union-attr]

    def _append(self, entry: Dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf8", newline="\n") as handle:
            handle.write(json.dumps(entry, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    @property
    def totals(self) -> Dict[str, int]:
        return {
            "documents_written": sum(e["documents"] for e in self.entries),
            "mentions": sum(e["mentions"] for e in self.entries),
            "mentions_linked": sum(e["linked"] for e in self.entries),
            "chunks": len(self.entries),
        }


_HELD: Set[int] = set()  # descriptors of the output-folder locks this process holds


def _not_in_child() -> None:
    """After a fork: the child closes its copies of the lock descriptors. A ``flock`` lives as long as any
    copy of its descriptor, so a worker that kept one would hold its parent's lock after the parent died."""
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_not_in_child)


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """One run per output folder: an exclusive ``flock`` on ``OUT/.lock``, held by this process alone
    (the descriptor is opened close-on-exec and closed in every forked child, so workers never hold
    it), so the kernel frees it when this process ends, also on kill -9 (the module docstring says why
    this is not the ``filelock`` package)."""
    import fcntl

    path = out / ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise AnnotateError(
            f"{path} cannot be opened ({err.strerror}); {named('out')} must be a folder this user can write"
        ) from err
    _HELD.add(fd)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AnnotateError(f"another annotate run is writing to {out}") from None
        yield
    finally:
        if fd in _HELD:  # (a forked child that got here closed it already)
            _HELD.discard(fd)
            os.close(fd)


# -- provenance -------------------------------------------------------------------------------------------------
def provenance(
    nlp: Any, pipeline_dir: Path, component: Any, device: str, settings: Dict[str, Any], command: str
) -> Dict[str, Any]:
    """What wrote this folder: package and library versions, pipeline, model (with the component's config
    as loaded), KB (its checksum guards a resumed run), device, the job's ``settings`` (its options, and
    under ``settings`` the genbioel settings it was given) and ``command``, and a first entry in ``runs``:
    when, how (command, device, genbioel settings: a resumed run may use another device or batch size)."""
    import spacy
    import torch
    import transformers

    from spacy_genbioel import __version__

    linker = component.linker
    kb = linker.kb
    model = linker.model
    try:
        model_device = str(next(model.parameters()).device)
    except StopIteration:
        model_device = device
    component_cfg = dict(nlp.config["components"].get(component.name, {}))
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {
        "package": "spacy_genbioel",
        "version": __version__,
        "versions": {
            "spacy": spacy.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
        },
        "pipeline": str(pipeline_dir.resolve()),
        "pipeline_meta": {k: nlp.meta.get(k) for k in ("lang", "name", "version")}
        | {"components": list(nlp.pipe_names)},
        "model": {
            "type": getattr(model.config, "model_type", type(model).__name__),
            "name_or_path": getattr(model.config, "_name_or_path", "") or "",
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "component": component.name,
            "config": component_cfg,
        },
        "kb": {"name": kb.name, "checksum": kb.checksum(), "concepts": len(kb), "names": kb.n_names},
        "device": model_device,
        "created": now,
        "command": command,
        **settings,
        "runs": [
            {"started": now, "command": command, "device": model_device, "settings": settings.get("settings", {})}
        ],
    }


def update_provenance(out: Path, provenance: Dict[str, Any], format: str, chunk_size: int) -> None:
    """Write ``provenance.json``; a folder written before keeps its record and gets this run appended.
    Raises :class:`AnnotateError` when the folder holds another format or was linked with another KB."""
    path = out / PROVENANCE
    if path.exists():
        try:
            previous = json.loads(path.read_text(encoding="utf8"))
            if not isinstance(previous, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            raise AnnotateError(
                f"{path} cannot be read ({err}); this file is written by annotate and was changed since"
            ) from err
        if previous.get("format") != format:
            raise AnnotateError(
                f"{out} was written as {previous.get('format')}, not {format}; use another output folder "
                f"({named('out')})"
            )
        if previous.get("kb", {}).get("checksum") != provenance["kb"]["checksum"]:
            raise AnnotateError(
                f"{out} was written with another KB (checksum {previous.get('kb', {}).get('checksum')}); "
                f"use another output folder ({named('out')})"
            )
        if previous.get("chunk_size") != chunk_size:
            logger.warning(
                "chunk size changed from %s to %s: chunk boundaries will differ from an uninterrupted run",
                previous.get("chunk_size"),
                chunk_size,
            )
        previous["runs"] = previous.get("runs", []) + provenance["runs"]
        provenance = previous
    atomic_json(path, provenance)
