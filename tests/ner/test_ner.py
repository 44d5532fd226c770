"""NER corpus conversion, the NER training configs, and packaging with a trained NER."""

from pathlib import Path

import pytest
import spacy
from conftest import data_dir
from spacy.tokens import DocBin
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.corpus.pubtator import CorpusFormatError
from spacy_genbioel.ner import NCBI_LABEL_MAP, convert_pubtator, make_tokenizer_nlp, parse_label_map, source_ner

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()

# (text, [(mention, occurrence, type, ids)]): offsets are found in the text
DOCS = [
    (
        "Hereditary breast cancer and ovarian cancers after Lidocaine-induced arthritis.",
        [
            ("breast cancer", 0, "SpecificDisease", "D001943"),
            ("Hereditary breast cancer", 0, "DiseaseClass", "D061325"),  # overlaps the one above: the longer stays
            ("ovarian cancer", 0, "SpecificDisease", "D010051"),  # ends inside "cancers": expands
            ("Lidocaine", 0, "Chemical", "D008012"),  # inside "Lidocaine-induced" for scispacy's tokenizer
            ("arthritis", 0, "Modifier", "-1"),
        ],
    ),
    (
        "Renal failure and cystic fibrosis.",
        [
            ("Renal failure", 0, "CompositeMention", "D051437|D007676"),
            ("cystic fibrosis", 0, "SpecificDisease", "D003550"),
        ],
    ),
]


def write_pubtator(path, docs, first_pmid=1):
    lines = []
    for pmid, (text, mentions) in enumerate(docs, start=first_pmid):
        lines += [f"{pmid}|t|{text}", f"{pmid}|a|"]
        for mention, occurrence, label, ids in mentions:
            start = -1
            for _ in range(occurrence + 1):
                start = text.index(mention, start + 1)
            lines.append(f"{pmid}\t{start}\t{start + len(mention)}\t{mention}\t{label}\t{ids}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf8")
    return path


def read_docbin(path, nlp=None):
    nlp = nlp or spacy.blank("en")
    return list(DocBin().from_disk(path).get_docs(nlp.vocab))


def test_label_maps():
    assert parse_label_map("ncbi") == NCBI_LABEL_MAP
    assert set(NCBI_LABEL_MAP.values()) == {"Disease"}
    assert parse_label_map("A=B, C = D") == {"A": "B", "C": "D"}
    assert parse_label_map(None) == {} and parse_label_map("none") == {}
    with pytest.raises(ValueError, match="FROM=TO"):
        parse_label_map("SpecificDisease")


def test_conversion_labels_boundaries_and_overlaps(tmp_path, caplog):
    corpus = write_pubtator(tmp_path / "train.txt", DOCS)
    with caplog.at_level("INFO", logger="spacy_genbioel.ner"):
        stats = convert_pubtator([corpus], tmp_path / "train.spacy", label_map=NCBI_LABEL_MAP)
    assert (stats.documents, stats.mentions, stats.entities) == (2, 7, 6)
    assert (stats.boundary_changed, stats.overlaps_dropped, stats.skipped) == (1, 1, 0)
    assert dict(stats.labels) == {"Disease": 5, "Chemical": 1}  # labels the map does not name stay
    assert stats.files == {str(corpus): 2}
    assert "'ovarian cancer' at 29-43 expanded to token boundaries 29-44" in caplog.text
    assert "overlapping mention 'breast cancer'" in caplog.text
    first, second = read_docbin(tmp_path / "train.spacy")
    assert [(e.text, e.label_) for e in first.ents] == [
        ("Hereditary breast cancer", "Disease"),
        ("ovarian cancers", "Disease"),
        ("Lidocaine", "Chemical"),
        ("arthritis", "Disease"),
    ]
    assert len(first.spans["gold"]) == 5  # every mention, overlapping ones included
    assert first.user_data["doc_id"] == "1" and second.user_data["doc_id"] == "2"
    assert [(e.text, e.kb_id_) for e in second.ents] == [
        ("Renal failure", "D051437|D007676"),
        ("cystic fibrosis", "D003550"),
    ]


def test_single_label_and_the_scispacy_tokenizer(tmp_path):
    pytest.importorskip("scispacy")
    corpus = write_pubtator(tmp_path / "train.txt", DOCS)
    stats = convert_pubtator(
        [corpus], tmp_path / "train.spacy", single_label="Disease", tokenizer="scispacy", tokenizer_out=tmp_path / "tok"
    )
    assert dict(stats.labels) == {"Disease": 6}
    assert stats.boundary_changed == 2  # "Lidocaine" grows to the whole "Lidocaine-induced"
    loaded = spacy.load(tmp_path / "tok")
    first = read_docbin(tmp_path / "train.spacy", loaded)[0]
    assert "Lidocaine-induced" in [e.text for e in first.ents]


