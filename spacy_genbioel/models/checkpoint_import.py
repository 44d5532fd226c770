"""Importing a released GenBioEL/ANGEL checkpoint: pickled weights in, a
verified safetensors Hugging Face directory out (``import-checkpoint``).

The component loads safetensors only (:mod:`.hf`); this is the one explicit,
audited step that reads a pickled ``pytorch_model.bin``. The source (a folder
with ``config.json`` and ``pytorch_model.bin`` or a sharded
``pytorch_model.bin.index.json``, or one ``.bin``/``.pt``/``.ckpt`` file) is read
without running anything in it (:mod:`.checkpoint_pickle`); its key names are
mapped onto ``BartForConditionalGeneration`` (wrapper prefixes such as
``module.`` or Lightning's ``model.`` stripped, tied embeddings and
``final_logits_bias`` filled in); the directory is written with
``model.safetensors``, ``config.json``, the tokenizer and ``import.json`` (the
source files' SHA-256 and sizes, the key mapping, versions); and the written
directory, loaded by :func:`~spacy_genbioel.models.hf.load_model`, must give the
source weights' logits on probe inputs, or nothing is left at ``out``.

``config.json`` is checked before anything is built: no custom code
(``auto_map``) and no Hub attention kernel, sizes that are whole numbers, and
then (on the meta device, allocating nothing) tensors of the shapes the
checkpoint holds. The new folder is written beside ``out`` (a hidden
``.<out>.importing-*`` folder, locked while it is written; one a killed import
left is removed by the next import into ``out``) and renamed into place;
``--replace`` replaces an earlier import only when it holds nothing but what
the import wrote (``import.json`` lists it), renaming it aside until the new
one is in. Sources must be regular files: a FIFO is refused, not read.

The tokenizer folder must load with a padding token (facebook/bart-large's
needs its ``config.json`` for that), or the import stops before reading the
weights. The released input style the weights were trained on (given, or read
from the source folder's name: ``ANGEL_ncbi``) is recorded in the model's
``config.genbioel_inputs``, and ``package`` applies it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from spacy_genbioel.linking.inputs.released_style import RECORD_KEY, RELEASED_STYLES, style_named_in
from spacy_genbioel.models.checkpoint_pickle import CheckpointError, load_checkpoint_file, tensor_entries
from spacy_genbioel.models.hf import (
    ModelFormatError,
    check_attention,
    check_padding,
    check_vocabulary,
    load_model,
    load_tokenizer,
    tokenizer_fingerprint,
)
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = [
    "CheckpointError",
    "ImportOptions",
    "KeyMapping",
    "SourceCheckpoint",
    "find_source",
    "import_checkpoint",
    "map_keys",
    "read_config",
    "read_state_dict",
]

INDEX_NAME = "pytorch_model.bin.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
RECORD_NAME = "import.json"
#: ``config.genbioel_inputs`` of an imported released model whose corpus is not known: trained on
#: GenBioEL's own inputs, not this package's (with its corpus known: the style, ``genbioel-released-<corpus>.v1``)
RELEASED_INPUTS = "genbioel-released"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
#: what an import writes (with the weights' shards, ``model-00001-of-00002.safetensors``, and the
#: files its ``import.json`` lists): ``--replace`` replaces a folder holding nothing else
IMPORT_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        RECORD_NAME,
        "model.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "vocab.txt",
        "spiece.model",
        "sentencepiece.bpe.model",
        "chat_template.jinja",
    }
)
SHARD_NAME = re.compile(r"model-[0-9]{5}-of-[0-9]{5}\.safetensors")
#: held (``flock``) in a folder an import is being written to, until it is published
LOCK_NAME = ".import.lock"
#: a folder of an import in progress with no lock (an older version's, or one just created) is
#: left alone for this long
STALE_SECONDS = 120.0
#: config.json's probabilities of a BART
PROBABILITIES = (
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "classifier_dropout",
    "encoder_layerdrop",
    "decoder_layerdrop",
)
#: the most classification labels a config may ask for (``num_labels``: transformers makes a name for each)
MAX_LABELS = 10_000
#: config.json's sizes of a BART, and the least each may be
SIZE_FIELDS = (
    ("vocab_size", 1),
    ("d_model", 1),
    ("encoder_layers", 0),
    ("decoder_layers", 0),
    ("encoder_attention_heads", 1),
    ("decoder_attention_heads", 1),
    ("encoder_ffn_dim", 1),
    ("decoder_ffn_dim", 1),
    ("max_position_embeddings", 1),
)
ARCHITECTURES = ("BartForConditionalGeneration", "BartModel")
TOKENIZER_HINT = (
    "The released GenBioEL/ANGEL checkpoints ship without a tokenizer: they use facebook/bart-large's. "
    "Download its tokenizer files (tokenizer.json, vocab.json, merges.txt and config.json, without which the "
    "tokenizer has no padding token, from https://huggingface.co/facebook/bart-large) into a local folder and "
    "pass it as --tokenizer DIR, or pass "
    "--no-tokenizer to import the weights alone (then copy the tokenizer files into the output folder, or give "
    "the tokenizer folder whenever the model is loaded)"
)


@dataclass(frozen=True)
class ImportOptions:
    """How :func:`import_checkpoint` runs."""

    #: tokenizer folder written beside the weights (facebook/bart-large's for the released models)
    tokenizer: Optional[PathLike] = None
    #: import without a tokenizer (refused otherwise when ``tokenizer`` is None)
    no_tokenizer: bool = False
    #: the model's config.json when it is not beside the weights (a DeepSpeed step folder)
    config: Optional[PathLike] = None
    #: probe inputs whose logits the written model must reproduce
    probes: int = 4
    #: replace an earlier import in ``out`` (a folder with its import.json), once the new one is verified
    replace: bool = False
    #: the released input style the weights were trained on (``genbioel-released-<corpus>.v1``), recorded in
    #: ``config.genbioel_inputs`` for ``package`` to apply; None: read from the source folder's name (``ANGEL_ncbi``)
    inputs_style: Optional[str] = None
    #: tolerance of that comparison (``torch.allclose``)
    atol: float = 1e-4
    rtol: float = 1e-4
    seed: int = 0


@dataclass(frozen=True)
class SourceCheckpoint:
    """The files a checkpoint is imported from."""

    config: Path
    weights: Tuple[Path, ...]
    #: the sharded checkpoint's ``pytorch_model.bin.index.json``
    index: Optional[Path] = None


@dataclass
class KeyMapping:
    """How the source's key names became the model's (written to ``import.json``)."""

    #: the nested entry the state dict was found under (``state_dict``, ``module``), or None
    container: Optional[str] = None
    stripped_prefix: str = ""
    added_prefix: str = ""
    #: model key -> the source key (after renaming) whose tied tensor it takes
    tied: Dict[str, str] = field(default_factory=dict)
    #: model keys absent from the source and set to zeros (``final_logits_bias``)
    zero_filled: List[str] = field(default_factory=list)
    #: source keys (after renaming) the model has no place for, ignored
    unexpected: List[str] = field(default_factory=list)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _shard_files(index: Path) -> Tuple[Path, ...]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(
            f"{index}: not a checkpoint index with a weight_map ({type(err).__name__}: {err})"
        ) from err
    for name in names:
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise CheckpointError(f"{index}: shard {name!r} is not a file name in {index.parent}")
    missing = [name for name in names if not (index.parent / name).is_file()]
    if missing:
        raise CheckpointError(f"{index}: shard files not found in {index.parent}: {', '.join(missing)}")
    return tuple(index.parent / name for name in names)


def check_regular(path: Path, what: str) -> None:
    """Refuse a FIFO, device or socket (reading one would hang or never end), naming it."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # missing: the caller says what it expected there
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device or special file"
        raise CheckpointError(f"{path}: {kind}, not a regular file: give the {what} as a file")


