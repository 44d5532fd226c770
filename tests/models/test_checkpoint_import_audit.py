"""The reliability audit of ``import-checkpoint``: ``--replace`` replaces an import alone and
atomically, config.json's sizes are checked against the checkpoint before anything is
allocated, malformed configs and Hub attention kernels are refused naming the field, and
what a killed import left is cleaned up; a FIFO given as the source is refused, not read."""

import fcntl
import json
import logging
import os
import threading
import time

import pytest
import torch
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_checkpoint_import import released_config, write_released
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.models import (
    CheckpointError,
    ImportOptions,
    ModelFormatError,
    checkpoint_import,
    import_checkpoint,
    load_model,
)

runner = CliRunner()


@pytest.fixture()
def tokenizer_dir(tmp_path, word_tokenizer):
    word_tokenizer.save_pretrained(tmp_path / "tokenizer")
    return tmp_path / "tokenizer"


def with_config(src, **change):
    config = json.loads((src / "config.json").read_text())
    config.update(change)
    (src / "config.json").write_text(json.dumps(config))
    return src


def hidden(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))


# -- item 4: --replace -----------------------------------------------------------------------------------------------
def test_replace_refuses_a_folder_holding_files_the_import_did_not_write(tmp_path, micro_model):
    src = write_released(tmp_path / "src", micro_model)
    out = tmp_path / "out"
    record = import_checkpoint(src, out, ImportOptions(no_tokenizer=True))
    (out / "notes.txt").write_text("mine")
    (out / "runs").mkdir()
    (out / "runs" / "log.txt").write_text("mine too")
    with pytest.raises(CheckpointError, match="refused to replace") as err:
        import_checkpoint(src, out, ImportOptions(no_tokenizer=True, replace=True))
    assert "notes.txt" in str(err.value) and "runs/" in str(err.value) and str(out) in str(err.value)
    assert (out / "notes.txt").read_text() == "mine" and (out / "runs" / "log.txt").read_text() == "mine too"
    assert (out / "model.safetensors").exists() and hidden(tmp_path) == []
    assert record["files"] == sorted(p.name for p in out.iterdir() if p.name not in ("notes.txt", "runs"))


def test_replace_of_an_older_import_without_a_file_list(tmp_path, micro_model):
    src = write_released(tmp_path / "src", micro_model)
    out = tmp_path / "out"
    import_checkpoint(src, out, ImportOptions(no_tokenizer=True))
    record = json.loads((out / "import.json").read_text())
    del record["files"]  # as imports before the audit wrote it
    (out / "import.json").write_text(json.dumps(record))
    import_checkpoint(src, out, ImportOptions(no_tokenizer=True, replace=True))
    assert "files" in json.loads((out / "import.json").read_text())
    record = json.loads((out / "import.json").read_text())
    (out / "thesis.tex").write_text("mine")
    (out / "import.json").write_text(json.dumps({**record, "files": record["files"] + ["thesis.tex"]}))
    with pytest.raises(CheckpointError, match="thesis.tex"):  # an edited record lists what no import writes
        import_checkpoint(src, out, ImportOptions(no_tokenizer=True, replace=True))
    (out / "thesis.tex").unlink()
    (out / "import.json").write_text("{}")  # a file named import.json is not an import
    with pytest.raises(CheckpointError, match="not an import record"):
        import_checkpoint(src, out, ImportOptions(no_tokenizer=True, replace=True))


def test_replace_is_atomic_a_failed_swap_leaves_the_earlier_import(tmp_path, micro_model, monkeypatch):
    src = write_released(tmp_path / "src", micro_model)
    out = tmp_path / "out"
    import_checkpoint(src, out, ImportOptions(no_tokenizer=True))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_replace = os.replace

    def failing(a, b):
        if ".importing-" in str(a):
            raise OSError(28, "No space left on device")
        return real_replace(a, b)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="No space left"):
        import_checkpoint(src, out, ImportOptions(no_tokenizer=True, replace=True))
    monkeypatch.setattr(os, "replace", real_replace)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert hidden(tmp_path) == []


