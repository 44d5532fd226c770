"""ANGEL's ``loss = "listwise"``: each mention's gold name against every wrong name its forced ranking holds,
one softmax over the forced scores, one encoder pass per mention."""

import math
from pathlib import Path

import pytest
import torch
from conftest import MICRO, random_kb
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.linking.decoding.candidates import CandidateUnion
from spacy_genbioel.linking.inputs.builder import InputBuilder, PromptTokenizer
from spacy_genbioel.models import build_model, special_ids
from spacy_genbioel.training.angel import AngelConfig, AngelTrainer
from spacy_genbioel.training.angel.dpo import encode_lists, list_logprobs, listwise_loss, sequence_logprobs
from spacy_genbioel.training.angel.mining import (
    PreferencePair,
    group_lists,
    listwise_pairs,
    preference_pairs,
    prior_floor,
    rank_priors,
)
from spacy_genbioel.training.engine import TrainingEngine
from spacy_genbioel.training.examples import TrainingExample
from spacy_genbioel.training.seq2seq import encode_examples
from spacy_genbioel.training.settings import EngineConfig, load_stage_config
from spacy_genbioel.ty import Candidate, Mention

BUILDER = InputBuilder(context_words=4)
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _ranking(ids):
    return [Candidate((i,), f"name {n}", 1.0 - n / 10) for n, i in enumerate(ids)]


def test_listwise_pairs_set_the_first_gold_name_against_every_wrong_one():
    ranking = _ranking(["D2", "D1", "D3", "D1", "D4"])
    assert listwise_pairs({"D1"}, ranking) == [(1, 0), (1, 2), (1, 4)]
    assert listwise_pairs({"D9"}, ranking) == []
    assert listwise_pairs({"D1"}, _ranking(["D1"])) == []
    # ANGEL's pairing of the same ranking pairs each gold name with the wrong names above it only
    assert preference_pairs({"D1"}, ranking) == [(1, 0), (3, 0), (3, 2)]


@given(st.lists(st.sampled_from(["D1", "D2", "D3", "D4"]), max_size=8))
@settings(max_examples=60, deadline=None)
def test_a_listwise_list_holds_each_wrong_candidate_once(ids):
    pairs = listwise_pairs({"D1"}, _ranking(ids))
    wrong = [j for j, i in enumerate(ids) if i != "D1"]
    if "D1" in ids and wrong:
        assert {k for k, _ in pairs} == {ids.index("D1")} and [j for _, j in pairs] == wrong
    else:
        assert pairs == []


def test_group_lists_makes_one_list_per_mention_and_chosen_name_in_order():
    a, b = Mention("a", ("D1",)), Mention("a", ("D1",))  # equal mentions, separate occurrences
    pairs = [PreferencePair(a, "x", "y"), PreferencePair(b, "x", "z"), PreferencePair(a, "x", "w")]
    assert group_lists(pairs) == [[pairs[0], pairs[2]], [pairs[1]]]


def test_listwise_loss_is_the_softmax_cross_entropy_with_the_chosen_name_first():
    scores = torch.tensor([-0.5, -1.0, -0.2, -2.0, -0.1])  # lists of 3 and 2 rows
    losses, margins = listwise_loss(scores, [3, 2], scale=2.0)
    first = -torch.log_softmax(2.0 * scores[:3], 0)[0]
    second = -torch.log_softmax(2.0 * scores[3:], 0)[0]
    assert losses.tolist() == pytest.approx([first.item(), second.item()])
    assert margins.tolist() == pytest.approx([-0.3, -1.9])
    assert math.isfinite(losses.sum().item())


def test_list_logprobs_equal_each_rows_sequence_logprob(word_tokenizer):
    kb = random_kb(1, n_concepts=6)
    names = [c.names[0] for c in kb]
    model = build_model(MICRO, word_tokenizer, seed=0, dropout=0.0).eval()
    start, eos, pad = special_ids(model, word_tokenizer)
    prompts = PromptTokenizer(word_tokenizer, start, eos)
    m1, m2 = Mention(names[0], ("X",), left="left", right="right"), Mention(names[1], ("Y",))
    lists = [
        [PreferencePair(m1, names[0], names[2]), PreferencePair(m1, names[0], names[3])],
        [PreferencePair(m2, names[1], names[4])],
    ]
    batch = encode_lists(lists, word_tokenizer, prompts, BUILDER, pad)
    rows = [(m1, names[0]), (m1, names[2]), (m1, names[3]), (m2, names[1]), (m2, names[4])]
    plain = encode_examples([TrainingExample(m, n) for m, n in rows], word_tokenizer, prompts, BUILDER, pad)
    with torch.no_grad():
        listed = list_logprobs(model, batch, [3, 2])
        each = sequence_logprobs(model, plain)
    assert listed.tolist() == pytest.approx(each.tolist(), abs=1e-4)


def _trainer(tmp_path, word_tokenizer, kb, **angel):
    model = build_model(MICRO, word_tokenizer, seed=0, dropout=0.0)
    config = EngineConfig(max_steps=20, batch_size=4, learning_rate=1e-3, warmup_steps=0, progress=False)
    engine = TrainingEngine(model, word_tokenizer, config, inputs=BUILDER, out_dir=tmp_path)
    return AngelTrainer(engine, kb, AngelConfig(num_beams=3, **angel))


def _mentions(kb, n):
    concepts = list(kb)
    return [
        Mention(concepts[i % len(concepts)].names[-1], (concepts[i % len(concepts)].id,), left=f"case {i}")
        for i in range(n)
    ]


