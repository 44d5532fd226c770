"""train-rescnn's numeric settings (spacy_genbioel.retrieval.rescnn_checks): coerced where they spell a
number (``.5``, ``+1``), refused with their dotted name where they are NaN, infinite or out of range."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from spacy_genbioel.kb.base import Concept, KnowledgeBase
from spacy_genbioel.retrieval.rescnn import RESCNN_CONFIG, ResCNNArch
from spacy_genbioel.retrieval.rescnn_checks import RESCNN_BOUNDS, check_rescnn_settings, check_setting


@pytest.mark.parametrize(
    "name, value, expected",
    [
        ("training.dense_ratio", ".5", 0.5),
        ("model.blocks", "+1", 1),
        ("training.epochs", 3.0, 3),
        ("data.kb_queries", "1e3", 1000),
        ("training.learning_rate", "1e-3", 0.001),
        ("training.max_seconds", None, None),
        ("training.max_seconds", "90", 90.0),
        ("training.progress", "false", False),
        ("model.kernel_sizes", ["1", 3], [1, 3]),
    ],
)
def test_numbers_written_as_text_are_coerced(name, value, expected):
    got = check_rescnn_settings({name: value})[name]
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "name, value",
    [
        ("training.initial_scale", float("nan")),
        ("training.initial_scale", "nan"),
        ("training.initial_scale", "inf"),
        ("training.initial_scale", 0),
        ("training.learning_rate", float("-inf")),
        ("training.epochs", -1),
        ("training.epochs", "-1"),
        ("training.epochs", 2.5),
        ("training.epochs", True),
        ("training.epochs", None),
        ("training.dense_ratio", 1.5),
        ("model.dropout", 1.0),
        ("training.topk", 1),
        ("data.refresh_pool", "ten"),
        ("training.progress", 1),
        ("model.kernel_sizes", []),
        ("model.kernel_sizes", [1, float("nan")]),
    ],
)
def test_nan_inf_and_out_of_range_settings_are_refused_by_name(name, value):
    with pytest.raises(
        ValueError, match=rf"^cfg: {name} must be .*got {value!r}".replace("[", r"\[").replace("(", r"\(")
    ):
        check_rescnn_settings({name: value}, "cfg")


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(sorted(RESCNN_BOUNDS)),
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet="+-.0123456789eEnaifNI tru", max_size=8)
    | st.lists(st.integers(-3, 9), max_size=3),
)
def test_fuzz_every_setting_is_a_number_in_range_or_refused_by_name(name, value):
    bound = RESCNN_BOUNDS[name]
    try:
        got = check_setting(name, value, bound, "here")
    except ValueError as err:
        assert str(err).startswith(f"here: {name} must be ")
        return
    if got is None:
        assert bound.optional
    elif bound.kind is bool:
        assert isinstance(got, bool)
    elif bound.kind is list:
        assert got and all(type(k) is int and k >= 1 for k in got)
    else:
        assert type(got) is bound.kind and math.isfinite(got)
        assert bound.low is None or (got > bound.low if bound.open else got >= bound.low)
        assert bound.high is None or (got < bound.high if bound.below else got <= bound.high)


def test_the_architecture_checks_its_settings():
    assert ResCNNArch(hidden="8", dropout=".5", kernel_sizes=["1", 3]).hidden == 8
    with pytest.raises(ValueError, match="model.dropout must be a finite number in"):
        ResCNNArch(dropout=float("nan"))
    with pytest.raises(ValueError, match="model.hidden must be a whole number >= 1, got 0"):
        ResCNNArch(hidden=0)


# -- the command -----------------------------------------------------------------------------------------------
def command(wordpiece_dir, tmp_path, *extra):
    kb_path = tmp_path / "kb" / "toy.jsonl"
    kb_path.parent.mkdir(exist_ok=True)
    KnowledgeBase(
        [
            Concept("D1", ["heart attack", "myocardial infarction"]),
            Concept("D2", ["renal failure", "kidney failure"]),
            Concept("D3", ["lung disease"]),
        ]
    ).to_jsonl(kb_path)
    args = ["train-rescnn", "--kb", str(kb_path), "--out", str(tmp_path / "out"), "--wordpieces", str(wordpiece_dir)]
    args += ["--model.hidden", "8", "--model.blocks", "1", "--model.filters", "4", "--training.topk", "3"]
    args += ["--data.kb_queries", "4", "--training.progress", "false", "--no-index", *extra]
    from spacy_genbioel.cli import app

    return CliRunner().invoke(app, args)


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--training.initial_scale", "NaN"], "--training.initial_scale: training.initial_scale must be a finite"),
        (["--training.initial_scale", "nan"], "training.initial_scale must be a finite number > 0, got 'nan'"),
        (["--training.epochs", "-1"], "--training.epochs: training.epochs must be a whole number >= 1, got -1"),
        (["--training.learning_rate", "inf"], "training.learning_rate must be a finite number > 0, got 'inf'"),
    ],
)
def test_train_rescnn_refuses_a_nan_scale_or_negative_epochs(wordpiece_dir, tmp_path, extra, words):
    result = command(wordpiece_dir, tmp_path, "--training.epochs", "1", *extra)
    assert result.exit_code != 0 and words in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and not (tmp_path / "out" / "model").exists()


def config_file(tmp_path, blocks: str, training: str):
    """A tiny config with ``blocks`` and the ``[training]`` lines ``training`` (overrides need their sections)."""
    config = tmp_path / "rescnn.cfg"
    config.write_text(
        f"[model]\nhidden = 8\nblocks = {blocks}\nfilters = 4\n\n[training]\n{training}\ntopk = 3\n"
        "progress = false\n\n[data]\nkb_queries = 4\n",
        encoding="utf8",
    )
    return config


def test_train_rescnn_refuses_a_nan_in_the_config_file(wordpiece_dir, tmp_path):
    config = config_file(tmp_path, "1", "epochs = 1\ninitial_scale = nan")
    result = command(wordpiece_dir, tmp_path, "--config", str(config))
    output = " ".join(result.output.split())
    assert result.exit_code != 0 and "rescnn.cfg: training.initial_scale must be a finite number" in output
    assert not (tmp_path / "out" / "model").exists()


def test_train_rescnn_reads_dot_five_and_plus_one_as_numbers(wordpiece_dir, tmp_path):
    config = config_file(tmp_path, "+1", "epochs = +1\ndense_ratio = .5")
    result = command(wordpiece_dir, tmp_path, "--config", str(config), "--training.learning_rate", ".01")
    assert result.exit_code == 0, result.output
    model_config = (tmp_path / "out" / "model" / RESCNN_CONFIG).read_text()
    assert "NaN" not in model_config and "1 epochs" in " ".join(result.output.split())


@pytest.mark.parametrize(
    "setting, value",
    [("initial_scale", float("nan")), ("epochs", -1), ("learning_rate", float("inf")), ("dropout", 1.5)],
)
def test_the_training_config_refuses_bad_numbers_however_it_is_built(setting, value):
    from spacy_genbioel.training.rescnn import ResCNNTrainConfig

    with pytest.raises(ValueError, match=rf"rescnn: \w+\.{setting} must be"):
        ResCNNTrainConfig(**{setting: value})
    assert ResCNNTrainConfig(epochs="3", initial_scale=".5").epochs == 3  # text coerced as in a config file
