"""``import-checkpoint``: released pickled checkpoints (written here exactly as
dmis-lab's ANGEL_* are: ``torch.save`` of an ``OrderedDict`` state dict, no
tokenizer) become verified safetensors folders; pickles that ask for anything
but tensors are refused without running."""

import hashlib
import json
import os
import pickle
import stat
import subprocess
from collections import OrderedDict

import pytest
import spacy
import torch
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.models import (
    CheckpointError,
    ImportOptions,
    checkpoint_import,
    checkpoint_pickle,
    import_checkpoint,
    load_model,
)

runner = CliRunner()
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def released_config(model) -> dict:
    """The model's config as a transformers 4.11 BART config.json reads (with bart-large's generation keys)."""
    config = model.config.to_dict()
    # a released checkpoint records no tokenizer of ours (the session's micro model does once a test saved it)
    config.pop("genbioel_tokenizer_fingerprint", None)
    config.update(
        {
            "architectures": ["BartForConditionalGeneration"],
            "transformers_version": "4.11.3",
            "no_repeat_ngram_size": 3,
            "num_beams": 4,
            "early_stopping": True,
            "forced_bos_token_id": 0,
            "add_bias_logits": False,
            "normalize_before": False,
            "output_past": False,
            "gradient_checkpointing": False,
        }
    )
    return config


def write_released(folder, model, state=None, name="pytorch_model.bin", **save_args):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(released_config(model)))
    state = OrderedDict(model.state_dict()) if state is None else state
    torch.save(state, folder / name, **save_args)
    return folder


@pytest.fixture()
def tokenizer_dir(tmp_path, word_tokenizer):
    word_tokenizer.save_pretrained(tmp_path / "bart-tokenizer")
    return tmp_path / "bart-tokenizer"


def probe_logits(model):
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randint(0, model.config.vocab_size, (3, 10), generator=generator)
    decoder = torch.randint(0, model.config.vocab_size, (3, 5), generator=generator)
    with torch.no_grad():
        return model(input_ids=inputs, decoder_input_ids=decoder).logits


def assert_same_model(out, micro_model):
    model, tokenizer = load_model(out)
    assert torch.allclose(probe_logits(model), probe_logits(micro_model), atol=1e-6, rtol=0)
    assert len(tokenizer) == micro_model.config.vocab_size
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "config.json",
            "generation_config.json",
            "import.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o644
    return json.loads((out / "import.json").read_text())


@pytest.mark.parametrize("save_args", [{}, {"_use_new_zipfile_serialization": False}], ids=["zip", "legacy"])
def test_released_checkpoint_imports_with_identical_logits(tmp_path, micro_model, tokenizer_dir, save_args):
    src = write_released(tmp_path / "ANGEL_micro", micro_model, **save_args)
    record = import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    assert_same_model(tmp_path / "out", micro_model)
    weights = record["source"]["weights"][0]
    data = (src / "pytorch_model.bin").read_bytes()
    assert weights["sha256"] == hashlib.sha256(data).hexdigest() and weights["bytes"] == len(data)
    assert weights["format"] == ("legacy" if save_args.get("_use_new_zipfile_serialization") is False else "zip")
    assert set(weights["globals"]) == {
        "collections.OrderedDict",
        "torch.FloatStorage",
        "torch._utils._rebuild_tensor_v2",
    }
    assert record["key_mapping"]["stripped_prefix"] == "" and not record["key_mapping"]["unexpected"]
    assert "no_repeat_ngram_size" in record["source"]["config_keys_not_kept"]
    assert record["verification"]["max_abs_diff"] <= 1e-6 and record["versions"]["torch"] == torch.__version__
    assert (
        record["output"]["model.safetensors"]["sha256"]
        == hashlib.sha256((tmp_path / "out" / "model.safetensors").read_bytes()).hexdigest()
    )