def test_the_scispacy_tokenizer_survives_saving_and_loading(tmp_path):
    pytest.importorskip("scispacy")
    text = (
        "BRCA1-associated cancer (BC) in 5-FU/LV-treated pts; IL-2R alpha, Na+/K+-ATPase, 2.5mg/kg i.v. "
        "e.g. Dr. Smith's C57BL/6J mice; [3H]thymidine (p<0.05), see http://www.x.org/a."
    )
    nlp = make_tokenizer_nlp("scispacy")
    nlp.to_disk(tmp_path / "tok")
    loaded = spacy.load(tmp_path / "tok")
    assert loaded.config["nlp"]["tokenizer"] == {"@tokenizers": "spacy.Tokenizer.v1"}  # no code needed to load it
    tokens = [t.text for t in nlp(text)]
    assert [t.text for t in loaded(text)] == tokens
    assert "5-FU/LV-treated" in tokens and "BRCA1-associated" in tokens
    default = [t.text for t in make_tokenizer_nlp("default")(text)]
    assert "BRCA1" in default and default != tokens
    with pytest.raises(ValueError, match="Unknown tokenizer"):
        make_tokenizer_nlp("whitespace")


def test_bad_input_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("1|t|Renal failure.\n1|a|\n1\t0\t13\tRenal failure\n\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=rf"{bad}:3: PMID 1: expected"):
        convert_pubtator([bad], tmp_path / "x.spacy")
    untyped = tmp_path / "untyped.txt"
    untyped.write_text("7|t|Renal failure.\n7|a|\n7\t0\t13\tRenal failure\t\tD1\n\n", encoding="utf8")
    with pytest.raises(CorpusFormatError, match=rf"{untyped}: PMID 7: mention 'Renal failure' at 0-13 has no type"):
        convert_pubtator([untyped], tmp_path / "x.spacy")
    assert convert_pubtator([untyped], tmp_path / "x.spacy", single_label="Disease").entities == 1


def test_ner_corpus_command(tmp_path):
    corpus = write_pubtator(tmp_path / "train.txt", DOCS)
    result = runner.invoke(
        app,
        [
            "ner-corpus",
            str(corpus),
            str(corpus),
            "--out",
            str(tmp_path / "c" / "train.spacy"),
            "--label-map",
            "ncbi",
            "--tokenizer-out",
            str(tmp_path / "tok"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "4 documents, 12 entities (Chemical 2, Disease 10)" in " ".join(result.output.split())
    assert len(read_docbin(tmp_path / "c" / "train.spacy")) == 4 and (tmp_path / "tok" / "tokenizer").exists()
    both = runner.invoke(
        app,
        [
            "ner-corpus",
            str(corpus),
            "--out",
            str(tmp_path / "y.spacy"),
            "--label-map",
            "ncbi",
            "--single-label",
            "Disease",
        ],
    )
    assert both.exit_code != 0


@pytest.mark.parametrize("name", ["ner_ncbi_cnn", "ner_bc5cdr_cnn"])
def test_ner_configs_are_valid_spacy_training_configs(name):
    from spacy.cli.debug_config import debug_config

    path = ROOT / "configs" / f"{name}.cfg"
    debug_config(path, overrides={})  # raises on an invalid config
    config = spacy.util.load_config(path)
    assert config["nlp"]["pipeline"] == ["tok2vec", "ner"]
    assert config["components"]["tok2vec"]["model"]["@architectures"] == "spacy.HashEmbedCNN.v2"
    assert config["initialize"]["before_init"]["@callbacks"] == "spacy.copy_from_base_model.v1"
    assert config["paths"]["vectors"] is None and 0 < config["training"]["max_steps"] <= 5000


# -- training and packaging ----------------------------------------------------------------------------
TRAIN_DOCS = [
    (
        "Patients with renal failure were given Lidocaine-induced relief.",
        [("renal failure", 0, "Disease", "D1"), ("Lidocaine", 0, "Chemical", "C1")],
    ),
    (
        "Cystic fibrosis and renal failure after cocaine.",
        [
            ("Cystic fibrosis", 0, "Disease", "D2"),
            ("renal failure", 0, "Disease", "D1"),
            ("cocaine", 0, "Chemical", "C2"),
        ],
    ),
    (
        "We studied lung cancer in mice given cocaine-treated water.",
        [("lung cancer", 0, "Disease", "D3"), ("cocaine", 0, "Chemical", "C2")],
    ),
] * 2


@pytest.fixture(scope="module")
def trained_ner(tmp_path_factory):
    """A spaCy NER trained for a few seconds with the project's config and scispacy's tokenizer."""
    pytest.importorskip("scispacy")
    from spacy.cli.train import train

    tmp = tmp_path_factory.mktemp("ner")
    corpus = write_pubtator(tmp / "train.txt", TRAIN_DOCS)
    convert_pubtator([corpus], tmp / "train.spacy", tokenizer="scispacy", tokenizer_out=tmp / "tok")
    overrides = {
        "paths.train": str(tmp / "train.spacy"),
        "paths.dev": str(tmp / "train.spacy"),
        "paths.tokenizer": str(tmp / "tok"),
        "training.max_steps": 60,
        "training.eval_frequency": 20,
        "training.patience": 0,
        "training.batcher.size.start": 40,
        "training.batcher.size.stop": 40,
        "components.tok2vec.model.embed_size": 500,
        "components.tok2vec.model.depth": 2,
    }
    train(ROOT / "configs" / "ner_ncbi_cnn.cfg", tmp / "out", overrides=overrides)
    return tmp / "out" / "model-last"


def test_trained_ner_keeps_the_corpus_tokenizer(trained_ner):
    nlp = spacy.load(trained_ner)
    assert nlp.pipe_names == ["tok2vec", "ner"]
    assert "Lidocaine-induced" in [t.text for t in nlp("Lidocaine-induced relief.")]  # scispacy's rules, copied
    assert set(nlp.get_pipe("ner").labels) == {"Chemical", "Disease"}


def test_package_with_a_trained_ner(tmp_path, trained_ner, micro_model, word_tokenizer, small_kb):
    from spacy_genbioel.models import save_model
    from spacy_genbioel.training.package import EntitySource, package

    save_model(micro_model, word_tokenizer, tmp_path / "model")
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    out = package(
        tmp_path / "model",
        tmp_path / "kb.jsonl",
        tmp_path / "pkg",
        entities=EntitySource(ner=trained_ner),
        settings={"num_beams": 2, "top_k": 2},
    )
    nlp = spacy.load(out)
    assert nlp.pipe_names == ["abbreviation_detector", "tok2vec", "ner", "genbioel"]
    assert "trained" in nlp.meta["description"]
    ner_only = spacy.load(trained_ner)
    text = " ".join(text for text, _ in TRAIN_DOCS[:3])
    assert [t.text for t in nlp.make_doc(text)] == [t.text for t in ner_only.make_doc(text)]
    doc = nlp(text)
    expected = [(e.start_char, e.end_char, e.label_) for e in ner_only(text).ents]
    assert [(e.start_char, e.end_char, e.label_) for e in doc.ents] == expected
    assert expected, "the few-step NER should find some of its training entities"
    kb_ids = {c.id for c in small_kb}
    assert all(e._.kb_id in kb_ids and e.kb_id_ == e._.kb_id for e in doc.ents)
    # without --ner the entity ruler stays the entity source
    ruler = spacy.load(
        package(tmp_path / "model", tmp_path / "kb.jsonl", tmp_path / "pkg2", settings={"num_beams": 2, "top_k": 2})
    )
    assert "entity_ruler" in ruler.pipe_names and "ner" not in ruler.pipe_names
    assert not ruler.get_pipe("genbioel").linker.decoding.exact_match
    exact = spacy.load(
        package(
            tmp_path / "model",
            tmp_path / "kb.jsonl",
            tmp_path / "pkg3",
            settings={"num_beams": 2, "top_k": 2, "decoding.exact_match": True},
        )
    )
    assert exact.config["components"]["genbioel"]["decoding"]["exact_match"] is True
    assert exact.get_pipe("genbioel").linker.decoding.exact_match


def test_source_ner_needs_an_ner(trained_ner):
    target = spacy.blank("en")
    assert source_ner(target, trained_ner) == ["tok2vec", "ner"]
    with pytest.raises(ValueError, match="no 'ner' component"):
        source_ner(spacy.blank("en"), spacy.blank("en"))


def test_package_command_takes_ner(tmp_path, trained_ner, micro_model, word_tokenizer, small_kb):
    from spacy_genbioel.models import save_model

    save_model(micro_model, word_tokenizer, tmp_path / "model")
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    result = runner.invoke(
        app,
        [
            "package",
            "--model",
            str(tmp_path / "model"),
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--out",
            str(tmp_path / "pkg"),
            "--ner",
            str(trained_ner),
            "--decoding.num_beams",
            "2",
            "--decoding.top_k",
            "2",
        ],
    )
    assert result.exit_code == 0, result.output
    config = spacy.util.load_config(tmp_path / "pkg" / "config.cfg")
    assert config["nlp"]["pipeline"] == ["abbreviation_detector", "tok2vec", "ner", "genbioel"]
    candidates = config["components"]["genbioel"]["candidates"]
    assert (candidates["retriever"], candidates["shortcut_threshold"]) == ("none", None)
    assert config["components"]["genbioel"]["decoding"]["num_beams"] == 2
    # retrieve the easy mentions, generate the rest: the settings travel in the config
    result = runner.invoke(
        app,
        [
            "package",
            "--model",
            str(tmp_path / "model"),
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--out",
            str(tmp_path / "pkg2"),
            "--decoding.num_beams",
            "2",
            "--decoding.top_k",
            "2",
            "--candidates.retriever",
            "tfidf",
            "--candidates.num_candidates",
            "7",
            "--candidates.restrict_to_candidates",
            "false",
            "--candidates.shortcut_threshold",
            "0.8",
        ],
    )
    assert result.exit_code == 0, result.output
    linker = spacy.load(tmp_path / "pkg2").get_pipe("genbioel").linker
    assert (
        linker.candidates.num_candidates,
        linker.candidates.restrict_to_candidates,
        linker.candidates.shortcut_threshold,
    ) == (7, False, 0.8)
    assert linker.retriever.name == "tfidf"
    # an unknown setting is a usage error naming it
    result = runner.invoke(
        app,
        [
            "package",
            "--model",
            str(tmp_path / "model"),
            "--kb",
            str(tmp_path / "kb.jsonl"),
            "--out",
            str(tmp_path / "pkg3"),
            "--decoding.num_beam",
            "2",
        ],
    )
    assert result.exit_code == 2 and "decoding.num_beam" in result.output


# -- the shared data ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.skipif(data_dir() is None, reason="needs ../shared/data")
def test_conversion_of_the_real_corpora(tmp_path):
    data = data_dir()
    ncbi = convert_pubtator(
        [data / "ncbi_disease" / "NCBItrainset_corpus.txt"], tmp_path / "ncbi.spacy", label_map=NCBI_LABEL_MAP
    )
    assert (ncbi.documents, ncbi.mentions, ncbi.entities) == (593, 5145, 5145)
    assert (ncbi.boundary_changed, ncbi.overlaps_dropped, dict(ncbi.labels)) == (9, 0, {"Disease": 5145})
    cdr = convert_pubtator([data / "bc5cdr" / "CDR_TrainingSet.PubTator.txt"], tmp_path / "cdr.spacy")
    assert (cdr.documents, cdr.mentions, cdr.entities) == (500, 9385, 9381)
    assert (cdr.boundary_changed, cdr.overlaps_dropped) == (121, 4)
    assert set(cdr.labels) == {"Chemical", "Disease"}


def test_project_ner_commands():
    """The project's spaCy lines (ner-train, ner-evaluate) use spaCy's real options and existing configs,
    for every corpus (project.yml's defaults and each configs/corpora/<corpus>.vars) and NER architecture."""
    import shlex

    import srsly
    import typer
    from spacy.cli import app as spacy_app
    from weasel.util import load_project_config, parse_config_overrides

    names = {c["name"] for c in srsly.read_yaml(ROOT / "project.yml")["commands"]}
    assert {"ner-corpus", "ner-train", "ner-evaluate", "package-ner", "evaluate-e2e"} <= names
    assert not any(name.startswith("bc5cdr-") for name in names)  # one command per step, vars.corpus picks the corpus
    spacy_cli = typer.main.get_command(spacy_app)
    trained = set()
    for var_file in [None, *sorted((ROOT / "configs" / "corpora").glob("*.vars"))]:
        corpus_vars = parse_config_overrides(shlex.split(var_file.read_text(encoding="utf8")) if var_file else [])
        for arch in ("cnn", "transformer"):  # vars.ner_arch picks the config
            project = load_project_config(ROOT, overrides={**corpus_vars, "vars.ner_arch": arch})
            for command in project["commands"]:
                for line in command["script"]:
                    args = shlex.split(line)
                    if args[:3] != ["python", "-m", "spacy"]:
                        continue
                    _check_spacy_line(spacy_cli, command["name"], args, command.get("deps", []))
                    if args[3] == "train":
                        trained.add(args[4])
    assert {f"configs/ner_{c}_{a}.cfg" for c in ("ncbi", "bc5cdr") for a in ("cnn", "transformer")} <= trained


def _check_spacy_line(spacy_cli, name, args, deps):
    click_cmd = spacy_cli.commands[args[3]]
    known = {opt for p in click_cmd.params for opt in (*p.opts, *p.secondary_opts)}
    for arg in args[4:]:
        if arg.startswith("--"):
            assert arg in known or (args[3] == "train" and "." in arg), f"{name}: unknown option {arg}"
    if args[3] == "train":
        assert (ROOT / args[4]).exists() and args[4] in deps
        config = spacy.util.load_config(ROOT / args[4])
        for arg in args[5:]:
            if arg.startswith("--paths."):
                assert arg[len("--paths.") :] in config["paths"], arg