def find_source(src: PathLike, config: Optional[PathLike] = None) -> SourceCheckpoint:
    """The weights and config of a checkpoint folder or file (see the module docstring)."""
    src = Path(src)
    if not src.exists():
        raise CheckpointError(f"{src}: no such checkpoint file or folder")
    check_regular(src, "checkpoint")
    index = None
    if src.is_dir():
        for name in (INDEX_NAME, WEIGHTS_NAME, "config.json"):
            check_regular(src / name, "checkpoint's " + name)
        pickles = sorted(p for p in src.iterdir() if p.is_file() and p.suffix in PICKLE_SUFFIXES)
        if (src / INDEX_NAME).is_file():
            index = src / INDEX_NAME
        elif (src / WEIGHTS_NAME).is_file():
            pickles = [src / WEIGHTS_NAME]
        elif len(pickles) != 1:
            safetensors = (
                " (it holds safetensors: load_model reads it as it is)" if any(src.glob("*.safetensors")) else ""
            )
            listed = f"several: {', '.join(p.name for p in pickles)}; name one" if pickles else "none found"
            raise CheckpointError(
                f"{src}: expected {WEIGHTS_NAME}, {INDEX_NAME} or one {'/'.join(PICKLE_SUFFIXES)} "
                f"file ({listed}){safetensors}"
            )
        folder = src
    else:
        folder = src.parent
        if src.name.endswith(".index.json"):
            index = src
        else:
            pickles = [src]
    weights = _shard_files(index) if index is not None else tuple(pickles)
    for path in weights:
        check_regular(path, "weights")
    config_path = Path(config) if config is not None else folder / "config.json"
    check_regular(config_path, "config.json")
    if not config_path.is_file():
        raise CheckpointError(f"{config_path}: no config.json for the checkpoint {src} (give it with --config)")
    return SourceCheckpoint(config=config_path, weights=weights, index=index)


