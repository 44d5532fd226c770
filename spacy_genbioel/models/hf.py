"""Hugging Face model directories: load, save, tokenizers and special ids.

Any local Hugging Face encoder-decoder directory loads (BART, BioBART, the
dmis-lab ANGEL checkpoints whose tokenizer lives elsewhere, an
``EncoderDecoderModel``, T5), always with ``local_files_only``: these machines
reach no model hub. Weights are read and written as safetensors only
(``use_safetensors=True``: a pickled ``pytorch_model.bin`` is never loaded).

A directory that cannot be loaded (a missing or truncated file, a tokenizer
that does not fit the model's embeddings) raises :class:`ModelFormatError`
naming the file. :func:`tokenizer_fingerprint` identifies a tokenizer by what it
does (its vocabulary and the ids of a few probe texts), so a trie or a model
can tell whether the tokenizer beside it is the one it was built with:
:func:`save_model` records it in the model's ``config.json``
(``genbioel_tokenizer_fingerprint``), and :func:`load_model` refuses any other
tokenizer (one of the same size with its ids permuted would otherwise link
every mention wrong); a model saved without it (before 0.3, or imported)
loads as before.

A model config naming an attention implementation other than transformers'
own (``eager``, ``sdpa``), such as a Hub kernel repository, is refused
(:func:`check_attention`): with the ``kernels`` package installed transformers
would fetch and run its code.

Loading and saving are quiet: transformers' own bars ("Loading weights",
"Writing model shards") are off while they run (:func:`quiet_transformers`)
unless the package logs at INFO (``--verbose``), and saved files get the mode
``open()`` would give them (safetensors writes ``0600``, which kept another
user from loading a shared pipeline; :func:`~spacy_genbioel.util.share_files`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Tuple, Union

from spacy_genbioel.models.quantize import quantized_api_quiet
from spacy_genbioel.util import PathLike, resolve_device, resolve_dtype, share_files

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

MARKERS = ("START", "END")
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
WEIGHTS_FILES = ("model.safetensors", "model.safetensors.index.json")
#: facebook/bart-large's config.json: its tokenizer folder needs it to load with its special tokens
BART_LARGE_CONFIG_URL = "https://huggingface.co/facebook/bart-large/resolve/main/config.json"
#: the attention implementations a model config may name (or none): transformers' own. Any other,
#: such as a Hub kernel repository (``kernels-community/flash-attn``), has transformers fetch and
#: run code when the ``kernels`` package is installed
ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa")
ATTENTION_KEYS = ("attn_implementation", "_attn_implementation", "_attn_implementation_internal")
#: the model config's record of its tokenizer's :func:`tokenizer_fingerprint` (written by :func:`save_model`)
TOKENIZER_KEY = "genbioel_tokenizer_fingerprint"
# texts whose token ids join the vocabulary in a tokenizer's fingerprint: case,
# punctuation, digits, other scripts, the markers and the prompt
_PROBES = (
    "renal failure",
    " Acute MI (type 2), 1,25-dihydroxyvitamin D3",
    "Σύνδρομο ßü 文字 😷",
    f" {MARKERS[0]} x {MARKERS[1]} is",
    "x is",
)


class ModelFormatError(ValueError):
    """A model directory or pipeline file that is missing, cannot be read, or
    does not fit the rest of the pipeline; the message names the file."""


class ModelFileNotFoundError(FileNotFoundError, ModelFormatError):
    """A file a model directory or saved pipeline needs is missing (named in the message)."""


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars off for the block (and back as they were after it), unless
    this package logs at INFO: a library call draws no bars of its own on a user's stderr."""
    from transformers.utils import logging as hf_logging

    if logger.isEnabledFor(logging.INFO) or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def load_tokenizer(path: PathLike):
    from transformers import AutoTokenizer

    path = Path(path)
    found = [path / name for name in TOKENIZER_FILES if (path / name).exists()]
    if not found:
        raise ModelFileNotFoundError(
            f"No tokenizer in {path} (looked for {', '.join(TOKENIZER_FILES)}); "
            "checkpoints such as dmis-lab/ANGEL_* ship without one: pass the tokenizer directory separately"
        )
    if not (path / "tokenizer.json").exists() and (path / "vocab.json").exists() and not (path / "merges.txt").exists():
        raise ModelFileNotFoundError(
            f"{path / 'merges.txt'}: not found: a BPE tokenizer's vocab.json needs its merges.txt "
            f"beside it (or a tokenizer.json) in {path}"
        )
    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # tokenizers and transformers raise many kinds for a damaged file
        raise ModelFormatError(
            f"{found[0]}: cannot load the tokenizer in {path} ({type(err).__name__}: {err})"
        ) from err