def test_protocol_4_passes_the_scan_but_not_torchs_unpickler(tmp_path, micro_model, tokenizer_dir):
    src = write_released(tmp_path / "src", micro_model, pickle_protocol=4)
    assert "torch.FloatStorage" in checkpoint_pickle.scan_pickle_globals(src / "pytorch_model.bin")[1]
    with pytest.warns(UserWarning, match="protocol 4"), pytest.raises(CheckpointError, match="pickle protocol 2"):
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))


def test_deduplicated_checkpoint_gets_tied_weights_and_zero_bias(tmp_path, micro_model, tokenizer_dir):
    state = OrderedDict(
        (k, v) for k, v in micro_model.state_dict().items() if k not in TIED and k != "final_logits_bias"
    )
    src = write_released(tmp_path / "src", micro_model, state)
    record = import_checkpoint(src / "pytorch_model.bin", tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    assert_same_model(tmp_path / "out", micro_model)
    assert record["key_mapping"]["tied"] == {k: "model.shared.weight" for k in TIED}
    assert record["key_mapping"]["zero_filled"] == ["final_logits_bias"]


def test_sharded_checkpoint(tmp_path, micro_model, tokenizer_dir):
    src = tmp_path / "sharded"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(released_config(micro_model)))
    items = list(micro_model.state_dict().items())
    shards = {
        "pytorch_model-00001-of-00002.bin": OrderedDict(items[:20]),
        "pytorch_model-00002-of-00002.bin": OrderedDict(items[20:]),
    }
    for name, shard in shards.items():
        torch.save(shard, src / name)
    index = {"metadata": {"total_size": 0}, "weight_map": {k: name for name, shard in shards.items() for k in shard}}
    (src / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    record = import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    assert_same_model(tmp_path / "out", micro_model)
    assert len(record["source"]["weights"]) == 2 and record["source"]["index"]["sha256"]


@pytest.mark.parametrize("layout", ["deepspeed", "model.", "module.model.", "lightning", "bart_model"])
def test_prefixed_keys(tmp_path, micro_model, tokenizer_dir, layout):
    state = micro_model.state_dict()
    if layout == "deepspeed":
        obj = {
            "module": OrderedDict(("module." + k, v) for k, v in state.items()),
            "ds_version": "0.5.4",
            "buffer_names": [],
            "param_shapes": [OrderedDict((k, v.shape) for k, v in state.items())],
        }
        expected = ("module", "module.")
    elif layout == "lightning":
        obj = {
            "state_dict": OrderedDict(("model." + k, v) for k, v in state.items()),
            "epoch": 3,
            "global_step": 120,
            "pytorch-lightning_version": "1.5.10",
            "optimizer_states": [{"state": {}, "param_groups": [{"lr": 1e-5}]}],
        }
        expected = ("state_dict", "model.")
    elif layout == "bart_model":  # a BartModel's keys (no "model." prefix, no head)
        obj = OrderedDict((k[len("model.") :], v) for k, v in state.items() if k.startswith("model."))
        expected = (None, "")
    else:
        obj = OrderedDict((layout + k, v) for k, v in state.items())
        expected = (None, layout)
    src = write_released(tmp_path / "src", micro_model, obj, name="checkpoint.ckpt")
    record = import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    assert_same_model(tmp_path / "out", micro_model)
    mapping = record["key_mapping"]
    assert (mapping["container"], mapping["stripped_prefix"]) == expected
    assert mapping["added_prefix"] == ("model." if layout == "bart_model" else "")


# -- refusals ---------------------------------------------------------------------------------------------------------
def touch(path):  # a custom callable a pickle could ask for
    open(path, "w").close()


class Payload:
    """A custom class whose unpickling (``__setstate__``) would create a file."""

    def __setstate__(self, state):
        touch(state["marker"])


class Reduce:
    def __init__(self, call, args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def payloads(marker):
    custom = Payload.__new__(Payload)
    custom.marker = str(marker)
    return {
        "os.system": (Reduce(os.system, (f"touch {marker}",)), f"{os.system.__module__}.system"),
        "builtins.eval": (Reduce(eval, (f"open({str(marker)!r}, 'w').close()",)), "builtins.eval"),
        "subprocess.Popen": (Reduce(subprocess.Popen, (["touch", str(marker)],)), "subprocess.Popen"),
        "custom function": (Reduce(touch, (str(marker),)), f"{__name__}.touch"),
        "custom class": (custom, f"{__name__}.Payload"),
    }


@pytest.mark.parametrize(
    "fmt", [{}, {"_use_new_zipfile_serialization": False}, {"pickle_protocol": 4}], ids=["zip", "legacy", "protocol4"]
)
@pytest.mark.parametrize("kind", ["os.system", "builtins.eval", "subprocess.Popen", "custom function", "custom class"])
def test_unsafe_pickle_is_refused_without_running(tmp_path, micro_model, tokenizer_dir, kind, fmt):
    marker = tmp_path / "payload-ran"
    payload, global_name = payloads(marker)[kind]
    state = OrderedDict(micro_model.state_dict())
    state["model.extra"] = payload
    src = write_released(tmp_path / "evil", micro_model, state, **fmt)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match=f"asks for {global_name}") as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    assert str(src / "pytorch_model.bin") in str(err.value)
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_torch_restricted_unpickler_is_the_second_gate(tmp_path, micro_model, tokenizer_dir, monkeypatch):
    marker = tmp_path / "payload-ran"
    payload, global_name = payloads(marker)["os.system"]
    src = write_released(tmp_path / "evil", micro_model, OrderedDict(x=payload))
    monkeypatch.setattr(checkpoint_pickle, "ALLOWED_GLOBALS", checkpoint_pickle.ALLOWED_GLOBALS | {global_name})
    with pytest.raises(CheckpointError, match="restricted unpickler"):
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    assert not marker.exists()


def test_hidden_stack_global_is_refused(tmp_path, micro_model):
    """A STACK_GLOBAL whose strings are not pushed right before it cannot be named by
    parsing: refused as unresolved (here it would resolve to os.system)."""

    def unicode(text):
        data = text.encode()
        return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE

    stream = b"\x80\x04" + unicode("os") + unicode("junk") + b"0" + unicode("system") + b"\x93" + b"N\x85R."
    src = tmp_path / "hidden.bin"
    src.write_bytes(stream)
    (tmp_path / "config.json").write_text(json.dumps(released_config(micro_model)))
    with pytest.raises(CheckpointError, match="unresolved STACK_GLOBAL"):
        import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True))
    legacy = tmp_path / "legacy.bin"
    legacy.write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(os.system, protocol=2))
    with pytest.raises(CheckpointError, match=f"asks for {os.system.__module__}.system"):
        checkpoint_pickle.scan_pickle_globals(legacy)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"auto_map": {"AutoModelForSeq2SeqLM": "modeling_evil.EvilModel"}}, "auto_map asks for custom model code"),
        ({"model_type": "t5"}, "only 'bart'"),
    ],
)
def test_config_with_custom_code_or_other_model_is_refused(tmp_path, micro_model, tokenizer_dir, change, message):
    src = write_released(tmp_path / "src", micro_model)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message) as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    assert str(src / "config.json") in str(err.value)


