"""The compact KB (kb.safetensors): the same answers as KnowledgeBase, read memory-mapped, damage refused."""

import json
import mmap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.arrayfile import backing_map
from spacy_genbioel.kb.base import Concept, EmptyKBError, KBFormatError, KnowledgeBase
from spacy_genbioel.kb.compact import CompactKB, jsonl_fingerprint
from spacy_genbioel.kb.compact_build import _Blob, group_strings

WORDS = [
    "renal",
    "Renal",
    "failure",
    "acute",
    "cancer",
    "lung",
    "α-synuclein",
    "文字",
    "C6H12O6",
    ",",
    "-",
    "",
    " ",
    "(",
    "it's",
]

names = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
concepts = st.lists(
    st.builds(
        Concept,
        id=st.sampled_from(["D1", "D2", " D2", "D3", "C10", "OMIM:1", "x"]) | st.text("abc", min_size=1, max_size=3),
        names=st.lists(names, max_size=4),
        definition=st.none() | st.sampled_from(["", "a definition", "Другое"]),
        types=st.lists(st.sampled_from(["T047", "T121", "C"]), max_size=3),
        prior=st.sampled_from([0.0, 0.0, 1.0, 2.5]),
    ),
    max_size=12,
)


def _kbs(items, dedup, **kwargs):
    try:
        kb = KnowledgeBase(items, dedup=dedup, **kwargs)
    except EmptyKBError:
        with pytest.raises(EmptyKBError):
            CompactKB.build(items, dedup=dedup, **kwargs)
        return None, None
    return kb, CompactKB.build(items, dedup=dedup, **kwargs)


def assert_same_index(kb, other):
    assert list(other.names) == list(kb.names) and other.n_names == kb.n_names
    assert list(other.concept_ids) == list(kb.concept_ids) and len(other) == len(kb)
    for i, name in enumerate(kb.names):
        assert other.ids_for_name_index(i) == kb.ids_for_name_index(i)
        assert other.name_index(name) == i
        assert other.ids_for_name(name, normalize=False) == kb.ids_for_name(name, normalize=False)
    for cid in kb.concept_ids:
        assert other.names_of(cid) == kb.names_of(cid) and cid in other
    for missing in ("nope", "renal failure x", "", "D9"):
        assert other.name_index(missing) == kb.name_index(missing)
        assert other.names_of(missing) == kb.names_of(missing) and (missing in other) == (missing in kb)
    assert other.checksum() == kb.checksum()


@given(concepts, st.booleans())
@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_the_compact_kb_answers_as_the_knowledge_base(tmp_path_factory, items, dedup):
    kb, compact = _kbs(items, dedup)
    if kb is None:
        return
    assert_same_index(kb, compact)
    assert compact.drops == kb.drops
    # the concepts are those of the KB's JSONL file (names whose normalized form stayed with them)
    folder = tmp_path_factory.mktemp("kb")
    kb.to_jsonl(folder / "kb.jsonl")
    compact.to_jsonl(folder / "compact.jsonl")
    assert (folder / "compact.jsonl").read_text(encoding="utf8") == (folder / "kb.jsonl").read_text(encoding="utf8")
    reread = KnowledgeBase.load(folder / "kb.jsonl", dedup=dedup)
    assert list(compact) == list(reread)
    for cid in kb.concept_ids:
        assert compact[cid] == reread[cid] and compact.preferred_name(cid) == reread.preferred_name(cid)
    kb.to_target_kb_json(folder / "a.json")
    compact.to_target_kb_json(folder / "b.json")
    assert (folder / "a.json").read_text(encoding="utf8") == (folder / "b.json").read_text(encoding="utf8")
    # saved and memory-mapped: the same again
    compact.save(folder / "kb.safetensors", jsonl=folder / "kb.jsonl")
    opened = KnowledgeBase.load(folder / "kb.safetensors", dedup=dedup)
    assert isinstance(opened, CompactKB) and opened.matches_jsonl(folder / "kb.jsonl")
    assert_same_index(kb, opened)
    assert list(opened) == list(reread)
    opened.validate()


