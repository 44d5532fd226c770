"""What an annotation job is told: :class:`AnnotateOptions` (how the job runs and
what it writes) and the genbioel settings the pipeline is loaded with
(:func:`component_settings`), each checked here, before anything is loaded or
written.

    annotate(inputs, "pipeline/", "out/")                                        # the defaults
    annotate(inputs, "pipeline/", "out/", {"format": "pubtator", "chunk_size": 1000},
             {"device": "cuda", "decoding.batch_size": 64, "candidates.retriever": "tfidf"})
    annotate(inputs, "pipeline/", "out/", AnnotateOptions(engine="ray", n_process=8))

The options are the job's; the settings are the genbioel component's (any
setting of its config, dotted as ``block.key`` or bare, as ``spacy.load``
overrides: :func:`spacy_genbioel.linking.settings.nested_overrides`). Among
them ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``; default ``auto``)
also decides where the job may run: forked workers (``n_process > 1``) run on
their CPU cores, and with ``cuda`` each runs its generator on one of the
machine's GPUs, several workers to a GPU (:func:`worker_device`); Ray workers
take a GPU each with ``cuda`` (:func:`run_device`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Union

from spacy_genbioel.annotate.lines import DEFAULT_LIMITS, ReadLimits
from spacy_genbioel.annotate.records import AnnotateError, named
from spacy_genbioel.util import PathLike, resolve_device

#: oneDNN (PyTorch's CPU kernels, bfloat16 ones above all) keeps a compiled kernel per input shape, 1,024
#: by default; the linker's batches come in thousands of shapes, and that cache grew each BC5CDR worker by
#: 0.9 GB over 2,500 abstracts. 16 kernels cost no speed there (docs/scale.md).
KERNEL_CACHE = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16"}


def bound_kernel_cache() -> None:
    """Set :data:`KERNEL_CACHE` in this process's environment where the user has not: oneDNN reads it when
    torch first runs a CPU kernel, so call it before (forked workers and a local Ray's workers inherit it)."""
    for name, value in KERNEL_CACHE.items():
        os.environ.setdefault(name, value)


__all__ = ["DEFAULT_DEVICE", "ENGINES", "AnnotateOptions", "component_settings", "run_device", "worker_device"]

ENGINES = ("local", "ray")
DEFAULT_DEVICE = "auto"  # the genbioel device of a job whose settings name none, whatever the pipeline was saved with


@dataclass(frozen=True)
class AnnotateOptions:
    """How an annotation job runs and what it writes. Every field is checked when the options are
    made: a bad value raises :class:`AnnotateError` naming the field. ``format`` and ``input_format``
    are part of the job (a folder holds one job, see :mod:`.job`); the others may change between
    the runs of a job. The genbioel component's own settings (``device``, ``decoding.batch_size``...)
    are not options: they are :func:`~.runner.annotate`'s ``settings``."""

    #: output format: jsonl, pubtator, bioc or docbin
    format: str = "jsonl"
    #: the format of every input (pubtator, bioc, pubmed, jsonl, text);
    #: None: told per file (:func:`~.detect.detect_format`)
    input_format: Optional[str] = None
    #: documents per ``nlp.pipe`` batch (the linker's own batch of mentions is the setting ``decoding.batch_size``)
    batch_size: int = 64
    #: forked worker processes, a unit of ``chunk_size`` documents at a time, one CPU core each (with
    #: device ``cuda`` their generators share the GPUs); with engine "ray": Ray workers
    n_process: int = 1
    #: documents per output chunk: the unit of commit (with engine "ray" also the unit of work)
    chunk_size: int = 500
    #: the errors file (JSONL); None: ``OUT/errors.jsonl``
    errors_path: Optional[PathLike] = None
    #: show a progress bar (on a terminal, or with ``GENBIOEL_PROGRESS=1``)
    progress: bool = True
    #: the command recorded in provenance.json; None: this process's command line
    command: Optional[str] = None
    #: "local" (this machine) or "ray" (Ray workers: :mod:`.ray_engine`)
    engine: str = "local"
    #: with engine "ray": the cluster ("auto", or the head node HOST:6379); None: a local Ray started for the run
    ray_address: Optional[str] = None
    #: the most bytes one input record (a line, an XML record) may hold; a larger one is an error entry naming the cap
    max_record_bytes: int = DEFAULT_LIMITS.max_record_bytes
    #: the most bytes of a BioC JSON file that is one collection (parsed whole)
    max_json_bytes: int = DEFAULT_LIMITS.max_json_bytes

    @property
    def read_limits(self) -> ReadLimits:
        """The readers' caps (:class:`~.lines.ReadLimits`)."""
        return ReadLimits(
            max_line_bytes=self.max_record_bytes,
            max_record_bytes=self.max_record_bytes,
            max_json_bytes=self.max_json_bytes,
        )

    def __post_init__(self) -> None:
        # the readers and writers (and the corpus and KB modules they read with) are imported here, when options are
        # made, not with this module: the command line reads the defaults of its flags from the fields
        from spacy_genbioel.annotate.readers import INPUT_FORMATS
        from spacy_genbioel.annotate.writers import OUTPUT_FORMATS

        if self.format not in OUTPUT_FORMATS:
            raise AnnotateError(
                f"{named('format')} {self.format!r}: unknown output format; use one of {', '.join(OUTPUT_FORMATS)}"
            )
        if self.input_format is not None and self.input_format not in INPUT_FORMATS:
            raise AnnotateError(
                f"{named('input_format')} {self.input_format!r}: unknown input format; "
                f"use one of {', '.join(INPUT_FORMATS)} (or none, to tell each file's)"
            )
        for name in ("batch_size", "n_process", "chunk_size", "max_record_bytes", "max_json_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AnnotateError(f"{named(name)} must be a whole number of at least 1, not {value!r}")
        if not isinstance(self.progress, bool):
            raise AnnotateError(f"{named('progress')} must be True or False, not {self.progress!r}")
        if self.engine not in ENGINES:
            raise AnnotateError(f"{named('engine')} {self.engine!r}: unknown engine; use local or ray")
        if self.ray_address is not None and self.engine != "ray":
            raise AnnotateError(f"{named('ray_address')} needs {named('engine')} ray")

    @classmethod
    def of(cls, options: Union[AnnotateOptions, Mapping[str, Any], None]) -> AnnotateOptions:
        """``options`` as AnnotateOptions: these, the defaults (None), or a mapping of their fields."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if not isinstance(options, Mapping):
            raise AnnotateError(
                f"{named('options')} must be AnnotateOptions or a mapping of their fields, not {type(options).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = [str(key) for key in options if key not in known]
        if unknown:
            hint = " (a genbioel setting: give it in settings)" if any(_is_setting(key) for key in unknown) else ""
            raise AnnotateError(
                f"unknown annotate option {', '.join(map(repr, unknown))}{hint}; "
                f"the options are {', '.join(sorted(known))}"
            )
        return cls(**options)


def _is_setting(name: str) -> bool:
    from spacy_genbioel.linking.settings import UnknownSettingError, nested_overrides

    try:
        nested_overrides({name: 0})
    except UnknownSettingError:
        return False
    return True


def component_settings(settings: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The genbioel settings of a job (dotted or bare names; None values: the pipeline's) as the nested
    overrides of the component's config, with ``device`` always there (default :data:`DEFAULT_DEVICE`)."""
    from spacy_genbioel.linking.settings import UnknownSettingError, nested_overrides

    if settings is None:
        settings = {}
    if not isinstance(settings, Mapping):
        raise AnnotateError(
            f"{named('settings')} must be a mapping of genbioel settings "
            f"({{'decoding.batch_size': 16}}), not {type(settings).__name__}"
        )
    try:
        nested = nested_overrides({str(key): value for key, value in settings.items()})
    except UnknownSettingError as err:
        raise AnnotateError(str(err)) from None
    device = nested.setdefault("device", DEFAULT_DEVICE)
    if not isinstance(device, str):
        raise AnnotateError(f"{named('device')} {device!r}: use auto, cpu, cuda or cuda:N")
    return nested


def run_device(options: AnnotateOptions, device: str) -> str:
    """Refuse a ``device`` the job cannot run on, before anything is loaded or written; the device the
    local engine loads the pipeline on. With ``n_process > 1`` that is always ``cpu``: ``auto`` runs on
    the CPU, and with ``cuda``/``cuda:N`` each forked worker moves its generator to a GPU itself
    (:func:`worker_device`), so this process never starts CUDA (a forked child cannot use a CUDA its
    parent started). With engine "ray" the workers' devices are the cluster's, checked when it is reached."""
    if options.engine == "ray":  # Ray gives each worker a whole GPU (or one CPU)
        if device.startswith("cuda:"):
            raise AnnotateError(
                f"{named('device')} {device} with {named('engine')} ray: Ray gives each worker its own GPU; "
                f"use {named('device')} cuda"
            )
        if device not in ("auto", "cpu", "cuda"):
            raise AnnotateError(f"{named('device')} {device}: use auto, cpu or cuda with {named('engine')} ray")
        return device
    if options.n_process > 1 and device not in ("auto", "cpu"):
        worker_device(device, 0)  # a GPU there? (counted without starting CUDA here)
        return "cpu"
    if device != "auto":
        try:
            dev = resolve_device(device)
        except (ValueError, RuntimeError) as err:
            raise AnnotateError(f"{named('device')} {device}: {err}") from None
        if dev.type == "cuda" and dev.index is not None:
            import torch

            if dev.index >= torch.cuda.device_count():
                raise AnnotateError(f"{named('device')} {device}: there are {torch.cuda.device_count()} CUDA devices")
    return "cpu" if options.n_process > 1 else device


def worker_device(device: str, slot: int) -> str:
    """The device of forked worker ``slot`` (0, 1...) of a job on ``device``: ``cuda:N`` as given, and
    ``cuda`` the machine's GPUs in turn (workers 0, 1... on GPUs 0, 1..., then again from 0), so
    several workers share a GPU: each runs its own generator there, the rest of its pipeline on its
    CPU core. The GPUs are counted through NVML (``torch.cuda.device_count``), which does not start
    CUDA in the calling process."""
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise AnnotateError(f"{named('device')} {device}: {err}") from None
    if dev.type != "cuda":
        raise AnnotateError(f"{named('device')} {device}: use auto, cpu, cuda or cuda:N")
    count = torch.cuda.device_count()
    if count == 0:
        raise AnnotateError(f"{named('device')} {device}: no CUDA device is available")
    if dev.index is None:
        return f"cuda:{slot % count}"
    if dev.index >= count:
        raise AnnotateError(f"{named('device')} {device}: there are {count} CUDA devices")
    return device