def check_attention(config: Any, path: PathLike) -> None:
    """Refuse a model config (``config.json`` as data, sub-configs included) naming an attention
    implementation other than transformers' own: a Hub kernel would be code from outside the package."""
    pending = [config]
    while pending:
        data = pending.pop()
        if not isinstance(data, dict):
            continue
        for key in ATTENTION_KEYS:
            value = data.get(key)
            if value is not None and value not in ATTENTION_IMPLEMENTATIONS:
                raise ModelFormatError(
                    f"{path}: refused: {key} is {json.dumps(value)}, an attention implementation that is not "
                    f"transformers' own ({' or '.join(ATTENTION_IMPLEMENTATIONS)}): a Hub kernel would be code "
                    f"fetched from outside. Remove the {key} entry (the model runs with sdpa)"
                )
        pending.extend(value for value in data.values() if isinstance(value, dict))


def check_padding(tokenizer, path: PathLike) -> None:
    """Refuse a tokenizer without a padding token, which could not batch two inputs of
    different lengths (the first document would fail), naming the file that would give it
    one. A tokenizer folder with neither ``tokenizer_config.json`` nor ``config.json`` (as
    facebook/bart-large's is without its ``config.json``) loads as a bare tokenizer with
    no special tokens at all."""
    if tokenizer.pad_token_id is not None:
        return
    path = Path(path)
    if not (path / "tokenizer_config.json").exists() and not (path / "config.json").exists():
        raise ModelFileNotFoundError(
            f"{path / 'config.json'}: not found, and without it (or a tokenizer_config.json) the tokenizer in {path} "
            f"loads as a bare {type(tokenizer).__name__} with no padding token. Copy the config.json of the model "
            f"the tokenizer belongs to beside tokenizer.json (facebook/bart-large's for the released GenBioEL/ANGEL "
            f"models: {BART_LARGE_CONFIG_URL})"
        )
    raise ModelFormatError(
        f"{path}: the tokenizer loaded from this folder ({type(tokenizer).__name__}) has no padding token; set "
        f"pad_token in {path / 'tokenizer_config.json'}, or import the model again with a tokenizer folder that has "
        f"one (facebook/bart-large's needs its config.json: {BART_LARGE_CONFIG_URL})"
    )


