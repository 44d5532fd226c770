"""Score fusion: rerank the union of the generator's and the retrievers' top candidates.

The generative linker and the retrievers fail on different mentions: the
generator links paraphrases no string matcher can, and sometimes misses a
mention whose text is exactly a name of its concept, which a retriever gets.
A :class:`FusionModel` reranks, per mention, every concept in the top
``depth`` candidates of each source (``genbioel`` and retrievers such as
``tfidf`` or ``dense``) by a linear score of what each source says about it:

* per source: ``<source>_in`` (the concept is in its list), ``<source>_score``
  (its score there: mean log-probability for the generator, cosine
  similarity for a retriever; 0 when absent), ``<source>_rr`` (1 / rank
  among the source's concepts; 0 when absent) and ``<source>_gap`` (its score
  minus the source's best score for the mention, how far behind the source's
  favourite it is; a concept the source does not list is at least as far
  behind as the last one it lists). Chosen on training predictions only
  (fit on one cross-fitted fold, score the other, ``bench/fusion_swap.py``): on NCBI
  training mentions the gap added 2.2 points of recall@1 of the fused concept
  (what ``span._.kb_id`` gets) and was neutral under ``evaluate``'s any-ID rule;
* ``exact``: the normalized mention is one of the concept's KB names;
* ``log_prior``: ``log(1 + prior)``, the concept's count among training gold IDs.

The concepts' softmax probabilities become the candidates' scores, best
first. The weights are a conditional logit fitted on cross-fitted training
predictions (:mod:`spacy_genbioel.training.fusion_fit`): a dozen numbers,
saved as JSON beside the pipeline (``fusion.json``) and readable as they are.
:func:`fusion_features` is the one feature function, shared by the fit
(offline, from ``evaluate --predictions`` files) and the component (online).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from spacy_genbioel.ty import Candidate, Linker, LinkPaths, Mention, mention_text
from spacy_genbioel.util import PathLike

logger = logging.getLogger(__name__)

__all__ = [
    "GENERATOR",
    "FusionFormatError",
    "FusionModel",
    "FusionReranker",
    "feature_names",
    "fusion_features",
    "concept_ranks",
]

#: the source name of the generative linker's own candidates
GENERATOR = "genbioel"
#: how a fusion's generator lists were made (``FusionModel.generator``); ``none``: retrieval only
GENERATOR_LISTS = ("beam", "forced", "none")
FORMAT_VERSION = 1
_PER_SOURCE = ("in", "score", "rr", "gap")
_SHARED = ("exact", "log_prior")
_MAX_NESTING = 64  # levels of JSON a fusion file may nest
_BUNDLED = "retrievers"  # the folder beside a saved pipeline's fusion.json that holds its retrievers' models


class FusionFormatError(ValueError):
    """A fusion file that cannot be read (names the file and the problem)."""


#: a fusion shipped with the package (``spacy_genbioel/assets/<name>.json``) is named ``genbioel:<name>``
#: wherever a fusion file is (``reranker.fusion``, ``package --fusion``): ``genbioel:retrieval``, say
SHIPPED = "genbioel:"
_ASSETS = Path(__file__).resolve().parents[2] / "assets"  # spacy_genbioel/assets


def shipped_fusions() -> List[str]:
    """The names of the fusions shipped with the package (``genbioel:<name>``)."""
    return sorted(f"{SHIPPED}{p.stem}" for p in _ASSETS.glob("*.json"))


def resolve_fusion_path(value: PathLike) -> Path:
    """The file a fusion setting names: a path, or a shipped fusion's file for ``genbioel:<name>``."""
    text = str(value)
    if not text.startswith(SHIPPED):
        return Path(value)
    name = text[len(SHIPPED) :]
    path = _ASSETS / f"{name}.json"
    if not name or "/" in name or "\\" in name or not path.is_file():
        raise FusionFormatError(
            f"{text}: no fusion of that name ships with spacy_genbioel (shipped: {', '.join(shipped_fusions())})"
        )
    return path


