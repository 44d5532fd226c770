"""The zip archive of a checkpoint is read as ``torch.load`` reads it: the pickle scanned
is the one PyTorch unpickles (its own zip reader, case-insensitive names, the end record
at the end), and layouts on which readers could disagree are refused naming the member,
the byte or the size, before anything is unpickled or allocated."""

import io
import json
import os
import pickle
import re
import struct
import tracemalloc
import zipfile
from collections import OrderedDict

import pytest
import torch
from test_checkpoint_import import Reduce
from typer.testing import CliRunner

from spacy_genbioel.cli import app
from spacy_genbioel.models import CheckpointError, ImportOptions, checkpoint_pickle, import_checkpoint

runner = CliRunner()


def genuine(tmp_path, name="ckpt.bin", state=None):
    path = tmp_path / name
    torch.save(OrderedDict(w=torch.arange(6.0), b=torch.ones(2)) if state is None else state, path)
    return path


def members(path):
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()]


def write_zip(path, items, deflate=()):
    """``items`` rewritten by Python's zipfile (stored, or deflated for the names in ``deflate``)."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in items:
            archive.writestr(name, data, zipfile.ZIP_DEFLATED if name in deflate else zipfile.ZIP_STORED)
    return path


def evil_pickle(marker):
    return pickle.dumps(OrderedDict(w=Reduce(os.system, (f"touch {marker}",))), protocol=2)


def test_a_rewritten_archive_still_reads(tmp_path):
    """Python's zipfile layout (sizes in the local headers, no zip64 end) is read like torch.save's."""
    src = genuine(tmp_path)
    copy = write_zip(tmp_path / "copy.bin", members(src))
    for path in (src, copy):
        obj, facts = checkpoint_pickle.load_checkpoint_file(path)
        assert torch.equal(obj["w"], torch.arange(6.0)) and facts["format"] == "zip"


def test_a_case_colliding_pickle_is_refused_naming_both(tmp_path):
    """PyTorch's reader finds ``data.pkl`` case-insensitively: it would unpickle ``DATA.PKL``."""
    marker = tmp_path / "ran"
    items = members(genuine(tmp_path))
    prefix = items[0][0].split("/")[0]
    path = write_zip(tmp_path / "case.bin", items[:1] + [(f"{prefix}/DATA.PKL", evil_pickle(marker))] + items[1:])
    assert torch._C.PyTorchFileReader(str(path)).get_record("data.pkl") == evil_pickle(marker)  # what torch reads
    with pytest.raises(CheckpointError, match="same name but for case") as err:
        checkpoint_pickle.load_checkpoint_file(path)
    assert f"{prefix}/DATA.PKL" in str(err.value) and f"{prefix}/data.pkl" in str(err.value)
    assert not marker.exists()


def test_the_scanned_pickle_is_the_one_torch_reads(tmp_path, monkeypatch):
    """The scan reads ``data.pkl`` through PyTorch's reader: what it returns is what is checked."""
    from spacy_genbioel.models import checkpoint_archive

    marker = tmp_path / "ran"
    path = genuine(tmp_path)
    seen = []
    original = checkpoint_archive.read_record

    def spy(layout, name):
        data = original(layout, name)
        seen.append(data)
        return evil_pickle(marker) if name == "data.pkl" else data

    monkeypatch.setattr(checkpoint_pickle, "read_record", spy)
    with pytest.raises(CheckpointError, match="asks for posix.system|asks for os.system"):
        checkpoint_pickle.scan_pickle_globals(path)
    assert seen == [members(path)[0][1]] and not marker.exists()


def test_data_prepended_to_the_archive_is_refused(tmp_path):
    """Python's zipfile shifts its offsets over prepended bytes; miniz does not: two readers, two pickles."""
    marker = tmp_path / "ran"
    prefix = members(genuine(tmp_path))[0][0].split("/")[0]
    evil = write_zip(tmp_path / "evil.bin", [(f"{prefix}/data.pkl", evil_pickle(marker))])
    good = genuine(tmp_path).read_bytes()
    path = tmp_path / "prepended.bin"
    path.write_bytes(evil.read_bytes() + good)
    assert zipfile.ZipFile(path).read(f"{prefix}/data.pkl") == members(genuine(tmp_path))[0][1]
    with pytest.raises(CheckpointError, match="data prepended to the archive"):
        checkpoint_pickle.load_checkpoint_file(path)
    plain = tmp_path / "gap.bin"  # bytes before the first member, offsets fixed up: still refused
    items = members(genuine(tmp_path))
    body = io.BytesIO()
    body.write(b"PK\x03\x04" + b"\0" * 60)
    with zipfile.ZipFile(body, "a") as archive:
        for name, data in items:
            archive.writestr(name, data)
    plain.write_bytes(body.getvalue())
    with pytest.raises(CheckpointError, match="at the start of the file|prepended"):
        checkpoint_pickle.load_checkpoint_file(plain)
    assert not marker.exists()


