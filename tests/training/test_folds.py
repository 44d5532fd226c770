"""Document folds for cross-fitting (``folds``), AskAPatient's concept list as a KB
(``build-kb --format askapatient``) and the ``corpus`` step on AskAPatient folds."""

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.corpus.folds import assign_folds, pubtator_blocks, split_pubtator
from spacy_genbioel.corpus.pubtator import CorpusFormatError, read_pubtator
from spacy_genbioel.kb.base import KBFormatError, KnowledgeBase
from spacy_genbioel.kb.sources import read_askapatient_kb

runner = CliRunner()


def doc(pmid, title, abstract="", mentions=()):
    text = f"{title} {abstract}"
    lines = [f"{pmid}|t|{title}", f"{pmid}|a|{abstract}"]
    for name, cid in mentions:
        start = text.index(name)
        lines.append(f"{pmid}\t{start}\t{start + len(name)}\t{name}\tDisease\t{cid}")
    return "\n".join(lines) + "\n"


def corpus(n, repeat=None):
    docs = [
        doc(
            str(100 + i),
            f"Case {i} of renal failure.",
            f"Abstract {i} on cystic fibrosis.",
            [("renal failure", "D1"), ("cystic fibrosis", "D2")],
        )
        for i in range(n)
    ]
    if repeat is not None:  # the same PMID again, later in the file (a duplicate a split must not cut)
        docs.append(doc(str(100 + repeat), "Repeated renal failure.", "", [("renal failure", "D1")]))
    return docs


def write(path, docs):
    path.write_text("\n".join(docs), encoding="utf8")
    return path


# -- blocks ---------------------------------------------------------------------------------------------
def test_pubtator_blocks_in_file_order(tmp_path):
    docs = corpus(3)
    path = tmp_path / "train.txt"
    path.write_text("\ufeff" + docs[0] + "\n\n \n" + docs[1] + "\n" + docs[2].rstrip("\n"), encoding="utf8")
    blocks = pubtator_blocks(path)
    assert [d for d, _ in blocks] == ["100", "101", "102"]
    assert [b for _, b in blocks] == docs  # blank lines (and a BOM, a missing final newline) are not part of a block
    tab_first = tmp_path / "tab.txt"
    tab_first.write_text("7\t0\t3\tfoo\tDisease\tD1\n\n", encoding="utf8")
    assert pubtator_blocks(tab_first) == [("7", "7\t0\t3\tfoo\tDisease\tD1\n")]
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf8")
    assert pubtator_blocks(tmp_path / "empty.txt") == []