def feature_names(sources: Sequence[str]) -> List[str]:
    """The features of ``sources``, in the order of the weight vector."""
    return [f"{s}_{f}" for s in sources for f in _PER_SOURCE] + list(_SHARED)


def concept_ranks(candidates: Sequence[Candidate], depth: int) -> Dict[str, Tuple[int, float, str]]:
    """``concept -> (rank, score, name)`` over a ranked list, rank counted in distinct concepts
    (1 = best), each concept at its first (best) appearance, at most ``depth`` concepts."""
    out: Dict[str, Tuple[int, float, str]] = {}
    for cand in candidates:
        for cid in cand.ids:
            if cid not in out:
                if len(out) >= depth:
                    return out
                out[cid] = (len(out) + 1, float(cand.score), cand.name)
    return out


def fusion_features(
    text: str,
    lists: Mapping[str, Sequence[Candidate]],
    sources: Sequence[str],
    depth: int,
    kb: Any,
    priors: Optional[Dict[str, float]] = None,
) -> Tuple[List[str], List[str], np.ndarray]:
    """``(concept IDs, names, features)`` for one mention: every concept in the top ``depth`` of any
    source, generator's first, then each retriever's in order; ``features`` is
    ``(n_concepts, len(feature_names(sources)))``. ``kb`` gives the exact-match and prior features
    (``normalize``, ``ids_for_name``, ``kb[cid].prior``); ``priors`` caches the latter."""
    ranked = {s: concept_ranks(lists.get(s, ()), depth) for s in sources}
    concepts: Dict[str, str] = {}
    for s in sources:
        for cid, (_, _, name) in ranked[s].items():
            concepts.setdefault(cid, name)
    ids = list(concepts)
    per = len(_PER_SOURCE)
    x = np.zeros((len(ids), len(sources) * per + len(_SHARED)), dtype=np.float64)
    exact = set(kb.ids_for_name(text)) if text.strip() else set()
    scores = {s: [score for _, score, _ in ranked[s].values()] for s in sources}
    best = {s: max(v, default=0.0) for s, v in scores.items()}
    behind = {
        s: min(v, default=0.0) - best[s] for s, v in scores.items()
    }  # the gap of a concept a source does not list
    for row, cid in enumerate(ids):
        for k, s in enumerate(sources):
            hit = ranked[s].get(cid)
            if hit is not None:
                rank, score, _ = hit
                x[row, per * k : per * (k + 1)] = (1.0, score, 1.0 / rank, score - best[s])
            else:
                x[row, per * k + 3] = behind[s]
        x[row, -2] = float(cid in exact)
        x[row, -1] = math.log1p(max(_prior(kb, cid, priors), 0.0))
    return ids, [concepts[c] for c in ids], x


def _prior(kb: Any, cid: str, cache: Optional[Dict[str, float]]) -> float:
    if cache is not None and cid in cache:
        return cache[cid]
    try:
        value = float(getattr(kb[cid], "prior", 0.0) or 0.0)
    except KeyError:  # a concept the KB does not hold (a retriever run on another KB)
        value = 0.0
    if cache is not None:
        cache[cid] = value
    return value


