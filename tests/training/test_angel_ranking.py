"""ANGEL trained for the cascade's question: pairs mined from the model's forced ranking of the names a
retriever proposes (``[angel] mining = "forced"``), and pairs of the mentions retrieval gets wrong weighted
up (``deferred_weight``)."""

import math

import pytest
import torch
from conftest import MICRO, random_kb

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.models import build_model
from spacy_genbioel.retrieval.tfidf import TfidfLinker
from spacy_genbioel.training.angel import AngelConfig, AngelTrainer
from spacy_genbioel.training.angel.mining import PreferencePair, read_pairs_jsonl, weight_deferred, write_pairs_jsonl
from spacy_genbioel.training.engine import TrainingEngine
from spacy_genbioel.training.evaluator import linking_evaluator, mining_candidates
from spacy_genbioel.training.settings import EngineConfig
from spacy_genbioel.ty import Candidate, Mention

BUILDER = InputBuilder(context_words=4)


def _mentions(kb, n):
    concepts = list(kb)
    return [
        Mention(
            concepts[i % len(concepts)].names[-1], (concepts[i % len(concepts)].id,), left=f"case {i}", right="seen"
        )
        for i in range(n)
    ]


def _trainer(tmp_path, word_tokenizer, kb, **angel):
    model = build_model(MICRO, word_tokenizer, seed=0, dropout=0.0)
    config = EngineConfig(max_steps=20, batch_size=4, learning_rate=1e-3, warmup_steps=0, progress=False)
    engine = TrainingEngine(model, word_tokenizer, config, inputs=BUILDER, out_dir=tmp_path)
    return AngelTrainer(engine, kb, AngelConfig(top_k=3, num_beams=3, **angel))


def test_weight_deferred_weighs_the_pairs_of_mentions_retrieval_ranks_wrong():
    right, wrong, unseen = Mention("a", ("D1",)), Mention("b", ("D2",)), Mention("c", ("D3",))
    pairs = [PreferencePair(m, "gold", "other") for m in (right, wrong, unseen)]
    retrieved = {id(right): [Candidate(("D1",), "a", 1.0)], id(wrong): [Candidate(("D9",), "x", 0.9)]}
    weighted = weight_deferred(pairs, retrieved, 3.0)
    assert [p.weight for p in weighted] == [1.0, 3.0, 3.0]  # nothing retrieved counts as wrong
    assert [p.mention for p in weighted] == [right, wrong, unseen]
    assert weight_deferred(pairs, retrieved, 1.0) == pairs


def test_a_pair_keeps_its_weight_through_jsonl(tmp_path):
    pair = PreferencePair(Mention("a", ("D1",)), "gold", "other", 2, 1, ("D1",), ("D2",), weight=2.5)
    write_pairs_jsonl([pair], tmp_path / "pairs.jsonl")
    assert read_pairs_jsonl(tmp_path / "pairs.jsonl") == [pair]


@pytest.mark.parametrize(
    "setting, value",
    [("mining", "sample"), ("mining_candidates", 0), ("deferred_weight", 0.0), ("deferred_weight", math.nan)],
)
def test_angel_settings_refuse_what_cannot_mine(setting, value):
    with pytest.raises(ValueError, match=rf"\[angel\] {setting}|angel\.{setting} must be"):
        AngelConfig(**{setting: value})


def test_forced_mining_pairs_only_names_the_retriever_proposes(tmp_path, word_tokenizer):
    kb = random_kb(3, n_concepts=12)
    trainer = _trainer(tmp_path, word_tokenizer, kb, mining="forced", mining_retriever="tfidf", mining_candidates=4)
    mentions = _mentions(kb, 10)
    pairs, info = trainer.mine(mentions)
    retrieved = TfidfLinker(kb).link(mentions, top_k=4)
    proposed = {id(m): {c.name for c in r} for m, r in zip(mentions, retrieved)}
    assert pairs and info["mentions"] == 10
    for pair in pairs:
        assert pair.rejected in proposed[id(pair.mention)]
        assert not set(pair.rejected_ids) & set(pair.mention.ids)
    assert trainer.linker.decoding.search == "forced"


def test_deferred_weight_reaches_the_mined_pairs_and_the_loss(tmp_path, word_tokenizer):
    kb = KnowledgeBase(
        [
            Concept("D1", ["renal failure", "kidney failure"]),
            Concept("D2", ["renal cyst"]),
            Concept("D3", ["heart failure", "cardiac failure"]),
            Concept("D4", ["heart attack"]),
        ]
    )
    # "kidney failure" is a KB name (retrieval right); TF-IDF ranks "heart failure" above "heart attack" for "heart"
    mentions = [Mention("kidney failure", ("D1",), left="acute", right="seen"), Mention("heart", ("D4",))]
    trainer = _trainer(tmp_path, word_tokenizer, kb, mining="forced", mining_candidates=4, deferred_weight=4.0)
    top = TfidfLinker(kb).link(mentions, top_k=1)
    wrong = {id(m) for m, r in zip(mentions, top) if not r or not set(r[0].ids) & set(m.ids)}
    assert 0 < len(wrong) < len(mentions)  # one mention of each kind
    pairs, info = trainer.mine(mentions)
    assert pairs and info["deferred_pairs"] == sum(id(p.mention) in wrong for p in pairs)
    for pair in pairs:
        assert pair.weight == (4.0 if id(pair.mention) in wrong else 1.0)
    # the loss is the weighted mean of the pairs' DPO losses
    ref_c, ref_r = trainer.score_pairs(pairs)
    ref_c, ref_r = ref_c - 0.3, ref_r + 0.2  # a reference the policy differs from
    loss, logits, _ = trainer._batch_loss(pairs, ref_c, ref_r)
    per_pair = -torch.nn.functional.logsigmoid(logits.float())
    weights = torch.tensor([p.weight for p in pairs])
    assert loss.item() == pytest.approx(float((per_pair * weights).sum() / weights.sum()), rel=1e-5)