def test_pubtator_blocks_refuse_a_block_without_an_id(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text(corpus(1)[0] + "\n" + "no separator here\nmore\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=re.escape(f"{path}:6")):
        pubtator_blocks(path)
    path.write_text("|t|title without an ID\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match="bad.txt:1"):
        pubtator_blocks(path)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        pubtator_blocks(tmp_path / "missing.txt")


# -- assignment --------------------------------------------------------------------------------------------
doc_ids = st.lists(
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8), min_size=2, max_size=40, unique=True
)


@settings(max_examples=80, deadline=None)
@given(doc_ids, st.integers(2, 7), st.integers(0, 3), st.randoms(use_true_random=False))
def test_assign_folds_property(ids, k, seed, rng):
    if len(ids) < k:
        with pytest.raises(ValueError, match="cannot make"):
            assign_folds(ids, k, seed)
        return
    folds = assign_folds(ids, k, seed)
    assert set(folds) == set(ids) and set(folds.values()) <= set(range(k))  # every document in exactly one fold
    sizes = [list(folds.values()).count(i) for i in range(k)]
    assert sum(sizes) == len(ids) and max(sizes) - min(sizes) <= 1
    shuffled = list(ids)
    rng.shuffle(shuffled)
    assert assign_folds(shuffled, k, seed) == folds  # the file order does not matter


def test_assign_folds_refusals_and_seed():
    with pytest.raises(ValueError, match="k must be at least 2"):
        assign_folds(["a", "b", "c"], 1)
    with pytest.raises(ValueError, match="k must be at least 2"):
        assign_folds(["a", "b", "c"], 0)
    with pytest.raises(ValueError, match="2 documents cannot make 3 folds"):
        assign_folds(["a", "b"], 3)
    ids = [f"doc{i}" for i in range(30)]
    assert assign_folds(ids, 3, seed=1) == assign_folds(ids, 3, seed=1)
    assert assign_folds(ids, 3, seed=1) != assign_folds(ids, 3, seed=2)


# -- split --------------------------------------------------------------------------------------------------
def blocks_of(path):
    return [b for _, b in pubtator_blocks(path)]


@pytest.mark.parametrize("k", [2, 3])
def test_split_pubtator_partitions_documents(tmp_path, k):
    docs = corpus(7)
    src = write(tmp_path / "train.txt", docs)
    summary = split_pubtator(src, tmp_path / "folds", k=k, seed=0)
    assert summary["k"] == k and summary["seed"] == 0 and summary["source"] == str(src)
    assert json.loads((tmp_path / "folds" / "folds.json").read_text()) == summary
    held_all = []
    for i in range(k):
        folder = tmp_path / "folds" / f"fold-{i}"
        held, train = blocks_of(folder / "heldout.txt"), blocks_of(folder / "train.txt")
        assert sorted(held + train) == sorted(docs)  # byte for byte, nothing lost, nothing twice
        assert not set(held) & set(train)
        assert len(held) == summary["documents"][i]
        held_all.extend(held)
        # the fold files read as PubTator with their mentions
        parsed = list(read_pubtator(folder / "heldout.txt"))
        assert [d.pmid for d in parsed] == [b.split("|", 1)[0] for b in held]
        assert all(len(d.annotations) == 2 for d in parsed)
    assert sorted(held_all) == sorted(docs)  # the held-out folds partition the documents
    assert max(summary["documents"]) - min(summary["documents"]) <= 1
    # the heldout blocks keep file order, and the file is the blocks separated by blank lines
    fold0 = (tmp_path / "folds" / "fold-0" / "heldout.txt").read_text(encoding="utf8")
    held0 = blocks_of(tmp_path / "folds" / "fold-0" / "heldout.txt")
    assert held0 == [d for d in docs if d in held0] and fold0 == "\n".join(held0)


def test_split_pubtator_keeps_a_repeated_document_in_one_fold(tmp_path):
    docs = corpus(6, repeat=2)
    src = write(tmp_path / "train.txt", docs)
    summary = split_pubtator(src, tmp_path / "folds", k=3)
    assert sum(summary["documents"]) == 7  # blocks: the repeated ID is counted as two blocks, in one fold
    homes = []
    for i in range(3):
        held = blocks_of(tmp_path / "folds" / f"fold-{i}" / "heldout.txt")
        train = blocks_of(tmp_path / "folds" / f"fold-{i}" / "train.txt")
        repeated = [b for b in held + train if b.startswith("102|")]
        assert len(repeated) == 2
        assert all(b in held for b in repeated) or all(b in train for b in repeated)
        if repeated[0] in held:
            homes.append(i)
    assert len(homes) == 1


def test_split_pubtator_is_independent_of_file_order(tmp_path):
    docs = corpus(9)
    shuffled = list(docs)
    random.Random(3).shuffle(shuffled)
    a = split_pubtator(write(tmp_path / "a.txt", docs), tmp_path / "a", k=3, seed=5)
    b = split_pubtator(write(tmp_path / "b.txt", shuffled), tmp_path / "b", k=3, seed=5)
    assert a["documents"] == b["documents"]
    for i in range(3):
        assert sorted(blocks_of(tmp_path / "a" / f"fold-{i}" / "heldout.txt")) == sorted(
            blocks_of(tmp_path / "b" / f"fold-{i}" / "heldout.txt")
        )


def test_split_pubtator_refuses_too_few_documents(tmp_path):
    with pytest.raises(ValueError, match="2 documents cannot make 3 folds"):
        split_pubtator(write(tmp_path / "t.txt", corpus(2, repeat=0)), tmp_path / "out", k=3)


# -- folds command ------------------------------------------------------------------------------------------
def test_folds_command(tmp_path):
    src = write(tmp_path / "train.txt", corpus(5))
    result = runner.invoke(app, ["folds", str(src), "--out", str(tmp_path / "f"), "--k", "2", "--seed", "4"])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "f" / "folds.json").read_text())
    assert summary["k"] == 2 and summary["seed"] == 4 and sorted(summary["documents"]) == [2, 3]
    assert {p.name for p in (tmp_path / "f" / "fold-1").iterdir()} == {"train.txt", "heldout.txt"}
    assert not (tmp_path / "f" / "fold-2").exists()


