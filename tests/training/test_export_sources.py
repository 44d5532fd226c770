"""``export-sources`` writes GenBioEL's ``.source`` / ``.target`` / ``label.txt`` files, and
on the shared NCBI-disease dev data its lines match GenBioEL's own (bench/genbioel_sources.py)."""

import json
import sys
from pathlib import Path

import pytest
from conftest import data_dir
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.kb.base import Concept, KnowledgeBase

BENCH = Path(__file__).resolve().parents[2] / "bench"
runner = CliRunner()

TITLE = "Wilms Tumour in Children"
ABSTRACT = "Wilms tumour (WT) and breast and ovarian cancer are studied. WT, and X Y are rare."


def pubtator(path: Path) -> Path:
    text = f"{TITLE} {ABSTRACT}"
    rows = [
        ("Wilms Tumour", "D1", ""),
        ("WT", "D1", ""),
        ("breast and ovarian cancer", "D2|D3", ""),
        ("X Y", "D4|D5", "X|Y"),
        ("rare", "-1", ""),
        ("Children", "D9", ""),
    ]
    lines = [f"1|t|{TITLE}", f"1|a|{ABSTRACT}"]
    for mention, ids, parts in rows:
        start = text.rindex(mention) if mention == "WT" else text.index(mention)
        lines.append(
            "\t".join(
                ["1", str(start), str(start + len(mention)), mention, "Disease", ids, *([parts] if parts else [])]
            )
        )
    path.write_text("\n".join(lines) + "\n\n", encoding="utf8")
    return path


def kb_file(path: Path) -> Path:
    KnowledgeBase(
        [
            Concept("D1", ["wilms tumor", "nephroblastoma"]),
            Concept("D2", ["breast cancer"]),
            Concept("D3", ["ovarian cancer"]),
            Concept("D4", ["x"]),
            Concept("D5", ["y"]),
        ]
    ).to_jsonl(path)
    return path


def read(out: Path, split: str):
    source = [json.loads(line) for line in (out / f"{split}.source").read_text().splitlines()]
    target = [json.loads(line) for line in (out / f"{split}.target").read_text().splitlines()]
    return source, target, (out / f"{split}label.txt").read_text().splitlines()


def test_export_ncbi_style(tmp_path):
    result = runner.invoke(
        app,
        [
            "export-sources",
            str(pubtator(tmp_path / "c.txt")),
            "--out",
            str(tmp_path / "out"),
            "--split",
            "dev",
            "--kb",
            str(kb_file(tmp_path / "kb.jsonl")),
        ],
    )
    assert result.exit_code == 0, result.output
    source, target, labels = read(tmp_path / "out", "dev")
    assert all(isinstance(s, list) and len(s) == 1 for s in source)
    doc = "wilms tumour in children wilms tumour (wt) and breast and ovarian cancer are studied."
    assert source[0] == [f"START wilms tumor END in children {doc[25:]} wt, and x y are rare."]
    # the short form is expanded inside the mention (BioSyn with Ab3P's pairs), then spelled as BioSyn's list says
    assert source[1] == [f"{doc} START wilms tumor END , and x y are rare."]
    assert target[1] == ["wilms tumor is", "wilms tumor"]
    # composite: its first part; label: every ID; D9 is not in the KB, -1 has no concept
    assert source[2][0].endswith("START breast cancer END are studied. wt, and x y are rare.")
    assert labels == ["D1", "D1", "D2|D3", "D4|D5"]
    assert "not_in_kb" in result.output or "left out" in result.output


def test_export_bc5cdr_style_splits_by_parts(tmp_path):
    result = runner.invoke(
        app,
        [
            "export-sources",
            str(pubtator(tmp_path / "c.txt")),
            "--out",
            str(tmp_path / "out"),
            "--split",
            "train",
            "--style",
            "genbioel-released-bc5cdr.v1",
            "--abbreviations",
            "none",
        ],
    )
    assert result.exit_code == 0, result.output
    source, target, labels = read(tmp_path / "out", "train")
    # "breast and ovarian cancer" has no 7th column: left out; "X Y" gives one line per part
    assert labels == ["D1", "D1", "D4", "D5", "D9"]
    assert [t[0] for t in target] == ["wilms tumour is", "wt is", "x is", "y is", "children is"]
    assert source[3][0].endswith("wt, and x START y END are rare.")
    assert target[0] == ["wilms tumour is", "wilms tumour"]  # no KB: the mention itself


def test_export_refuses_the_default_style(tmp_path):
    result = runner.invoke(
        app,
        [
            "export-sources",
            str(pubtator(tmp_path / "c.txt")),
            "--out",
            str(tmp_path / "out"),
            "--split",
            "dev",
            "--style",
            "genbioel.v1",
        ],
    )
    assert result.exit_code != 0 and "released style" in result.output


