"""Cross-fitting as package commands (``crossfit``, ``crossfit-folds``, the fold reports): which steps each
stage runs for NCBI-disease, BC5CDR and AskAPatient, with the steps recorded instead of run; what is skipped
once its output exists; the settings refused; the ``fit`` stage end to end on small synthetic predictions."""

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.training.crossfit import (
    CrossfitSettings,
    FoldsSettings,
    Step,
    StepError,
    crossfit_stage,
    given_folds_stage,
    run_steps,
)

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


class Recorder:
    """A runner that records each step and writes what it would have (an empty report, a folder, a fusion file
    whose retrievers are the last --alternative, or every --source)."""

    def __init__(self):
        self.steps, self.logs = [], {}

    def __call__(self, step: Step, log=None):
        self.steps.append(step)
        self.logs[step] = log
        argv = list(step.argv)
        if argv[0] == "fit-fusion":
            sources = [argv[i + 1].split("=")[0] for i, a in enumerate(argv) if a == "--source"]
            alternatives = [argv[i + 1].split(",") for i, a in enumerate(argv) if a == "--alternative"]
            out = Path(argv[argv.index("--out") + 1])
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"sources": ["genbioel", *(alternatives[-1] if alternatives else sources[1:])]}))
        target = step.done_when
        if target is not None and not target.exists():
            if target.suffix:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text("{}")
            else:
                target.mkdir(parents=True)

    def commands(self, name=None):
        return [list(s.argv) for s in self.steps if name is None or s.argv[0] == name]


def option(argv, name):
    return argv[argv.index(name) + 1]


def options(argv, name):
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