def test_the_forced_evaluator_scores_the_retrieved_names(word_tokenizer):
    kb = random_kb(5, n_concepts=10)
    model = build_model(MICRO, word_tokenizer, seed=0, dropout=0.0)
    mentions = _mentions(kb, 8)
    forced = linking_evaluator(
        kb,
        mentions,
        inputs=BUILDER,
        decoding=_forced_decoding(),
        candidates=mining_candidates(AngelConfig(mining="forced", mining_candidates=3)),
    )(model, word_tokenizer)
    # every mention is a KB name, so TF-IDF retrieves its gold concept: recall@5 over retrieved names is 1
    assert forced["recall@5"] == 1.0 and 0.0 <= forced["recall@1"] <= 1.0


def _forced_decoding():
    from spacy_genbioel.linking.settings import DecodingSettings

    return DecodingSettings(num_beams=2, top_k=2, search="forced")


def test_the_ranking_config_differs_from_angel_tiny_only_in_what_it_mines():
    from pathlib import Path

    from spacy_genbioel.training.settings import load_stage_config

    configs = Path(__file__).resolve().parents[2] / "configs"
    rank, plain = load_stage_config(configs / "angel_rank_tiny.cfg"), load_stage_config(configs / "angel_tiny.cfg")
    assert rank.training == plain.training and rank.inputs == plain.inputs and rank.data == plain.data
    mining = ("mining", "mining_retriever", "mining_candidates", "deferred_weight", "gold_fallback")
    assert (rank.angel.mining, rank.angel.mining_retriever, rank.angel.deferred_weight) == (
        "forced",
        "tfidf+dense",
        2.0,
    )
    differs = {k for k, v in vars(rank.angel).items() if v != getattr(plain.angel, k)}
    assert differs <= set(mining)


def test_the_rank_loss_compares_forced_scores_without_a_reference(tmp_path, word_tokenizer):
    """``loss = "rank"``: each pair's logit is rank_scale x (mean token log-probability of the chosen name -
    that of the rejected one): the forced scores the cascade ranks by; the reference plays no part."""
    from spacy_genbioel.training.angel.dpo import pair_logprobs, rank_loss

    kb = random_kb(3, n_concepts=12)
    trainer = _trainer(tmp_path, word_tokenizer, kb, mining="forced", mining_candidates=4, loss="rank", rank_scale=3.0)
    pairs, _ = trainer.mine(_mentions(kb, 10))
    assert pairs
    ref_c, ref_r = trainer.score_pairs(pairs)
    loss, logits, _ = trainer._batch_loss(pairs, ref_c, ref_r)
    again, same_logits, _ = trainer._batch_loss(pairs, ref_c + 5.0, ref_r - 5.0)
    assert torch.equal(logits, same_logits) and loss.item() == pytest.approx(again.item())
    tensors = trainer._encode(pairs)
    chosen, rejected = pair_logprobs(trainer.model, tensors)
    lengths = (tensors["labels"] != -100).sum(dim=-1)
    forced = torch.cat([chosen, rejected]) / lengths
    expected = 3.0 * (forced[: len(pairs)] - forced[len(pairs) :])
    assert torch.allclose(logits, expected.detach(), atol=1e-5)
    per_pair, _ = rank_loss(forced[: len(pairs)], forced[len(pairs) :], 3.0)
    assert loss.item() == pytest.approx(per_pair.mean().item(), rel=1e-5)  # every pair weighs 1 here
    with pytest.raises(ValueError, match=r"\[angel\] loss"):
        AngelConfig(loss="listwise")


def test_the_rank_loss_moves_the_forced_ranking_towards_the_chosen_names(tmp_path, word_tokenizer):
    kb = random_kb(3, n_concepts=12)
    trainer = _trainer(tmp_path, word_tokenizer, kb, mining="forced", mining_candidates=4, loss="rank", rank_scale=5.0)
    pairs, _ = trainer.mine(_mentions(kb, 12))
    unused = torch.zeros(len(pairs))
    with torch.no_grad():
        before, before_logits, _ = trainer._batch_loss(pairs, unused, unused)
    assert trainer.train_round(pairs)["steps"] > 0
    with torch.no_grad():
        after, after_logits, _ = trainer._batch_loss(pairs, unused, unused)
    assert after.item() < before.item()
    assert (after_logits > 0).float().mean() >= (before_logits > 0).float().mean()


def test_the_margin_config_is_the_ranking_config_with_the_rank_loss():
    from pathlib import Path

    from spacy_genbioel.training.settings import load_stage_config

    configs = Path(__file__).resolve().parents[2] / "configs"
    margin, rank = (
        load_stage_config(configs / "angel_margin_tiny.cfg"),
        load_stage_config(configs / "angel_rank_tiny.cfg"),
    )
    assert (margin.angel.loss, rank.angel.loss) == ("rank", "dpo")
    differs = {k for k, v in vars(margin.angel).items() if v != getattr(rank.angel, k)}
    assert differs == {"loss", "sft_weight"}
    assert margin.training.learning_rate > rank.training.learning_rate and margin.inputs == rank.inputs
