"""ANGEL negative-aware training: the DPO loss, sequence log-probabilities after
the inference prompt, ANGEL's pair rules, KB negatives and short rounds on a
micro model (a few seconds on one CPU core)."""

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import MICRO, random_kb

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.inputs.builder import InputBuilder
from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.models import build_model, save_model, special_ids
from spacy_genbioel.training import encode_examples
from spacy_genbioel.training.angel import (
    AngelConfig,
    AngelTrainer,
    GoldFallback,
    PreferencePair,
    dpo_loss,
    encode_pairs,
    kb_negative_pairs,
    mine_pairs,
    pair_logprobs,
    preference_pairs,
    read_pairs_jsonl,
    sequence_logprobs,
    write_pairs_jsonl,
)
from spacy_genbioel.training.engine import TrainingEngine
from spacy_genbioel.training.examples import TrainingExample, write_examples_jsonl
from spacy_genbioel.training.pretraining import pretraining_examples
from spacy_genbioel.training.settings import EngineConfig
from spacy_genbioel.training.trainlog import read_log
from spacy_genbioel.ty import Candidate, Mention

ROOT = Path(__file__).resolve().parents[2]
BUILDER = InputBuilder(context_words=8)


# -- the loss --------------------------------------------------------------------------------
def test_dpo_loss_matches_the_formula():
    policy_chosen = torch.tensor([-1.0, -2.0, -4.0])
    policy_rejected = torch.tensor([-3.0, -1.0, -0.5])
    ref_chosen = torch.tensor([-1.5, -2.0, -3.0])
    ref_rejected = torch.tensor([-2.5, -1.5, -0.5])
    beta = 0.5
    losses, logits = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
    for i in range(3):
        z = beta * ((policy_chosen[i] - ref_chosen[i]) - (policy_rejected[i] - ref_rejected[i])).item()
        assert logits[i].item() == pytest.approx(z)
        assert losses[i].item() == pytest.approx(-math.log(1.0 / (1.0 + math.exp(-z))), rel=1e-6)
    # by hand: z = 0.5 * (0.5 + 0.5) = 0.5 -> log(1 + e^-0.5); z = 0.5 * (0 - 0.5) -> log(1 + e^0.25)
    assert losses[0].item() == pytest.approx(math.log1p(math.exp(-0.5)), rel=1e-6)
    assert losses[1].item() == pytest.approx(math.log1p(math.exp(0.25)), rel=1e-6)
    # policy == reference: every pair costs log 2, whatever beta
    same, zero = dpo_loss(policy_chosen, policy_rejected, policy_chosen, policy_rejected, beta=3.0)
    assert torch.allclose(same, torch.full((3,), math.log(2.0)))
    assert torch.all(zero == 0)


# -- sequence log-probabilities after the inference prompt -----------------------------------
def _manual_logprob(model, tokenizer, linker, mention, name):
    source = tokenizer([linker.inputs.source(mention)], return_tensors="pt")
    prompt = linker.prompt_tokens.prompts([linker.inputs.prompt(mention)])[0]
    target = linker.prompt_tokens.targets([name])[0]
    decoder = torch.tensor([prompt + target[:-1]])
    with torch.no_grad():
        logits = model(
            input_ids=source["input_ids"], attention_mask=source["attention_mask"], decoder_input_ids=decoder
        ).logits
    logp = torch.log_softmax(logits[0].float(), dim=-1)
    # the token after prompt[-1] is target[0]; EOS is the last one predicted
    return sum(logp[len(prompt) - 1 + t, tok].item() for t, tok in enumerate(target)), len(target)


