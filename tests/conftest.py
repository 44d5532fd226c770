import os
import random
from pathlib import Path

import pytest
import torch

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.models import Preset, build_model, train_tokenizer
from spacy_genbioel.ty import Mention

WORDS = [
    "acute",
    "chronic",
    "renal",
    "failure",
    "cancer",
    "breast",
    "lung",
    "syndrome",
    "disease",
    "type",
    "diabetes",
    "heart",
    "attack",
    "arthritis",
    "reactive",
    "reiter",
    "pain",
    "liver",
    "fibrosis",
    "cystic",
]
# small enough that a forward pass takes milliseconds on CPU
MICRO = Preset(
    d_model=32,
    encoder_layers=1,
    decoder_layers=1,
    attention_heads=2,
    ffn_dim=64,
    max_position_embeddings=128,
    vocab_size=400,
)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def data_dir():
    path = Path(os.environ.get("GENBIOEL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    return path if path.is_dir() else None


def random_kb(seed: int, n_concepts: int = 60) -> KnowledgeBase:
    rng = random.Random(seed)
    concepts = [
        Concept(f"D{i:04d}", [" ".join(rng.choices(WORDS, k=rng.randint(1, 4))) for _ in range(rng.randint(1, 4))])
        for i in range(n_concepts)
    ]
    return KnowledgeBase(concepts)


@pytest.fixture(scope="session")
def word_tokenizer():
    """A byte-level BPE tokenizer that knows the test vocabulary (and bytes for anything else)."""
    return train_tokenizer([" ".join(WORDS)] * 5 + WORDS * 5, vocab_size=400, min_frequency=1)


@pytest.fixture(scope="session")
def micro_model(word_tokenizer):
    """A randomly initialized micro BART: enough to test decoding mechanics, not accuracy."""
    torch.manual_seed(0)
    return build_model(MICRO, word_tokenizer, seed=0, dropout=0.0).eval()


@pytest.fixture()
def small_kb():
    return random_kb(0)


def _same(a, b, tol: float) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], tol) for k in a)
    return a == b


def assert_same_links(a, b, tol: float = 1e-4) -> None:
    """Links equal up to float noise: IDs, names and order exactly, scores within ``tol``.

    Batch composition changes the matmul kernels on some CPUs (seen on AMD EPYC:
    the 6th decimal of a mean log-probability), so scores are never compared bit
    for bit across batch shapes or processes."""
    assert _same(a, b, tol), f"links differ beyond score noise:\n{a}\n!=\n{b}"


def mentions_for(kb, n=12):
    names = kb.names
    out = []
    for i in range(n):
        text = names[(i * 7) % len(names)] if i % 3 else f"{WORDS[i % len(WORDS)]} {WORDS[(i * 3) % len(WORDS)]}"
        out.append(Mention(text, left="the patient had " * (i % 4), right=" and was treated"))
    return out


#: synonym words of the ResCNN tests (a WordPiece vocabulary of them: wordpiece_dir)
SYNONYM_WORDS = [
    "heart",
    "attack",
    "myocardial",
    "infarction",
    "cardiac",
    "breast",
    "cancer",
    "carcinoma",
    "neoplasm",
    "tumor",
    "renal",
    "kidney",
    "failure",
    "insufficiency",
    "high",
    "blood",
    "pressure",
    "hypertension",
    "lung",
    "disease",
]


@pytest.fixture(scope="session")
def wordpiece_dir(tmp_path_factory):
    """A BERT-like directory with a WordPiece vocabulary of the test words and a random 8-wide table."""
    from safetensors.torch import save_file
    from transformers import BertTokenizerFast

    path = tmp_path_factory.mktemp("wordpieces")
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = list(
        dict.fromkeys(
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *SYNONYM_WORDS, *letters, *[f"##{c}" for c in letters]]
        )
    )
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf8")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt"), do_lower_case=True).save_pretrained(str(path))
    generator = torch.Generator().manual_seed(0)
    save_file(
        {"embeddings.word_embeddings.weight": torch.randn(len(vocab), 6, generator=generator)},
        str(path / "model.safetensors"),
    )
    return path
