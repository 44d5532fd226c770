"""The whole loop learns: a tiny model trained for at most 60 s of CPU time
links exact-synonym mentions of a small synthetic KB."""
import torch

from spacy_genbioel.linking.decoder import GenerativeLinker

from spacy_genbioel.linking.settings import DecodingSettings
from spacy_genbioel.ty import Mention
from spacy_genbioel.models import build_model, train_tokenizer
from spacy_genbioel.training import TrainConfig, kb_name_examples, train_seq2seq

from conftest import random_kb


def test_tiny_model_learns_exact_synonyms_in_a_minute_of_cpu():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # CPU time then measures work, not threads spinning on a busy machine
    try:
        torch.manual_seed(0)
        kb = random_kb(7, n_concepts=40)
        tokenizer = train_tokenizer(kb.names, vocab_size=500, min_frequency=1)
        model = build_model("tiny", tokenizer, seed=0)
        examples = kb_name_examples(kb, synonyms_per_name=0)
        config = TrainConfig(max_steps=200, max_seconds=60, budget_clock="cpu", batch_size=32, learning_rate=1e-3,
                             warmup_steps=20, label_smoothing=0.0, seed=0)
        losses = train_seq2seq(model, tokenizer, examples, config)
        linker = GenerativeLinker(model, tokenizer, kb, decoding=DecodingSettings(num_beams=3, top_k=1, batch_size=64))
        mentions = [Mention(name, (cid,)) for cid in kb.concept_ids for name in kb.names_of(cid)]
        results = linker.link(mentions)
    finally:
        torch.set_num_threads(threads)
    recall = sum(bool(r) and bool(set(r[0].ids) & set(m.ids)) for m, r in zip(mentions, results)) / len(mentions)
    assert recall >= 0.9, (recall, len(losses))