@pytest.mark.parametrize(
    "args,problem", [(["--k", "9"], "5 documents cannot make 9 folds"), (["--k", "1"], "k must be at least 2")]
)
def test_folds_command_errors(tmp_path, args, problem):
    src = write(tmp_path / "train.txt", corpus(5))
    result = runner.invoke(app, ["folds", str(src), "--out", str(tmp_path / "f"), *args])
    assert result.exit_code == 1 and "folds:" in result.output and problem in result.output


def test_folds_command_names_a_bad_file(tmp_path):
    (tmp_path / "bad.txt").write_text("no id line\n", encoding="utf8")
    result = runner.invoke(app, ["folds", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "f")])
    assert result.exit_code == 1 and "bad.txt:1" in result.output
    result = runner.invoke(app, ["folds", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "f")])
    assert result.exit_code == 1 and "missing.txt" in result.output


# -- AskAPatient concepts -------------------------------------------------------------------------------------
ASK_KB = {
    "22298006": [["synonym", "heart attack"], ["primary", "Myocardial infarction"], ["synonym", "heart attack"]],
    " 267032009": [["primary", "Tired all the time"], ["synonym", "  "], ["synonym", "tiredness"]],
    "83901003": [["primary", "Sjögren's syndrome"]],
}


def test_read_askapatient_kb(tmp_path):
    path = tmp_path / "askapatient.json"
    path.write_text(json.dumps(ASK_KB, ensure_ascii=False), encoding="utf8")
    concepts = {c.id: c.names for c in read_askapatient_kb(path)}
    assert concepts == {
        "22298006": ["Myocardial infarction", "heart attack"],  # primary first, repeats once
        "267032009": ["Tired all the time", "tiredness"],  # ID cleaned, a blank name dropped
        "83901003": ["Sjögren's syndrome"],
    }


@pytest.mark.parametrize(
    "content,problem",
    [
        ("[1, 2]", "expected a JSON object"),
        ('{"1": "name"}', "concept '1': expected a list of"),
        ('{"1": [["primary"]]}', "concept '1': expected a list of"),
        ('{"1": [["primary", 3]]}', "concept '1': expected a list of"),
        ('{"1": [{"primary": "x"}]}', "concept '1': expected a list of"),
        ('{"1": []}', "no ID or no name"),
        ('{"1": [["primary", "  "]]}', "no ID or no name"),
        ('{" ": [["primary", "x"]]}', "no ID or no name"),
        ('{"1": [["primary", "x"]', "not valid JSON"),
    ],
)
def test_read_askapatient_kb_refusals_name_the_file(tmp_path, content, problem):
    path = tmp_path / "ask_bad.json"
    path.write_text(content, encoding="utf8")
    with pytest.raises(KBFormatError, match=re.escape(str(path)) + ".*" + re.escape(problem)):
        list(read_askapatient_kb(path))


def test_build_kb_askapatient_command(tmp_path):
    (tmp_path / "askapatient.json").write_text(json.dumps(ASK_KB), encoding="utf8")
    result = runner.invoke(
        app,
        [
            "build-kb",
            "--format",
            "askapatient",
            str(tmp_path / "askapatient.json"),
            "--out",
            str(tmp_path / "kb.jsonl"),
            "--no-dedup",
        ],
    )
    assert result.exit_code == 0, result.output
    kb = KnowledgeBase.load(tmp_path / "kb.jsonl")
    assert len(kb) == 3 and kb.preferred_name("22298006") == "Myocardial infarction"
    assert kb.ids_for_name("Heart Attack") == ("22298006",)
    (tmp_path / "bad.json").write_text('{"1": "x"}', encoding="utf8")
    result = runner.invoke(
        app, ["build-kb", "--format", "askapatient", str(tmp_path / "bad.json"), "--out", str(tmp_path / "b.jsonl")]
    )
    assert result.exit_code == 1 and "bad.json" in result.output and not (tmp_path / "b.jsonl").exists()


