"""Which retrievers a fusion reads (fit-fusion --alternative, training.fusion_fit.choose_sources), the models
its retrievers travel with (FusionModel.bundled), and per-retriever model directories of a candidate union."""

import json
import random
import shutil

import pytest
import spacy
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.decoding.candidates import model_for
from spacy_genbioel.linking.reranking.fusion import FusionModel
from spacy_genbioel.training.fusion_fit import FusionExample, choose_sources
from spacy_genbioel.ty import Candidate

runner = CliRunner()
N_CONCEPTS = 20


def kb() -> KnowledgeBase:
    return KnowledgeBase([Concept(f"C{i}", [f"concept {i} name"]) for i in range(N_CONCEPTS)])


def lists_for(gold: str, rng: random.Random, seen_by_tfidf: bool):
    """The generator ranks gold first or second at random; "tfidf" ranks it first when it sees it;
    "dense" never has it."""
    others = [f"C{j}" for j in rng.sample(range(N_CONCEPTS), 6) if f"C{j}" != gold][:4]
    first, second = (gold, others[0]) if rng.random() < 0.5 else (others[0], gold)
    gen = [Candidate((first,), "a", -0.2), Candidate((second,), "g", -0.6), Candidate((others[1],), "b", -1.0)]
    tfidf = (
        [Candidate((gold,), "g", 0.9), Candidate((others[2],), "c", 0.5)]
        if seen_by_tfidf
        else [Candidate((others[2],), "c", 0.9), Candidate((gold,), "g", 0.5)]
    )
    dense = [Candidate((others[3],), "d", 0.8), Candidate((others[2],), "c", 0.7)]
    return {"genbioel": gen, "tfidf": tfidf, "dense": dense}


