"""Batch annotation: many documents through a spaCy pipeline with the genbioel
linker, streaming, in committed chunks, resumable after any interruption.

* :mod:`.records` -- what the parts hand each other (:class:`InputRecord`,
  :class:`RecordError`, :class:`LinkedMention`...) and :class:`AnnotateError`;
* :mod:`.lines` -- bytes to lines, one at a time, through damaged ``.gz`` files;
* :mod:`.readers` -- input records from PubTator, JSONL or plain text, and
  :func:`read_records` for all formats; :mod:`.xml_readers` -- PubMed XML and
  BioC XML/JSON; :mod:`.detect` -- :func:`detect_format`, which refuses a file
  whose format cannot be told;
* :mod:`.writers` -- one chunk of annotated documents as a JSONL, PubTator,
  BioC or DocBin file (:data:`WRITERS`);
* :mod:`.checkpoint` -- the checkpoint, errors file, lock and provenance of
  an output folder; :mod:`.job` -- the job's identity (``job.json``): one job
  per output folder;
* :mod:`.options` -- what a job is told: :class:`AnnotateOptions` (how it runs,
  what it writes) and the genbioel settings the pipeline is loaded with;
* :mod:`.runner` -- the job itself, :func:`annotate`; :mod:`.workers` -- its
  units on forked worker processes (``n_process > 1``), which die with it.

The command line (``python -m spacy_genbioel annotate``) is
:mod:`spacy_genbioel.cli.annotate`; ``docs/annotate.md`` has the guarantees.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spacy_genbioel.annotate.options import AnnotateOptions
    from spacy_genbioel.annotate.readers import INPUT_FORMATS, READERS, detect_format, read_records
    from spacy_genbioel.annotate.records import AnnotateError, InputRecord, LinkedMention, RecordError, doc_mentions
    from spacy_genbioel.annotate.runner import annotate
    from spacy_genbioel.annotate.writers import OUTPUT_FORMATS, WRITERS

#: each public name -> the module it lives in, imported on first use: the job (:mod:`.runner`) loads spaCy and
#: torch, which the command line's ``--help`` and the readers, writers and options do without
_PUBLIC = {
    "AnnotateOptions": "options",
    "INPUT_FORMATS": "readers",
    "READERS": "readers",
    "detect_format": "readers",
    "read_records": "readers",
    "AnnotateError": "records",
    "InputRecord": "records",
    "LinkedMention": "records",
    "RecordError": "records",
    "doc_mentions": "records",
    "annotate": "runner",
    "OUTPUT_FORMATS": "writers",
    "WRITERS": "writers",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = [
    "INPUT_FORMATS",
    "OUTPUT_FORMATS",
    "READERS",
    "WRITERS",
    "AnnotateError",
    "AnnotateOptions",
    "InputRecord",
    "LinkedMention",
    "RecordError",
    "annotate",
    "detect_format",
    "doc_mentions",
    "read_records",
]