@dataclass
class FusionModel:
    """Linear fusion weights over :func:`feature_names` of ``sources``.

    ``retrievers`` holds each retriever source's settings (``{"dense": {"model": DIR}}``;
    empty: the retriever's defaults); ``fit`` the fitting report (data, cross-fitted
    recall of each source and of the fusion), kept for inspection."""

    sources: List[str]
    weights: List[float]
    depth: int = 5
    retrievers: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    fit: Dict[str, Any] = field(default_factory=dict)
    #: how the generator's lists it was fitted on were made: ``beam`` (beam search) or ``forced``
    #: (forced scores of the retrievers' candidates, ``decoding.search = "forced"``); ``none``: fitted
    #: without a generator (its lists empty, its weights 0), a retrieval-only fusion that links with no model
    generator: str = "beam"
    #: the cascade's fit (:mod:`.cascade`): ``settle_weights`` (retrieval features only),
    #: ``settle_threshold``, ``beam_threshold`` and their report; empty: not fitted for it
    cascade: Dict[str, Any] = field(default_factory=dict)
    #: candidates asked of each retriever (None: ``depth``); the fusion reads the first ``depth`` concepts among
    #: them. A retrieval-only fusion asks for 20: five names are often one concept's synonyms, and a list of one
    #: concept makes it certain (probability 1) where a deeper list would show the competition
    list_depth: Optional[int] = None

    @property
    def retrieval_depth(self) -> int:
        """How many candidates each retriever is asked for."""
        return self.list_depth or self.depth

    def __post_init__(self) -> None:
        if not self.sources or self.sources[0] != GENERATOR:
            raise ValueError(f"fusion sources must start with {GENERATOR!r}, got {self.sources}")
        if len(set(self.sources)) != len(self.sources):
            raise ValueError(f"fusion sources repeat: {self.sources}")
        names = feature_names(self.sources)
        if len(self.weights) != len(names):
            raise ValueError(f"{len(self.weights)} weights for {len(names)} features ({', '.join(names)})")
        if isinstance(self.depth, (bool, np.bool_)) or not isinstance(self.depth, (int, np.integer)) or self.depth < 1:
            raise ValueError(f"depth must be a whole number of at least 1, got {self.depth!r}")
        bad = [
            n
            for n, w in zip(names, self.weights)
            if isinstance(w, (bool, np.bool_))
            or not isinstance(w, (int, float, np.integer, np.floating))
            or not math.isfinite(w)
        ]
        if bad:
            raise ValueError(
                f"weights must be finite numbers: {', '.join(bad)} ({[self.weights[names.index(n)] for n in bad]})"
            )
        from spacy_genbioel.retrieval.registry import known_retrievers, resolve_retriever

        for source in self.sources[1:]:
            try:
                resolve_retriever(source)
            except ValueError:
                raise ValueError(
                    f"unknown retriever source {source!r}; known: {', '.join(known_retrievers())}"
                ) from None
        if self.list_depth is not None and (
            isinstance(self.list_depth, bool) or not isinstance(self.list_depth, int) or self.list_depth < self.depth
        ):
            raise ValueError(
                f"list_depth must be a whole number of at least depth ({self.depth}), got {self.list_depth!r}"
            )
        if self.generator not in GENERATOR_LISTS:
            raise ValueError(f"generator must be one of {', '.join(GENERATOR_LISTS)}, got {self.generator!r}")
        if not isinstance(self.cascade, dict):
            raise ValueError("cascade must be an object")

    @property
    def retriever_sources(self) -> List[str]:
        return self.sources[1:]

    @property
    def retrieval_only(self) -> bool:
        """Fitted without a generator: links with the retrievers alone (a pipeline with no model)."""
        return self.generator == "none"

    def without(self, sources: Sequence[str], weights: Mapping[str, float]) -> "FusionModel":
        """A fusion over this one's sources minus ``sources``, with ``weights`` (a weight per feature of
        this model, as :mod:`.cascade` stores them) for the features that remain: the early step of a
        retrieval-only fusion, where a deferred retriever is not installed, say."""
        kept = [s for s in self.sources if s not in set(sources)]
        return FusionModel(
            kept,
            [float(weights[f]) for f in feature_names(kept)],
            depth=self.depth,
            retrievers={s: v for s, v in self.retrievers.items() if s in kept},
            fit=self.fit,
            generator=self.generator,
            list_depth=self.list_depth,
        )

    @property
    def features(self) -> List[str]:
        return feature_names(self.sources)

    def rank(
        self,
        text: str,
        lists: Mapping[str, Sequence[Candidate]],
        kb: Any,
        top_k: int,
        priors: Optional[Dict[str, float]] = None,
    ) -> List[Candidate]:
        """The fused ranking of one mention: up to ``top_k`` candidates (a name, the fused concept first
        among its IDs), scores the concepts' softmax probabilities over the union."""
        ids, names, x = fusion_features(text, lists, self.sources, self.depth, kb, priors)
        if not ids:
            return []
        logits = x @ np.asarray(self.weights, dtype=np.float64)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        out: List[Candidate] = []
        for i in sorted(range(len(ids)), key=lambda i: (-logits[i], i)):
            if len(out) >= top_k:
                break
            name = names[i]
            if any(
                name == c.name for c in out
            ):  # a shared name already ranked: this concept under another of its names
                name = next((n for n in kb.names_of(ids[i]) if all(n != c.name for c in out)), "")
                if not name:
                    continue
            # a candidate is a name and its concepts, as the generator's and the retrievers' are:
            # the fused concept first (span.kb_id), then the name's other concepts
            others = [c for c in kb.ids_for_name(name) if c != ids[i]]
            out.append(Candidate((ids[i], *others), name, float(probs[i])))
        return out

    # -- files -------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "sources": self.sources,
            "depth": self.depth,
            "retrievers": self.retrievers,
            "weights": dict(zip(self.features, (round(float(w), 8) for w in self.weights))),
            "fit": self.fit,
            "generator": self.generator,
            "cascade": self.cascade,
            **({"list_depth": self.list_depth} if self.list_depth is not None else {}),
        }

    def save(self, path: PathLike) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf8")

    def bundled(self, folder: PathLike) -> "FusionModel":
        """This fusion with each retriever's model directory copied to ``folder/retrievers/<source>`` and
        named relative to ``folder`` (:meth:`load` of ``folder/fusion.json`` resolves it): a saved pipeline
        carries the encoders its fusion reads (a trained ResCNN or dense model), not paths of the machine
        that made it. A retriever without a model (MiniLM as installed) is left as it is."""
        folder = Path(folder)
        retrievers: Dict[str, Dict[str, Any]] = {}
        for source, settings in self.retrievers.items():
            model = settings.get("model")
            if isinstance(model, str) and Path(model).is_dir():
                target = folder / _BUNDLED / source
                if Path(model).resolve() != target.resolve():
                    if target.exists():
                        shutil.rmtree(target)
                    shutil.copytree(model, target)
                settings = {**settings, "model": f"{_BUNDLED}/{source}"}
            retrievers[source] = settings
        for stale in (folder / _BUNDLED).glob("*") if (folder / _BUNDLED).is_dir() else ():
            if stale.name not in retrievers:
                shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        return dataclasses.replace(self, retrievers=retrievers)

    def _resolved(self, folder: Path) -> "FusionModel":
        """Relative model paths that name a directory beside the fusion file, made absolute."""
        retrievers = {
            source: {**settings, "model": str(folder / settings["model"])}
            if isinstance(settings.get("model"), str)
            and not Path(settings["model"]).is_absolute()
            and (folder / settings["model"]).is_dir()
            else settings
            for source, settings in self.retrievers.items()
        }
        return dataclasses.replace(self, retrievers=retrievers)

    @classmethod
    def from_dict(cls, data: Any, where: str = "fusion") -> "FusionModel":
        if not isinstance(data, dict):
            raise FusionFormatError(f"{where}: expected a JSON object")
        if data.get("version") != FORMAT_VERSION:
            raise FusionFormatError(f"{where}: version {data.get('version')!r}, this package reads {FORMAT_VERSION}")
        sources, weights = data.get("sources"), data.get("weights")
        if not isinstance(sources, list) or not all(isinstance(s, str) for s in sources):
            raise FusionFormatError(f"{where}: 'sources' must be a list of source names")
        if not isinstance(weights, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in weights.values()
        ):
            raise FusionFormatError(f"{where}: 'weights' must map feature names to numbers")
        nested = [
            (data, 0)
        ]  # a nesting JSON allows but no fusion file needs would overflow the stack where it is written out
        while nested:
            value, level = nested.pop()
            if level > _MAX_NESTING:
                raise FusionFormatError(f"{where}: nested deeper than {_MAX_NESTING} levels")
            children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
            nested.extend((child, level + 1) for child in children)
        if not isinstance(data.get("fit", {}), dict):
            raise FusionFormatError(f"{where}: 'fit' must be an object (the fitting report)")
        expected = feature_names(sources)
        if sorted(weights) != sorted(expected):
            missing, extra = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
            raise FusionFormatError(
                f"{where}: weights do not match the sources' features (missing {missing}, unknown {extra})"
            )
        retrievers = data.get("retrievers", {})
        if not isinstance(retrievers, dict) or not all(isinstance(v, dict) for v in retrievers.values()):
            raise FusionFormatError(f"{where}: 'retrievers' must map retriever names to settings objects")
        try:
            return cls(
                sources,
                [float(weights[f]) for f in expected],
                depth=data.get("depth", 5),
                retrievers=retrievers,
                fit=data.get("fit", {}),
                generator=data.get("generator", "beam"),
                cascade=data.get("cascade", {}),
                list_depth=data.get("list_depth"),
            )
        except (TypeError, ValueError, OverflowError) as err:
            raise FusionFormatError(f"{where}: {err}") from None

    @classmethod
    def load(cls, path: PathLike) -> "FusionModel":
        """Read a fusion file (or a shipped one, ``genbioel:<name>``: :func:`resolve_fusion_path`); a missing,
        unreadable or malformed one (a folder, NaN or Infinity, which JSON does not allow, numbers beyond float
        range, nesting too deep) raises :class:`FusionFormatError` naming it."""

        def refuse(text: str) -> float:
            raise ValueError(f"{text} is not a finite number")

        def finite(text: str) -> float:
            return float(text) if math.isfinite(float(text)) else refuse(text)

        path = resolve_fusion_path(path)
        try:
            data = json.loads(Path(path).read_text(encoding="utf8"), parse_constant=refuse, parse_float=finite)
        except FileNotFoundError:
            raise FusionFormatError(f"{path}: fusion file not found") from None
        except IsADirectoryError:
            raise FusionFormatError(f"{path}: a folder, not a fusion file") from None
        except OSError as err:
            raise FusionFormatError(f"{path}: cannot read the fusion file ({err.strerror or err})") from None
        except RecursionError:
            raise FusionFormatError(f"{path}: nested deeper than {_MAX_NESTING} levels") from None
        except (ValueError, UnicodeDecodeError) as err:  # json.JSONDecodeError is a ValueError
            raise FusionFormatError(f"{path}: not a JSON fusion file ({err})") from None
        return cls.from_dict(data, str(path))._resolved(Path(path).parent)