def test_listwise_training_mines_whole_lists_and_ranks_the_chosen_names_higher(tmp_path, word_tokenizer):
    kb = random_kb(3, n_concepts=12)
    trainer = _trainer(
        tmp_path,
        word_tokenizer,
        kb,
        top_k=4,
        mining="forced",
        mining_candidates=4,
        loss="listwise",
        gold_fallback=True,
        sft_weight=0.1,
        score_after=0,
    )
    mentions = _mentions(kb, 12)
    pairs, info = trainer.mine(mentions)
    lists = group_lists(pairs)
    assert pairs and len(lists) <= info["mentions"]
    for group in lists:  # one mention, one chosen name, each wrong name once
        assert len({id(p.mention) for p in group}) == 1 and len({p.chosen for p in group}) == 1
        assert len({p.rejected for p in group}) == len(group) <= 4
        assert not {i for p in group for i in p.rejected_ids} & set(group[0].mention.ids)
    before = trainer.score_lists(lists)
    record = trainer.train_round(pairs)
    after = trainer.score_lists(lists)
    assert record["steps"] > 0 and record["lists"] == len(lists) and record["scored_lists"] == len(lists)
    assert record["list_accuracy_after"] == pytest.approx(float((after > 0).float().mean()))
    assert after.mean() > before.mean()
    with torch.no_grad():
        loss_after, _ = trainer._lists_loss(lists)
    assert math.isfinite(loss_after.item())


def test_the_listwise_loss_needs_forced_mining():
    with pytest.raises(ValueError, match="listwise"):
        AngelConfig(loss="listwise", mining="beam")


def test_the_listwise_config_is_the_margin_config_over_whole_lists():
    listwise = load_stage_config(CONFIGS / "angel_listwise_tiny.cfg")
    margin = load_stage_config(CONFIGS / "angel_margin_tiny.cfg")
    assert (listwise.angel.loss, listwise.angel.mining) == ("listwise", "forced")
    assert listwise.angel.top_k == 2 * listwise.angel.mining_candidates  # every name both retrievers propose
    differs = {k for k, v in vars(listwise.angel).items() if v != getattr(margin.angel, k)}
    assert differs == {"loss", "top_k", "score_after"}
    assert listwise.inputs == margin.inputs and listwise.training.max_seconds == margin.training.max_seconds


class _Part:
    def __init__(self, names):
        self.names = names

    def link(self, mentions, top_k=5):
        return [[Candidate(("X",), n, 1.0) for n in self.names[:top_k]] for _ in mentions]


def test_rank_priors_sum_each_parts_log_rank_with_a_floor_for_names_a_part_missed():
    union = CandidateUnion([_Part(["a", "b", "c"]), _Part(["b", "d"])])
    (prior,) = rank_priors(union, [Mention("m", ("X",))], top_k=3)
    floor = -math.log(4)
    assert prior == pytest.approx(
        {"a": 0.0 + floor, "b": -math.log(2) + 0.0, "c": -math.log(3) + floor, "d": floor - math.log(2)}
    )
    assert prior_floor(union, 3) == pytest.approx(2 * floor)
    (alone,) = rank_priors(_Part(["a", "b"]), [Mention("m", ("X",))], top_k=2)
    assert alone == pytest.approx({"a": 0.0, "b": -math.log(2)})


def test_listwise_loss_adds_fixed_offsets_to_the_logits_only():
    scores = torch.tensor([-0.5, -1.0, -0.2], requires_grad=True)
    offsets = torch.tensor([0.0, -1.0, -3.0])
    losses, margins = listwise_loss(scores, [3], scale=2.0, offsets=offsets)
    expected = -torch.log_softmax(2.0 * scores.detach() + offsets, 0)[0]
    assert losses.item() == pytest.approx(expected.item())
    assert margins.item() == pytest.approx(-0.3)  # the generator's own margin: offsets left out
    losses.sum().backward()
    assert scores.grad is not None and offsets.grad is None


def test_the_retrieval_prior_shrinks_the_loss_where_retrieval_already_ranks_the_gold_name_first(
    tmp_path, word_tokenizer
):
    kb = random_kb(3, n_concepts=12)
    settings = dict(top_k=4, mining="forced", mining_candidates=4, loss="listwise", gold_fallback=True)
    for name in ("plain", "fused"):
        (tmp_path / name).mkdir()
    plain = _trainer(tmp_path / "plain", word_tokenizer, kb, **settings)
    fused = _trainer(tmp_path / "fused", word_tokenizer, kb, retrieval_prior=2.0, **settings)
    mentions = _mentions(kb, 12)  # each mention is a KB name: TF-IDF ranks its concept first
    pairs, _ = fused.mine(mentions)
    lists = group_lists(pairs)
    assert fused._priors and set(fused._priors) <= {id(m) for m in mentions}
    with torch.no_grad():
        without, _ = plain._lists_loss(lists)
        with_prior, _ = fused._lists_loss(lists)
    assert with_prior.item() < without.item()
    assert fused.train_round(pairs)["steps"] > 0


def test_the_fused_config_is_the_listwise_config_with_a_retrieval_prior():
    fused = load_stage_config(CONFIGS / "angel_fused_tiny.cfg")
    listwise = load_stage_config(CONFIGS / "angel_listwise_tiny.cfg")
    differs = {k for k, v in vars(fused.angel).items() if v != getattr(listwise.angel, k)}
    assert differs == {"retrieval_prior"} and fused.angel.retrieval_prior > 0
    assert (fused.training, fused.inputs, fused.data) == (listwise.training, listwise.inputs, listwise.data)