def read_config(path: PathLike) -> Dict[str, Any]:
    """A checkpoint's ``config.json`` as data, refused when it asks for custom code
    (``auto_map``) or is not a BART."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{path}: not a JSON model config ({type(err).__name__}: {err})") from err
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: a model config is a JSON object, not {type(data).__name__}")
    if "auto_map" in data:
        raise CheckpointError(
            f"{path}: refused: auto_map asks for custom model code ({json.dumps(data['auto_map'])}); "
            "only the BART of transformers is imported, no code from a checkpoint"
        )
    try:
        check_attention(data, path)
    except ModelFormatError as err:
        raise CheckpointError(str(err)) from None
    if data.get("model_type") != "bart":
        raise CheckpointError(f"{path}: model_type is {data.get('model_type')!r}; only 'bart' checkpoints are imported")
    odd = [name for name in data.get("architectures") or () if name not in ARCHITECTURES]
    if odd:
        logger.warning("%s: architectures %s: imported as BartForConditionalGeneration", path, ", ".join(map(str, odd)))
    return data


def read_state_dict(source: SourceCheckpoint) -> Tuple[Dict[str, Any], Optional[str], List[Dict[str, Any]]]:
    """``(tensors, container, facts per file)`` of every weights file of ``source``."""
    state: Dict[str, Any] = {}
    containers = set()
    files = []
    for path in source.weights:
        obj, facts = load_checkpoint_file(path)
        tensors, container = tensor_entries(obj, path)
        containers.add(container)
        clash = sorted(set(tensors) & set(state))
        if clash:
            raise CheckpointError(f"{path}: {len(clash)} tensors also in another shard (first: {clash[0]})")
        state.update(tensors)
        files.append({"file": str(path), **facts, "tensors": len(tensors)})
    if source.index is not None:
        expected = json.loads(source.index.read_text(encoding="utf8"))["weight_map"]
        absent = sorted(set(expected) - set(state))
        if absent:
            raise CheckpointError(
                f"{source.index}: {len(absent)} tensors named in weight_map are in no shard (first: {absent[0]})"
            )
    if len(containers) > 1:
        raise CheckpointError(
            f"{source.weights[0]}: shards keep their tensors under different entries ({sorted(map(str, containers))})"
        )
    return state, containers.pop() if containers else None, files


def _rename(keys: List[str], target: set) -> Tuple[int, str, str]:
    """``(components stripped, stripped prefix, added prefix)``: the renaming under
    which most source keys are model keys (the fewest changes on a tie)."""
    parts = [key.split(".") for key in keys]
    common = 0
    while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    best = (-1, 0, "")
    for strip in range(common + 1):
        for added in ("", "model."):
            score = sum(added + ".".join(p[strip:]) in target for p in parts)
            if score > best[0]:
                best = (score, strip, added)
    _, strip, added = best
    prefix = "".join(part + "." for part in parts[0][:strip]) if parts else ""
    return strip, prefix, added


def map_keys(state: Dict[str, Any], model, where: str = "the checkpoint") -> Tuple[Dict[str, Any], KeyMapping]:
    """The source tensors under ``model``'s state-dict names, and how they were renamed
    (``where``, the source file, starts every error message).

    Tied embeddings missing from the source take the tensor of their group's key
    that is present (``model.shared.weight`` first); a missing ``final_logits_bias``
    is zeros. A missing real weight, a shape that does not fit, or tied copies
    that differ are refused."""
    import torch

    target = model.state_dict()
    strip, prefix, added = _rename(list(state), set(target))
    mapped: Dict[str, Any] = {}
    for key, tensor in state.items():
        name = added + ".".join(key.split(".")[strip:])
        if name in mapped:
            raise CheckpointError(f"{where}: source keys {key!r} and another both map to {name!r}")
        mapped[name] = tensor
    mapping = KeyMapping(
        stripped_prefix=prefix, added_prefix=added, unexpected=sorted(name for name in mapped if name not in target)
    )
    for name in mapping.unexpected:
        del mapped[name]
    groups: Dict[int, List[str]] = {}  # tied weights are one parameter under several names
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    for group in (sorted(g, key=lambda n: (n != "model.shared.weight", n)) for g in groups.values() if len(g) > 1):
        present = [name for name in group if name in mapped]
        if not present:
            continue
        for other in present[1:]:
            if mapped[other].shape != mapped[present[0]].shape or not torch.equal(mapped[other], mapped[present[0]]):
                raise CheckpointError(f"{where}: the model ties {other} to {present[0]}, but their values differ here")
        for name in group:
            if name not in mapped:
                mapped[name] = mapped[present[0]]
                mapping.tied[name] = present[0]
    if "final_logits_bias" in target and "final_logits_bias" not in mapped:
        bias = target["final_logits_bias"]
        mapped["final_logits_bias"] = torch.zeros(tuple(bias.shape), dtype=bias.dtype)
        mapping.zero_filled.append("final_logits_bias")
    missing = [name for name in target if name not in mapped]
    if missing:
        raise CheckpointError(
            f"{where}: {len(missing)} weights of the model are missing (first: {', '.join(missing[:5])}); "
            f"unmatched source keys: {', '.join(mapping.unexpected[:5]) or 'none'}"
        )
    for name, tensor in mapped.items():
        if tuple(tensor.shape) != tuple(target[name].shape):
            raise CheckpointError(
                f"{where}: {name} has shape {tuple(tensor.shape)}, the model its config.json describes "
                f"{tuple(target[name].shape)}"
            )
    if mapping.unexpected:
        logger.warning(
            "%s: %d tensors have no place in BartForConditionalGeneration and are ignored: %s",
            where,
            len(mapping.unexpected),
            ", ".join(mapping.unexpected[:10]),
        )
    return mapped, mapping


def _probe_logits(model, vocab: int, options: ImportOptions):
    import torch

    generator = torch.Generator().manual_seed(options.seed)
    inputs = torch.randint(0, vocab, (options.probes, 12), generator=generator)
    decoder = torch.randint(0, vocab, (options.probes, 6), generator=generator)
    mask = torch.ones_like(inputs)
    mask[0, 8:] = 0  # one padded probe
    with torch.no_grad():
        return model(input_ids=inputs, attention_mask=mask, decoder_input_ids=decoder).logits.float()


def _verify(reference, written: Path, with_tokenizer: bool, options: ImportOptions, config: Path) -> Dict[str, Any]:
    """Logits of the written directory, loaded as the component loads it, against the source weights';
    ``config``: the source's config.json, which an error names (the written one is about to go)."""
    import torch

    if with_tokenizer:
        loaded, _ = load_model(written, device="cpu", dtype="fp32")
    else:  # the same call load_model makes, without the tokenizer it requires
        from transformers import AutoModelForSeq2SeqLM

        loaded = AutoModelForSeq2SeqLM.from_pretrained(
            str(written), local_files_only=True, use_safetensors=True, dtype=torch.float32
        ).eval()
    vocab = int(reference.config.vocab_size)
    try:
        expected, got = _probe_logits(reference, vocab, options), _probe_logits(loaded, vocab, options)
    except Exception as err:  # a setting of config.json the model cannot run with
        raise CheckpointError(
            f"{config}: the model it describes cannot run on probe inputs ({type(err).__name__}: "
            f"{err}); correct the source's config.json: nothing was imported"
        ) from None
    diff = float((expected - got).abs().max())
    result = {"probes": options.probes, "max_abs_diff": diff, "atol": options.atol, "rtol": options.rtol}
    if not (torch.isfinite(got).all() and torch.allclose(expected, got, rtol=options.rtol, atol=options.atol)):
        raise CheckpointError(
            f"{written}: the written model's logits differ from the source weights' "
            f"(max |diff| {diff:.3g} > atol {options.atol}): nothing was imported"
        )
    return result


