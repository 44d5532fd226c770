"""Model directories a training run leaves, written so that a crash never
leaves a half-written one: checkpoints (``checkpoint/``: the model and
tokenizer as a Hugging Face directory plus ``trainer_state.pt``), the best
model (``best/``) and the final export (``model/``); and the RNG states and
weights a resumed run reads back.

``trainer_state.pt`` holds the optimizer, scheduler, step, data position and
RNG states as plain tensors and dicts, saved with ``torch.save`` and read
back with ``weights_only=True``.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import numpy as np
import torch

from spacy_genbioel.models import save_model
from spacy_genbioel.util import PathLike

STATE_FILE = "trainer_state.pt"


# -- RNG states ------------------------------------------------------------------------------
def rng_state() -> Dict[str, Any]:
    """The torch, CUDA, numpy and Python RNG states as tensors and plain values."""
    np_state = np.random.get_state(legacy=False)
    version, mt, gauss = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "python": {"version": version, "state": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
    }


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": np_state["key"].numpy().astype(np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"],
            "gauss": np_state["gauss"],
        }
    )
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))


# -- weights ---------------------------------------------------------------------------------
def load_weights(model, model_dir: PathLike) -> None:
    """Load the safetensors weights of a Hugging Face directory into ``model`` in place.

    Keys that ``save_pretrained`` leaves out because they are tied to another
    parameter (BART's embeddings and LM head) may be missing; anything else
    missing or unexpected is an error.
    """
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text(encoding="utf8"))["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    state: Dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(model_dir / shard)))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{model_dir}: unexpected weights {result.unexpected_keys[:5]}")
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
    untied = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs]
    buffers = dict(model.named_buffers())
    untied = [k for k in untied if k not in buffers]
    if untied:
        raise ValueError(f"{model_dir}: weights missing for {untied[:5]}")


def save_quietly(model, tokenizer, path: Path) -> None:
    """``save_model`` without transformers' per-shard progress bar under our own."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        save_model(model, tokenizer, path)
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# -- directories -----------------------------------------------------------------------------
def replace_dir(tmp: Path, final: Path) -> None:
    """Swap a freshly written directory into place (a crash leaves the old or the new one)."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    if old.exists():
        shutil.rmtree(old)


def fresh_tmp(final: Path) -> Path:
    """``final``'s empty sibling ``NAME.tmp`` to write into before :func:`replace_dir`."""
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    return tmp


def save_snapshot(
    model,
    tokenizer,
    final: Path,
    *,
    json_files: Optional[Mapping[str, Any]] = None,
    state: Optional[Dict[str, Any]] = None,
) -> None:
    """The model and tokenizer in ``final`` (replaced whole), with ``json_files``
    (file name -> data) and, when given, the trainer ``state``."""
    tmp = fresh_tmp(final)
    save_quietly(model, tokenizer, tmp)
    if state is not None:
        torch.save(state, tmp / STATE_FILE)
    for name, data in (json_files or {}).items():
        (tmp / name).write_text(json.dumps(data, indent=2), encoding="utf8")
    replace_dir(tmp, final)


def export_model(model, tokenizer, best_dir: Optional[Path], target: Path) -> Path:
    """``target`` (``out_dir/model``): a copy of ``best_dir`` when there is one, else the current weights."""
    tmp = fresh_tmp(target)
    if best_dir is not None and best_dir.exists():
        shutil.copytree(best_dir, tmp)
    else:
        save_quietly(model, tokenizer, tmp)
    replace_dir(tmp, target)
    return target