def test_sequence_logprob_is_the_sum_over_name_and_eos_after_the_inference_prompt(micro_model, word_tokenizer):
    kb = random_kb(4, n_concepts=20)
    linker = GenerativeLinker(
        micro_model, word_tokenizer, kb, inputs=BUILDER, decoding=DecodingSettings(num_beams=4, top_k=4)
    )
    _, _, pad = special_ids(micro_model, word_tokenizer)
    mentions = [
        Mention("acute renal failure", ("D0001",), left="the patient had", right="after surgery"),
        Mention("pain", ("D0002",), left="chronic", right=""),
    ]
    names = [kb.names[0], kb.names[5]]
    examples = [TrainingExample(m, n) for m in mentions for n in names]  # prompts of different lengths: padding
    batch = encode_examples(examples, word_tokenizer, linker.prompt_tokens, BUILDER, pad)
    with torch.no_grad():
        got = sequence_logprobs(micro_model, batch)
    for row, ex in enumerate(examples):
        expected, _ = _manual_logprob(micro_model, word_tokenizer, linker, ex.mention, ex.target)
        assert got[row].item() == pytest.approx(expected, abs=1e-4)
    # a pair batch (one encoder pass for both names) scores the same
    pairs = [PreferencePair(m, names[0], names[1]) for m in mentions]
    with torch.no_grad():
        chosen, rejected = pair_logprobs(
            micro_model, encode_pairs(pairs, word_tokenizer, linker.prompt_tokens, BUILDER, pad)
        )
    assert torch.allclose(chosen, got[[0, 2]], atol=1e-4) and torch.allclose(rejected, got[[1, 3]], atol=1e-4)
    # the beam search scores exactly these sequences: score = log p / tokens
    for mention in mentions:
        for cand in linker.link([mention])[0]:
            logp, n_tokens = _manual_logprob(micro_model, word_tokenizer, linker, mention, cand.name)
            assert cand.score == pytest.approx(logp / n_tokens, abs=1e-4)


# -- ANGEL's pair rules ------------------------------------------------------------------------------
def _c(name, *ids):
    return Candidate(tuple(ids), name, 0.0)


def test_pairs_every_correct_candidate_with_every_wrong_one_above_it():
    ranking = [_c("a", "X1"), _c("b", "G"), _c("c", "X2"), _c("d", "G"), _c("e", "X3")]
    assert preference_pairs({"G"}, ranking) == [(1, 0), (3, 0), (3, 2)]


def test_a_correct_top1_pairs_with_the_highest_ranked_wrong_candidate():
    ranking = [_c("a", "G"), _c("b", "G"), _c("c", "X1"), _c("d", "G"), _c("e", "X2")]
    # rank 2 has no wrong candidate above it; rank 4 has rank 3 above it
    assert preference_pairs({"G"}, ranking) == [(0, 2), (3, 2)]
    assert preference_pairs({"G"}, [_c("a", "G"), _c("b", "X")]) == [(0, 1)]


def test_no_pairs_without_a_correct_or_without_a_wrong_candidate():
    assert preference_pairs({"G"}, [_c("a", "X1"), _c("b", "X2")]) == []
    assert preference_pairs({"G"}, [_c("a", "G"), _c("b", "G")]) == []
    assert preference_pairs(set(), [_c("a", "G"), _c("b", "X")]) == []
    assert preference_pairs({"G"}, []) == []


def test_a_name_shared_by_concepts_is_correct_when_any_of_them_is_gold():
    ranking = [_c("shared name", "X1", "G"), _c("b", "X2"), _c("c", "G", "X3")]
    assert preference_pairs({"G"}, ranking) == [(0, 1), (2, 1)]
    # composite gold: a hit on either ID counts
    assert preference_pairs({"G", "H"}, [_c("a", "X"), _c("b", "H")]) == [(1, 0)]


class FakeLinker:
    """Hand-made rankings by mention text."""

    def __init__(self, rankings):
        self.rankings = rankings
        self.calls = []

    def link(self, mentions, top_k=5):
        self.calls.append(len(mentions))
        return [list(self.rankings.get(m.text, []))[:top_k] for m in mentions]


@pytest.fixture()
def pair_kb():
    return KnowledgeBase(
        [
            Concept("D1", ["breast cancer", "mammary carcinoma", "cancer of the breast"]),
            Concept("D2", ["breast cyst"]),
            Concept("D3", ["ovarian cancer", "breast ovarian syndrome"]),
            Concept("D4", ["cancer"]),
            Concept("D5", ["breast cancer"]),  # "breast cancer" is shared by D1 and D5
        ]
    )