@given(concepts, st.booleans(), st.lists(st.tuples(st.sampled_from(["D1", "D2", "D3", "zz"]), names), max_size=5))
@settings(max_examples=60, deadline=None, derandomize=True)
def test_derived_kbs_match_too(items, dedup, extra):
    kb, compact = _kbs(items, dedup)
    if kb is None:
        return
    pairs = [(cid, name) for cid, name in extra]
    for derive in (
        lambda k: k.with_extra_names(pairs),
        lambda k: k.with_first_names_only(),
        lambda k: k.with_priors({cid: i for i, (cid, _) in enumerate(pairs)}),
    ):
        try:
            expected = derive(kb)
        except EmptyKBError:
            with pytest.raises(EmptyKBError):
                derive(compact)
            continue
        got = derive(compact)
        assert isinstance(got, CompactKB)
        assert_same_index(expected, got)


def test_merged_ids_keep_the_knowledge_base_rules():
    items = [
        Concept("D1", ["Renal failure", "renal failure"], None, ["B", "B"], 1.0),
        Concept("D2", ["cancer"], "", ["C"]),
        Concept(" D1", ["kidney failure", "Renal failure"], "second", ["A", "B", "A"], 3.0),
        Concept("D1", ["renal  failure"], "third", ["C"], 2.0),
    ]
    kb, compact = KnowledgeBase(items), CompactKB.build(items)
    assert_same_index(kb, compact)
    assert (
        compact["D1"]
        == Concept(
            "D1",
            ["Renal failure", "renal failure", "kidney failure", "renal  failure"],
            "second",
            ["B", "B", "A", "C"],
            3.0,
        )
        == kb["D1"]
    )
    assert compact["D2"].definition is None and compact.preferred_name("D1") == "Renal failure"


def test_dedup_and_priors_order_shared_names():
    items = [
        Concept("A", ["tumor", "neoplasm", "growth"]),
        Concept("B", ["tumor"], prior=0.0),
        Concept("C", ["tumor", "mass"], prior=5.0),
    ]
    for dedup in (False, True):
        kb, compact = KnowledgeBase(items, dedup=dedup), CompactKB.build(items, dedup=dedup)
        assert_same_index(kb, compact)
    assert CompactKB.build(items).ids_for_name("tumor") == ("C", "A", "B")
    assert CompactKB.build(items, dedup=True).ids_for_name("tumor") == ("B",)


def test_a_kb_without_names_is_refused_as_before():
    with pytest.raises(EmptyKBError, match="no usable name"):
        CompactKB.build([Concept("D1", [",", " "])])


def test_equal_hashes_never_merge_different_strings(monkeypatch):
    blob = _Blob(hashed=True)
    for text in ["b", "a", "b", "c", "a"]:
        blob.add(text)
    blob.hashes = bytearray(8 * 5)  # every string collides
    labels, firsts = group_strings(blob.hash_array(), blob)
    assert labels.tolist() == [0, 1, 0, 2, 1] and firsts.tolist() == [0, 1, 3]
    kb = CompactKB.build([Concept("D1", ["renal failure", "cancer"]), Concept("D2", ["lung cancer"])])
    monkeypatch.setattr("spacy_genbioel.kb.compact.string_hash", lambda data: 0)
    kb.arrays["name_hashes"] = np.zeros(kb.n_names, dtype=np.int64)
    assert [kb.name_index(n) for n in ("renal failure", "cancer", "lung cancer", "other")] == [0, 1, 2, None]


def test_the_arrays_are_memory_mapped_not_copied(tmp_path):
    kb = CompactKB.build([Concept(f"D{i}", [f"name {i}", f"other {i}"]) for i in range(500)])
    kb.save(tmp_path / "kb.safetensors")
    opened = CompactKB.open(tmp_path / "kb.safetensors")
    for key, array in opened.arrays.items():
        assert not array.flags.owndata, key
        assert isinstance(backing_map(array), mmap.mmap), key
    assert opened.name_index("name 7") == kb.name_index("name 7") and opened.names[-1] == "other 499"
    # the file is an ordinary safetensors file
    from safetensors.numpy import load_file

    assert (load_file(str(tmp_path / "kb.safetensors"))["name_offsets"] == kb.arrays["name_offsets"]).all()