#: retrievers whose candidates for a text are the same floats whatever texts share its call (a sparse
#: product row by row; an exact lookup): their cached texts outlive the annotate job's chunks
PER_TEXT_EXACT = frozenset({"tfidf", "exact"})


class FusionReranker:
    """Applies a :class:`FusionModel` to the generator's results: asks each retriever source
    for its top ``depth`` candidates (built lazily on the generator's KB, like the
    candidate generators) and reranks the union."""

    def __init__(self, model: FusionModel, kb: Any, retrievers: Mapping[str, Any], cache_size: int = 0) -> None:
        """``cache_size``: mention texts whose candidates each retriever keeps (:meth:`retrieve`)."""
        missing = [s for s in model.retriever_sources if s not in retrievers]
        if missing:
            raise ValueError(f"no retriever for fusion source(s) {missing}")
        self.model = model
        self.kb = kb
        self.retrievers = dict(retrievers)
        self._priors: Dict[str, float] = {}
        #: a :class:`~spacy_genbioel.linking.decoding.stages.StageClock` timing each retriever
        #: (stage ``retrieval:<source>``; the annotate job's); None: untimed
        self.clock: Any = None
        self.cache_size = cache_size
        self._cache: Dict[str, "OrderedDict[str, List[Candidate]]"] = {s: OrderedDict() for s in self.retrievers}
        self.cache_stats: Counter = Counter()  # ``hits`` and ``misses``, mention by mention

    def clear_cache(self, every: bool = False) -> None:
        """Forget the texts retrieved by retrievers whose answer for a text may depend on the texts
        batched with it (float rounding in a neural encoder's padded batch; every retriever but
        :data:`PER_TEXT_EXACT`'s), or with ``every`` all of them. The annotate job does the first at each
        chunk, so a chunk's links never depend on the chunks a process annotated before it."""
        for source, cached in self._cache.items():
            if every or source not in PER_TEXT_EXACT:
                cached.clear()

    def retrieve(self, source: str, mentions: Sequence[Mention]) -> List[List[Candidate]]:
        """``source``'s top ``retrieval_depth`` candidates for each of ``mentions`` (timed on :attr:`clock`);
        texts met before come from the cache of the last ``cache_size`` texts, the rest in one call."""
        if self.clock is None:
            return self._retrieve(source, mentions)
        with self.clock.stage(f"retrieval:{source}"):
            return self._retrieve(source, mentions)

    def _retrieve(self, source: str, mentions: Sequence[Mention]) -> List[List[Candidate]]:
        retriever = self.retrievers[source]
        if not self.cache_size:
            return retriever.link(mentions, self.model.retrieval_depth)
        cached = self._cache.setdefault(source, OrderedDict())
        texts = [self.kb.normalize(mention_text(m)) for m in mentions]  # what the retrievers read
        missing = [i for i, text in enumerate(texts) if text not in cached]
        self.cache_stats.update(hits=len(texts) - len(missing), misses=len(missing))
        fresh: Dict[str, List[Candidate]] = {}
        if missing:
            found = retriever.link([mentions[i] for i in missing], self.model.retrieval_depth)
            fresh = {texts[i]: list(f) for i, f in zip(missing, found)}
        out: List[List[Candidate]] = []
        for text in texts:
            if text in fresh:
                candidates = fresh[text]
            else:
                candidates = cached[text]
                cached.move_to_end(text)
            out.append(list(candidates))
        for text, candidates in fresh.items():
            cached[text] = candidates
        while len(cached) > self.cache_size:
            cached.popitem(last=False)
        return out

    def rerank(
        self, mentions: Sequence[Mention], generated: Sequence[Sequence[Candidate]], top_k: int
    ) -> List[List[Candidate]]:
        """Fused candidates per mention; a mention the generator left empty (nothing to link) stays empty."""
        todo = [i for i, cands in enumerate(generated) if cands]
        retrieved: Dict[str, List[List[Candidate]]] = {}
        if todo:
            for source in self.model.retriever_sources:
                retrieved[source] = self.retrieve(source, [mentions[i] for i in todo])
        out: List[List[Candidate]] = [[] for _ in mentions]
        for pos, i in enumerate(todo):
            lists = {GENERATOR: generated[i], **{s: retrieved[s][pos] for s in retrieved}}
            out[i] = self.model.rank(mentions[i].text, lists, self.kb, top_k, self._priors)
        return out

    def link_paths(self, linker: Linker, mentions: Sequence[Mention], top_k: int) -> LinkPaths:
        """The generator's (``linker``'s) candidates, reranked; every mention's path is ``beam`` (``none``:
        no candidates)."""
        results = self.rerank(mentions, linker.link(mentions, top_k), top_k)
        return results, ["beam" if found else "none" for found in results]