def test_mine_pairs_records_ranks_ids_and_statistics(pair_kb):
    rankings = {
        "breast cancers": [_c("breast cancer", "D1", "D5"), _c("breast cyst", "D2"), _c("mammary carcinoma", "D1")],
        "ovary cancer": [_c("cancer", "D4"), _c("breast cyst", "D2"), _c("ovarian cancer", "D3")],
        "mammary tumour": [_c("breast cyst", "D2"), _c("cancer", "D4")],  # gold D1 missing
        "nothing": [_c("cancer", "D4")],
    }
    mentions = [
        Mention("breast cancers", ("D1",)),
        Mention("ovary cancer", ("D3",)),
        Mention("mammary tumour", ("D1",)),
        Mention("nothing", ("-1",)),
    ]
    linker = FakeLinker(rankings)
    pairs, stats = mine_pairs(linker, mentions, top_k=3, chunk_size=2)
    assert linker.calls == [2, 1]  # the no-gold mention is never linked
    assert [(p.mention.text, p.chosen, p.chosen_rank, p.rejected, p.rejected_rank) for p in pairs] == [
        ("breast cancers", "breast cancer", 1, "breast cyst", 2),
        ("breast cancers", "mammary carcinoma", 3, "breast cyst", 2),
        ("ovary cancer", "ovarian cancer", 3, "cancer", 1),
        ("ovary cancer", "ovarian cancer", 3, "breast cyst", 2),
    ]
    assert pairs[0].chosen_ids == ("D1", "D5") and pairs[0].rejected_ids == ("D2",) and pairs[0].kind == "mined"
    assert (stats.mentions, stats.no_gold, stats.top1_correct, stats.gold_in_top_k, stats.gold_missing) == (
        3,
        1,
        1,
        2,
        1,
    )
    assert stats.mined_pairs == 4 and stats.fallback_pairs == 0
    # top_k cuts the ranking before the rules apply
    short, _ = mine_pairs(linker, mentions[:2], top_k=2)
    assert [(p.chosen, p.rejected) for p in short] == [("breast cancer", "breast cyst")]


def test_gold_fallback_pairs_the_best_gold_synonym_with_the_top_wrong_prediction(pair_kb):
    rankings = {"carcinoma of the mamma": [_c("breast cyst", "D2"), _c("cancer", "D4")], "no candidates": []}
    mentions = [
        Mention("carcinoma of the mamma", ("D1",)),
        Mention("no candidates", ("D1",)),
        Mention("two concepts", ("D1", "D3"), composite=True),
    ]
    rankings["two concepts"] = [_c("cancer", "D4")]
    without, stats = mine_pairs(FakeLinker(rankings), mentions, top_k=5)
    assert without == [] and stats.gold_missing == 3
    with_fallback, stats = mine_pairs(FakeLinker(rankings), mentions, top_k=5, gold_fallback=GoldFallback(pair_kb))
    # the mention without candidates has no wrong prediction; the composite one no single gold concept
    assert len(with_fallback) == 1 and stats.fallback_pairs == 1
    pair = with_fallback[0]
    assert (pair.chosen, pair.rejected, pair.chosen_rank, pair.rejected_rank, pair.kind) == (
        "mammary carcinoma",
        "breast cyst",
        None,
        1,
        "gold_fallback",
    )
    assert "D1" in pair.chosen_ids
    with pytest.raises(ValueError, match="pairing"):
        mine_pairs(FakeLinker(rankings), mentions, pairing="best")


def test_pairs_jsonl_round_trip(tmp_path):
    pairs = [
        PreferencePair(
            Mention("CF", ("D3",), left="l", right="r", doc_id="9", start=1, end=3, label="Disease"),
            "cystic fibrosis",
            "cyst",
            2,
            1,
            ("D3",),
            ("D7", "D8"),
        ),
        PreferencePair(Mention("a", ("D1",)), "b", "c", None, 1, ("D1",), ("D2",), kind="gold_fallback"),
    ]
    assert write_pairs_jsonl(pairs, tmp_path / "p" / "pairs.jsonl") == 2
    assert read_pairs_jsonl(tmp_path / "p" / "pairs.jsonl") == pairs
    first = json.loads((tmp_path / "p" / "pairs.jsonl").read_text().splitlines()[0])
    assert {"text", "ids", "left", "right", "chosen", "rejected", "chosen_rank", "rejected_rank", "kind"} <= set(first)


