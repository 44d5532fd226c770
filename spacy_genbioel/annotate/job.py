"""The identity of an annotation job, kept in ``OUT/job.json``, so that an output
folder only ever holds one job's documents.

A job is: its inputs (each by resolved path, size, fingerprint and the format
it is read in, in order), the output format, and the pipeline (a fingerprint
of the genbioel model's weights and config, of its KB, of every other file in
the pipeline folder, and the genbioel component's settings: its config with
the job's settings applied). A run into a folder whose ``job.json`` says the
same resumes it; anything else is refused with
:class:`~spacy_genbioel.annotate.records.AnnotateError` saying what differs.
What is not identity: the pipeline's path (a copy of the same pipeline is the
same), how an input path is spelled (it is resolved), ``input_format`` where
detection gives the same format, the options ``batch_size``, ``n_process``,
``engine``, ``chunk_size`` and ``errors_path``, and the settings that say how
the linker runs, not what it computes (:data:`RUN_SETTINGS`: ``device``,
``decoding.batch_size``).

Where a job may write (:func:`check_places`): not into a folder given as an
input, nor into the pipeline folder, since what it writes there would change
the job (its chunks read as inputs, the pipeline's fingerprint) and no rerun
could resume it. A read-only output folder (:func:`finished_read_only`) is an
error, unless it holds this job, finished: then there is nothing to do.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from spacy_genbioel.annotate.checkpoint import CHUNK_NAME
from spacy_genbioel.annotate.records import CHECKPOINT, JOB, PROVENANCE, SUMMARY, AnnotateError, named
from spacy_genbioel.util import PathLike, atomic_json, fingerprint

logger = logging.getLogger(__name__)

__all__ = [
    "RUN_SETTINGS",
    "check_job",
    "check_places",
    "differences",
    "finished_read_only",
    "job_identity",
    "record_job",
]

VERSION = 1
# genbioel settings that are not the job's: where and in what batches it runs (the flat batch_size: 0.1 pipelines')
RUN_SETTINGS: Tuple[Tuple[str, ...], ...] = (("device",), ("decoding", "batch_size"), ("batch_size",))


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _existing(path: Optional[Path]) -> Optional[Path]:
    return path if path is not None and path.exists() else None


def _merged(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> Dict[str, Any]:
    merged = dict(config)
    for key, value in overrides.items():
        base = merged.get(key)
        merged[key] = _merged(base, value) if isinstance(base, Mapping) and isinstance(value, Mapping) else value
    return merged


def _what_it_computes(config: Any) -> Any:
    """A component config without :data:`RUN_SETTINGS`."""
    if not isinstance(config, dict):
        return config
    config = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for path in RUN_SETTINGS:
        section = config
        for key in path[:-1]:
            section = section.get(key) if isinstance(section.get(key), dict) else {}
        section.pop(path[-1], None)
    return config


def _pipeline_identity(pipeline_dir: Path, name: str, overrides: Mapping[str, Any]) -> Dict[str, Any]:
    from spacy.util import load_config

    config = _merged(load_config(pipeline_dir / "config.cfg", interpolate=False)["components"][name], overrides)
    config.pop("device", None)  # where it runs is not what it computes
    folder = pipeline_dir / name
    # a saved linker travels in the folder; one never initialized loads from its config's paths
    model = _existing(folder / "model") or _existing(Path(config["model"]) if config.get("model") else None)
    kb = _existing(folder / "kb.jsonl") or _existing(Path(config["kb"]) if config.get("kb") else None)
    counted = set()
    if model is not None and model.is_dir():
        counted = {p.resolve() for p in [*model.glob("*.safetensors"), *model.glob("config.json")]}
    if kb is not None:
        counted.add(kb.resolve())
    others = sorted(p for p in pipeline_dir.rglob("*") if p.is_file() and p.resolve() not in counted)
    return {
        "path": str(pipeline_dir.resolve()),
        "component": name,
        "model": fingerprint([model]) if model is not None else None,
        "kb": fingerprint([kb]) if kb is not None else None,
        "files": fingerprint(others),
        "config": _plain(config),
    }


def job_identity(
    paths: Sequence[Path],
    formats: Sequence[str],
    input_format: Optional[str],
    format: str,
    pipeline_dir: Path,
    component: str,
    overrides: Mapping[str, Any],
) -> Dict[str, Any]:
    """What makes a job this job (see the module docstring); reads every input and pipeline file once.
    ``overrides``: the job's genbioel settings, nested as the component's config."""
    inputs = []
    for path, fmt in zip(paths, formats):
        resolved = path.resolve()
        inputs.append(
            {
                "path": str(resolved),
                "size": resolved.stat().st_size,
                "fingerprint": fingerprint([resolved]),
                "format": fmt,
            }
        )
    return {
        "version": VERSION,
        "format": format,
        "input_format": input_format,
        "inputs": inputs,
        "pipeline": _pipeline_identity(pipeline_dir, component, overrides),
    }


def _listed(paths: Sequence[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def _config_changes(old: Any, new: Any, prefix: str = "") -> List[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            c
            for key in sorted(set(old) | set(new), key=str)
            for c in _config_changes(old.get(key), new.get(key), f"{prefix}{key}.")
        ]
    return [] if old == new else [f"{prefix[:-1]} {json.dumps(old)} before, {json.dumps(new)} now"]


def differences(old: Dict[str, Any], new: Dict[str, Any]) -> List[str]:
    """What differs between a recorded job and this one, in words (empty: the same job)."""
    diffs = []
    if old.get("version") != new["version"]:
        diffs.append(f"job record version {old.get('version')} before, {new['version']} now")
    if old.get("format") != new["format"]:
        diffs.append(f"output format {old.get('format')} before, {new['format']} now")
    before = {i.get("path"): i for i in old.get("inputs", [])}
    now = {i["path"]: i for i in new["inputs"]}
    added = [p for p in now if p not in before]
    missing = [p for p in before if p not in now]
    if added:
        diffs.append(f"inputs added: {_listed(added)}")
    if missing:
        diffs.append(f"inputs missing: {_listed(missing)}")
    for path in (p for p in now if p in before):
        was, is_ = before[path], now[path]
        if was.get("format") != is_["format"]:
            diffs.append(f"{path} was read as {was.get('format')}, now as {is_['format']}")
        elif was.get("size") != is_["size"] or was.get("fingerprint") != is_["fingerprint"]:
            diffs.append(f"{path} changed (size {was.get('size')} bytes before, {is_['size']} now; other content)")
    if not added and not missing and list(before) != list(now):
        diffs.append("the same inputs in another order")
    was_pipe, pipe = old.get("pipeline", {}), new["pipeline"]
    if was_pipe.get("component") != pipe["component"]:
        diffs.append(f"genbioel component {was_pipe.get('component')!r} before, {pipe['component']!r} now")
    for key, label in (
        ("model", "model weights"),
        ("kb", "KB"),
        ("files", "other pipeline files (NER, vocabulary, tokenizer, trie, meta)"),
    ):
        if was_pipe.get(key) != pipe[key]:
            diffs.append(f"the pipeline's {label} differ ({was_pipe.get('path')} before, {pipe['path']} now)")
    changes = _config_changes(_what_it_computes(was_pipe.get("config")), _what_it_computes(pipe["config"]))
    if changes:
        diffs.append(
            "genbioel settings differ: "
            + "; ".join(changes[:4])
            + (f" and {len(changes) - 4} more" if len(changes) > 4 else "")
        )
    return diffs


def check_job(out: Path, identity: Dict[str, Any]) -> bool:
    """True when ``out`` holds no job yet; False when it holds this one (a resume). Raises
    :class:`AnnotateError`, changing nothing, when it holds another job or output whose job is unknown."""
    path = out / JOB
    if not path.exists():
        earlier = sorted(
            p.name for p in out.iterdir() if p.name in (CHECKPOINT, PROVENANCE) or CHUNK_NAME.match(p.name)
        )
        if earlier:
            raise AnnotateError(
                f"{out} holds annotate output ({_listed(earlier)}) but no {JOB}: it was written by an earlier "
                f"version, so it cannot be told whether it is this job. Give another output folder ({named('out')}), "
                f"or remove {out}, to start this job."
            )
        return True
    try:
        recorded = json.loads(path.read_text(encoding="utf8"))
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as err:
        raise AnnotateError(
            f"{path} cannot be read ({err}); give another output folder ({named('out')}) to start the job again"
        ) from err
    diffs = differences(recorded, identity)
    if diffs:
        raise AnnotateError(
            f"{out} holds the output of another job: {'; '.join(diffs)}. To resume that job, rerun the command that "
            f"started it (in {out / PROVENANCE}); to start this one, "
            f"give another output folder ({named('out')}), or remove {out}."
        )
    return False


def record_job(out: Path, identity: Dict[str, Any]) -> None:
    """Write ``OUT/job.json`` (before anything else of the job is written)."""
    atomic_json(out / JOB, identity)


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_places(
    out: Path, errors_path: Optional[Path], inputs: Union[PathLike, Sequence[PathLike]], pipeline_dir: Path
) -> None:
    """Refuse, before anything is written, an output folder (or errors file) where writing changes the job:
    a folder given as an input or inside one, the folder that holds an input file (what is written lands
    beside the inputs, and a run over that folder reads it), or in the pipeline folder (its files are the
    pipeline). The message names both paths."""
    given = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    folders = [p for p in given if p.is_dir()]
    files = [p for p in given if not p.is_dir()]
    pipeline = pipeline_dir.resolve()
    if errors_path is not None and any(errors_path.resolve() == p.resolve() for p in given):
        raise AnnotateError(
            f"{named('errors_path')} {errors_path} is an input file; give another {named('errors_path')}"
        )
    for setting, path in (("out", out), ("errors_path", errors_path)):
        if path is None:
            continue
        where = path.resolve() if setting == "out" else path.resolve().parent
        for folder in folders:
            if where == folder.resolve():
                raise AnnotateError(
                    f"{named(setting)} {path} is in the input folder {folder}: what the job writes there would "
                    f"be read as input by a rerun, which could then never resume it; give another {named(setting)}"
                )
            if _inside(where, folder.resolve()):
                raise AnnotateError(
                    f"{named(setting)} {path} is inside the input folder {folder}: what the job writes would sit "
                    f"among its inputs, for a run over that folder's tree (or a copy of it) to read as input; "
                    f"give another {named(setting)}"
                )
        for file in files:
            if where == file.resolve().parent:
                raise AnnotateError(
                    f"{named(setting)} {path} is in the folder {file.parent} that holds the input file {file}: "
                    f"what the job writes would land beside its inputs, and a run over that folder would read "
                    f"it as input; give another {named(setting)}"
                )
        if _inside(path.resolve(), pipeline):
            raise AnnotateError(
                f"{named(setting)} {path} is in the pipeline folder {pipeline_dir}: what the job writes there would "
                f"change the pipeline, so a rerun could never resume it; give another {named(setting)}"
            )


def finished_read_only(out: Path, identity: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """For an output folder this process cannot write (a read-only mount...): its summary when it holds this
    job, finished (nothing to do: the summary with an empty ``this_run``); None when the folder is writable.
    Raises :class:`AnnotateError` otherwise, changing nothing."""
    if os.access(out, os.W_OK | os.X_OK):
        return None
    summary: Optional[Dict[str, Any]] = None
    if not check_job(out, identity):  # this job (another job is refused by check_job)
        try:
            summary = json.loads((out / SUMMARY).read_text(encoding="utf8"))
        except (OSError, ValueError):
            summary = None
    if not isinstance(summary, dict) or summary.get("complete") is not True:
        state = (
            "holds this job, unfinished: copy it to a writable place and rerun there to resume"
            if (out / JOB).exists()
            else "is where a new job would be written"
        )
        raise AnnotateError(
            f"{named('out')} {out} is not writable (read-only, or not this user's) and {state}; "
            f"give a writable {named('out')}"
        )
    logger.warning("%s is read-only and holds this job, finished: nothing to do", out)
    summary["this_run"] = {
        "documents_resumed": summary.get("documents_written", 0),
        "documents_annotated": 0,
        "mentions": 0,
        "seconds": 0.0,
        "documents_per_s": None,
        "mentions_per_s": None,
        "read_only": True,
    }
    return summary
