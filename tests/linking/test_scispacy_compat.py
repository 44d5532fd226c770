"""What scispacy users expect from the component (issue 18, items 1-3): ``span._.kb_ents``
and ``linker.kb.cui_to_entity``, an abstention threshold, several linkers in one pipeline."""

import logging
import shutil

import pytest
import spacy
from conftest import assert_same_links, random_kb
from spacy.tokens import Span

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.linking.settings import OutputSettings, nested_overrides
from spacy_genbioel.models import save_model

PATTERNS = [
    {"label": "Disease", "pattern": p} for p in ("renal failure", "cystic fibrosis", "lung cancer", "acute pain")
]
TEXTS = [
    "The patient had renal failure and cystic fibrosis .",
    "No entities here .",
    "acute pain with lung cancer and renal failure again",
]
MESH = {"kb_id_attr": "mesh_id", "candidates_attr": "mesh_candidates", "ents_attr": "mesh_ents", "write_kb_id": False}


@pytest.fixture()
def resources(tmp_path, micro_model, word_tokenizer):
    """A micro model and two micro KBs with disjoint IDs (D... and M:...)."""
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    kb = random_kb(1, n_concepts=30)
    kb.to_jsonl(tmp_path / "kb.jsonl")
    other = KnowledgeBase([Concept(f"M:{c.id}", c.names, f"definition of {c.id}", ["T047"]) for c in random_kb(2, 25)])
    other.to_jsonl(tmp_path / "mesh.jsonl")
    return tmp_path, kb, other


def make_nlp(tmp_path, linkers=(("genbioel", "kb.jsonl", {}),)):
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns(PATTERNS)
    for name, kb_file, output in linkers:
        nlp.add_pipe(
            "genbioel",
            name=name,
            config={
                "model": str(tmp_path / "model"),
                "kb": str(tmp_path / kb_file),
                "device": "cpu",
                "decoding": {"num_beams": 3, "top_k": 3},
                "output": output,
            },
        )
    return nlp


def results(doc, attrs=("kb_id", "kb_candidates", "kb_ents")):
    return [(e.text, e.kb_id_, *[e._.get(a) for a in attrs]) for e in doc.ents]


# -- item 1: kb_ents and linker.kb ---------------------------------------------------------------------------
def test_kb_ents_are_scispacy_shaped_and_agree_with_the_candidates(resources):
    tmp_path, kb, _ = resources
    doc = make_nlp(tmp_path)(TEXTS[0])
    assert doc.ents
    for ent in doc.ents:
        ents = ent._.kb_ents
        assert 1 <= len(ents) <= 3 and all(isinstance(cid, str) and isinstance(score, float) for cid, score in ents)
        assert len({cid for cid, _ in ents}) == len(ents)  # one entry per concept
        assert [s for _, s in ents] == sorted((s for _, s in ents), reverse=True)  # best first
        assert ents[0] == (ent._.kb_id, ent._.kb_candidates[0][2]) and all(cid in kb for cid, _ in ents)
        best = {}
        for cid, _, score in ent._.kb_candidates:
            best.setdefault(cid, score)
        assert all(best[cid] == score for cid, score in ents if cid in best)


def test_code_written_for_scispacy_runs_unchanged(resources, capsys):
    tmp_path, kb, _ = resources
    nlp = make_nlp(tmp_path)
    doc = nlp(TEXTS[0])
    # scispacy's README, verbatim but for the pipe name (and _score: the README leaves it unused)
    linker = nlp.get_pipe("genbioel")
    for ent in doc.ents:
        for cui, _score in ent._.kb_ents:
            print(linker.kb.cui_to_entity[cui])
    printed = capsys.readouterr().out
    top = doc.ents[0]._.kb_ents[0][0]
    assert f"CUI: {top}, Name: {kb.preferred_name(top)}\n" in printed and "Aliases: (total: " in printed
    scispacy_utils = pytest.importorskip("scispacy.linking_utils")
    ours = linker.kb.cui_to_entity[top]
    theirs = scispacy_utils.Entity(*ours)
    assert ours._fields == theirs._fields and repr(ours) == repr(theirs)


def test_linker_kb_views_the_kb_without_copying_it(resources):
    tmp_path, kb, _ = resources
    view = make_nlp(tmp_path).get_pipe("genbioel").kb
    cid = kb.concept_ids[3]
    entity = view.cui_to_entity[cid]
    concept = kb[cid]
    assert entity.concept_id == cid and entity.canonical_name == concept.names[0]
    assert entity.aliases == concept.names[1:] and entity.types == [] and entity.definition is None
    assert len(view.cui_to_entity) == len(kb) and cid in view.cui_to_entity and "nope" not in view.cui_to_entity
    assert list(view.cui_to_entity) == kb.concept_ids
    with pytest.raises(KeyError):
        view.cui_to_entity["nope"]
    assert not view.alias_to_cuis.built  # indexed only when asked for
    for name in concept.names:
        assert cid in view.alias_to_cuis[name]
    assert view.alias_to_cuis.built and view.knowledge_base.checksum() == kb.checksum()


def test_types_and_definitions_reach_the_entity(resources):
    tmp_path, _, other = resources
    view = make_nlp(tmp_path, [("genbioel", "mesh.jsonl", {})]).get_pipe("genbioel").kb
    entity = view.cui_to_entity["M:D0003"]
    assert entity.types == ["T047"] and entity.definition == "definition of D0003"