def test_a_second_end_record_or_trailing_bytes_are_refused(tmp_path):
    good = genuine(tmp_path).read_bytes()
    for name, data in (("second-end.bin", good + good[-22:]), ("trailing.bin", good + b"\0" * 7)):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(CheckpointError, match="end record") as err:
            checkpoint_pickle.load_checkpoint_file(path)
        assert str(path) in str(err.value)
    appended = tmp_path / "appended.bin"  # a whole second archive after the first
    appended.write_bytes(good + write_zip(tmp_path / "other.bin", members(genuine(tmp_path))).read_bytes())
    with pytest.raises(CheckpointError, match="second central directory"):
        checkpoint_pickle.load_checkpoint_file(appended)


@pytest.mark.parametrize("member", ["data/0", "data.pkl"])
def test_a_compressed_member_is_refused(tmp_path, member):
    """A deflated storage would be memory-mapped as its compressed bytes (garbage in both probes)."""
    items = members(genuine(tmp_path))
    name = next(n for n, _ in items if n.endswith("/" + member))
    path = write_zip(tmp_path / "deflated.bin", items, deflate={name})
    with pytest.raises(CheckpointError, match=f"member '{name}' is compressed"):
        checkpoint_pickle.load_checkpoint_file(path)


def test_a_zip_bomb_pickle_is_refused_before_it_is_read(tmp_path, monkeypatch):
    from spacy_genbioel.models import checkpoint_archive

    items = members(genuine(tmp_path))
    name, data = items[0]
    bomb = data[:-1] + b"N" * (16 << 20) + b"."  # 16 MB of NONE opcodes, deflated to a few KB
    path = write_zip(tmp_path / "bomb.bin", [(name, bomb)] + items[1:], deflate={name})
    assert path.stat().st_size < 200_000
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="compressed"):
            checkpoint_pickle.scan_pickle_globals(path)
        assert tracemalloc.get_traced_memory()[1] < 4 << 20
    finally:
        tracemalloc.stop()
    stored = write_zip(tmp_path / "big.bin", [(name, data + b"\0" * 4096)] + items[1:])
    monkeypatch.setattr(checkpoint_archive, "PICKLE_CAP", 1024)
    with pytest.raises(CheckpointError, match=f"member {name} holds a {len(data) + 4096}-byte pickle"):
        checkpoint_pickle.scan_pickle_globals(stored)


@pytest.mark.parametrize(
    "extra", ["notes.txt", "data/evil.pkl", "constants.pkl", "data/../data.pkl", "code/__torch__.py", "OTHER/x"]
)
def test_members_outside_torch_saves_layout_are_refused(tmp_path, extra):
    items = members(genuine(tmp_path))
    prefix = items[0][0].split("/")[0]
    name = f"{prefix}/{extra}" if not extra.startswith("OTHER") else extra
    path = write_zip(tmp_path / "odd.bin", items + [(name, b"x")])
    with pytest.raises(CheckpointError, match="is not one torch.save writes") as err:
        checkpoint_pickle.load_checkpoint_file(path)
    assert repr(name) in str(err.value)


def test_a_storage_larger_than_its_record_is_refused_before_allocation(tmp_path):
    items = members(genuine(tmp_path, state=OrderedDict(w=torch.zeros(1))))
    name, data = items[0]
    big = data.replace(b"K\x01t", b"J\x00\x00\x00\x04t", 1)  # 1 element -> 2**26
    assert big != data
    path = write_zip(tmp_path / "big.bin", [(name, big)] + items[1:])
    with pytest.raises(CheckpointError, match="67108864 elements of storage '0'"):
        checkpoint_pickle.load_checkpoint_file(path)
    missing = write_zip(tmp_path / "missing.bin", [item for item in items if not item[0].endswith("/data/0")])
    with pytest.raises(CheckpointError, match="no member .*data/0"):
        checkpoint_pickle.load_checkpoint_file(missing)
    legacy = tmp_path / "legacy.bin"
    torch.save(OrderedDict(w=torch.zeros(1)), legacy, _use_new_zipfile_serialization=False)
    legacy.write_bytes(legacy.read_bytes().replace(b"K\x01N", b"J\x00\x00\x00\x04N", 1))
    with pytest.raises(CheckpointError, match="storages of 67108864 elements"):
        checkpoint_pickle.load_checkpoint_file(legacy)