def test_missing_weight_and_missing_tokenizer_are_refused(tmp_path, micro_model, tokenizer_dir):
    state = OrderedDict((k, v) for k, v in micro_model.state_dict().items() if k != "model.encoder.layers.0.fc1.weight")
    src = write_released(tmp_path / "src", micro_model, state)
    with pytest.raises(CheckpointError, match="model.encoder.layers.0.fc1.weight"):
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    full = write_released(tmp_path / "full", micro_model)
    with pytest.raises(CheckpointError, match="facebook/bart-large"):
        import_checkpoint(full, tmp_path / "out")
    record = import_checkpoint(full, tmp_path / "out", ImportOptions(no_tokenizer=True))
    assert record["tokenizer"] is None and not (tmp_path / "out" / "tokenizer.json").exists()
    model, _ = load_model(tmp_path / "out", tokenizer_path=tokenizer_dir)
    assert torch.allclose(probe_logits(model), probe_logits(micro_model), atol=1e-6, rtol=0)
    with pytest.raises(CheckpointError, match="not an empty folder"):
        import_checkpoint(full, tmp_path / "out", ImportOptions(no_tokenizer=True))


def test_logits_that_differ_fail_and_leave_nothing(tmp_path, micro_model, tokenizer_dir, monkeypatch):
    src = write_released(tmp_path / "src", micro_model)

    def perturbed(path, **kwargs):
        model, tokenizer = load_model(path, **kwargs)
        with torch.no_grad():
            model.final_logits_bias += 0.01
        return model, tokenizer

    monkeypatch.setattr(checkpoint_import, "load_model", perturbed)
    with pytest.raises(CheckpointError, match="logits differ"):
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bart-tokenizer", "src"]