# -- settings ----------------------------------------------------------------------------------------------------------
def test_settings_take_the_scripts_defaults_and_the_corpus_inputs():
    ncbi = CrossfitSettings()
    assert (ncbi.k, ncbi.seconds, ncbi.rescnn_seconds, ncbi.beams, ncbi.variants, ncbi.forced) == (
        2,
        1200,
        0,
        None,
        ("plain", "aug"),
        True,
    )
    assert ncbi.out == Path("training/ncbi/tiny/crossfit") and ncbi.pretrained == Path(
        "training/ncbi/tiny/pretrain/model"
    )
    assert ncbi.config == Path("configs/finetune_tiny.cfg") and ncbi.rescnn_model == Path("training/ncbi/rescnn/model")
    assert ncbi.train == Path("../shared/data/ncbi_disease/NCBItrainset_corpus.txt") and ncbi.dev == Path(
        "corpus/ncbi/dev.jsonl"
    )
    assert ncbi.kb_sources == ("../shared/data/vocab/medic_06Jul2012.txt",) and ncbi.kb_format == "medic"
    assert ncbi.crosswalk is None and ncbi.refresh_pool == 0 and ncbi.generator_row == "genbioel"
    cdr = CrossfitSettings(corpus="bc5cdr", data_dir=Path("/data"), preset="base", beams=2)
    assert cdr.kb_format == "ctd" and cdr.refresh_pool == 50 and cdr.generator_row == "genbioel_b2"
    assert cdr.kb_sources == (
        "/data/vocab/CTD_diseases_2017.tsv.gz",
        "mesh-tsv:/data/vocab/mesh/mesh_id_label_mappings.tsv",
        "mesh-tsv:/data/vocab/mesh/mesh_supp_id_label_mappings.tsv",
    )
    assert cdr.crosswalk == Path("/data/vocab/bc5cdr_legacy_id_crosswalk.tsv") and cdr.out == Path(
        "training/bc5cdr/base/crossfit"
    )
    # the vars given (project.yml passes its own) win over the known corpus's
    given = CrossfitSettings(
        corpus="bc5cdr", train=Path("t.txt"), kb_sources=("a.tsv",), kb_format="medic", refresh_pool=0
    )
    assert (given.train, given.kb_sources, given.kb_format, given.refresh_pool) == (
        Path("t.txt"),
        ("a.tsv",),
        "medic",
        0,
    )
    other = CrossfitSettings(corpus="medmentions", train=Path("t.txt"), kb_sources=("umls",), kb_format="umls")
    assert other.out == Path("training/medmentions/tiny/crossfit") and other.crosswalk is None


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"corpus": "medmentions"}, "unknown corpus 'medmentions'"),
        ({"k": 1}, "at least 2 folds"),
        ({"beams": 0}, "beams 0"),
        ({"variants": ("plain", "both")}, "variants plain both"),
        ({"variants": ()}, "variants"),
        ({"folds": (2,)}, "folds [2]: each in 0..1"),
        ({"seconds": -1}, "negative seconds"),
        ({"eval_mentions": -1}, "negative --eval-mentions"),
        ({"jobs": -1}, "jobs -1"),
        ({"l2": 0.0}, "l2 0.0: above 0"),
    ],
)
def test_settings_refuse_what_cannot_run(bad, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        CrossfitSettings(**bad)


def test_folds_settings_refuse_what_cannot_run():
    for bad, message in (
        ({"folds": ()}, "no folds"),
        ({"jobs": 0}, "jobs 0"),
        ({"folds_fit": (1,)}, "two folds"),
        ({"max_recall_loss": -0.1}, "below 0"),
        ({"l2": 0.0}, "l2 0.0: above 0"),
    ):
        with pytest.raises(ValueError, match=message):
            FoldsSettings(**bad)


def test_commands_refuse_unknown_stages_corpora_and_values(tmp_path):
    for argv, message in (
        (["crossfit", "nonsense"], "unknown stage"),
        (["crossfit", "train", "--corpus", "medmentions"], "unknown corpus"),
        (["crossfit", "fit", "--beams", "two"], "--beams 'two'"),
        (["crossfit", "fit", "--l2", "much"], "--l2 'much'"),
        (["crossfit", "fit", "--anchor", str(tmp_path / "missing.json")], "no such fusion file"),
        (["crossfit", "all", "--anchor", "genbioel:nothing"], "no fusion of that name ships"),
        (["crossfit-folds", "nonsense"], "unknown stage"),
        (["crossfit-folds", "fusion", "--max-recall-loss", "lots"], "--max-recall-loss"),
        (["crossfit-folds", "fusion", "--folds-fit", "3"], "two folds"),
        (["crossfit-folds", "fusion", "cascade", "report"], "unknown stage 'report'"),
        (["crossfit-folds", "cascade", "--anchor", str(tmp_path / "missing.json")], "no such fusion file"),
        (["crossfit-folds", "fusion", "--l2", "much"], "--l2 'much'"),
    ):
        result = runner.invoke(app, [*argv, "--out", str(tmp_path / "out")])
        assert result.exit_code == 2 and message in result.output, (argv, result.output)
    assert not (tmp_path / "out").exists()


def test_run_steps_skips_what_is_done_and_reads_earlier_outputs(tmp_path):
    done = tmp_path / "done.json"
    done.write_text("{}")

    def plan():
        yield Step(("a",), done_when=done)
        yield Step(("b",), done_when=tmp_path / "b.json")
        yield Step(("c",), done_when=tmp_path / "b.json")  # b wrote it: c is done by the time it is reached
        yield Step(("d",))  # no output named: always runs

    record = Recorder()
    assert run_steps(plan(), record) == 2 and record.commands() == [["b"], ["d"]]
    assert str(Step(("evaluate", "--kb", "a b.jsonl"))) == "python -m spacy_genbioel evaluate --kb 'a b.jsonl'"
    assert str(Step(("bench/cascade.py", "--rows", "x"), script=True)) == "python bench/cascade.py --rows x"


# -- crossfit ----------------------------------------------------------------------------------------------------------
def test_train_stage_cuts_folds_once_and_trains_each_fold_in_its_log(tmp_path):
    s = CrossfitSettings(out=tmp_path / "cf", data_dir=tmp_path / "data", seconds=900)
    record = Recorder()
    crossfit_stage(s, "train", runner=record)
    assert record.steps[0].argv == (
        "folds",
        str(tmp_path / "data/ncbi_disease/NCBItrainset_corpus.txt"),
        "--out",
        str(tmp_path / "cf/folds"),
        "--k",
        "2",
    )
    for fold in (0, 1):
        steps = [st for st in record.steps[1:] if f"fold-{fold}" in " ".join(st.argv)]
        assert [st.argv[0] for st in steps] == ["build-kb", "corpus", "finetune"]  # no ResCNN without its seconds
        assert {record.logs[st] for st in steps} == {tmp_path / "cf" / f"train-fold-{fold}.log"}
        kb, corpus, finetune = (list(st.argv) for st in steps)
        assert (
            kb[1:4] == [str(tmp_path / "data/vocab/medic_06Jul2012.txt"), "--format", "medic"]
            and "--crosswalk" not in kb
        )
        assert option(kb, "--prior-pubtator") == str(
            tmp_path / f"cf/folds/fold-{fold}/train.txt"
        )  # the fold's own priors
        assert (
            option(corpus, "--dev") == str(tmp_path / f"cf/folds/fold-{fold}/heldout.txt")
            and "--abbreviations" in corpus
        )
        assert (
            option(finetune, "--model") == "training/ncbi/tiny/pretrain/model"
            and option(finetune, "--dev") == "corpus/ncbi/dev.jsonl"
        )
        assert (option(finetune, "--training.max_seconds"), option(finetune, "--training.seed")) == ("900", str(fold))
        assert option(finetune, "--data.eval_mentions") == "300"  # the fold models' evaluations only report
        assert option(finetune, "--out") == str(tmp_path / f"cf/models/fold-{fold}")
    again = Recorder()
    crossfit_stage(s, "train", runner=again)
    assert again.steps == []  # everything is there: a rerun does nothing


def test_fold_generators_take_the_final_models_angel_stage_and_are_the_ones_scored(tmp_path):
    s = CrossfitSettings(out=tmp_path / "cf", angel_config=Path("configs/angel_rank_tiny.cfg"), folds=(1,), jobs=1)
    record = Recorder()
    crossfit_stage(s, "train", runner=record)
    assert [st.argv[0] for st in record.steps] == ["folds", "build-kb", "corpus", "finetune", "angel"]
    angel = record.commands("angel")[0]
    models = tmp_path / "cf/models/fold-1"
    assert option(angel, "--model") == str(models / "model") and option(angel, "--out") == str(models / "angel")
    assert option(angel, "--config") == "configs/angel_rank_tiny.cfg" and option(angel, "--training.seed") == "1"
    assert option(angel, "--train") == str(tmp_path / "cf/folds/fold-1/corpus/train.jsonl")
    assert option(angel, "--data.eval_mentions") == "300"
    assert record.steps[-1].done_when == models / "angel" / "result.json"
    scored = Recorder()
    crossfit_stage(s, "score", runner=scored)
    for package in scored.commands("package"):
        assert option(package, "--model") == str(models / "angel" / "model")
        assert option(package, "--config") == str(models / "angel" / "config.cfg")


def test_bc5cdr_folds_use_its_vocabularies_crosswalk_and_refresh_pool(tmp_path):
    s = CrossfitSettings(
        corpus="bc5cdr", out=tmp_path / "cf", data_dir=Path("D"), rescnn_seconds=600, folds=(1,), jobs=1
    )
    record = Recorder()
    crossfit_stage(s, "train", runner=record)
    assert [st.argv[0] for st in record.steps] == ["folds", "build-kb", "corpus", "finetune", "train-rescnn"]
    kb, corpus, _, rescnn = record.commands()[1:]
    assert "mesh-tsv:D/vocab/mesh/mesh_supp_id_label_mappings.tsv" in kb and option(kb, "--format") == "ctd"
    assert option(kb, "--crosswalk") == option(corpus, "--crosswalk") == "D/vocab/bc5cdr_legacy_id_crosswalk.tsv"
    assert option(rescnn, "--data.refresh_pool") == "50" and option(rescnn, "--training.max_seconds") == "600"
    assert record.steps[-1].done_when == tmp_path / "cf/models/fold-1/rescnn/model"


def test_score_stage_writes_every_row_once(tmp_path):
    s = CrossfitSettings(out=tmp_path / "cf", beams=2, folds=(0,))
    record = Recorder()
    crossfit_stage(s, "score", runner=record)
    names = [st.argv[0] for st in record.steps]
    assert names == ["folds", "build-kb", "package", *["evaluate"] * 4, "package", *["evaluate"] * 4]
    package = record.commands("package")[0]
    assert "--no-entity-ruler" in package and option(package, "--kb") == str(
        tmp_path / "cf/folds/fold-0/kb_plain.jsonl"
    )
    rows = {Path(option(c, "--predictions")).name: c for c in record.commands("evaluate")}
    assert sorted(rows) == sorted(
        f"{v}_{r}.jsonl" for v in ("plain", "aug") for r in ("genbioel_b2", "tfidf", "dense", "forced")
    )
    generator = rows["plain_genbioel_b2.jsonl"]
    assert option(generator, "--decoding.num_beams") == option(generator, "--decoding.top_k") == "2"
    assert option(generator, "--candidates.retriever") == "none" and option(generator, "--device") == "cpu"
    forced = rows["aug_forced.jsonl"]
    assert option(forced, "--decoding.search") == "forced" and option(forced, "--candidates.retriever") == "tfidf+dense"
    assert "--device" not in rows["plain_tfidf.jsonl"] and option(rows["plain_tfidf.jsonl"], "--corpus").endswith(
        "fold-0/heldout.txt"
    )
    # a fold ResCNN, once trained, is a source of its own and of the forced rows; the rows made already are kept
    (tmp_path / "cf/models/fold-0/rescnn/model").mkdir(parents=True)
    more = Recorder()
    crossfit_stage(s, "score", runner=more)
    made = sorted(Path(option(c, "--predictions")).name for c in more.commands())
    assert made == sorted(
        f"{v}_{r}.jsonl"
        for v in ("plain", "aug")
        for r in ("rescnn", "forced_tfidf_rescnn", "forced_tfidf_dense_rescnn")
    )
    # no forced rows at all (FORCED=0)
    quiet = Recorder()
    crossfit_stage(
        CrossfitSettings(out=tmp_path / "other", variants=("plain",), forced=False, folds=(1,)), "score", runner=quiet
    )
    assert [Path(option(c, "--predictions")).name for c in quiet.commands("evaluate")] == [
        "plain_genbioel.jsonl",
        "plain_tfidf.jsonl",
        "plain_dense.jsonl",
    ]


def test_fit_stage_fits_the_fusion_then_the_cascade_on_the_chosen_retrievers(tmp_path):
    out = tmp_path / "cf"
    s = CrossfitSettings(out=out, rescnn_seconds=60, rescnn_model=Path("models/rescnn"), beams=2, variants=("aug",))
    record = Recorder()
    crossfit_stage(s, "fit", runner=record)
    fusion, cascade = record.commands("fit-fusion")
    assert options(fusion, "--source") == [
        f"{name}={out}/fold-0/aug_{row}.jsonl,{out}/fold-1/aug_{row}.jsonl"
        for name, row in (("genbioel", "genbioel_b2"), ("tfidf", "tfidf"), ("dense", "dense"), ("rescnn", "rescnn"))
    ]
    assert options(fusion, "--kb") == [f"{out}/folds/fold-{i}/kb_aug.jsonl" for i in (0, 1)]
    assert options(fusion, "--alternative") == ["tfidf,dense", "tfidf,rescnn", "tfidf,dense,rescnn"]
    assert option(fusion, "--retriever-model") == "rescnn=models/rescnn" and option(fusion, "--generator-beams") == "2"
    assert (
        "--cascade" in fusion
        and option(fusion, "--defer") == "dense"
        and option(fusion, "--out") == f"{out}/fusion_aug.json"
    )
    # the recorder's fusion chose all three: the cascade reads the forced scores of their candidates
    assert (
        options(cascade, "--source")[0]
        == f"genbioel={out}/fold-0/aug_forced_tfidf_dense_rescnn.jsonl,{out}/fold-1/aug_forced_tfidf_dense_rescnn.jsonl"
    )
    assert options(cascade, "--alternative") == ["tfidf,dense,rescnn"] and option(cascade, "--generator") == "forced"
    assert "--generator-beams" not in cascade and option(cascade, "--out") == f"{out}/cascade_aug.json"
    again = Recorder()
    crossfit_stage(CrossfitSettings(out=out, variants=("aug",), forced=False), "fit", runner=again)
    (fusion,) = again.commands(
        "fit-fusion"
    )  # fits always rerun; without rescnn seconds or fold ResCNNs: TF-IDF and MiniLM
    assert [s.split("=")[0] for s in options(fusion, "--source")] == [
        "genbioel",
        "tfidf",
        "dense",
    ] and "--alternative" not in fusion


def test_fit_stage_centres_both_fits_penalty_on_the_anchor(tmp_path):
    """--anchor and --l2 reach the beam fusion's fit and the forced cascade's alike; unset, neither is passed."""
    s = CrossfitSettings(out=tmp_path / "cf", variants=("plain",), anchor="genbioel:retrieval", l2=0.1)
    record = Recorder()
    crossfit_stage(s, "fit", runner=record)
    fits = record.commands("fit-fusion")
    assert len(fits) == 2
    for fit in fits:
        assert option(fit, "--anchor") == "genbioel:retrieval" and option(fit, "--l2") == "0.1"
        assert fit.index("--l2") < fit.index("--out")
    plain = Recorder()
    crossfit_stage(CrossfitSettings(out=tmp_path / "cf", variants=("plain",)), "fit", runner=plain)
    assert all("--anchor" not in fit and "--l2" not in fit for fit in plain.commands("fit-fusion"))
    alone = Recorder()
    crossfit_stage(CrossfitSettings(out=tmp_path / "cf", variants=("plain",), l2=1.0), "fit", runner=alone)
    assert all("--anchor" not in fit and option(fit, "--l2") == "1.0" for fit in alone.commands("fit-fusion"))


def test_all_runs_the_stages_in_order_and_stops_at_a_failure(tmp_path):
    record = Recorder()
    crossfit_stage(CrossfitSettings(out=tmp_path / "cf", variants=("plain",)), "all", runner=record)
    names = [st.argv[0] for st in record.steps]
    assert names[0] == "folds" and names.index("finetune") < names.index("package") < names.index("fit-fusion")

    def broken(step, log=None):
        if step.argv[0] == "finetune":
            raise StepError("finetune failed")
        record(step, log)

    with pytest.raises(StepError, match="fold 0: finetune failed; fold 1: finetune failed"):
        crossfit_stage(CrossfitSettings(out=tmp_path / "other"), "all", runner=broken)


def _fit_predictions(out: Path) -> None:
    """Held-out predictions of two folds: the generator a coin toss between two concepts, TF-IDF sometimes right,
    MiniLM never, the ResCNN mostly, the forced scores right."""
    rng = random.Random(0)
    kb = KnowledgeBase([Concept(f"C{i}", [f"concept {i} name"]) for i in range(20)])
    (out / "folds").mkdir(parents=True)
    (out / "folds" / "folds.json").write_text("{}")

    def cand(cid, score):
        return [[cid], kb.preferred_name(cid), score]

    for fold in range(2):
        (out / "folds" / f"fold-{fold}").mkdir()
        kb.to_jsonl(out / "folds" / f"fold-{fold}" / "kb_plain.jsonl")
        rows = {
            name: []
            for name in (
                "genbioel",
                "tfidf",
                "dense",
                "rescnn",
                "forced",
                "forced_tfidf_rescnn",
                "forced_tfidf_dense_rescnn",
            )
        }
        for i in range(40):
            gold, wrong, other, far = (f"C{j}" for j in rng.sample(range(20), 4))
            first, second = rng.sample([gold, wrong], 2)
            lists = {
                "genbioel": [cand(first, -0.2), cand(second, -0.5)],
                "tfidf": [cand(other, 0.9), cand(rng.choice([gold, far]), 0.6)],
                "dense": [cand(other, 0.8), cand(far, 0.7)],
                "rescnn": [cand(gold, 0.9), cand(other, 0.5)] if i % 5 else [cand(other, 0.9), cand(gold, 0.5)],
            }
            lists.update({name: [cand(gold, -0.3), cand(other, -0.9)] for name in rows if name.startswith("forced")})
            for name, found in lists.items():
                rows[name].append(
                    {
                        "doc_id": f"d{fold}-{i}",
                        "start": 0,
                        "end": 4,
                        "text": f"m {i}",
                        "gold": [gold],
                        "hit_rank": None,
                        "candidates": found,
                    }
                )
        (out / f"fold-{fold}").mkdir()
        for name, records in rows.items():
            (out / f"fold-{fold}" / f"plain_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_fit_command_chooses_the_retrievers_and_fits_the_cascade_on_their_forced_scores(tmp_path):
    """``crossfit fit`` end to end (fit-fusion in this process) with fold ResCNNs: the fusion keeps the retriever
    set that links the held-out folds best, the cascade is fitted on the forced scores of that set's candidates."""
    out = tmp_path / "crossfit"
    _fit_predictions(out)
    base = [
        "crossfit",
        "fit",
        "--out",
        str(out),
        "--variants",
        "plain",
        "--rescnn-seconds",
        "60",
        "--rescnn-model",
        "models/rescnn",
    ]
    result = runner.invoke(app, base)
    assert result.exit_code == 0, result.output
    fusion = json.loads((out / "fusion_plain.json").read_text())
    assert fusion["sources"] == ["genbioel", "tfidf", "rescnn"], fusion["fit"]
    assert set(fusion["fit"]["choice"]) == {"tfidf+dense", "tfidf+rescnn", "tfidf+dense+rescnn"}
    assert fusion["retrievers"] == {"tfidf": {}, "rescnn": {"model": "models/rescnn"}}
    assert fusion["generator"] == "beam" and fusion["cascade"]["settle_weights"] and "early" not in fusion["cascade"]
    cascade = json.loads((out / "cascade_plain.json").read_text())
    assert cascade["sources"] == fusion["sources"] and cascade["generator"] == "forced" and cascade["cascade"]
    assert "generator_beams" not in fusion["fit"] and fusion["fit"]["generator_width"] == 2
    # --beams: the fold generators' files at that width, recorded in the fusion file;
    # --no-forced: no forced-score cascade
    for fold in range(2):
        (out / f"fold-{fold}" / "plain_genbioel.jsonl").rename(out / f"fold-{fold}" / "plain_genbioel_b2.jsonl")
        for forced in (out / f"fold-{fold}").glob("plain_forced*.jsonl"):
            forced.unlink()
    (out / "cascade_plain.json").unlink()
    result = runner.invoke(app, [*base, "--beams", "2", "--no-forced"])
    assert result.exit_code == 0, result.output
    fusion = json.loads((out / "fusion_plain.json").read_text())
    assert fusion["fit"]["generator_beams"] == 2 and fusion["cascade"]["settle_weights"]
    assert not (out / "cascade_plain.json").exists()
    # a step that fails ends the command with one line naming it
    (out / "fold-1" / "plain_tfidf.jsonl").unlink()
    result = runner.invoke(app, [*base, "--beams", "2", "--no-forced"])
    assert result.exit_code == 1 and "python -m spacy_genbioel fit-fusion" in result.output


# -- crossfit-folds (AskAPatient) --------------------------------------------------------------------------------------
def _folds(tmp_path, stage, **settings):
    s = FoldsSettings(
        data_dir=tmp_path / "data",
        out=tmp_path / "aap",
        metrics=tmp_path / "metrics",
        cascade_bench=ROOT / "bench" / "cascade.py",
        **{"jobs": 1, **settings},
    )
    record = Recorder()
    given_folds_stage(s, stage, runner=record)
    return record


def test_prepare_shares_one_kb_tokenizer_and_pre_training(tmp_path):
    record = _folds(tmp_path, "prepare", pretrain_steps=10, seed=3)
    assert [st.argv[0] for st in record.steps] == ["build-kb", "tokenizer", "init-model", "pretrain"]
    kb, tokenizer, init, pretrain = record.commands()
    assert kb[1] == str(tmp_path / "data/askapatient/askapatient.json") and option(kb, "--format") == "askapatient"
    assert option(tokenizer, "--kb") == str(tmp_path / "aap/kb.jsonl") and "--texts" not in tokenizer  # names only
    assert (
        option(init, "--seed") == option(pretrain, "--training.seed") == "3"
        and option(pretrain, "--training.max_steps") == "10"
    )
    assert option(pretrain, "--config") == "configs/pretrain_tiny.cfg"


def test_folds_give_the_device_to_the_generator_rows_only(tmp_path):
    """``evaluate`` refuses component settings (``--device``) for a retriever: the fold rows must not pass it."""
    record = _folds(tmp_path, "folds", folds=(3,))
    assert {record.logs[st] for st in record.steps} == {tmp_path / "aap" / "fold-3.log"}
    rows = {Path(option(c, "--json")).name: c for c in record.commands("evaluate")}
    assert sorted(rows) == sorted(
        f"{kb}_{name}.json"
        for kb in ("plain", "aug")
        for name in ("exact", "tfidf", "dense", "rescnn", "genbioel", "genbioel_b2")
    )
    for name, call in rows.items():
        assert ("--device" in call) == ("genbioel" in name), call
        assert option(call, "--corpus") == str(tmp_path / "data/askapatient/AskAPatient.fold-3.validation.txt")
    b2 = rows["plain_genbioel_b2.json"]
    assert option(b2, "--decoding.num_beams") == option(b2, "--decoding.top_k") == "2"
    assert "--decoding.num_beams" not in rows["plain_genbioel.json"]
    kb = record.commands("build-kb")[1]
    assert option(kb, "--augment-pubtator") == str(tmp_path / "data/askapatient/AskAPatient.fold-3.train.txt")
    assert option(kb, "--mentions-format") == "askapatient"


def test_fusion_of_a_fold_reads_every_other_fold_whichever_folds_this_process_takes(tmp_path):
    record = _folds(tmp_path, "fusion", folds=(1,), folds_fit=(0, 1, 2))
    fits, evaluations = record.commands("fit-fusion"), record.commands("evaluate")
    folds = tmp_path / "aap" / "folds"
    assert len(fits) == 2 and len(evaluations) == 2
    assert (
        options(fits[0], "--source")[0]
        == f"genbioel={folds}/fold-0/plain_genbioel.jsonl,{folds}/fold-2/plain_genbioel.jsonl"
    )
    assert option(fits[0], "--exclude") == f"{folds}/fold-1/plain_genbioel.jsonl"
    assert option(evaluations[1], "--fusion") == f"{folds}/fold-1/fusion_aug.json"


def test_cascade_is_fitted_on_the_other_folds_at_two_beams(tmp_path):
    """Each fold's cascade fusion reads the other folds' held-out lists (the generator's at 2 beams), leaves out the
    fold's own mention/concept pairs, may choose among the retriever sets; then the fold is benched."""
    record = _folds(
        tmp_path, "cascade", folds=(1,), folds_fit=(0, 1, 2), max_recall_loss=None, extra_rows=("cascade_grouped",)
    )
    assert [st.argv[0] for st in record.steps] == ["fit-fusion", str(ROOT / "bench" / "cascade.py")] * 2
    fit, bench = record.commands()[:2]
    folds = tmp_path / "aap" / "folds"
    assert (
        options(fit, "--source")[0]
        == f"genbioel={folds}/fold-0/plain_genbioel_b2.jsonl,{folds}/fold-2/plain_genbioel_b2.jsonl"
    )
    assert options(fit, "--source")[1:] == [
        f"{name}={folds}/fold-0/plain_{name}.jsonl,{folds}/fold-2/plain_{name}.jsonl"
        for name in ("tfidf", "dense", "rescnn")
    ]
    assert options(fit, "--alternative") == ["tfidf,dense", "tfidf,rescnn", "tfidf,dense,rescnn"]
    assert (
        option(fit, "--exclude") == f"{folds}/fold-1/plain_genbioel.jsonl" and option(fit, "--generator-beams") == "2"
    )
    assert "--cascade" in fit and option(fit, "--out") == f"{folds}/fold-1/beamcascade_b2_plain.json"
    assert option(fit, "--defer") == "dense"  # MiniLM runs only where TF-IDF and ResCNN do not settle
    assert record.steps[1].script and option(bench, "--out") == str(tmp_path / "metrics/cascade_aap_fold1_plain.json")
    assert option(bench, "--rows") == "generator,fusion,fusion_b2,cascade_b2,cascade_int8_b2,cascade_grouped"


def test_cascade_with_a_recall_budget_fits_both_cascades(tmp_path):
    record = _folds(tmp_path, "cascade", folds=(1,), folds_fit=(0, 1, 2))  # the default budget
    folds = tmp_path / "aap" / "folds"
    fits = record.commands("fit-fusion")
    assert [option(c, "--out") for c in fits] == [
        f"{folds}/fold-1/beamcascade_b2_{kb}{tag}.json" for kb in ("plain", "aug") for tag in ("", "_loss")
    ]
    assert [option(c, "--max-recall-loss") if "--max-recall-loss" in c else None for c in fits] == [
        None,
        "0.002",
        None,
        "0.002",
    ]
    bench = [c for c in record.commands() if c[0].endswith("cascade.py")][0]
    assert option(bench, "--out") == str(tmp_path / "metrics/cascade_aap_fold1_plain_loss.json")
    budget = f"{folds}/fold-1/beamcascade_b2_plain_loss.json"
    assert options(bench, "--variant")[-1] == f"loss={budget},{budget},2"
    assert len(_folds(tmp_path, "cascade", folds=(1,), folds_fit=(0, 1, 2)).steps) == 0  # all there: nothing reruns
    with pytest.raises(FileNotFoundError, match="bench/cascade.py"):  # outside a checkout the bench is not there
        given_folds_stage(
            FoldsSettings(out=tmp_path / "x", metrics=tmp_path / "m", cascade_bench=tmp_path / "none.py"),
            "cascade",
            runner=Recorder(),
        )


def test_folds_fits_centre_their_penalty_on_the_anchor(tmp_path):
    """crossfit-folds' fusion and cascade fits (the recall-budget one too) take --anchor and --l2 as crossfit's
    do; unset, neither is passed, and the fold's other steps never get them."""
    anchored = {"folds": (1,), "folds_fit": (0, 1, 2), "anchor": "genbioel:retrieval", "l2": 0.1}
    for stage, fits in (("fusion", 2), ("cascade", 4)):
        record = _folds(tmp_path / stage, stage, **anchored)
        assert len(record.commands("fit-fusion")) == fits
        for fit in record.commands("fit-fusion"):
            assert option(fit, "--anchor") == "genbioel:retrieval" and option(fit, "--l2") == "0.1"
            assert fit.index("--l2") < fit.index("--out")
        assert all("--anchor" not in c for c in record.commands() if c[0] != "fit-fusion")
        plain = _folds(tmp_path / f"{stage}-plain", stage, folds=(1,), folds_fit=(0, 1, 2))
        assert all("--anchor" not in c and "--l2" not in c for c in plain.commands())


def test_commands_run_their_stages_in_order_with_the_options_given(tmp_path, monkeypatch):
    import spacy_genbioel.cli.crossfit as command

    record = Recorder()
    monkeypatch.setattr(command, "run_here", record)
    result = runner.invoke(
        app,
        [
            "crossfit-folds",
            "fusion",
            "cascade",
            "--out",
            str(tmp_path / "aap"),
            "--folds",
            "1,3",
            "--folds-fit",
            "0 1 3",
            "--max-recall-loss",
            "none",
            "--metrics",
            str(tmp_path / "m"),
            "--cascade-bench",
            str(ROOT / "bench" / "cascade.py"),
            "--anchor",
            "genbioel:retrieval",
            "--l2",
            "0.1",
        ],
    )
    assert result.exit_code == 0, result.output
    assert {(option(c, "--anchor"), option(c, "--l2")) for c in record.commands("fit-fusion")} == {
        ("genbioel:retrieval", "0.1")
    }
    outs = [Path(option(c, "--out" if "--out" in c else "--json")).name for c in record.commands()]
    assert outs[:4] == [
        "fusion_plain.json",
        "plain_fusion.json",
        "fusion_aug.json",
        "aug_fusion.json",
    ]  # fold 1's fusion
    assert outs[8:11] == ["beamcascade_b2_plain.json", "cascade_aap_fold1_plain.json", "beamcascade_b2_aug.json"]
    assert len(outs) == 16 and "--max-recall-loss" not in " ".join(" ".join(c) for c in record.commands())
    result = runner.invoke(
        app,
        [
            "crossfit",
            "train",
            "--corpus",
            "bc5cdr",
            "--out",
            str(tmp_path / "cf"),
            "--fold",
            "1",
            "--kb-sources",
            "a.tsv mesh-tsv:b.tsv",
            "--kb-format",
            "ctd",
            "--refresh-pool",
            "0",
            "--rescnn-seconds",
            "5",
            "--no-abbreviations",
            "--beams",
            "null",
        ],
    )
    assert result.exit_code == 0, result.output
    kb, corpus, _, rescnn = [c for c in record.commands() if "fold-1" in " ".join(c) and c[0] != "fit-fusion"][-4:]
    assert kb[1:3] == ["a.tsv", "mesh-tsv:b.tsv"] and "--no-abbreviations" in corpus
    assert option(corpus, "--crosswalk") == "../shared/data/vocab/bc5cdr_legacy_id_crosswalk.tsv"
    assert option(rescnn, "--data.refresh_pool") == "0"
    fitted = Recorder()
    monkeypatch.setattr(command, "run_here", fitted)
    argv = ["crossfit", "fit", "--out", str(tmp_path / "cf"), "--variants", "plain"]
    result = runner.invoke(app, [*argv, "--anchor", "genbioel:retrieval", "--l2", "0.1"])
    assert result.exit_code == 0, result.output
    assert [(option(c, "--anchor"), option(c, "--l2")) for c in fitted.commands("fit-fusion")] == [
        ("genbioel:retrieval", "0.1")
    ] * 2


def test_every_planned_step_is_a_call_the_command_line_takes(tmp_path):
    """Each step's options are the command's, and its dotted settings are the component's or the config's."""
    import typer.main

    from spacy_genbioel.cli._util import component_settings, parse_overrides
    from spacy_genbioel.training.rescnn import load_rescnn_config
    from spacy_genbioel.training.settings import load_stage_config

    record = Recorder()
    crossfit_stage(
        CrossfitSettings(
            corpus="bc5cdr",
            out=tmp_path / "cf",
            rescnn_seconds=5,
            beams=2,
            angel_config=Path("configs/angel_rank_tiny.cfg"),
        ),
        "all",
        runner=record,
    )
    given_folds_stage(
        FoldsSettings(out=tmp_path / "aap", metrics=tmp_path / "m", cascade_bench=ROOT / "bench" / "cascade.py"),
        "all",
        runner=record,
    )
    commands = typer.main.get_command(app).commands
    seen = set()
    for step in record.steps:
        if step.script:
            continue
        ctx = commands[step.argv[0]].make_context(step.argv[0], list(step.argv[1:]))
        seen.add(step.argv[0])
        if step.argv[0] in ("evaluate", "package"):
            component_settings(ctx.args)
        elif ctx.args:
            config = ROOT / option(list(step.argv), "--config")
            load = load_rescnn_config if step.argv[0] == "train-rescnn" else load_stage_config
            load(config, parse_overrides(ctx.args))
    assert seen == {
        "folds",
        "build-kb",
        "corpus",
        "finetune",
        "angel",
        "train-rescnn",
        "package",
        "evaluate",
        "fit-fusion",
        "tokenizer",
        "init-model",
        "pretrain",
    }


# -- the fold reports --------------------------------------------------------------------------------------------------
def test_folds_report_gives_mean_and_spread_per_kb_and_linker(tmp_path):
    values = {"fold-0": (0.80, 0.90), "fold-1": (0.84, 0.94), "fold-10": (0.82, 0.92)}
    for fold, (r1, r5) in values.items():
        (tmp_path / fold).mkdir()
        (tmp_path / fold / "plain_tfidf.json").write_text(
            json.dumps({"recall": {"recall": {"recall@1": r1, "recall@5": r5}}})
        )
        (tmp_path / fold / "fusion_plain.json").write_text(
            json.dumps({"version": 1, "weights": {}})
        )  # weights, not a report
    (tmp_path / "fold-0" / "aug_fusion.json").write_text(
        json.dumps({"recall": {"recall": {"recall@1": 0.9, "recall@5": 0.95}}})
    )
    (tmp_path / "fold-3.log").write_text("a log beside the folds is no fold")
    result = runner.invoke(app, ["folds-report", str(tmp_path), "--json", str(tmp_path / "out" / "summary.json")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    tfidf = summary["plain"]["tfidf"]
    assert tfidf["folds"] == 3 and set(summary) == {"plain", "aug"}
    assert tfidf["recall@1"]["mean"] == pytest.approx(0.82) and tfidf["recall@1"]["sd"] == pytest.approx(0.02)
    assert (tfidf["recall@1"]["min"], tfidf["recall@1"]["max"]) == (0.80, 0.84)
    assert (
        summary["aug"]["fusion"]["folds"] == 1 and "1 of 3" in result.output
    )  # a linker missing on some folds says so
    empty = runner.invoke(app, ["folds-report", str(tmp_path / "out")])
    assert isinstance(empty.exception, ValueError) and "no fold reports under" in str(
        empty.exception
    )  # `✘ ...`, exit 1


def test_cascade_folds_report_sums_up_the_cascade_against_the_fusion_per_fold(tmp_path):
    def row(r1, speed, **paths):
        return {"recall@1": r1, "recall@5": r1 + 0.05, "mentions_per_cpu_second": speed, "paths": paths}

    folds = {0: (0.80, 0.81, 100, 600), 1: (0.84, 0.837, 200, 800), 10: (0.82, 0.815, 100, 300)}
    for k, (fusion, cascade, slow, fast) in folds.items():
        rows = {
            "generator": row(0.7, slow * 1.5, beam=1.0),
            "fusion": row(fusion, slow, beam=1.0),
            "cascade_loss": row(cascade, fast, early=0.9, beam=0.1),
        }
        (tmp_path / f"cascade_aap_fold{k}_plain_loss.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "cascade_aap_fold2_plain.json").write_text("{}")  # another run's report: not read
    result = runner.invoke(app, ["cascade-folds-report", str(tmp_path), "--json", str(tmp_path / "summary.json")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary) == {"plain"}
    cascade = summary["plain"]["cascade_loss"]
    assert cascade["folds"] == 3 and cascade["recall@1"] == pytest.approx((0.81 + 0.837 + 0.815) / 3)
    assert cascade["x_fusion"] == pytest.approx({"mean": (6 + 4 + 3) / 3, "min": 3, "max": 6})
    assert cascade["folds_at_speed_goal"] == 1  # only fold 0 reaches 5x
    gap = cascade["points_vs_fusion"]
    assert gap["mean"] == pytest.approx((1 - 0.3 - 0.5) / 3) and gap["folds_within"] == 1
    assert cascade["x_generator"]["mean"] == pytest.approx((4 + 8 / 3 + 2) / 3)
    assert cascade["paths"] == pytest.approx({"beam": 0.1, "early": 0.9})
    assert "| plain | cascade_loss | 0.8207" in result.output
    empty = runner.invoke(app, ["cascade-folds-report", str(tmp_path / "empty")])
    assert isinstance(empty.exception, ValueError) and "no cascade_aap_fold" in str(empty.exception)