def test_names_are_a_sequence_view():
    kb = CompactKB.build([Concept("D1", ["a b", "c"]), Concept("D2", ["d"])])
    names = kb.names
    assert len(names) == 3 and names[0] == "a b" and names[-1] == "d" and names[1:] == ["c", "d"]
    assert names[::2] == ["a b", "d"] and "c" in names and "zz" not in names and names.index("d") == 2
    assert list(names) == ["a b", "c", "d"] == names
    with pytest.raises(IndexError):
        names[3]
    assert list(kb.concept_ids) == ["D1", "D2"]


def test_knowledge_base_load_and_save_speak_safetensors(tmp_path):
    kb = KnowledgeBase([Concept("D1", ["Renal failure"], "def", ["T047"], 1.5), Concept("D2", ["cancer"])], name="mine")
    kb.save(tmp_path / "kb.safetensors")
    opened = KnowledgeBase.load(tmp_path / "kb.safetensors")
    assert isinstance(opened, CompactKB) and opened.name == "kb"
    assert_same_index(kb, opened)
    assert opened["D1"] == Concept("D1", ["Renal failure"], "def", ["T047"], 1.5)


def test_opening_with_other_settings_gives_what_the_jsonl_gives(tmp_path):
    items = [Concept("A", ["Tumor", "neoplasm"]), Concept("B", ["tumor"]), Concept("C", ["Mass-lesion"])]
    kb = KnowledgeBase(items)
    kb.to_jsonl(tmp_path / "kb.jsonl")
    CompactKB.from_kb(kb).save(tmp_path / "kb.safetensors")
    for kwargs in (
        {"normalizer": "lower"},
        {"dedup": True},
        {"normalizer": "none", "dedup": True},
        {"normalizer": "genbioel"},
    ):
        expected = KnowledgeBase.load(tmp_path / "kb.jsonl", **kwargs)
        assert_same_index(expected, KnowledgeBase.load(tmp_path / "kb.safetensors", **kwargs))


def _damage(path, change):
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    with safe_open(str(path), framework="np") as handle:
        meta = dict(handle.metadata())
    arrays, meta = change(load_file(str(path)), meta)
    save_file(arrays, str(path), metadata=meta)


