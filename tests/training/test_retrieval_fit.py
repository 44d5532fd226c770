"""Fitting the retrieval-only fusion (:mod:`spacy_genbioel.training.retrieval_fit`, ``fit-retrieval``): held-out
predictions never see their own mention in the dictionary, the fit is retrieval-only with an early step, and
the command writes a file the component links with."""

import json

import pytest
import spacy
from conftest import random_kb
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.reranking.fusion import FusionModel
from spacy_genbioel.retrieval.registry import get_retriever
from spacy_genbioel.training.retrieval_fit import FitCorpus, crossfit_retrieval, fit_retrieval_fusion, fold_of_mentions
from spacy_genbioel.ty import Mention


def corpus(n_docs=12, seed=0):
    kb = random_kb(seed, n_concepts=30)
    concepts = list(kb)
    mentions = []
    for d in range(n_docs):
        for j in range(3):
            concept = concepts[(d * 3 + j) % len(concepts)]
            name = concept.names[0]
            # a paraphrase: the words of a name reversed, so it is not itself a KB name
            mentions.append(Mention(" ".join(reversed(name.split())) + f" x{d}", ids=(concept.id,), doc_id=f"doc{d}"))
    return FitCorpus("toy", kb, mentions)


class Recording:
    """TF-IDF that records the names of each KB it is built on."""

    def __init__(self):
        self.kbs = []

    def __call__(self, source, kb):
        self.kbs.append(kb)
        return get_retriever("tfidf", kb)


@given(st.lists(st.sampled_from([f"d{i}" for i in range(8)]), min_size=4, max_size=40), st.integers(2, 4))
@settings(max_examples=40, deadline=None)
def test_a_document_is_never_on_both_sides_of_a_fold(doc_ids, k):
    docs = sorted(set(doc_ids))
    if len(docs) < k:
        return
    mentions = [Mention(f"m{i}", doc_id=d) for i, d in enumerate(doc_ids)]
    folds = fold_of_mentions(mentions, k)
    by_doc = {}
    for m, f in zip(mentions, folds):
        by_doc.setdefault(m.doc_id, set()).add(f)
    assert all(len(f) == 1 for f in by_doc.values()) and set(folds) <= set(range(k))


def test_phrases_without_documents_fold_by_text():
    mentions = [Mention("Head ache"), Mention("head  ache"), Mention("nausea"), Mention("rash")]
    folds = fold_of_mentions(mentions, 2)
    assert folds[0] == folds[1]


def test_held_out_mentions_are_never_names_of_their_own_fold_kb():
    data = corpus()
    record = Recording()
    groups = crossfit_retrieval(data, ["tfidf"], record, k=2)
    assert len(groups["plain"]) == len(data.mentions) == len(groups["aug"])
    plain_kb, *fold_kbs = record.kbs
    assert plain_kb is data.kb and len(fold_kbs) == 2
    folds = fold_of_mentions(data.mentions, 2)
    for fold, kb in enumerate(fold_kbs):
        for m, f in zip(data.mentions, folds):
            assert bool(kb.ids_for_name(m.text)) == (f != fold)  # the other folds' mentions are names, its own are not
    assert all(ex.lists["genbioel"] == [] for ex in groups["aug"])
    # the augmented fold's retrievers find the other folds' paraphrases: priors come with them
    assert any(kb[c.id].prior for kb in fold_kbs for c in data.kb if kb[c.id].prior)


def test_excluded_pairs_and_mentions_without_gold_are_left_out():
    data = corpus()
    data.mentions.append(Mention("no concept", ids=("-1",), doc_id="doc0"))
    data.exclude = frozenset({(data.mentions[0].text.lower(), frozenset(data.mentions[0].ids))})
    groups = crossfit_retrieval(data, ["tfidf"], Recording(), variants=["plain"])
    texts = [ex.text for ex in groups["plain"]]
    assert data.mentions[0].text not in texts and "no concept" not in texts and len(texts) == len(data.mentions) - 2


def test_the_fit_is_retrieval_only_with_an_early_step():
    data = corpus(n_docs=30)
    groups = {
        f"toy/{v}": ex
        for v, ex in crossfit_retrieval(data, ["tfidf", "exact"], lambda s, kb: get_retriever(s, kb)).items()
    }
    model = fit_retrieval_fusion(
        groups, ["tfidf", "exact"], defer=["exact"], provenance={"splits": {"toy": "train.txt"}}
    )
    assert model.retrieval_only and model.sources == ["genbioel", "tfidf", "exact"]
    assert all(w == 0 for f, w in zip(model.features, model.weights) if f.startswith("genbioel"))
    assert model.cascade["early"]["defer"] == ["exact"]
    # the early step keeps every group within the recall budget on the fit data, not only the pooled examples
    for report in model.cascade["report"].values():
        assert report["recall@1_with_early"] >= report["recall@1"] - 0.002 - 1e-9
    assert set(model.cascade) == {"early", "targets", "report"}  # no generator: no settle or beam thresholds
    assert set(model.fit["groups"]) == {"toy/plain", "toy/aug"} and "genbioel" not in model.fit["recall"]
    assert model.fit["provenance"]["splits"] == {"toy": "train.txt"}
    assert FusionModel.from_dict(json.loads(json.dumps(model.to_dict()))).to_dict() == model.to_dict()