# -- CLI and packaging -------------------------------------------------------------------------------------------------
def test_cli_imports_and_refuses_without_traceback(tmp_path, micro_model, tokenizer_dir):
    src = write_released(tmp_path / "ANGEL_micro", micro_model)
    result = runner.invoke(
        app, ["import-checkpoint", str(src), "--out", str(tmp_path / "out"), "--tokenizer", str(tokenizer_dir)]
    )
    assert result.exit_code == 0, result.output
    assert "Imported" in result.output
    assert_same_model(tmp_path / "out", micro_model)
    no_tok = runner.invoke(app, ["import-checkpoint", str(src), "--out", str(tmp_path / "out2")])
    assert no_tok.exit_code == 1 and "facebook/bart-large" in no_tok.output and "Traceback" not in no_tok.output
    marker = tmp_path / "payload-ran"
    payload, global_name = payloads(marker)["os.system"]
    evil = write_released(tmp_path / "evil", micro_model, OrderedDict(x=payload))
    refused = runner.invoke(
        app, ["import-checkpoint", str(evil), "--out", str(tmp_path / "out3"), "--tokenizer", str(tokenizer_dir)]
    )
    assert refused.exit_code == 1 and isinstance(refused.exception, SystemExit)
    assert global_name in refused.output and "Traceback" not in refused.output
    assert not marker.exists() and not (tmp_path / "out3").exists()


def test_imported_model_packages_and_round_trips_through_spacy_load(tmp_path, micro_model, tokenizer_dir, small_kb):
    from spacy_genbioel.training.package import package

    src = write_released(tmp_path / "ANGEL_micro", micro_model)
    import_checkpoint(src, tmp_path / "model", ImportOptions(tokenizer=tokenizer_dir))
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    out = package(tmp_path / "model", tmp_path / "kb.jsonl", tmp_path / "pkg", settings={"num_beams": 2, "top_k": 2})
    nlp = spacy.load(out)
    assert "genbioel" in nlp.pipe_names
    names = [name for name in small_kb.names if len(name) > 5][:3]
    doc = nlp(f"The patient had {names[0]} and then {names[1]}, not {names[2]}.")
    kb_ids = {concept.id for concept in small_kb}
    assert doc.ents and all(ent._.kb_id in kb_ids and ent.kb_id_ == ent._.kb_id for ent in doc.ents)
    linked = nlp.get_pipe("genbioel").linker.model
    assert torch.allclose(probe_logits(linked.float().cpu()), probe_logits(micro_model), atol=1e-6, rtol=0)