# -- KB negatives (pre-training variant) ---------------------------------------------------------------
def test_kb_negatives_are_the_most_similar_names_of_other_concepts():
    kb = KnowledgeBase(
        [
            Concept("D1", ["heart attack", "myocardial infarction"]),
            Concept("D2", ["heart attack syndrome"]),
            Concept("D3", ["heart disease", "cardiopathy"]),
            Concept("D4", ["liver failure"]),
            Concept("D5", ["heart attack"]),  # shared with D1: never a negative for D1
        ]
    )
    example = TrainingExample(
        Mention("myocardial infarction", ("D1",), left="", right="has synonyms such as x"), "heart attack"
    )
    [pair] = kb_negative_pairs(kb, [example])
    assert (pair.mention, pair.chosen, pair.rejected, pair.kind) == (
        example.mention,
        "heart attack",
        "heart attack syndrome",
        "kb",
    )
    assert pair.rejected_ids == ("D2",) and "D1" in pair.chosen_ids
    # drawn among the 2 most similar other-concept names
    drawn = {kb_negative_pairs(kb, [example], pool=2, seed=s)[0].rejected for s in range(20)}
    assert drawn == {"heart attack syndrome", "heart disease"}
    # every pre-training example: chosen is its target, rejected belongs to another concept only
    examples = pretraining_examples(kb, seed=0)
    pairs = kb_negative_pairs(kb, examples)
    # "liver failure" shares no character 3-gram with another concept's name: no negative
    assert len(pairs) == len(examples) - 1 and "liver failure" not in {p.chosen for p in pairs}
    by_mention = {id(ex.mention): ex for ex in examples}
    for p in pairs:
        ex = by_mention[id(p.mention)]
        assert p.chosen == ex.target and p.rejected in kb.names
        assert not set(p.rejected_ids) & set(ex.mention.ids)


# -- rounds on a micro model ------------------------------------------------------------------------------
def _corpus(kb, n, seed):
    import random

    rng = random.Random(seed)
    mentions = []
    for i in range(n):
        concept = rng.choice(list(kb))
        mentions.append(
            Mention(
                rng.choice(concept.names),
                (concept.id,),
                left=f"case {i} with",
                right="was seen",
                doc_id=str(i),
                start=0,
                end=1,
            )
        )
    return mentions


def test_rounds_keep_the_best_model_and_stop_on_patience(tmp_path, word_tokenizer):
    from spacy_genbioel.models import load_model

    kb = random_kb(1, n_concepts=10)
    model = build_model(MICRO, word_tokenizer, seed=0, dropout=0.0)
    scores = iter([0.5, 0.6, 0.55, 0.58, 0.9])
    snapshots = []

    def evaluate(m, tokenizer):
        snapshots.append({k: v.detach().clone() for k, v in m.state_dict().items()})
        return {"recall@1": next(scores), "recall@5": 1.0}

    config = EngineConfig(max_steps=100, batch_size=4, learning_rate=1e-3, warmup_steps=0, progress=False, log_every=1)
    settings = AngelConfig(
        rounds=5, patience=2, steps_per_round=2, top_k=3, num_beams=3, gold_fallback=True, mentions_per_round=6
    )
    engine = TrainingEngine(model, word_tokenizer, config, inputs=BUILDER, out_dir=tmp_path, evaluate=evaluate)
    trainer = AngelTrainer(engine, kb, settings)
    result = trainer.run(_corpus(kb, 12, 0) * 2)  # duplicates are mined once
    assert [r["round"] for r in result.rounds] == [1, 2, 3]
    assert result.stopped_by == "patience" and result.best_round == 1 and result.best_metric == 0.6
    assert result.baseline_metric == 0.5 and result.step == 6
    assert [r["best"] for r in result.rounds] == [True, False, False]
    assert all(r["mining"]["mentions"] == 6 for r in result.rounds)
    best, _ = load_model(tmp_path / "model")
    for name, value in best.state_dict().items():
        assert torch.equal(value, snapshots[1][name]), name  # after round 1, not the last round
    evals = [r for r in read_log(tmp_path / "train_log.jsonl") if "eval" in r and "event" not in r]
    assert [e["step"] for e in evals] == [0, 2, 4, 6]