# -- item 6: config sizes against the checkpoint ---------------------------------------------------------------------
def test_config_sizes_are_checked_before_a_model_is_allocated(tmp_path, micro_model, monkeypatch):
    built = []
    real_init = transformers.BartForConditionalGeneration.__init__

    def spy(self, config, *args, **kwargs):
        built.append(torch.empty(0).device.type)
        real_init(self, config, *args, **kwargs)

    monkeypatch.setattr(transformers.BartForConditionalGeneration, "__init__", spy)
    src = with_config(write_released(tmp_path / "src", micro_model), vocab_size=2_000_000)
    with pytest.raises(CheckpointError, match=r"has shape .*, the model its config.json describes \(.*2000000") as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True))
    assert str(src / "config.json") in str(err.value) and "2000000" in str(err.value)
    assert built == ["meta"]  # never allocated on the CPU
    src2 = with_config(write_released(tmp_path / "src2", micro_model), encoder_layers=100_000)
    start = time.monotonic()
    with pytest.raises(CheckpointError, match="encoder_layers is 100000, but .* has weights for 1 encoder layers"):
        import_checkpoint(src2, tmp_path / "out", ImportOptions(no_tokenizer=True))
    assert time.monotonic() - start < 10 and not (tmp_path / "out").exists()


# -- item 7: malformed configs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, field",
    [
        ({"vocab_size": "400"}, "vocab_size"),
        ({"d_model": [32]}, "d_model"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"d_model": 0}, "d_model"),
        ({"encoder_attention_heads": True}, "encoder_attention_heads"),
        ({"max_position_embeddings": 1.5}, "max_position_embeddings"),
        ({"dropout": "high"}, "dropout"),
        ({"attention_dropout": -1}, "attention_dropout"),
        ({"encoder_attention_heads": 3}, "encoder_attention_heads"),
        ({"num_labels": 10**9}, "num_labels"),  # transformers would name a billion labels first
    ],
)
def test_a_malformed_config_is_refused_naming_the_field(tmp_path, micro_model, change, field):
    src = with_config(write_released(tmp_path / "src", micro_model), **change)
    with pytest.raises(CheckpointError, match=field) as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True))
    assert str(src / "config.json") in str(err.value)
    result = runner.invoke(app, ["import-checkpoint", str(src), "--out", str(tmp_path / "out"), "--no-tokenizer"])
    assert result.exit_code == 1 and field in result.output and "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit) and not (tmp_path / "out").exists()


# -- item 8: Hub attention kernels -----------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["attn_implementation", "_attn_implementation"])
@pytest.mark.parametrize("value", ["kernels-community/flash-attn", "flash_attention_2", "my/own:kernel"])
def test_a_hub_attention_kernel_in_the_config_is_refused(tmp_path, micro_model, key, value):
    src = with_config(write_released(tmp_path / "src", micro_model), **{key: value})
    with pytest.raises(CheckpointError, match=f"{key} is {json.dumps(value)}") as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True))
    assert str(src / "config.json") in str(err.value) and not (tmp_path / "out").exists()


def test_transformers_own_attention_imports_and_load_model_refuses_a_kernel(tmp_path, micro_model, tokenizer_dir):
    src = with_config(write_released(tmp_path / "src", micro_model), attn_implementation="eager")
    import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    (tmp_path / "out" / "config.json").write_text(
        json.dumps({**config, "_attn_implementation": "kernels-community/flash-attn"})
    )
    with pytest.raises(ModelFormatError, match='_attn_implementation is "kernels-community/flash-attn"') as err:
        load_model(tmp_path / "out")
    assert str(tmp_path / "out" / "config.json") in str(err.value)


# -- item 9: what a killed import left; FIFOs ------------------------------------------------------------------------
def test_a_killed_imports_folder_is_removed_by_the_next_import(tmp_path, micro_model, caplog):
    src = write_released(tmp_path / "src", micro_model)
    old = tmp_path / ".out.importing-abc123"  # an older version's: no lock, not touched for an hour
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"\0" * 1024)
    os.utime(old, (time.time() - 3600,) * 2)
    unlocked = tmp_path / ".out.importing-def456"  # its lock no longer held: its import died
    unlocked.mkdir()
    (unlocked / ".import.lock").touch()
    running = tmp_path / ".out.importing-ghi789"  # an import still writing it
    running.mkdir()
    held = os.open(running / ".import.lock", os.O_CREAT | os.O_WRONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    other = tmp_path / ".other.importing-xyz"  # another destination's
    other.mkdir()
    os.utime(other, (time.time() - 3600,) * 2)
    users = tmp_path / ".out.importing-mine"  # named like one, but holding what no import writes
    users.mkdir()
    (users / "thesis.tex").write_text("mine")
    os.utime(users, (time.time() - 3600,) * 2)
    try:
        with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
            import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True))
    finally:
        os.close(held)
    assert not old.exists() and not unlocked.exists() and running.exists() and other.exists()
    assert (users / "thesis.tex").read_text() == "mine" and "left " + str(users) + " alone" in caplog.text
    assert str(old) in caplog.text and str(unlocked) in caplog.text and "killed" in caplog.text
    assert (tmp_path / "out" / "import.json").exists()


