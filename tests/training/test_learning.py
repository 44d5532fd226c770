"""The whole loop learns: a tiny model trained for at most 60 s of CPU time
links exact-synonym mentions of a small synthetic KB."""

import torch
from conftest import random_kb

from spacy_genbioel.linking.decoding.decoder import GenerativeLinker
from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.models import build_model, train_tokenizer
from spacy_genbioel.training import TrainConfig, kb_name_examples, train_seq2seq
from spacy_genbioel.ty import Mention


def test_tiny_model_learns_exact_synonyms_in_a_minute_of_cpu():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU time then measures work, not threads spinning on a busy machine
    try:
        torch.manual_seed(0)
        kb = random_kb(7, n_concepts=40)
        tokenizer = train_tokenizer(kb.names, vocab_size=500, min_frequency=1)
        model = build_model("tiny", tokenizer, seed=0)
        examples = kb_name_examples(kb, synonyms_per_name=0)
        config = TrainConfig(
            max_steps=200,
            max_seconds=60,
            budget_clock="cpu",
            batch_size=32,
            learning_rate=1e-3,
            warmup_steps=20,
            label_smoothing=0.0,
            seed=0,
        )
        losses = train_seq2seq(model, tokenizer, examples, config)
        linker = GenerativeLinker(model, tokenizer, kb, decoding=DecodingSettings(num_beams=3, top_k=1, batch_size=64))
        mentions = [Mention(name, (cid,)) for cid in kb.concept_ids for name in kb.names_of(cid)]
        results = linker.link(mentions)
    finally:
        torch.set_num_threads(threads)
    recall = sum(bool(r) and bool(set(r[0].ids) & set(m.ids)) for m, r in zip(mentions, results)) / len(mentions)
    assert recall >= 0.9, (recall, len(losses))


def test_stop_after_ends_the_loop_early_on_the_longer_schedule():
    """``stop_after`` (the demo's step count) stops the loop, the learning rate still following ``max_steps``."""
    from spacy_genbioel.training.loop import lr_factor
    from spacy_genbioel.training.settings import EngineConfig

    kb = random_kb(3, n_concepts=10)
    tokenizer = train_tokenizer(kb.names, vocab_size=300, min_frequency=1)
    examples = kb_name_examples(kb, synonyms_per_name=0)
    runs = {}
    for name, max_steps, stop in (("stopped", 1000, 3), ("short", 3, None)):
        torch.manual_seed(0)
        model = build_model("tiny", tokenizer, seed=0)
        config = TrainConfig(max_steps=max_steps, batch_size=4, warmup_steps=2, seed=0)
        runs[name] = train_seq2seq(model, tokenizer, examples, config, stop_after=stop)
    assert len(runs["stopped"]) == len(runs["short"]) == 3
    assert runs["stopped"][:2] == runs["short"][:2]  # the same warm-up; then the short run's schedule decays
    long = EngineConfig(
        max_steps=1000, warmup_steps=2, scheduler="clipped_cosine", min_lr_ratio=0.05, schedule_horizon="steps"
    )
    assert lr_factor(long, 2) > 0.99  # what the stopped run's third step used