def _versions() -> Dict[str, str]:
    import importlib.metadata as metadata

    found = {"python": sys.version.split()[0]}
    for dist in ("spacy_genbioel", "torch", "transformers", "safetensors", "tokenizers"):
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def _file_record(path: Path) -> Dict[str, Any]:
    return {"file": str(path.resolve()), "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _not_written_by_an_import(out: Path) -> List[str]:
    """What ``out`` (an earlier import) holds that an import did not write: the files its
    ``import.json`` does not list (an older record lists none: :data:`IMPORT_FILES` and the
    weights' shards then), any subfolder; ``[import.json]`` when that record cannot be read."""
    try:
        record = json.loads((out / RECORD_NAME).read_text(encoding="utf8"))
        listed = record.get("files") if isinstance(record, dict) else None
    except (OSError, ValueError):
        return [RECORD_NAME + " (not an import record)"]
    if not isinstance(record, dict) or "verification" not in record:
        return [RECORD_NAME + " (not an import record)"]
    listed = set(listed) if isinstance(listed, list) else None

    def written(name: str) -> bool:  # what the record lists, of what an import writes (a record can be edited)
        return (name in IMPORT_FILES or bool(SHARD_NAME.fullmatch(name))) and (listed is None or name in listed)

    return sorted(
        entry.name + ("/" if entry.is_dir() else "")
        for entry in out.iterdir()
        if entry.is_dir() or entry.is_symlink() or not written(entry.name)
    )


def _check_out(out: Path, replace: bool = False) -> None:
    """Refuse an ``out`` that is neither missing, nor an empty folder, nor (with ``replace``) an
    earlier import holding only what the import wrote."""
    if replace and out.is_dir() and not out.is_symlink() and (out / RECORD_NAME).is_file():
        extra = _not_written_by_an_import(out)
        if not extra:
            return  # an earlier import, replaced once the new one is verified
        raise CheckpointError(
            f"{out}: refused to replace: it holds {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}, "
            "which import-checkpoint did not write; move them out of the folder, or choose another --out"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(
            f"{out}: already exists and is not an empty folder (nor an earlier import to replace); "
            "remove it or choose another --out"
        )


def _lock(folder: Path) -> int:
    """A descriptor holding the lock of a folder an import is being written to (released when
    the process ends, however it ends)."""
    import fcntl

    fd = os.open(folder / LOCK_NAME, os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _in_use(folder: Path) -> bool:
    """Whether an import still writes ``folder`` (holds its lock; without a lock: made lately)."""
    import fcntl

    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        try:
            return time.time() - folder.stat().st_mtime < STALE_SECONDS
        except OSError:
            return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _foreign_files(folder: Path, whole: bool) -> List[str]:
    """What ``folder`` (one an import wrote, ``whole`` when complete) holds that no import writes."""
    if whole:
        return _not_written_by_an_import(folder) if (folder / RECORD_NAME).is_file() else [RECORD_NAME + " (none)"]
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.is_symlink()
        or not entry.is_file()
        or not (entry.name in IMPORT_FILES or entry.name == LOCK_NAME or SHARD_NAME.fullmatch(entry.name))
    )


def clean_stale(out: Path) -> List[Path]:
    """Remove what imports into ``out`` that were killed left beside it (a hidden
    ``.<out>.importing-*`` folder, a full model copy; an earlier import put aside to be replaced,
    which is put back when ``out`` is gone), saying so in the log; the folders removed or put back."""
    handled: List[Path] = []
    if not out.parent.is_dir():
        return handled
    name = glob.escape(out.name)
    for kind in ("importing", "replaced"):
        for folder in sorted(out.parent.glob(f".{name}.{kind}-*")):
            if folder.is_symlink() or not folder.is_dir() or _in_use(folder):
                continue
            foreign = _foreign_files(folder, kind == "replaced")
            if foreign:
                logger.warning(
                    "%s: left %s alone, though no import writes it any more: it holds %s, which an import "
                    "does not write",
                    out,
                    folder,
                    ", ".join(foreign[:5]),
                )
                continue
            if kind == "replaced" and not os.path.lexists(out):
                os.replace(folder, out)
                logger.warning(
                    "%s: put back the earlier import %s, left aside by an import that was killed", out, folder
                )
            else:
                shutil.rmtree(folder, ignore_errors=True)
                logger.warning("%s: removed %s, left by an import that was killed", out, folder)
            handled.append(folder)
    return handled


def _import_tokenizer(path: PathLike):
    """The tokenizer folder given with the checkpoint, refused (naming the missing file) unless it
    loads with a padding token: facebook/bart-large's without its config.json loads without one."""
    if Path(path).is_dir():
        for entry in Path(path).iterdir():
            check_regular(entry, "tokenizer's " + entry.name)
    try:
        tokenizer = load_tokenizer(path)
        check_padding(tokenizer, path)
    except CheckpointError:
        raise
    except ModelFormatError as err:
        raise CheckpointError(str(err)) from err
    return tokenizer


def _input_style(src: PathLike, options: ImportOptions) -> Tuple[Optional[str], Optional[str]]:
    """``(style, where it came from)``: the released input style recorded with the weights."""
    if options.inputs_style is not None:
        if options.inputs_style not in RELEASED_STYLES:
            raise CheckpointError(
                f"inputs style {options.inputs_style!r}: the released styles are {', '.join(RELEASED_STYLES)}"
            )
        return options.inputs_style, "given"
    folder = Path(src).resolve()
    folder = folder if folder.is_dir() else folder.parent
    style = style_named_in(folder.name)
    return style, (f"the source folder's name, {folder.name}" if style else None)


def _tokenizer_checks(model, tokenizer, where: str) -> List[str]:
    check_vocabulary(model, tokenizer, where)
    notes = []
    for role in ("pad", "eos", "bos"):
        ours, theirs = getattr(tokenizer, f"{role}_token_id"), getattr(model.config, f"{role}_token_id", None)
        if theirs is not None and ours != theirs:
            notes.append(f"{where}: {role} id {ours}, the model's config says {theirs}")
            logger.warning(notes[-1])
    return notes


def _publish(tmp: Path, out: Path) -> None:
    """Move the verified import ``tmp`` to ``out``: an earlier import there is renamed aside,
    the new one renamed in, then the earlier one removed; if the new one cannot be moved in,
    the earlier one is put back as it was."""
    os.chmod(tmp, 0o755)
    for file in tmp.iterdir():
        os.chmod(file, 0o644)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not (out.is_dir() and (out / RECORD_NAME).is_file()):
        if out.exists():
            out.rmdir()  # empty (checked before)
        os.replace(tmp, out)
        return
    _check_out(out, replace=True)  # what it holds, again: files may have been added since the start
    aside = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.replaced-"))
    os.replace(out, aside)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    if aside.exists():
        logger.warning("%s: could not remove the earlier import, renamed to %s: remove it", out, aside)


def _bart_config(data: Dict[str, Any], path: Path):
    """``config.json`` as a ``BartConfig``, refused naming the field that is not a size or
    not of its type (transformers' own checks raise errors of many kinds)."""
    from transformers import BartConfig

    for name, least in SIZE_FIELDS:
        value = data.get(name, least)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise CheckpointError(
                f"{path}: {name} is {json.dumps(value)}: a whole number of at least {least} is expected; "
                "use the config.json the checkpoint was saved with"
            )
    for name in PROBABILITIES:
        value = data.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1
        ):
            raise CheckpointError(f"{path}: {name} is {json.dumps(value)}: a probability from 0 to 1 is expected")
    labels = data.get("num_labels", 0)
    if isinstance(labels, bool) or not isinstance(labels, int) or not 0 <= labels <= MAX_LABELS:
        raise CheckpointError(  # transformers builds an id2label entry for each, before anything else
            f"{path}: num_labels is {json.dumps(labels)}: a whole number from 0 to {MAX_LABELS} is expected; "
            "use the config.json the checkpoint was saved with (bart-large's says 3)"
        )
    try:
        config = BartConfig.from_dict(data)
    except Exception as err:  # huggingface_hub's strict-dataclass errors are not ValueErrors
        detail = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        raise CheckpointError(f"{path}: not a usable BART config ({type(err).__name__}: {detail})") from None
    for side in ("encoder", "decoder"):
        heads = getattr(config, f"{side}_attention_heads")
        if config.d_model % heads:
            raise CheckpointError(
                f"{path}: d_model {config.d_model} is not a multiple of {side}_attention_heads {heads}"
            )
    return config


def build_checked_model(config_data: Dict[str, Any], state: Dict[str, Any], source: SourceCheckpoint):
    """``(model, key mapping)``: the BART ``config.json`` describes, with the checkpoint's weights,
    its sizes checked against the checkpoint's tensors before anything is allocated (the model is
    first built on the meta device: a ``vocab_size`` of 4e8 is refused, not allocated)."""
    import torch
    from transformers import BartForConditionalGeneration

    config = _bart_config(config_data, source.config)
    where = str(source.index or source.weights[0])
    for side in ("encoder", "decoder"):
        layers = {m.group(1) for key in state for m in [re.search(rf"(?:^|\.){side}\.layers\.([0-9]+)\.", key)] if m}
        wanted = getattr(config, f"{side}_layers")
        if wanted > len(layers):
            raise CheckpointError(
                f"{source.config}: {side}_layers is {wanted}, but {where} has weights for {len(layers)} {side} "
                "layers: use the config.json the checkpoint was saved with"
            )
    try:
        with torch.device("meta"):
            skeleton = BartForConditionalGeneration(config)
    except Exception as err:  # sizes transformers cannot build
        raise CheckpointError(f"{source.config}: not a usable BART config ({type(err).__name__}: {err})") from None
    try:
        mapped, mapping = map_keys(state, skeleton, where)
    except CheckpointError as err:
        raise CheckpointError(f"{err} (the model described by {source.config})") from None
    model = BartForConditionalGeneration(config).eval()
    model.load_state_dict(mapped, strict=True)
    return model, mapping


def import_checkpoint(src: PathLike, out: PathLike, options: ImportOptions = ImportOptions()) -> Dict[str, Any]:
    """Import the checkpoint at ``src`` into the Hugging Face folder ``out`` (which must
    not exist or be empty) and return the record written to ``out/import.json``.

    Raises :class:`CheckpointError` (naming the file) for a refused or damaged
    source, a missing tokenizer without ``options.no_tokenizer``, or a written
    model whose logits differ from the source's; ``out`` is then left untouched."""
    out = Path(out)
    clean_stale(out)
    _check_out(out, options.replace)
    source = find_source(src, options.config)
    config_data = read_config(source.config)
    style, style_source = _input_style(src, options)
    if options.tokenizer is None and not options.no_tokenizer:
        raise CheckpointError(f"{src}: no tokenizer given. {TOKENIZER_HINT}")
    tokenizer = _import_tokenizer(options.tokenizer) if options.tokenizer is not None else None
    state, container, files = read_state_dict(source)
    model, mapping = build_checked_model(config_data, state, source)
    mapping.container = container
    del state
    # what inputs the weights were trained on travels with them: package applies the style, the component
    # warns on another
    setattr(model.config, RECORD_KEY, style or RELEASED_INPUTS)
    notes = (
        _tokenizer_checks(model, tokenizer, f"The tokenizer in {options.tokenizer}") if tokenizer is not None else []
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.importing-"))
    lock = None
    try:
        lock = _lock(tmp)
        model.save_pretrained(str(tmp), safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        verification = _verify(model, tmp, tokenizer is not None, options, source.config)
        written = json.loads((tmp / "config.json").read_text(encoding="utf8"))
        record = {
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "source": {
                "path": str(Path(src).resolve()),
                "config": _file_record(source.config),
                "index": _file_record(source.index) if source.index is not None else None,
                "weights": [
                    {**_file_record(Path(f["file"])), **{k: v for k, v in f.items() if k != "file"}} for f in files
                ],
                "config_keys_not_kept": sorted(set(config_data) - set(written)),
            },
            "key_mapping": asdict(mapping),
            "inputs_style": {"style": style, "from": style_source},
            "tokenizer": None
            if tokenizer is None
            else {
                "path": str(Path(options.tokenizer).resolve()),
                "fingerprint": tokenizer_fingerprint(tokenizer),
                "notes": notes,
            },
            "output": {
                name.name: {"bytes": name.stat().st_size, "sha256": sha256_file(name)}
                for name in sorted(tmp.glob("*.safetensors"))
            },
            "verification": verification,
            "versions": _versions(),
            # what this import wrote: --replace replaces a folder holding these alone
            "files": sorted({path.name for path in tmp.iterdir() if path.name != LOCK_NAME} | {RECORD_NAME}),
        }
        (tmp / RECORD_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf8")
        (tmp / LOCK_NAME).unlink()  # still held until the folder is published
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            os.close(lock)
    logger.info("imported %s into %s (max |logit diff| %.3g)", src, out, verification["max_abs_diff"])
    return record