def test_an_earlier_import_put_aside_by_a_killed_replace_is_put_back(tmp_path, micro_model, caplog):
    src = write_released(tmp_path / "src", micro_model)
    import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True))
    aside = tmp_path / ".out.replaced-abc"
    os.replace(tmp_path / "out", aside)  # killed between the two renames
    os.utime(aside, (time.time() - 3600,) * 2)
    with caplog.at_level(logging.WARNING, logger="spacy_genbioel"):
        import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True, replace=True))
    assert "put back the earlier import" in caplog.text and hidden(tmp_path) == []


def _import_in_thread(src, out, config=None):
    errors = []

    def run():
        try:
            import_checkpoint(src, out, ImportOptions(no_tokenizer=True, config=config))
        except Exception as err:  # noqa: BLE001 - the test looks at what was raised
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(20)
    return thread, errors


@pytest.mark.parametrize("fifo_name", ["pytorch_model.bin", "config.json", "alone.bin"])
def test_a_fifo_is_refused_not_read(tmp_path, micro_model, fifo_name):
    src = write_released(tmp_path / "src", micro_model)
    if fifo_name == "alone.bin":
        fifo = tmp_path / fifo_name
        os.mkfifo(fifo)
        target = fifo
    else:
        fifo = src / fifo_name
        fifo.unlink()
        os.mkfifo(fifo)
        target = src
    thread, errors = _import_in_thread(target, tmp_path / "out", config=src / "config.json" if target == fifo else None)
    if thread.is_alive():  # let a reader blocked on the FIFO go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not thread.is_alive(), "the import hung reading the FIFO"
    assert len(errors) == 1 and isinstance(errors[0], CheckpointError) and "a FIFO" in str(errors[0])
    assert str(fifo) in str(errors[0])


def test_released_config_has_no_attention_entry(micro_model):
    """The fixture config carries no attention implementation (the tests above add one)."""
    assert not {"attn_implementation", "_attn_implementation"} & set(released_config(micro_model))


# -- config.json fuzz: sizes and types -------------------------------------------------------------------------------
FIELDS = [name for name, _ in checkpoint_import.SIZE_FIELDS] + [
    "num_labels",
    "dropout",
    "pad_token_id",
    "scale_embedding",
]
VALUES = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([10**6, 4 * 10**8, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.booleans(),
    st.none(),
    st.lists(st.integers(0, 3), max_size=2),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(change=st.dictionaries(st.sampled_from(FIELDS), VALUES, min_size=1, max_size=3))
def test_any_config_sizes_import_or_are_refused_naming_config_json(tmp_path_factory, micro_model, change):
    root = tmp_path_factory.mktemp("config-fuzz")
    src = with_config(write_released(root / "src", micro_model), **change)
    start = time.monotonic()
    try:
        import_checkpoint(src, root / "out", ImportOptions(no_tokenizer=True))
    except CheckpointError as err:
        assert str(src / "config.json") in str(err) or str(src / "pytorch_model.bin") in str(err), (change, err)
        assert not (root / "out").exists()
    assert time.monotonic() - start < 20, change


def test_a_config_the_model_cannot_run_is_refused_naming_the_sources_config_json(tmp_path, micro_model):
    """``dropout: null`` builds a model whose forward pass fails: the error names the source's config.json, not
    the staging folder's copy, and nothing is left at the output (a draw hypothesis found)."""
    src = with_config(write_released(tmp_path / "src", micro_model), dropout=None)
    with pytest.raises(CheckpointError, match="cannot run on probe inputs") as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True))
    assert str(src / "config.json") in str(err.value) and ".importing-" not in str(err.value)
    assert not (tmp_path / "out").exists()