def tokenizer_fingerprint(tokenizer) -> str:
    """SHA-256 over a tokenizer's vocabulary (token -> id) and the ids of a few
    probe texts: equal for the same tokenizer however it is saved or loaded,
    different for another vocabulary, other ids, merges or normalization."""
    vocab = sorted(tokenizer.get_vocab().items())
    probes = [list(tokenizer(text)["input_ids"]) for text in _PROBES]
    payload = json.dumps({"vocab": vocab, "probes": probes}, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf8")).hexdigest()


def check_tokenizer(config, tokenizer, where: str, config_file: PathLike) -> None:
    """Refuse a tokenizer other than the one the model was saved with (the fingerprint
    :func:`save_model` records in ``config_file``); a model without that record (saved
    before 0.3, or imported from a released checkpoint) takes any tokenizer that fits it."""
    recorded = getattr(config, TOKENIZER_KEY, None)
    if recorded is None:
        logger.info(
            "%s records no tokenizer fingerprint (saved by an older version): the tokenizer is not checked", config_file
        )
        return
    current = tokenizer_fingerprint(tokenizer)
    if current != recorded:
        raise ModelFormatError(
            f"{where} is not the tokenizer the model was trained with (fingerprint {current[:12]}, "
            f"{config_file} records {str(recorded)[:12]}): it would read other token ids"
        )


def check_vocabulary(model, tokenizer, where: str = "") -> None:
    """Refuse a tokenizer with ids beyond the model's embeddings (they would raise
    IndexError at the first input)."""
    rows = int(model.get_output_embeddings().weight.shape[0])
    if len(tokenizer) > rows:
        raise ModelFormatError(
            f"{where or 'The tokenizer'} has {len(tokenizer)} tokens but the model has embeddings for {rows}: "
            "this tokenizer does not belong to this model"
        )


def _check_weights(path: Path) -> None:
    """Every safetensors file of a model directory opens and covers its tensors
    (a truncated file is named here, not deep inside ``from_pretrained``)."""
    from safetensors import safe_open

    weights = path / WEIGHTS_FILES[0]
    index = path / WEIGHTS_FILES[1]
    if weights.exists():
        files = [weights]
    elif index.exists():
        try:
            shards = json.loads(index.read_text(encoding="utf8"))["weight_map"].values()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ModelFormatError(f"{index}: not a safetensors index ({type(err).__name__}: {err})") from err
        files = [path / name for name in sorted(set(shards))]
    else:
        pickled = [p.name for p in path.glob("*.bin")]
        raise ModelFileNotFoundError(
            f"No {WEIGHTS_FILES[0]} in {path}"
            + (f" (only {', '.join(pickled)}: pickled weights are never loaded)" if pickled else "")
        )
    for file in files:
        if not file.exists():
            raise ModelFileNotFoundError(f"{file}: weights file named by {index} not found")
        try:
            with safe_open(str(file), framework="pt") as handle:
                list(handle.keys())
        except Exception as err:  # safetensors' own error type; truncated or not safetensors
            raise ModelFormatError(f"{file}: not a complete safetensors file ({err})") from err


def load_model(
    path: PathLike,
    tokenizer_path: Optional[PathLike] = None,
    device: Union[str, "torch.device"] = "cpu",
    dtype: str = "fp32",
):
    """Load ``(model, tokenizer)`` from local directories, in eval mode on ``device``.

    A tokenizer without a padding token is refused (:func:`check_padding`). The
    tokenizer is checked against the model: one with more tokens than the
    model's embeddings is refused, and so is one other than the tokenizer whose
    fingerprint the model's ``config.json`` records (:func:`check_tokenizer`); for a
    model without that record, a tokenizer from another directory unlike the one
    saved with the model is loaded with a warning."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    path = Path(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise ModelFileNotFoundError(f"No Hugging Face model (config.json) in {path}")
    dev = resolve_device(device) if isinstance(device, str) else device
    try:
        config_data = json.loads(config_file.read_text(encoding="utf8"))
    except (OSError, ValueError) as err:
        raise ModelFormatError(f"{config_file}: not a Hugging Face model config ({type(err).__name__}: {err})") from err
    check_attention(config_data, config_file)
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception as err:  # JSON, type and value errors of many kinds
        raise ModelFormatError(f"{config_file}: not a Hugging Face model config ({type(err).__name__}: {err})") from err
    tokenizer = load_tokenizer(tokenizer_path or path)
    check_padding(tokenizer, tokenizer_path or path)
    _check_weights(path)
    if dtype == "int8" and dev.type != "cpu":
        raise ValueError(f"dtype 'int8' (dynamic quantization) runs on CPU only, not on {dev}; use bf16 on a GPU")
    try:
        with quiet_transformers():
            model = AutoModelForSeq2SeqLM.from_pretrained(
                str(path),
                local_files_only=True,
                use_safetensors=True,
                dtype=resolve_dtype("fp32" if dtype == "int8" else dtype, dev),
            )
    except Exception as err:
        raise ModelFormatError(f"{path}: cannot load a seq2seq model ({type(err).__name__}: {err})") from err
    where = f"The tokenizer in {tokenizer_path or path}"
    check_vocabulary(model, tokenizer, where)
    check_tokenizer(config, tokenizer, where, config_file)
    if tokenizer_path is not None and any((path / name).exists() for name in TOKENIZER_FILES):
        own = load_tokenizer(path)
        if tokenizer_fingerprint(own) != tokenizer_fingerprint(tokenizer):
            logger.warning(
                "%s differs from the tokenizer saved with the model in %s: the model reads other token ids "
                "than it was trained on",
                where,
                path,
            )
    model.to(dev).eval()
    if dtype == "int8":
        model = quantize_int8(model)
    return model, tokenizer


def quantize_int8(model):
    """The model with its linear layers dynamically quantized to int8 for CPU
    inference (``torch.ao.quantization.quantize_dynamic``); the output projection
    stays in float, so scores keep their full-vocabulary normalization. The float
    model rides along (not as a submodule) so :func:`save_model` writes the
    weights it was loaded with."""
    import torch

    output = model.get_output_embeddings()
    spec = {
        name: torch.ao.quantization.default_dynamic_qconfig
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not output
    }
    with quantized_api_quiet():
        quantized = torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8, inplace=False)
    object.__setattr__(quantized, "_genbioel_float_model", model)
    return quantized.eval()


def save_model(model, tokenizer, path: PathLike) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = getattr(model, "_genbioel_float_model", model)  # an int8 model saves the float weights it came from
    setattr(model.config, TOKENIZER_KEY, tokenizer_fingerprint(tokenizer))  # load_model refuses another tokenizer
    with quiet_transformers():
        model.save_pretrained(str(path), safe_serialization=True)
        tokenizer.save_pretrained(str(path))
    share_files([path])


def special_ids(model, tokenizer) -> Tuple[int, int, int]:
    """(decoder_start, eos, pad) ids for any encoder-decoder family."""
    cfg = model.config
    gen = getattr(model, "generation_config", None)
    start = getattr(cfg, "decoder_start_token_id", None)
    if start is None and gen is not None:
        start = gen.decoder_start_token_id
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(eos, (list, tuple)):
        eos = eos[0]
    if eos is None:
        eos = getattr(cfg, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    pad = getattr(cfg, "pad_token_id", None)
    if pad is None:
        pad = tokenizer.pad_token_id
    if start is None:
        start = pad
    if start is None or eos is None or pad is None:
        raise ValueError("The model needs decoder_start_token_id, eos_token_id and pad_token_id")
    return int(start), int(eos), int(pad)