def test_replace_swaps_an_earlier_import_only(tmp_path, micro_model, tokenizer_dir):
    src = write_released(tmp_path / "src", micro_model)
    import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    with pytest.raises(CheckpointError, match="not an empty folder"):
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir))
    import_checkpoint(
        src, tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir, replace=True)
    )  # a rerun of the step
    assert_same_model(tmp_path / "out", micro_model)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")  # not an import: never removed
    with pytest.raises(CheckpointError, match="not an empty folder"):
        import_checkpoint(src, tmp_path / "other", ImportOptions(tokenizer=tokenizer_dir, replace=True))
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_an_imported_model_warns_when_fed_another_input_style(tmp_path, micro_model, tokenizer_dir, small_kb, caplog):
    import spacy

    import_checkpoint(
        write_released(tmp_path / "src", micro_model), tmp_path / "out", ImportOptions(tokenizer=tokenizer_dir)
    )
    model, tokenizer = load_model(tmp_path / "out")
    assert model.config.genbioel_inputs == "genbioel-released"  # travels with the weights
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        spacy.blank("en").add_pipe("genbioel").set_model(model, tokenizer, small_kb)
    assert "trained on GenBioEL's own" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="spacy_genbioel"):
        pipe = spacy.blank("en").add_pipe("genbioel", config={"inputs": {"style": "genbioel-released-ncbi.v1"}})
        pipe.set_model(model, tokenizer, small_kb)
        spacy.blank("en").add_pipe("genbioel", config={"inputs": {"style": "genbioel-released-ncbi.v1"}}).set_model(
            micro_model, tokenizer, small_kb
        )  # a model trained here, fed the released inputs
    assert caplog.text.count("inputs.style") == 1 and "this package's" in caplog.text


# -- the tokenizer folder and the input style --------------------------------------------------------------------------
def bare_tokenizer_folder(tmp_path, tokenizer_dir, name="bart-large"):
    """facebook/bart-large's tokenizer folder as people download it without its config.json:
    tokenizer.json alone (bart-large has no tokenizer_config.json)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    return folder


def test_a_tokenizer_folder_without_config_json_is_refused_naming_it(tmp_path, micro_model, tokenizer_dir):
    src = write_released(tmp_path / "ANGEL_ncbi", micro_model)
    bare = bare_tokenizer_folder(tmp_path, tokenizer_dir)
    with pytest.raises(CheckpointError, match="no padding token") as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=bare))
    assert str(bare / "config.json") in str(err.value) and "facebook/bart-large" in str(err.value)
    assert not (tmp_path / "out").exists()
    refused = runner.invoke(
        app, ["import-checkpoint", str(src), "--out", str(tmp_path / "out"), "--tokenizer", str(bare)]
    )
    assert refused.exit_code == 1 and "config.json" in refused.output and "Traceback" not in refused.output
    # with bart-large's config.json beside it, the tokenizer knows its class and pads
    (bare / "config.json").write_text(json.dumps({"model_type": "bart"}))
    import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=bare))
    _, tokenizer = load_model(tmp_path / "out")
    assert tokenizer.pad_token == "<pad>" and tokenizer(["renal", "renal failure"], padding=True)["input_ids"]


def test_a_tokenizer_that_cannot_pad_or_lacks_merges_is_refused(tmp_path, micro_model, tokenizer_dir):
    src = write_released(tmp_path / "ANGEL_ncbi", micro_model)
    no_pad = bare_tokenizer_folder(tmp_path, tokenizer_dir, "no-pad")
    (no_pad / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "TokenizersBackend"}))
    with pytest.raises(CheckpointError, match="has no padding token") as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=no_pad))
    assert str(no_pad / "tokenizer_config.json") in str(err.value)
    vocab_only = tmp_path / "vocab-only"
    vocab_only.mkdir()
    (vocab_only / "vocab.json").write_text(json.dumps({"<pad>": 0, "a": 1}))
    with pytest.raises(CheckpointError, match="merges.txt") as err:
        import_checkpoint(src, tmp_path / "out", ImportOptions(tokenizer=vocab_only))
    assert str(vocab_only / "merges.txt") in str(err.value)


def test_a_model_whose_tokenizer_cannot_pad_is_refused_at_load_and_package(
    tmp_path, micro_model, tokenizer_dir, small_kb
):
    """A model imported before the check, with bart-large's tokenizer saved without its padding token."""
    from spacy_genbioel.models import ModelFormatError, load_tokenizer
    from spacy_genbioel.training.package import package

    import_checkpoint(
        write_released(tmp_path / "ANGEL_ncbi", micro_model), tmp_path / "model", ImportOptions(no_tokenizer=True)
    )
    load_tokenizer(bare_tokenizer_folder(tmp_path, tokenizer_dir)).save_pretrained(tmp_path / "model")
    with pytest.raises(ModelFormatError, match="no padding token") as err:
        load_model(tmp_path / "model")
    assert str(tmp_path / "model") in str(err.value)
    small_kb.to_jsonl(tmp_path / "kb.jsonl")
    with pytest.raises(ModelFormatError, match="no padding token"):
        package(tmp_path / "model", tmp_path / "kb.jsonl", tmp_path / "pkg")
    assert not (tmp_path / "pkg").exists()