def folds(n=60, seed=0):
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        gold = f"C{rng.randrange(N_CONCEPTS)}"
        examples.append(FusionExample(f"mention {i}", frozenset({gold}), lists_for(gold, rng, i % 4 != 0)))
    return [examples[: n // 2], examples[n // 2 :]]


def test_the_retriever_that_helps_on_held_out_folds_is_chosen():
    sources, report = choose_sources(folds(), kb(), [["dense"], ["tfidf"], ["tfidf", "dense"]], depth=3)
    assert sources == ["genbioel", "tfidf"]  # tfidf alone ties tfidf+dense: the one listed first wins
    assert set(report) == {"dense", "tfidf", "tfidf+dense"}
    assert report["tfidf"]["recall@1"] > report["dense"]["recall@1"]
    assert report["tfidf"]["recall@1"] >= report["tfidf+dense"]["recall@1"]
    assert all(0.0 <= r["recall@1"] <= r["recall@5"] <= 1.0 for r in report.values())


def test_a_tie_goes_to_the_alternative_listed_first():
    same = [
        [FusionExample(ex.text, ex.gold, {**ex.lists, "exact": ex.lists["tfidf"]}) for ex in fold] for fold in folds()
    ]
    assert choose_sources(same, kb(), [["exact"], ["tfidf"]])[0] == ["genbioel", "exact"]
    assert choose_sources(same, kb(), [["tfidf"], ["exact"]])[0] == ["genbioel", "tfidf"]


def test_choosing_needs_two_folds_and_an_alternative():
    with pytest.raises(ValueError, match="2 folds"):
        choose_sources(folds()[:1], kb(), [["tfidf"]])
    with pytest.raises(ValueError, match="no alternative"):
        choose_sources(folds(), kb(), [])


def write_predictions(path, examples, source):
    records = [
        {
            "doc_id": f"d{i}",
            "start": 0,
            "end": 1,
            "text": ex.text,
            "gold": sorted(ex.gold),
            "hit_rank": None,
            "candidates": [[list(c.ids), c.name, c.score] for c in ex.lists[source]],
        }
        for i, ex in enumerate(examples)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf8")
    return str(path)


def test_fit_fusion_command_keeps_the_chosen_retrievers(tmp_path):
    kb().to_jsonl(tmp_path / "kb.jsonl")
    parts = folds()
    args = ["fit-fusion", "--kb", str(tmp_path / "kb.jsonl"), "--out", str(tmp_path / "fusion.json"), "--depth", "3"]
    for source in ("genbioel", "tfidf", "dense"):
        files = [write_predictions(tmp_path / f"{source}{i}.jsonl", fold, source) for i, fold in enumerate(parts)]
        args += ["--source", f"{source}={','.join(files)}"]
    result = runner.invoke(
        app, [*args, "--alternative", "dense", "--alternative", "tfidf", "--retriever-model", "dense=some/dir"]
    )
    assert result.exit_code == 0, result.output
    model = FusionModel.load(tmp_path / "fusion.json")
    assert model.sources == ["genbioel", "tfidf"] and model.retrievers == {"tfidf": {}}
    assert set(model.fit["choice"]) == {"dense", "tfidf"} and "Sources chosen" in result.output
    result = runner.invoke(app, [*args, "--alternative", "tfidf,bm25"])
    assert result.exit_code != 0 and "bm25" in result.output


def test_bundled_copies_retriever_models_and_load_finds_them(tmp_path):
    encoder = tmp_path / "trained" / "rescnn"
    encoder.mkdir(parents=True)
    (encoder / "rescnn_config.json").write_text("{}", encoding="utf8")
    model = FusionModel(
        ["genbioel", "tfidf", "rescnn"], [0.0] * 14, retrievers={"tfidf": {}, "rescnn": {"model": str(encoder)}}
    )
    folder = tmp_path / "pipeline"
    (folder / "retrievers" / "dense").mkdir(parents=True)  # left from an earlier save: no longer read
    bundled = model.bundled(folder)
    bundled.save(folder / "fusion.json")
    assert bundled.retrievers == {"tfidf": {}, "rescnn": {"model": "retrievers/rescnn"}}
    assert (folder / "retrievers" / "rescnn" / "rescnn_config.json").is_file()
    assert not (folder / "retrievers" / "dense").exists()
    shutil.rmtree(tmp_path / "trained")
    loaded = FusionModel.load(folder / "fusion.json")
    assert loaded.retrievers["rescnn"]["model"] == str(folder / "retrievers" / "rescnn")
    assert loaded.bundled(folder).retrievers == bundled.retrievers  # saved again where it already is
    gone = FusionModel(["genbioel", "rescnn"], [0.0] * 10, retrievers={"rescnn": {"model": "not/here"}})
    assert gone.bundled(folder).retrievers == {"rescnn": {"model": "not/here"}}  # nothing to copy: kept as given


def test_each_retriever_of_a_union_gets_its_own_model():
    assert model_for("rescnn", "rescnn=a/b") == "a/b"
    assert model_for("genbioel.rescnn_retriever.v1", "dense=d,rescnn=r") == "r"
    assert model_for("dense", "rescnn=a/b") is None
    assert model_for("dense", "plain/dir") == "plain/dir" and model_for("dense", None) is None
    assert model_for("dense", "not_a_retriever=x") == "not_a_retriever=x"  # a directory whose name has "="


def test_a_packaged_pipeline_links_with_its_fusions_trained_rescnn(
    tmp_path, micro_model, word_tokenizer, wordpiece_dir, monkeypatch
):
    from conftest import random_kb

    from spacy_genbioel.models import save_model
    from spacy_genbioel.retrieval.rescnn import ResCNNArch, ResCNNEncoder
    from spacy_genbioel.training.package import EntitySource, package

    monkeypatch.setenv("SPACY_GENBIOEL_CACHE", str(tmp_path / "cache"))
    arch = ResCNNArch(hidden=8, blocks=1, filters=4, kernel_sizes=(1, 3), dropout=0.0, max_length=8)
    encoder_dir = ResCNNEncoder.from_wordpieces(wordpiece_dir, arch, seed=0).save(tmp_path / "rescnn")
    names = random_kb(1, n_concepts=30)
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    names.to_jsonl(tmp_path / "kb.jsonl")
    fusion = FusionModel(
        ["genbioel", "tfidf", "rescnn"],
        [0.5, 0.2, 1.0, 0.5, 0.5, 1.0, 1.0, 0.5, 0.5, 1.0, 1.0, 0.5, 2.0, 0.0],
        depth=3,
        retrievers={"tfidf": {}, "rescnn": {"model": str(encoder_dir)}},
    )
    fusion.save(tmp_path / "fusion.json")
    out = package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg",
        entities=EntitySource(entity_label="Disease", abbreviations=False),
        settings={"num_beams": 3, "top_k": 3, "reranker.fusion": str(tmp_path / "fusion.json")},
    )
    shutil.rmtree(encoder_dir)  # the pipeline travels with its own copy
    (tmp_path / "fusion.json").unlink()
    nlp = spacy.load(out)
    component = nlp.get_pipe("genbioel")
    assert component.fusion.retrievers["rescnn"]["model"] == str(out / "genbioel" / "retrievers" / "rescnn")
    doc = nlp(f"We saw {names.names[0]} and later {names.names[7]} in the clinic .")
    assert doc.ents and all(ent._.kb_id in names for ent in doc.ents)
    assert component.stats["beam"] == len(doc.ents)