def test_an_archive_refusal_reaches_the_cli_as_one_line(tmp_path, micro_model):
    src = tmp_path / "src"
    src.mkdir()
    config = micro_model.config.to_dict()
    config.pop("genbioel_tokenizer_fingerprint", None)
    (src / "config.json").write_text(json.dumps(config))
    torch.save(OrderedDict(micro_model.state_dict()), src / "pytorch_model.bin")
    items = members(src / "pytorch_model.bin")
    write_zip(src / "pytorch_model.bin", items, deflate={items[-2][0]})
    with pytest.raises(CheckpointError, match="compressed"):
        import_checkpoint(src, tmp_path / "out", ImportOptions(no_tokenizer=True))
    result = runner.invoke(app, ["import-checkpoint", str(src), "--out", str(tmp_path / "out"), "--no-tokenizer"])
    assert result.exit_code == 1 and "compressed" in result.output and "Traceback" not in result.output
    assert str(src / "pytorch_model.bin") in result.output.replace("\n", "")
    assert not (tmp_path / "out").exists()


def test_the_end_record_parser_reads_zip64_sizes(tmp_path):
    """torch.save always writes a zip64 end record; one that points elsewhere is refused."""
    data = bytearray(genuine(tmp_path).read_bytes())
    locator = len(data) - 22 - 20
    assert struct.unpack_from("<I", data, locator)[0] == 0x07064B50
    offset = struct.unpack_from("<Q", data, locator + 8)[0]
    struct.pack_into("<Q", data, locator + 8, offset - 1)
    path = tmp_path / "moved.bin"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="zip64 end record"):
        checkpoint_pickle.load_checkpoint_file(path)


def test_a_tensor_claiming_more_than_its_storage_is_refused_before_a_model_is_sized_to_it(tmp_path):
    """A stride-0 view of 4 bytes can claim any shape (and config.json a vocabulary to match)."""
    expanded = genuine(tmp_path, "expanded.bin", OrderedDict(w=torch.zeros(1).expand(10**6), b=torch.ones(2)))
    obj, _ = checkpoint_pickle.load_checkpoint_file(expanded)
    with pytest.raises(CheckpointError, match=r"tensor w has shape \(1000000,\) \(4000000 bytes\) over a storage of 4"):
        checkpoint_pickle.tensor_entries(obj, expanded)
    base = torch.arange(16384.0)
    overlapping = genuine(tmp_path, "overlap.bin", OrderedDict((f"w{i}", base[i : i + 16000]) for i in range(96)))
    obj, _ = checkpoint_pickle.load_checkpoint_file(overlapping)
    with pytest.raises(CheckpointError, match="overlapping views"):
        checkpoint_pickle.tensor_entries(obj, overlapping)
    tied = genuine(tmp_path, "tied.bin", OrderedDict((f"w{i}", base) for i in range(64)))  # one tensor, 64 names
    state, _ = checkpoint_pickle.tensor_entries(checkpoint_pickle.load_checkpoint_file(tied)[0], tied)
    assert len(state) == 64


@pytest.mark.parametrize("size", [1 << 40, 100 << 20])
def test_a_legacy_pickles_length_field_is_not_allocated(tmp_path, size):
    """``BufferedReader.read(n)`` allocates ``n``: a 20-byte file claiming a 1 TiB string is refused."""
    path = tmp_path / "legacy.bin"
    path.write_bytes(b"\x80\x04\x8e" + size.to_bytes(8, "little") + b"abc.")  # BINBYTES8
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=f"holds a {size}-byte value, over the 64 MiB") as err:
            checkpoint_pickle.scan_pickle_globals(path)
        assert tracemalloc.get_traced_memory()[1] < 4 << 20
    finally:
        tracemalloc.stop()
    assert str(path) in str(err.value)


@pytest.mark.parametrize("payload", [None, [1, 2], "weights"], ids=["none", "list", "text"])
def test_a_checkpoint_that_is_not_a_state_dict_is_refused_naming_the_file(tmp_path, payload):
    """A pickle that stops at once (``N.``: what the fuzz harness drew) or holds anything but a mapping
    carries no weights: refused, naming the file."""
    import torch

    from spacy_genbioel.models.checkpoint_pickle import CheckpointError, load_checkpoint_file

    path = tmp_path / "pytorch_model.bin"
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=f"{re.escape(str(path))}: holds a .*not a mapping of names to tensors"):
        load_checkpoint_file(path)