@pytest.mark.parametrize(
    "damage",
    [
        "empty",
        "7 bytes",
        "half",
        "last byte",
        "one byte more",
        "garbage",
        "version 2",
        "not a kb",
        "no checksum",
        "array missing",
        "offsets reversed",
        "pointers short",
        "floats",
        "two-dimensional",
        "unknown normalizer",
    ],
)
def test_a_damaged_file_is_refused_naming_it(tmp_path, damage):
    path = tmp_path / "kb.safetensors"
    CompactKB.build([Concept("D1", ["renal failure", "cancer"]), Concept("D2", ["lung"])]).save(path)
    data = path.read_bytes()
    cuts = {"empty": 0, "7 bytes": 7, "half": len(data) // 2, "last byte": len(data) - 1}
    if damage in cuts:
        path.write_bytes(data[: cuts[damage]])
    elif damage == "one byte more":
        path.write_bytes(data + b"\0")
    elif damage == "garbage":
        path.write_bytes(b"\xff" * 300)
    else:
        changes = {
            "version 2": lambda a, m: (a, {**m, "format_version": "2"}),
            "not a kb": lambda a, m: (a, {**m, "format": "genbioel.trie"}),
            "no checksum": lambda a, m: (a, {k: v for k, v in m.items() if k != "checksum"}),
            "array missing": lambda a, m: ({k: v for k, v in a.items() if k != "concept_names"}, m),
            "offsets reversed": lambda a, m: ({**a, "raw_offsets": a["raw_offsets"][::-1].copy()}, m),
            "pointers short": lambda a, m: ({**a, "name_concepts_ptr": a["name_concepts_ptr"][:-1].copy()}, m),
            "floats": lambda a, m: ({**a, "name_order": a["name_order"].astype(np.float32)}, m),
            "two-dimensional": lambda a, m: ({**a, "name_concepts": a["name_concepts"].reshape(1, -1)}, m),
            "unknown normalizer": lambda a, m: (a, {**m, "normalizer": "no-such-normalizer"}),
        }
        _damage(path, changes[damage])
    with pytest.raises(KBFormatError, match="kb.safetensors"):
        KnowledgeBase.load(path)


def test_a_nan_prior_is_refused_naming_the_file_and_the_array(tmp_path):
    path = tmp_path / "kb.safetensors"
    concepts = [Concept("D1", ["renal failure"], prior=2.0), Concept("D2", ["renal failure", "lung"], prior=1.0)]
    CompactKB.build(concepts).save(path)
    _damage(path, lambda a, m: ({**a, "priors": np.array([np.nan, 1.0], dtype=a["priors"].dtype)}, m))
    with pytest.raises(KBFormatError, match=r"kb\.safetensors.*'priors' holds nan at \[0\]"):
        KnowledgeBase.load(path)


def test_a_deeply_nested_header_is_a_kb_format_error(tmp_path):
    import struct

    path = tmp_path / "kb.safetensors"
    text = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path.write_bytes(struct.pack("<Q", len(text)) + text)
    with pytest.raises(KBFormatError, match=r"kb\.safetensors.*nested"):
        KnowledgeBase.load(path)


def test_damage_inside_the_arrays_is_refused_where_it_is_read(tmp_path):
    path = tmp_path / "kb.safetensors"
    CompactKB.build([Concept("D1", ["renal failure", "cancer"]), Concept("D2", ["lung"])]).save(path)
    _damage(
        path,
        lambda a, m: ({**a, "name_concepts": a["name_concepts"] + 100, "name_offsets": np.array([0, 13, 6, 23])}, m),
    )
    with pytest.raises(KBFormatError, match="kb.safetensors.*checksum"):
        KnowledgeBase.load(path)  # opening compares the arrays with their recorded digest
    kb = CompactKB.open(path, verify=False)  # unverified, every read still checks what it reads
    with pytest.raises(KBFormatError, match="kb.safetensors.*name_concepts"):
        kb.ids_for_name_index(0)
    with pytest.raises(KBFormatError, match="kb.safetensors.*name 1"):
        kb.names[1]
    with pytest.raises(KBFormatError, match="kb.safetensors"):
        list(kb.names)
    with pytest.raises(KBFormatError, match="not in order"):
        kb.validate()


def test_a_jsonl_edited_after_saving_is_noticed(tmp_path):
    kb = KnowledgeBase([Concept(f"D{i}", [f"name {i}"]) for i in range(2000)])
    kb.to_jsonl(tmp_path / "kb.jsonl")
    CompactKB.from_kb(kb).save(tmp_path / "kb.safetensors", jsonl=tmp_path / "kb.jsonl")
    opened = CompactKB.open(tmp_path / "kb.safetensors")
    assert opened.matches_jsonl(tmp_path / "kb.jsonl")
    size, digest = jsonl_fingerprint(tmp_path / "kb.jsonl")
    text = (tmp_path / "kb.jsonl").read_text()
    (tmp_path / "kb.jsonl").write_text(text.replace('"name 1999"', '"name 1998"'))  # same size, other bytes
    assert jsonl_fingerprint(tmp_path / "kb.jsonl")[0] == size and not opened.matches_jsonl(tmp_path / "kb.jsonl")
    assert not opened.matches_jsonl(tmp_path / "missing.jsonl")


def test_build_kb_writes_a_compact_kb(tmp_path):
    from typer.testing import CliRunner

    from spacy_genbioel.cli import app
    from spacy_genbioel.kb.build import build_kb

    (tmp_path / "medic.txt").write_text(
        "D001||Reiter Syndrome|Reactive Arthritis\nD002|613097||Tumor|Neoplasm|Reiter syndrome\n"
    )
    result = CliRunner().invoke(
        app,
        [
            "build-kb",
            "-f",
            "medic",
            str(tmp_path / "medic.txt"),
            "--out",
            str(tmp_path / "kb.safetensors"),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    expected = build_kb("medic", tmp_path / "medic.txt", name="kb")
    assert_same_index(expected, KnowledgeBase.load(tmp_path / "kb.safetensors"))
    assert isinstance(build_kb("medic", tmp_path / "medic.txt", compact=True), CompactKB)
    assert json.loads(CompactKB.open(tmp_path / "kb.safetensors").metadata["drops"])["names"] == 0


def test_a_kb_built_with_the_normalizer_function_opens_by_name(tmp_path):
    from spacy_genbioel.kb.normalizers import lower_normalize

    kb = KnowledgeBase([Concept("D1", ["Renal-Failure"])], normalizer=lower_normalize).with_priors({"D1": 2})
    kb.save(tmp_path / "kb.safetensors")
    opened = KnowledgeBase.load(tmp_path / "kb.safetensors")
    assert opened.metadata["normalizer"] == "lower" and opened.name_index("renal-failure") == 0


def test_a_saved_pipeline_maps_its_kb_and_links_as_before(tmp_path, micro_model, word_tokenizer, small_kb):
    import shutil

    import spacy
    from spacy.tokens import Span

    from spacy_genbioel.models import save_model

    save_model(micro_model, word_tokenizer, tmp_path / "model")
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    nlp = spacy.blank("en")
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "device": "cpu",
            "decoding": {"num_beams": 2, "top_k": 2},
        },
    )

    def links(pipeline):
        doc = pipeline.make_doc("acute renal failure and lung cancer")
        doc.ents = [Span(doc, 1, 3, "Disease"), Span(doc, 4, 6, "Disease")]
        return [(e._.kb_id, e._.kb_candidates) for e in pipeline(doc).ents]

    expected = links(nlp)
    nlp.to_disk(tmp_path / "saved")
    assert (tmp_path / "saved" / "genbioel" / "kb.safetensors").exists()
    loaded = spacy.load(tmp_path / "saved")
    assert isinstance(loaded.get_pipe("genbioel").linker.kb, CompactKB) and links(loaded) == expected
    loaded.to_disk(tmp_path / "saved")  # in place, over the files it maps
    again = spacy.load(tmp_path / "saved")
    assert isinstance(again.get_pipe("genbioel").linker.kb, CompactKB) and links(again) == expected
    shutil.copytree(tmp_path / "saved", tmp_path / "old")
    (tmp_path / "old" / "genbioel" / "kb.safetensors").unlink()  # as a pipeline saved before kb.safetensors
    old = spacy.load(tmp_path / "old")
    assert type(old.get_pipe("genbioel").linker.kb) is KnowledgeBase and links(old) == expected


def test_remembered_lookups_stay_right_and_bounded(monkeypatch):
    """Linking asks about the same names again and again: CompactKB remembers recent answers,
    at most ``_MEMO`` of them, and gives what it gave before it remembered."""
    import spacy_genbioel.kb.compact as compact

    items = [Concept(f"D{i}", [f"name {i}", f"other {i}", "shared"]) for i in range(30)]
    kb, fast = KnowledgeBase(items), CompactKB.build(items)
    monkeypatch.setattr(compact, "_MEMO", 8)
    for _ in range(2):
        for i in range(30):
            assert fast.ids_for_name(f"Name {i}") == kb.ids_for_name(f"Name {i}")
            assert fast.names_of(f"D{i}") == kb.names_of(f"D{i}")
            assert fast.ids_for_name("shared") == kb.ids_for_name("shared") and fast.ids_for_name("absent") == ()
            assert len(fast._memo) <= 8
    fast.names_of("D1").append("changed")  # a caller's list is its own
    assert fast.names_of("D1") == kb.names_of("D1")