def test_fit_retrieval_command_writes_a_fusion_the_component_links_with(tmp_path):
    kb = KnowledgeBase(
        [
            Concept(f"C{i}", [name])
            for i, name in enumerate(
                ["headache", "nausea", "skin rash", "muscle pain", "fatigue", "insomnia", "dizziness", "joint pain"]
            )
        ]
    )
    kb.to_jsonl(tmp_path / "kb.jsonl")
    phrases = [
        ("C0", "head ache"),
        ("C0", "my head hurts"),
        ("C1", "feel sick"),
        ("C1", "nauseous"),
        ("C2", "rash on skin"),
        ("C2", "itchy rash"),
        ("C3", "muscles ache"),
        ("C3", "sore muscles"),
        ("C4", "tired"),
        ("C4", "so tired all day"),
        ("C5", "cannot sleep"),
        ("C5", "no sleep"),
        ("C6", "dizzy"),
        ("C6", "feeling dizzy"),
        ("C7", "joints hurt"),
        ("C7", "pain in joints"),
    ] * 2
    (tmp_path / "train.txt").write_text(
        "".join(f"{cid}\tname\t{text}{i % 3 * ' '}\n" for i, (cid, text) in enumerate(phrases))
    )
    (tmp_path / "valid.txt").write_text("C4\tname\ttired\n")
    out = tmp_path / "fusion.json"
    result = CliRunner().invoke(
        app,
        [
            "fit-retrieval",
            "--train",
            f"toy={tmp_path / 'train.txt'}",
            "--kb",
            f"toy={tmp_path / 'kb.jsonl'}",
            "--format",
            "toy=askapatient",
            "--exclude",
            f"toy={tmp_path / 'valid.txt'}",
            "--sources",
            "tfidf,exact",
            "--defer",
            "exact",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    model = FusionModel.load(out)
    assert model.retrieval_only and model.fit["provenance"]["splits"] == {"toy": str(tmp_path / "train.txt")}
    assert model.fit["mentions"] == 2 * (len(phrases) - 2)  # both variants, "tired" excluded (twice)
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "ADR", "pattern": "joint pain"}])
    nlp.add_pipe("genbioel", config={"kb": str(tmp_path / "kb.jsonl"), "reranker": {"fusion": str(out)}})
    assert [e._.kb_id for e in nlp("Some joint pain today").ents] == ["C7"]


def test_fit_retrieval_refuses_a_split_without_its_kb(tmp_path):
    result = CliRunner().invoke(
        app, ["fit-retrieval", "--train", "a=x.txt", "--kb", "b=kb.jsonl", "--out", str(tmp_path / "f.json")]
    )
    assert result.exit_code != 0 and "one --train and one --kb per corpus" in result.output


def test_read_splits_sets_the_data_folder_and_names_a_bad_block(tmp_path):
    from spacy_genbioel.training.retrieval_fit import SplitSpec, read_splits

    (tmp_path / "ok.cfg").write_text(
        '[paths]\ndata = "nowhere"\n\n[splits]\n\n[splits.toy]\ntrain = "${paths.data}/train.txt"\n'
        'format = "askapatient"\nkb_format = "jsonl"\nkb_sources = ["${paths.data}/kb.jsonl"]\n'
        'exclude = ["${paths.data}/valid.txt"]\n'
    )
    [spec] = read_splits(tmp_path / "ok.cfg", data_dir=tmp_path)
    assert spec == SplitSpec(
        "toy",
        f"{tmp_path}/train.txt",
        "askapatient",
        kb_format="jsonl",
        kb_sources=(f"{tmp_path}/kb.jsonl",),
        exclude=(f"{tmp_path}/valid.txt",),
    )
    (tmp_path / "bad.cfg").write_text('[splits]\n\n[splits.toy]\ntrain = "t.txt"\nkb = "kb.jsonl"\ncorpus = "x"\n')
    with pytest.raises(ValueError, match=r"\[splits.toy\] has unknown keys \['corpus'\]"):
        read_splits(tmp_path / "bad.cfg")
    with pytest.raises(ValueError, match="give a kb file or kb_sources"):
        SplitSpec("toy", "t.txt")
    with pytest.raises(ValueError, match="kb_sources needs kb_format"):
        SplitSpec("toy", "t.txt", kb_sources=("a",))


def test_the_shipped_split_configs_name_training_splits_only():
    from pathlib import Path

    from spacy_genbioel.training.retrieval_fit import read_splits

    for path in sorted((Path(__file__).resolve().parents[2] / "configs" / "retrieval").glob("*.cfg")):
        for spec in read_splits(path, data_dir="/data"):
            assert (
                "dev" not in spec.train.lower()
                and "test" not in spec.train.lower()
                and "validation" not in spec.train.lower()
            )
            assert spec.kb_sources and spec.kb_format