@pytest.mark.skipif(
    data_dir() is None or not (data_dir() / "genbioel_reference/ncbi/dev.source").is_file(),
    reason="needs ../shared/data (GENBIOEL_DATA) with genbioel_reference/ncbi",
)
def test_ncbi_dev_lines_match_genbioel(capsys):
    sys.path.insert(0, str(BENCH))
    try:
        import genbioel_sources
    finally:
        sys.path.remove(str(BENCH))
    assert genbioel_sources.main([str(data_dir())]) == 0
    printed = capsys.readouterr().out
    result = genbioel_sources.compare(data_dir())
    assert result["reference_lines"] == result["aligned"] == 787 and result["share_identical"] >= 0.98, printed
    assert set(result["differences"]) <= {"composite mention split differently"}, printed
    assert result["identical_label"] == 787


# --- split names and long documents (reliability audit) ---------------------------------------------------------


@pytest.mark.parametrize("split", ["../x", "/tmp/abs", "a/b", "..", ".hidden", "", "-x", "dev\x00", "a\\b"])
def test_export_refuses_a_split_that_is_not_a_file_name_stem(tmp_path, split):
    corpus = pubtator(tmp_path / "c.txt")
    out = tmp_path / "out"
    result = runner.invoke(app, ["export-sources", str(corpus), "--out", str(out), "--split", split])
    assert result.exit_code != 0
    assert repr(split) in result.output or split.strip("\x00") in result.output
    assert "plain file-name stem" in result.output
    assert not (tmp_path / "x.source").exists() and not Path("/tmp/abs.source").exists()
    assert "Traceback" not in result.output


def test_write_genbioel_files_refuses_a_path_as_split(tmp_path):
    from spacy_genbioel.training.export_sources import write_genbioel_files

    with pytest.raises(ValueError, match=r"'\.\./x'"):
        write_genbioel_files([], tmp_path / "out", "../x")
    assert not (tmp_path / "x.source").exists()


@pytest.mark.parametrize("split", ["dev", "train_1", "test.v2", "Fold-3"])
def test_export_takes_plain_split_names(tmp_path, split):
    corpus = pubtator(tmp_path / "c.txt")
    result = runner.invoke(app, ["export-sources", str(corpus), "--out", str(tmp_path), "--split", split])
    assert result.exit_code == 0, result.output
    assert (tmp_path / f"{split}.source").is_file()


def _sides_agree(text: str, start: int, end: int) -> None:
    from spacy_genbioel.linking.inputs.released_style import cut_context
    from spacy_genbioel.training.export_sources import DocumentSides

    sides = DocumentSides(text)
    n_words = len(text.split(" "))
    for n in (n_words, max(n_words, 385), n_words + 10_000):  # a document has at least the words of its sides
        assert cut_context(sides.left(start), sides.right(end), n) == cut_context(text[:start], text[end:], n)


def test_document_sides_cut_as_the_whole_sides_do():
    words = [("w%d" % i) + " " * (1 + (i % 7 == 0) * 3) for i in range(1500)]
    text = "  " + "".join(words) + "   "
    for start in [0, 1, 2, 5, 100, 1000, len(text) // 2, len(text) - 4, len(text) - 1, len(text)]:
        for end in (start, min(start + 3, len(text)), len(text)):
            _sides_agree(text, start, end)


try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(st.sampled_from(["a", "bb", " ", "  ", "c d", "É", "&amp;"]), min_size=300, max_size=1200),
        st.integers(0, 10_000),
        st.integers(0, 40),
    )
    def test_document_sides_fuzz(pieces, at, length):
        text = "".join(pieces)
        start = min(at, len(text))
        _sides_agree(text, start, min(start + length, len(text)))


def test_source_lines_are_linear_in_document_length_times_mentions(monkeypatch):
    """A 300k-word document with 3000 mentions: slicing the document per mention (the old way) handed
    InputBuilder about 3000 x 1.8 MB of context; now each mention gets at most a few hundred words a side."""
    from spacy_genbioel.corpus.pubtator import PubTatorAnnotation, PubTatorDocument
    from spacy_genbioel.linking.inputs.builder import InputBuilder
    from spacy_genbioel.training.export_sources import source_lines

    n_words, n_mentions = 300_000, 3000
    text = " ".join(f"word{i % 997}" for i in range(n_words))
    step = len(text) // n_mentions
    annotations = []
    for k in range(n_mentions):
        start = text.index(" ", k * step) + 1
        end = text.index(" ", start)
        annotations.append(PubTatorAnnotation(start, end, text[start:end], "Disease", ("D1",)))
    doc = PubTatorDocument("1", text, "", annotations)
    handed = []
    builder = InputBuilder(style="genbioel-released-bc5cdr.v1")
    original = InputBuilder.source

    def source(self, mention, n_words=None):
        handed.append(len(mention.left) + len(mention.right))
        return original(self, mention, n_words)

    monkeypatch.setattr(InputBuilder, "source", source)
    lines = source_lines([doc], builder, find_abbreviations=False)
    assert len(lines) == n_mentions
    assert max(handed) < 2 * 400 * len("word996 ")
    assert all(len(line.source.split(" ")) <= 384 + 3 for line in lines)