def test_the_input_style_is_recorded_from_the_folder_name_or_as_given(tmp_path, micro_model, tokenizer_dir):
    from spacy_genbioel.linking.inputs.released_style import recorded_input_style, recorded_max_source_tokens

    record = import_checkpoint(
        write_released(tmp_path / "ANGEL_ncbi", micro_model), tmp_path / "ncbi", ImportOptions(tokenizer=tokenizer_dir)
    )
    assert record["inputs_style"] == {
        "style": "genbioel-released-ncbi.v1",
        "from": "the source folder's name, ANGEL_ncbi",
    }
    model, _ = load_model(tmp_path / "ncbi")
    config = json.loads((tmp_path / "ncbi" / "config.json").read_text())
    for where in (model, model.config, config, tmp_path / "ncbi", str(tmp_path / "ncbi" / "config.json")):
        assert recorded_input_style(where) == "genbioel-released-ncbi.v1"
        assert recorded_max_source_tokens(where) == micro_model.config.max_position_embeddings  # 128: fewer than 1024
    given = import_checkpoint(
        tmp_path / "ANGEL_ncbi",
        tmp_path / "bc5cdr",
        ImportOptions(tokenizer=tokenizer_dir, inputs_style="genbioel-released-bc5cdr.v1"),
    )
    assert given["inputs_style"]["style"] == recorded_input_style(tmp_path / "bc5cdr") == "genbioel-released-bc5cdr.v1"
    unknown = import_checkpoint(
        write_released(tmp_path / "ANGEL_pretrained", micro_model),
        tmp_path / "pretrained",
        ImportOptions(tokenizer=tokenizer_dir),
    )
    assert unknown["inputs_style"]["style"] is None and recorded_input_style(tmp_path / "pretrained") is None
    assert recorded_input_style(micro_model) is None and recorded_input_style(tmp_path / "nowhere") is None
    with pytest.raises(CheckpointError, match="the released styles are"):
        import_checkpoint(
            tmp_path / "ANGEL_ncbi", tmp_path / "x", ImportOptions(tokenizer=tokenizer_dir, inputs_style="genbioel.v1")
        )
    cli = runner.invoke(
        app,
        [
            "import-checkpoint",
            str(tmp_path / "ANGEL_pretrained"),
            "--out",
            str(tmp_path / "cli"),
            "--tokenizer",
            str(tokenizer_dir),
            "--inputs.style",
            "genbioel-released-bc5cdr.v1",
        ],
    )
    assert cli.exit_code == 0 and "genbioel-released-bc5cdr.v1" in cli.output, cli.output
    assert recorded_input_style(tmp_path / "cli") == "genbioel-released-bc5cdr.v1"