def test_angel_command_end_to_end(tmp_path, word_tokenizer):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    kb = random_kb(2, n_concepts=12)
    kb.to_jsonl(tmp_path / "kb.jsonl")
    write_examples_jsonl(((m, m.text) for m in _corpus(kb, 24, 0)), tmp_path / "train.jsonl")
    write_examples_jsonl(((m, None) for m in _corpus(kb, 8, 1)), tmp_path / "dev.jsonl")
    save_model(build_model(MICRO, word_tokenizer, seed=3, dropout=0.1), word_tokenizer, tmp_path / "start")
    cfg = tmp_path / "angel.cfg"
    cfg.write_text(
        '[training]\nmax_steps = 100\nbatch_size = 8\nlearning_rate = 0.002\nwarmup_steps = 0\nscheduler = "constant"\n'
        "progress = false\nlog_every = 1\n\n[inputs]\ncontext_words = 8\n\n[data]\neval_beams = 3\n\n"
        "[angel]\nrounds = 1\nsteps_per_round = 12\ntop_k = 4\nnum_beams = 4\ngold_fallback = true\n",
        encoding="utf8",
    )
    out = tmp_path / "angel"
    r = CliRunner().invoke(
        app,
        [
            "angel",
            "--model",
            str(tmp_path / "start"),
            "--train",
            str(tmp_path / "train.jsonl"),
            "--dev",
            str(tmp_path / "dev.jsonl"),
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--config",
            str(cfg),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--kb-negatives",
            "6",
            "--angel.beta",
            "0.5",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (out / "model" / "model.safetensors").exists() and (out / "model" / "tokenizer.json").exists()
    assert (out / "curve.png").exists() and "beta = 0.5" in (out / "config.cfg").read_text()
    result = json.loads((out / "result.json").read_text())
    assert result["step"] == 12 and len(result["rounds"]) == 1
    pairs = read_pairs_jsonl(out / "pairs" / "round_001.jsonl")
    kinds = {p.kind for p in pairs}
    assert "kb" in kinds and kinds <= {"mined", "gold_fallback", "kb"}
    assert sum(p.kind == "kb" for p in pairs) == 6
    log = read_log(out / "train_log.jsonl")
    assert log[0]["event"] == "start" and log[0]["angel"]["beta"] == 0.5 and log[-1]["event"] == "end"
    steps = [r for r in log if "loss" in r and "round" in r]
    assert [s["step"] for s in steps] == list(range(1, 13))
    # dropout off: the policy equals the reference at the first step
    assert steps[0]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    [round_record] = [r for r in log if r.get("event") == "round"]
    assert round_record["pairs"] == len(pairs) and set(round_record["eval"]) == {"recall@1", "recall@5"}
    assert round_record["mining"]["kb_pairs"] == 6
    # training moved the model towards the chosen names of its pairs
    assert round_record["margin_after"] > round_record["margin_before"] + 1.0
    assert round_record["preference_accuracy_after"] > round_record["preference_accuracy_before"]
    assert round_record["reward_accuracy_after"] > 0.8 and round_record["dpo_loss_after"] < math.log(2)


def test_angel_configs_load():
    from spacy_genbioel.training.settings import load_stage_config

    for preset in ("tiny", "base", "large"):
        stage = load_stage_config(ROOT / "configs" / f"angel_{preset}.cfg", {"angel.kb_negatives": 3})
        settings = stage.angel
        assert settings.kb_negatives == 3 and settings.beta == 0.1 and settings.top_k == 5
    large = load_stage_config(ROOT / "configs" / "angel_large.cfg")
    assert (large.training.learning_rate, large.training.batch_size) == (1e-5, 64)
    assert large.angel.num_beams == 10
    with pytest.raises(ValueError, match="Unknown \\[angel\\] settings"):
        AngelConfig.from_dict({"betta": 0.2})
    # the stage loader checks [angel] with the other sections, naming the file
    with pytest.raises(ValueError, match=r"angel_tiny.cfg: Unknown \[angel\] settings: betta"):
        load_stage_config(ROOT / "configs" / "angel_tiny.cfg", {"angel.betta": 0.2})