# -- item 2: abstention ------------------------------------------------------------------------------------
def test_threshold_abstains_below_and_keeps_the_candidates(resources):
    tmp_path, _, _ = resources
    free = [results(d) for d in make_nlp(tmp_path).pipe(TEXTS)]
    tops = sorted(ent[4][0][1] for doc in free for ent in doc)
    threshold = tops[len(tops) // 2]  # a score some span has: ties link
    nlp = make_nlp(tmp_path, [("genbioel", "kb.jsonl", {"threshold": threshold})])
    assert nlp.get_pipe("genbioel").output.threshold == threshold
    n_abstained = 0
    for before, doc in zip(free, nlp.pipe(TEXTS)):
        for (_text, _, kb_id, cands, ents), ent in zip(before, doc.ents):
            assert ent._.kb_candidates == cands and ent._.kb_ents == ents  # the candidates stay
            if ents[0][1] >= threshold:
                assert ent._.kb_id == kb_id == ent.kb_id_
            else:
                n_abstained += 1
                assert ent._.kb_id is None and ent.kb_id_ == ""
    assert 0 < n_abstained < len(tops)
    everything = make_nlp(tmp_path, [("genbioel", "kb.jsonl", {"threshold": 0.5})])(
        TEXTS[0]
    )  # above any log-probability
    assert all(e._.kb_id is None and e._.kb_ents for e in everything.ents)


def test_a_pipeline_saved_before_the_output_block_loads_with_threshold_off(resources, tmp_path_factory):
    tmp_path, _, _ = resources
    nlp = make_nlp(tmp_path)
    expected = [results(d) for d in nlp.pipe(TEXTS)]
    out = tmp_path_factory.mktemp("old") / "nlp"
    nlp.to_disk(out)
    config = (out / "config.cfg").read_text()
    start = config.index("[components.genbioel.output]")
    end = config.index("\n[", start + 1)
    (out / "config.cfg").write_text(config[:start] + config[end + 1 :])
    assert "genbioel.output" not in (out / "config.cfg").read_text()
    loaded = spacy.load(out)
    assert loaded.get_pipe("genbioel").output == OutputSettings()
    assert [results(d) for d in loaded.pipe(TEXTS)] == expected


def test_threshold_travels_with_a_saved_pipeline(resources, tmp_path_factory):
    tmp_path, _, _ = resources
    nlp = make_nlp(tmp_path, [("genbioel", "kb.jsonl", {"threshold": -2.5})])
    out = tmp_path_factory.mktemp("saved") / "nlp"
    nlp.to_disk(out)
    assert spacy.load(out).get_pipe("genbioel").output.threshold == -2.5


def test_output_block_validates_and_is_reachable_by_name():
    assert nested_overrides({"threshold": -1.5, "ents_attr": "x"}) == {"output": {"threshold": -1.5, "ents_attr": "x"}}
    with pytest.raises(ValueError, match="finite"):
        OutputSettings(threshold=float("nan"))
    with pytest.raises(ValueError, match="identifier"):
        OutputSettings(kb_id_attr="mesh id")
    with pytest.raises(ValueError, match="must differ"):
        OutputSettings(kb_id_attr="x", ents_attr="x")
    assert OutputSettings(threshold=-1.0).links(-1.0) and not OutputSettings(threshold=-1.0).links(-1.01)
    assert OutputSettings().links(-1e9)


# -- item 3: several linkers in one pipeline --------------------------------------------------------------------
def two_linkers(tmp_path):
    return make_nlp(tmp_path, [("genbioel", "kb.jsonl", {}), ("genbioel_mesh", "mesh.jsonl", MESH)])


def check_both(docs, kb, other):
    n = 0
    for doc in docs:
        for ent in doc.ents:
            n += 1
            assert ent._.kb_id in kb and ent.kb_id_ == ent._.kb_id  # the first linker owns span.kb_id_
            assert ent._.kb_candidates[0][0] == ent._.kb_id and ent._.kb_ents[0][0] == ent._.kb_id
            assert ent._.mesh_id in other and ent._.mesh_id.startswith("M:")
            assert ent._.mesh_candidates[0][0] == ent._.mesh_id and ent._.mesh_ents[0][0] == ent._.mesh_id
    assert n >= 4
    return [results(d, ("kb_id", "kb_candidates", "kb_ents", "mesh_id", "mesh_candidates", "mesh_ents")) for d in docs]


def test_two_linkers_with_different_kbs_do_not_clobber_each_other(resources, tmp_path_factory, caplog):
    tmp_path, kb, other = resources
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        nlp = two_linkers(tmp_path)
    assert "overwrites" not in caplog.text
    called = check_both([nlp(t) for t in TEXTS], kb, other)
    piped = check_both(list(nlp.pipe(TEXTS, batch_size=2)), kb, other)
    assert_same_links(piped, called)
    assert nlp.get_pipe("genbioel_mesh").kb.cui_to_entity[called[0][0][5]].definition.startswith("definition of")
    out = tmp_path_factory.mktemp("two") / "nlp"
    nlp.to_disk(out)
    shutil.rmtree(tmp_path / "model")
    for attr in ("mesh_id", "mesh_candidates", "mesh_ents"):
        Span.remove_extension(attr)  # loading registers them again
    loaded = spacy.load(out)
    assert loaded.pipe_names == ["entity_ruler", "genbioel", "genbioel_mesh"]
    assert check_both(list(loaded.pipe(TEXTS, batch_size=2)), kb, other) == piped


def test_two_linkers_writing_the_same_attributes_are_warned_about(resources, caplog):
    tmp_path, _, _ = resources
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        make_nlp(tmp_path, [("genbioel", "kb.jsonl", {}), ("second", "mesh.jsonl", {"kb_id_attr": "other_id"})])
    assert "'genbioel' and 'second' both write kb_candidates, kb_ents, span.kb_id_" in caplog.text