# -- corpus step on AskAPatient folds --------------------------------------------------------------------------
def test_make_corpus_askapatient_with_several_train_files(tmp_path):
    from spacy_genbioel.training.examples import read_mentions_jsonl
    from spacy_genbioel.training.stages import CorpusSettings, make_corpus

    (tmp_path / "askapatient.json").write_text(json.dumps(ASK_KB), encoding="utf8")
    kb = KnowledgeBase(read_askapatient_kb(tmp_path / "askapatient.json"))
    kb.to_jsonl(tmp_path / "kb.jsonl")
    (tmp_path / "fold-0.train.txt").write_text(
        "22298006\tMyocardial infarction\tHEART ATTACK\n267032009\tTired all the time\tso  tired\n", encoding="utf8"
    )
    (tmp_path / "fold-0.validation.txt").write_bytes(
        "83901003\tSj\u00f6gren's syndrome\tdry eyes\n\n".encode("latin-1")
    )
    (tmp_path / "fold-0.test.txt").write_text("22298006\tMyocardial infarction\tchest pain attack\n", encoding="utf8")
    stats = make_corpus(
        [tmp_path / "fold-0.train.txt", tmp_path / "fold-0.validation.txt"],
        tmp_path / "fold-0.test.txt",
        tmp_path / "kb.jsonl",
        tmp_path / "corpus",
        CorpusSettings(fmt="askapatient"),
    )
    assert stats["train_documents"] == 0 and stats["dev_documents"] == 0
    assert stats["targets"]["mentions"] == 3 and stats["targets"]["used"] == 3 and stats["train_lines"] == 3
    assert stats["dev_lines"] == 1
    train = list(read_mentions_jsonl(tmp_path / "corpus" / "train.jsonl"))
    assert [m.text for m, _ in train] == ["HEART ATTACK", "so  tired", "dry eyes"]
    assert [m.ids for m, _ in train] == [("22298006",), ("267032009",), ("83901003",)]
    for mention, target in train:
        assert target in kb.names_of(mention.ids[0]) and mention.left == "" and mention.right == ""
    dev = list(read_mentions_jsonl(tmp_path / "corpus" / "dev.jsonl"))
    assert [(m.text, t) for m, t in dev] == [("chest pain attack", None)]
    # no documents: the tokenizer texts are the training mentions
    assert (tmp_path / "corpus" / "texts.txt").read_text(encoding="utf8").splitlines() == [
        "HEART ATTACK",
        "so tired",
        "dry eyes",
    ]
    assert json.loads((tmp_path / "corpus" / "stats.json").read_text())["train_lines"] == 3
    # one file given as a path, not a list, reads the same
    one = make_corpus(
        tmp_path / "fold-0.train.txt",
        tmp_path / "fold-0.test.txt",
        tmp_path / "kb.jsonl",
        tmp_path / "c1",
        CorpusSettings(fmt="askapatient"),
    )
    assert one["train_lines"] == 2


def test_make_corpus_several_pubtator_files_and_unknown_format(tmp_path):
    from spacy_genbioel.kb.base import Concept
    from spacy_genbioel.training.stages import CorpusSettings, make_corpus

    KnowledgeBase([Concept("D1", ["renal failure"]), Concept("D2", ["cystic fibrosis"])]).to_jsonl(
        tmp_path / "kb.jsonl"
    )
    docs = corpus(4)
    a, b = write(tmp_path / "a.txt", docs[:3]), write(tmp_path / "b.txt", docs[3:])
    stats = make_corpus([a, b], b, tmp_path / "kb.jsonl", tmp_path / "out")
    assert stats["train_documents"] == 4 and stats["train_lines"] == 8 and stats["dev_lines"] == 2
    assert len((tmp_path / "out" / "texts.txt").read_text(encoding="utf8").splitlines()) == 4
    with pytest.raises(ValueError, match="unknown corpus format 'bioc'"):
        make_corpus(a, b, tmp_path / "kb.jsonl", tmp_path / "out2", CorpusSettings(fmt="bioc"))
