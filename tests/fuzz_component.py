"""Fuzz harness for the ``genbioel`` component: odd documents and spans through
a micro pipeline, and corrupt pipeline folders.

Every input either works or is refused with the project's own error naming the
file; nothing else may escape (no IndexError, KeyError, SafetensorError, ...):

* documents (:func:`document_cases`, :func:`random_documents`): empty, huge,
  control characters, emoji, unspaced 5,000-character tokens around mentions,
  overlapping and empty spans, very long mentions. Each must link: every
  encoder row the decoder reads holds ``START ... END``, every span gets a KB ID
  or None, and spans with nothing to link (control characters, whitespace,
  emoji) get None;
* folders (:func:`folder_cases`): a saved pipeline with a truncated
  ``model.safetensors``, ``trie.safetensors`` or ``kb.safetensors``, a missing
  or wrong tokenizer (a permuted one of the same size too: the model records
  its tokenizer's fingerprint), garbage ``cfg.json`` and ``config.json``, a
  ``cfg.json`` naming a registered function that is not a normalizer, an old
  trie without the tokenizer fingerprint, a trie whose ``max_depth`` is too
  small, a compact KB with damaged arrays or metadata or one changed byte of a
  concept ID, a ``kb.jsonl`` edited after saving, a ``fusion.json`` with NaN,
  infinite, out-of-range or boolean weights, a fractional or boolean depth,
  deep nesting, an unknown retriever, or a folder in its place, a pipeline
  saved before its first use. Each must link (with a warning where the case
  says so) or be refused naming the file.

Run against any tree (``PYTHONPATH`` first decides which ``spacy_genbioel``)::

    python tests/fuzz_component.py --report
    PYTHONPATH=/tmp/before python tests/fuzz_component.py --report

``tests/linking/test_fuzz_component.py`` runs the same generators under pytest.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

CONTROL = "".join(chr(c) for c in [0, 1, 2, 7, 8, 0x0B, 0x0C, 0x0E, 0x1B, 0x1F, 0x7F, 0x85, 0x9F])
EMOJI = ["😷", "🦠", "👩\u200d⚕️", "🧬", "❤️", "👍🏽", "🇺🇳", "\u200d", "\ufe0f"]
ODD = ["文字标题", "Σύνδρομο", "ßü", "C6H12O6", "ACGTTGCA", "α-synuclein", "\u202e", "\ufeff", "𝔘𝔫𝔦"]


# -- inputs -------------------------------------------------------------------------------------------------------
@dataclass
class DocCase:
    """A document and its spans (token ranges into ``nlp.make_doc(text)``, clipped);
    ``unlinkable``: indices of spans that must get ``kb_id = None``."""

    name: str
    text: str
    spans: List[Tuple[int, int]] = field(default_factory=list)
    unlinkable: Sequence[int] = ()


def _mention_at(words: List[str], mention: str) -> Tuple[str, Tuple[int, int]]:
    """Text ``words + mention + words`` (space separated) and the mention's token range
    (``make_doc`` splits on spaces here: every piece is free of spaCy's infixes)."""
    half = len(words) // 2
    text = " ".join([*words[:half], mention, *words[half:]])
    n = len(mention.split(" "))
    return text, (half, half + n)


def document_cases() -> List[DocCase]:
    """Hand-written odd documents (the issue's cases and their relatives)."""
    cases = [
        DocCase("empty", ""),
        DocCase("whitespace only", " \n\t  \n"),
        DocCase("control characters as spans", f"renal {CONTROL} failure", [(1, 2), (0, 1)], unlinkable=[0]),
        DocCase(
            "emoji spans",
            "😷 🦠 renal failure 👩\u200d⚕️ ❤️",
            [(0, 1), (1, 2), (2, 4), (4, 5), (5, 6)],
            unlinkable=[0, 1, 3, 4],
        ),
        DocCase("emoji run as one span", "pain " + "".join(EMOJI) + " pain", [(1, 2), (0, 1)], unlinkable=[0]),
        DocCase("whitespace span", "renal   \u3000  failure", [(1, 2)], unlinkable=[0]),
        DocCase("empty span", "renal failure", [(1, 1), (0, 2)], unlinkable=[0]),
    ]
    for label, blob in [
        ("200-base primer", "ACGT" * 50),
        ("5,000-char DNA", "ACGT" * 1250),
        ("Chinese title", "文字标题" * 60),
        ("5,000-char Chinese", "文字" * 2500),
        ("chemical formula", "C6H12O6-Na2SO4(aq)" * 50),
        ("5,000-char formula", "CH2" * 1667),
    ]:
        text, span = _mention_at([blob, blob], "renal failure")
        cases.append(DocCase(f"unspaced {label} around the mention", text, [span]))
        cases.append(DocCase(f"unspaced {label} left only", blob + " renal failure", [(1, 3)]))
        cases.append(DocCase(f"unspaced {label} right only", "renal failure " + blob, [(0, 2)]))
    words = ("cystic fibrosis of the liver " * 1200).split(" ")
    text, span = _mention_at(words, "renal failure")
    cases.append(DocCase("huge document", text, [span, (0, 2), (len(words) - 3, len(words) - 1)]))
    long_mention = " ".join(["chronic", "renal", "failure"] * 400)
    text, span = _mention_at(["acute", "pain"], long_mention)
    cases.append(DocCase("1,200-word mention", text, [span, (0, 1)]))
    text, span = _mention_at(["acute", "pain"], "renal" * 1000)
    cases.append(DocCase("5,000-char one-token mention", text, [span]))
    text, span = _mention_at(["ACGT" * 1250], "ACGT" * 1250)
    cases.append(DocCase("unspaced mention in unspaced context", text, [span]))
    cases.append(
        DocCase(
            "overlapping spans", "acute renal failure and lung cancer", [(1, 3), (0, 3), (0, 6), (2, 3), (1, 3), (5, 6)]
        )
    )
    cases.append(
        DocCase(
            "odd scripts",
            " ".join(ODD) + " renal failure",
            [(i, i + 1) for i in range(len(ODD))] + [(len(ODD), len(ODD) + 2)],
        )
    )
    return cases


def random_documents(seed: int, n: int) -> List[DocCase]:
    """``n`` random documents mixing words, emoji, control characters, scripts and
    long unspaced runs, with random (overlapping) spans; deterministic in ``seed``."""
    from conftest import WORDS

    rng = random.Random(seed)
    pieces: List[Callable[[], str]] = [
        lambda: rng.choice(WORDS),
        lambda: rng.choice(EMOJI),
        lambda: "".join(rng.choice(CONTROL) for _ in range(rng.randint(1, 4))),
        lambda: rng.choice(ODD),
        lambda: rng.choice(["ACGT", "文字", "CH2", "ab"]) * rng.randint(50, 1500),
        lambda: rng.choice(WORDS) * rng.randint(2, 200),
    ]
    weights = [10, 2, 2, 2, 1, 1]
    out = []
    for i in range(n):
        tokens = [rng.choices(pieces, weights)[0]() for _ in range(rng.randint(0, 60))]
        spans = []
        for _ in range(rng.randint(0, 8) if tokens else 0):
            start = rng.randrange(len(tokens))
            spans.append((start, min(len(tokens), start + rng.choice([0, 1, 1, 2, 3, 40]))))
        out.append(DocCase(f"random document {seed}/{i}", " ".join(tokens), spans))
    return out


@dataclass
class FolderCase:
    """A corruption of a saved pipeline folder. ``expect``: "link" (must link as
    before), "link_warned" (link with a warning, or be refused naming ``names``),
    "refuse" (refused with a project error naming one of ``names``), "no_model"
    (the clear "has no KB" error)."""

    name: str
    corrupt: Callable[[Path, "Resources"], None]
    expect: str
    names: Tuple[str, ...] = ()


def _truncate(rel: str, keep: Callable[[int], int]) -> Callable[[Path, "Resources"], None]:
    def run(folder: Path, _res) -> None:
        path = folder / rel
        data = path.read_bytes()
        path.write_bytes(data[: keep(len(data))])

    return run


def _write(rel: str, content: bytes) -> Callable[[Path, "Resources"], None]:
    def run(folder: Path, _res) -> None:
        (folder / rel).write_bytes(content)

    return run


def _delete(*rels: str) -> Callable[[Path, "Resources"], None]:
    def run(folder: Path, _res) -> None:
        for rel in rels:
            target = folder / rel
            shutil.rmtree(target) if target.is_dir() else target.unlink()

    return run


def _replace_tokenizer(which: str) -> Callable[[Path, "Resources"], None]:
    def run(folder: Path, res) -> None:
        res.other_tokenizers[which].save_pretrained(str(folder / "genbioel" / "model"))

    return run


def _trie_metadata(change: Callable[[Dict[str, str]], Dict[str, str]]) -> Callable[[Path, "Resources"], None]:
    def run(folder: Path, _res) -> None:
        from safetensors import safe_open
        from safetensors.numpy import load_file, save_file

        path = folder / "genbioel" / "trie.safetensors"
        with safe_open(str(path), framework="np") as handle:
            meta = dict(handle.metadata() or {})
        save_file(load_file(str(path)), str(path), metadata=change(meta))

    return run


def _kb_file(
    change: Callable[[Dict, Dict[str, str]], Tuple[Dict, Dict[str, str]]],
) -> Callable[[Path, "Resources"], None]:
    """Rewrite ``kb.safetensors`` with ``change(arrays, metadata)``."""

    def run(folder: Path, _res) -> None:
        from safetensors import safe_open
        from safetensors.numpy import load_file, save_file

        path = folder / "genbioel" / "kb.safetensors"
        with safe_open(str(path), framework="np") as handle:
            meta = dict(handle.metadata() or {})
        arrays, meta = change(load_file(str(path)), meta)
        save_file(arrays, str(path), metadata=meta)

    return run


def _edit_jsonl(folder: Path, _res) -> None:
    """Drop the KB's last concept from ``kb.jsonl`` (as a user editing the file would)."""
    path = folder / "genbioel" / "kb.jsonl"
    lines = path.read_text(encoding="utf8").splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n", encoding="utf8")


def _cfg(change: Callable[[dict], object]) -> Callable[[Path, "Resources"], None]:
    def run(folder: Path, _res) -> None:
        path = folder / "genbioel" / "cfg.json"
        path.write_text(json.dumps(change(json.loads(path.read_text()))))

    return run


def _flip_concept_byte(arrays: Dict, meta: Dict[str, str]) -> Tuple[Dict, Dict[str, str]]:
    """One byte of one concept ID changed (same length, still UTF-8): the arrays stay consistent, only the
    checksum recorded when the file was written can tell."""
    blob = arrays["concept_bytes"].copy()
    blob[len(blob) - 1] = ord("9") if blob[len(blob) - 1] != ord("9") else ord("8")
    return {**arrays, "concept_bytes": blob}, meta


def _fusion(
    change: Optional[Callable[[dict], object]] = None, text: Optional[Callable[[str], str]] = None
) -> Callable[[Path, "Resources"], None]:
    """Put a ``fusion.json`` (genbioel + tfidf, all weights 0 but ``exact``) in the pipeline: ``change`` edits
    its JSON object (returning a replacement, or None to keep the edited one), ``text`` its JSON text."""

    def run(folder: Path, _res) -> None:
        from spacy_genbioel.linking.reranking.fusion import FusionModel, feature_names

        sources = ["genbioel", "tfidf"]
        data = FusionModel(sources, [1.0 if f == "exact" else 0.0 for f in feature_names(sources)]).to_dict()
        if change is not None:
            data = change(data) or data
        path = folder / "genbioel" / "fusion.json"
        written = json.dumps(data)
        path.write_text(text(written) if text is not None else written, encoding="utf8")

    return run


def _fusion_weight(value: object) -> Callable[[Path, "Resources"], None]:
    return _fusion(lambda d: d["weights"].update(exact=value))


def _fusion_folder(folder: Path, _res) -> None:
    (folder / "genbioel" / "fusion.json").mkdir()


def _nested(levels: int) -> str:
    head = (
        '{"version": 1, "sources": ["genbioel"], "weights": {"genbioel_in": 0, "genbioel_score": 0, "genbioel_rr": 0, '
    )
    head += '"genbioel_gap": 0, "exact": 0, "log_prior": 0}, "fit": '
    return head + '{"a": ' * levels + "1" + "}" * levels + "}"


def _old_trie(meta: Dict[str, str]) -> Dict[str, str]:
    """The metadata a 0.1 trie file carries: format 1, no tokenizer fingerprint."""
    keep = ("vocab_size", "eos_token_id", "root_token_id", "max_depth")
    return {"format_version": "1", **{k: meta[k] for k in keep}}


def folder_cases() -> List[FolderCase]:
    m, t, c = "genbioel/model/model.safetensors", "genbioel/trie.safetensors", "genbioel/cfg.json"
    k = "genbioel/kb.safetensors"
    cases = [FolderCase("intact", lambda f, r: None, "link")]
    for label, keep in [
        ("empty", lambda n: 0),
        ("7 bytes", lambda n: 7),
        ("100 bytes", lambda n: 100),
        ("half", lambda n: n // 2),
        ("last byte cut", lambda n: n - 1),
    ]:
        cases.append(FolderCase(f"model.safetensors {label}", _truncate(m, keep), "refuse", ("model.safetensors",)))
        cases.append(FolderCase(f"trie.safetensors {label}", _truncate(t, keep), "refuse", ("trie.safetensors",)))
        cases.append(FolderCase(f"kb.safetensors {label}", _truncate(k, keep), "refuse", ("kb.safetensors",)))
    cases += [
        FolderCase(
            "model.safetensors garbage",
            _write(m, b"\x00" * 64 + b"not safetensors" * 50),
            "refuse",
            ("model.safetensors",),
        ),
        FolderCase("model.safetensors missing", _delete(m), "refuse", ("model.safetensors",)),
        FolderCase(
            "model config.json garbage", _write("genbioel/model/config.json", b"{not json"), "refuse", ("config.json",)
        ),
        FolderCase(
            "model config.json a list", _write("genbioel/model/config.json", b"[1, 2]"), "refuse", ("config.json",)
        ),
        FolderCase("model folder missing", _delete("genbioel/model"), "refuse", ("model", "config.json")),
        FolderCase(
            "tokenizer files missing",
            _delete("genbioel/model/tokenizer.json", "genbioel/model/tokenizer_config.json"),
            "refuse",
            ("tokenizer",),
        ),
        FolderCase(
            "tokenizer.json garbage", _write("genbioel/model/tokenizer.json", b'{"model": 5'), "refuse", ("tokenizer",)
        ),
        FolderCase("tokenizer of the same size, other ids", _replace_tokenizer("permuted"), "refuse", ("tokenizer",)),
        FolderCase("tokenizer with a larger vocabulary", _replace_tokenizer("larger"), "refuse", ("tokenizer",)),
        FolderCase("trie.safetensors garbage", _write(t, b"\xff" * 300), "refuse", ("trie.safetensors",)),
        FolderCase(
            "trie format version 99",
            _trie_metadata(lambda meta: {**meta, "format_version": "99"}),
            "refuse",
            ("trie.safetensors",),
        ),
        FolderCase(
            "trie metadata missing",
            _trie_metadata(lambda meta: {"format_version": meta["format_version"]}),
            "refuse",
            ("trie.safetensors",),
        ),
        FolderCase(
            "trie with another root token",
            _trie_metadata(lambda meta: {**meta, "root_token_id": "5"}),
            "link_warned",
            ("trie.safetensors",),
        ),
        FolderCase("trie of format 1 without fingerprint", _trie_metadata(_old_trie), "link"),
        FolderCase(
            "trie max_depth 1", _trie_metadata(lambda meta: {**meta, "max_depth": "1"}), "refuse", ("trie.safetensors",)
        ),
        FolderCase(
            "trie max_depth one too many",
            _trie_metadata(lambda meta: {**meta, "max_depth": str(int(meta["max_depth"]) + 1)}),
            "refuse",
            ("trie.safetensors",),
        ),
        FolderCase("trie missing", _delete(t), "link_warned", ("trie.safetensors",)),
        FolderCase(
            "kb.jsonl missing, kb.safetensors there", _delete("genbioel/kb.jsonl"), "link_warned", ("kb.jsonl",)
        ),
        FolderCase("kb.jsonl and kb.safetensors missing", _delete("genbioel/kb.jsonl", k), "refuse", ("kb.jsonl",)),
        FolderCase("kb.safetensors missing (a pipeline saved before it)", _delete(k), "link"),
        FolderCase("kb.jsonl edited after saving", _edit_jsonl, "link_warned", ("kb.jsonl",)),
        FolderCase("kb.safetensors garbage", _write(k, b"\xff" * 300), "refuse", ("kb.safetensors",)),
        FolderCase(
            "kb.safetensors of format version 99",
            _kb_file(lambda a, m: (a, {**m, "format_version": "99"})),
            "refuse",
            ("kb.safetensors",),
        ),
        FolderCase(
            "kb.safetensors not a KB",
            _kb_file(lambda a, m: (a, {k2: v for k2, v in m.items() if k2 != "format"})),
            "refuse",
            ("kb.safetensors",),
        ),
        FolderCase(
            "kb.safetensors without its checksum",
            _kb_file(lambda a, m: (a, {k2: v for k2, v in m.items() if k2 != "checksum"})),
            "refuse",
            ("kb.safetensors",),
        ),
        FolderCase(
            "kb.safetensors without name_offsets",
            _kb_file(lambda a, m: ({k2: v for k2, v in a.items() if k2 != "name_offsets"}, m)),
            "refuse",
            ("kb.safetensors",),
        ),
        FolderCase(
            "kb.safetensors name offsets reversed",
            _kb_file(lambda a, m: ({**a, "name_offsets": a["name_offsets"][::-1].copy()}, m)),
            "refuse",
            ("kb.safetensors",),
        ),
        FolderCase(
            "kb.safetensors concepts of names out of range",
            _kb_file(lambda a, m: ({**a, "name_concepts": a["name_concepts"] + 1000}, m)),
            "refuse",
            ("kb.safetensors",),
        ),
        FolderCase(
            "kb.safetensors names of concepts as text",
            _kb_file(lambda a, m: ({**a, "concept_names": a["concept_names"].astype("float32")}, m)),
            "refuse",
            ("kb.safetensors",),
        ),
        FolderCase(
            "kb.safetensors one byte of a concept ID changed",
            _kb_file(_flip_concept_byte),
            "refuse",
            ("kb.safetensors",),
        ),
        FolderCase("fusion.json intact", _fusion(), "link"),
        FolderCase("fusion.json NaN weight", _fusion_weight(float("nan")), "refuse", ("fusion.json",)),
        FolderCase("fusion.json Infinity weight", _fusion_weight(float("inf")), "refuse", ("fusion.json",)),
        FolderCase("fusion.json -Infinity weight", _fusion_weight(float("-inf")), "refuse", ("fusion.json",)),
        FolderCase(
            "fusion.json weight 1e400",
            _fusion(text=lambda t: t.replace('"exact": 1.0', '"exact": 1e400')),
            "refuse",
            ("fusion.json",),
        ),
        FolderCase("fusion.json boolean weight", _fusion_weight(True), "refuse", ("fusion.json",)),
        FolderCase("fusion.json depth 2.9", _fusion(lambda d: d.update(depth=2.9)), "refuse", ("fusion.json",)),
        FolderCase("fusion.json depth true", _fusion(lambda d: d.update(depth=True)), "refuse", ("fusion.json",)),
        FolderCase("fusion.json fit nested 200 deep", _fusion(text=lambda t: _nested(200)), "refuse", ("fusion.json",)),
        FolderCase(
            "fusion.json fit nested 100,000 deep", _fusion(text=lambda t: _nested(100_000)), "refuse", ("fusion.json",)
        ),
        FolderCase(
            "fusion.json unknown retriever",
            _fusion(
                lambda d: {
                    **d,
                    "sources": ["genbioel", "bogus"],
                    "weights": {k.replace("tfidf", "bogus"): v for k, v in d["weights"].items()},
                }
            ),
            "refuse",
            ("fusion.json",),
        ),
        FolderCase("fusion.json a folder", _fusion_folder, "refuse", ("fusion.json",)),
        FolderCase("cfg.json garbage", _write(c, b"{{{"), "refuse", ("cfg.json",)),
        FolderCase("cfg.json empty", _write(c, b""), "refuse", ("cfg.json",)),
        FolderCase("cfg.json a list", _write(c, b"[]"), "refuse", ("cfg.json",)),
        FolderCase("cfg.json not UTF-8", _write(c, b'{"has_linker": "\xff\xfe"}'), "refuse", ("cfg.json",)),
        FolderCase(
            "cfg.json without kb_normalizer",
            _cfg(lambda d: {k: v for k, v in d.items() if k != "kb_normalizer"}),
            "refuse",
            ("cfg.json",),
        ),
        FolderCase("cfg.json kb_dedup a string", _cfg(lambda d: {**d, "kb_dedup": "yes"}), "refuse", ("cfg.json",)),
        FolderCase(
            "cfg.json kb_normalizer another registered function",
            _cfg(lambda d: {**d, "kb_normalizer": "spacy.first_longest_spans_filter.v1"}),
            "refuse",
            ("cfg.json",),
        ),
        FolderCase(
            "cfg.json kb_normalizer a registered retriever",
            _cfg(lambda d: {**d, "kb_normalizer": "genbioel.exact_retriever.v1"}),
            "refuse",
            ("cfg.json",),
        ),
        FolderCase("cfg.json missing", _delete(c), "refuse", ("cfg.json",)),
        FolderCase("saved before first use, originals gone", lambda f, r: None, "link"),
        FolderCase("saved empty (no model or KB)", lambda f, r: None, "no_model"),
    ]
    return cases


# -- running them ---------------------------------------------------------------------------------------------------
@dataclass
class Resources:
    root: Path
    kb: object
    tokenizer: object
    other_tokenizers: Dict[str, object]
    saved: Path  # a pipeline saved after use
    unused: Path  # a pipeline saved before its first use (its model and KB then deleted)
    empty: Path  # a pipeline saved without model or KB


def make_nlp(model_dir: Optional[Path], kb_path: Optional[Path], **extra):
    import spacy

    import spacy_genbioel  # noqa: F401  (registers the factory)

    nlp = spacy.blank("en")
    cfg = {
        "model": str(model_dir) if model_dir else None,
        "kb": str(kb_path) if kb_path else None,
        "device": "cpu",
        "spans_key": "mentions",
        "decoding": {"num_beams": 2, "top_k": 2, "max_source_tokens": 64},
        **extra,
    }
    nlp.add_pipe("genbioel", config=cfg)
    return nlp


def permuted_tokenizer(tokenizer, folder: Path):
    """The same tokenizer with the ids of its ordinary tokens reversed: same size, other ids."""
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(str(folder))
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf8"))
    vocab = data["model"]["vocab"]
    ordinary = sorted((i for tok, i in vocab.items() if not tok.startswith("<")))
    tokens = sorted((t for t in vocab if vocab[t] in set(ordinary)), key=vocab.get)
    for tok, new in zip(tokens, reversed(ordinary)):
        vocab[tok] = new
    (folder / "tokenizer.json").write_text(json.dumps(data), encoding="utf8")
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def build_resources(root: Path) -> Resources:
    import torch
    from conftest import MICRO, WORDS, random_kb

    from spacy_genbioel.models import build_model, save_model, train_tokenizer

    tokenizer = train_tokenizer([" ".join(WORDS)] * 5 + WORDS * 5, vocab_size=400, min_frequency=1)
    torch.manual_seed(0)
    model = build_model(MICRO, tokenizer, seed=0, dropout=0.0).eval()
    kb = random_kb(1, n_concepts=30)
    save_model(model, tokenizer, root / "model")
    kb.to_jsonl(root / "kb.jsonl")
    extra = [f"{a}{b}" for a in WORDS for b in ("osis", "itis", "emia", "oma")]
    others = {
        "permuted": permuted_tokenizer(tokenizer, root / "permuted"),
        "larger": train_tokenizer(WORDS * 5 + extra * 5, vocab_size=1200, min_frequency=1),
    }
    assert len(others["permuted"]) == len(tokenizer) < len(others["larger"])
    nlp = make_nlp(root / "model", root / "kb.jsonl")
    nlp(nlp.make_doc("renal failure"))  # first use: the component loads its model
    nlp.to_disk(root / "saved")
    # a pipeline saved before first use, whose original model and KB then go away
    shutil.copytree(root / "model", root / "model_copy")
    shutil.copy(root / "kb.jsonl", root / "kb_copy.jsonl")
    make_nlp(root / "model_copy", root / "kb_copy.jsonl").to_disk(root / "unused")
    shutil.rmtree(root / "model_copy")
    (root / "kb_copy.jsonl").unlink()
    make_nlp(None, None).to_disk(root / "empty")
    return Resources(root, kb, tokenizer, others, root / "saved", root / "unused", root / "empty")


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def is_project_error(err: BaseException) -> bool:
    return any(cls.__module__.startswith("spacy_genbioel") for cls in type(err).__mro__)


def marker_ids(linker) -> Tuple[List[int], List[int]]:
    tok = linker.tokenizer
    return tuple(
        tok(" " + m, add_special_tokens=False)["input_ids"]
        for m in (linker.inputs.start_marker, linker.inputs.end_marker)
    )


def find(row: List[int], part: List[int], start: int = 0) -> int:
    for i in range(start, len(row) - len(part) + 1):
        if row[i : i + len(part)] == part:
            return i
    return -1


def _spy_rows(linker) -> List[List[int]]:
    """Record every encoder row the decoder reads (the pad-free ids)."""
    rows: List[List[int]] = []
    original = linker.encode_windows

    def spy(input_ids, attention_mask, *args, **kwargs):
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            rows.append([i for i, keep in zip(ids, mask) if keep])
        return original(input_ids, attention_mask, *args, **kwargs)

    linker.encode_windows = spy
    return rows


@dataclass
class Outcome:
    name: str
    status: str  # ok | refused | crash | silent | failed
    detail: str = ""


def run_document(nlp, case: DocCase) -> Outcome:
    from spacy.tokens import Span

    component = nlp.get_pipe("genbioel")
    linker = component.linker
    kb = linker.kb
    rows = _spy_rows(linker)
    start, end = marker_ids(linker)
    try:
        doc = nlp.make_doc(case.text)
        spans = [(min(a, len(doc)), min(b, len(doc))) for a, b in case.spans]
        doc.spans["mentions"] = [Span(doc, a, max(a, b), label="Disease") for a, b in spans]
        doc = nlp(doc)
    except Exception as err:  # noqa: BLE001 - the point is to see what escapes
        return Outcome(case.name, "crash", f"{type(err).__name__}: {str(err)[:200]}")
    finally:
        del linker.encode_windows
    problems = []
    for i, row in enumerate(rows):
        at = find(row, start)
        if at < 0 or find(row, end, at + len(start)) < 0:
            problems.append(f"encoder row {i} ({len(row)} tokens) lacks START ... END")
    for i, span in enumerate(doc.spans["mentions"]):
        if span._.kb_id is not None and span._.kb_id not in kb:
            problems.append(f"span {i} got {span._.kb_id!r}, not a KB ID")
        if i in case.unlinkable and span._.kb_id is not None:
            problems.append(f"span {i} {span.text!r} has nothing to link but got {span._.kb_id!r}")
    return Outcome(case.name, "silent" if problems else "ok", "; ".join(problems))


def run_folder(res: Resources, case: FolderCase) -> Outcome:
    import spacy

    source = {"saved before first use, originals gone": res.unused, "saved empty (no model or KB)": res.empty}.get(
        case.name, res.saved
    )
    handler = _Warnings()
    logger = logging.getLogger("spacy_genbioel")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(dir=res.root) as tmp:
        folder = Path(tmp) / "nlp"
        shutil.copytree(source, folder)
        case.corrupt(folder, res)
        try:
            nlp = spacy.load(folder)
            doc = nlp.make_doc("acute renal failure and lung cancer")
            from spacy.tokens import Span

            doc.spans["mentions"] = [Span(doc, 1, 3, "Disease"), Span(doc, 4, 6, "Disease")]
            doc = nlp(doc)
            ids = [s._.kb_id for s in doc.spans["mentions"]]
        except Exception as err:  # noqa: BLE001
            message = str(err)
            if case.expect == "no_model" and isinstance(err, ValueError) and "has no KB" in message:
                return Outcome(case.name, "ok", message[:120])
            if not is_project_error(err):
                return Outcome(case.name, "crash", f"{type(err).__name__}: {message[:200]}")
            if case.expect in ("refuse", "link_warned") and any(n in message for n in case.names):
                return Outcome(case.name, "refused", f"{type(err).__name__}: {message[:160]}")
            return Outcome(case.name, "failed", f"{type(err).__name__}: {message[:200]}")
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
    if not all(i is None or i in res.kb for i in ids):
        return Outcome(case.name, "silent", f"linked to non-KB IDs {ids}")
    if case.expect == "link" or (case.expect == "link_warned" and handler.messages):
        return Outcome(case.name, "ok", "; ".join(handler.messages)[:160])
    return Outcome(
        case.name, "silent", f"linked {ids} without error" + ("" if case.expect != "link_warned" else " or warning")
    )


def run_all(root: Path, seed: int = 0, n_random: int = 40) -> List[Outcome]:
    res = build_resources(root)
    outcomes: List[Outcome] = []
    nlp = make_nlp(root / "model", root / "kb.jsonl")
    for case in document_cases() + random_documents(seed, n_random):
        outcomes.append(run_document(nlp, case))
    for case in folder_cases():
        outcomes.append(run_folder(res, case))
    return outcomes


def summary(outcomes: Sequence[Outcome]) -> Dict[str, int]:
    counts = {"tried": len(outcomes)}
    for status in ("ok", "refused", "crash", "silent", "failed"):
        counts[status] = sum(o.status == status for o in outcomes)
    return counts


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="store_true", help="print every case that did not pass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random", type=int, default=40, help="random documents to try")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    from transformers.utils import logging as hf_logging

    import spacy_genbioel

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    with tempfile.TemporaryDirectory() as tmp:
        outcomes = run_all(Path(tmp), args.seed, args.random)
    if args.report:
        for o in outcomes:
            if o.status not in ("ok", "refused"):
                print(f"{o.status:7} {o.name}: {o.detail}")
    counts = summary(outcomes)
    print(f"spacy_genbioel from {Path(spacy_genbioel.__file__).parent}")
    print("component fuzz: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    print(
        f"malformed inputs tried {counts['tried']}, crashes {counts['crash']}, silent acceptances {counts['silent']}, "
        f"wrongly refused {counts['failed']}"
    )
    return 1 if counts["crash"] or counts["silent"] or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
