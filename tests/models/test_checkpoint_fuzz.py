"""Fuzz the checkpoint reader of ``import-checkpoint`` (:func:`load_checkpoint_file`) with
archive layouts (duplicate and case-colliding names, odd member names, compressed members,
bytes prepended or appended, a second archive, damaged bytes), pickle opcodes and storage
sizes. Whatever the file, the reader returns tensors or raises :class:`CheckpointError`
naming the file; no other exception escapes, no payload runs, and what it accepts is an
archive on which Python's zipfile and PyTorch's reader see the same pickle."""

from __future__ import annotations

import io
import os
import pickle
import re
import zipfile
from collections import OrderedDict

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from test_checkpoint_import import Reduce

from spacy_genbioel.models import CheckpointError, checkpoint_pickle

ODD_NAMES = [
    "data.pkl",
    "DATA.PKL",
    "Data.pkl",
    "data/0",
    "DATA/0",
    "data/00",
    "data/-1",
    "data/0 ",
    "data/../data.pkl",
    "../data.pkl",
    "/abs",
    "constants.pkl",
    "code/__torch__/x.py",
    "extra.pkl",
    "version",
    "VERSION",
    ".data/version",
    "byteorder",
    ".format_version",
    "data/99999999999999",
    "dätä.pkl",
    "data.pkl\x00",
    "",
]
OPCODES = [b"N", b"(", b"t", b"0", b"Q", b"R", b"b", b"s", b"u", b"}", b"]", b"a", b"e", b"\x93", b"\x94", b"."]
OPCODES += [b"cos\nsystem\n", b"ctorch\nFloatStorage\n", b"c__builtin__\neval\n", b"\x82\x01", b"J\xff\xff\xff\x7f"]


def base_members(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with zipfile.ZipFile(io.BytesIO(buffer.getvalue())) as archive:
        return buffer.getvalue(), [(info.filename, archive.read(info)) for info in archive.infolist()]


@st.composite
def checkpoints(draw, marker):
    """``(bytes, what was done)``: a torch.save archive of tiny tensors, maybe mutated."""
    shapes = draw(st.lists(st.integers(0, 5), min_size=1, max_size=3))
    state = OrderedDict((f"w{i}", torch.arange(float(n))) for i, n in enumerate(shapes))
    original, members = base_members(state)
    prefix = members[0][0].split("/")[0]
    done = []
    for _ in range(draw(st.integers(0, 3))):
        op = draw(
            st.sampled_from(
                ["duplicate", "case", "rename", "add", "drop", "swap", "compress", "opcodes", "numel", "evil", "proto"]
            )
        )
        i = draw(st.integers(0, len(members) - 1))
        name, data = members[i]
        if op == "duplicate":
            members.insert(draw(st.integers(0, len(members))), (name, data))
        elif op == "case":
            members.insert(i + 1, (name.upper() if name != name.upper() else name.lower(), pickle.dumps({}, 2)))
        elif op == "rename":
            members[i] = (
                f"{draw(st.sampled_from([prefix, prefix.upper(), 'other', '']))}/{draw(st.sampled_from(ODD_NAMES))}",
                data,
            )
        elif op == "add":
            members.append((f"{prefix}/{draw(st.sampled_from(ODD_NAMES))}", draw(st.binary(max_size=16))))
        elif op == "drop" and len(members) > 1:
            del members[i]
        elif op == "swap":
            j = draw(st.integers(0, len(members) - 1))
            members[i], members[j] = members[j], members[i]
        elif op == "compress":
            done.append(("compress", name))
        elif op in ("opcodes", "numel", "evil", "proto"):
            found = [(k, m) for k, m in enumerate(members) if m[0].endswith("data.pkl")]
            if not found:
                continue
            k, (pkl_name, pkl) = found[0]
            if op == "opcodes":
                at = draw(st.integers(0, len(pkl)))
                pkl = pkl[:at] + b"".join(draw(st.lists(st.sampled_from(OPCODES), min_size=1, max_size=4))) + pkl[at:]
            elif op == "numel":
                big = draw(st.sampled_from([b"J\xff\xff\xff\x0f", b"\x8a\x08" + b"\xff" * 7 + b"\x7f", b"K\x00"]))
                pkl = re.sub(rb"(cpuq.)(K.|M..)t", lambda m, big=big: m.group(1) + big + b"t", pkl, count=1, flags=re.S)
            elif op == "evil":
                pkl = pickle.dumps(OrderedDict(w=Reduce(os.system, (f"touch {marker}",))), protocol=2)
            else:
                pkl = pickle.dumps(OrderedDict(a=1, b=[1.5, "x"]), protocol=draw(st.integers(0, 5)))
            members[k] = (pkl_name, pkl)
        done.append(op)
    compressed = {name for kind, name in (d for d in done if isinstance(d, tuple))}
    buffer = io.BytesIO()
    if done:
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, data in members:
                method = zipfile.ZIP_DEFLATED if name in compressed else zipfile.ZIP_STORED
                archive.writestr(zipfile.ZipInfo(name) if name else zipfile.ZipInfo("x"), data, method)
        blob = buffer.getvalue()
    else:
        blob = original
    for _ in range(draw(st.integers(0, 2))):
        op = draw(st.sampled_from(["prepend", "append", "second", "end", "flip", "cut"]))
        if op == "prepend":
            blob = draw(st.sampled_from([b"PK\x03\x04", b"\x80\x02", b""])) + draw(st.binary(max_size=64)) + blob
        elif op == "append":
            blob += draw(st.binary(min_size=1, max_size=64))
        elif op == "second":
            blob = blob + original if draw(st.booleans()) else original + blob
        elif op == "end":
            blob += blob[-22:]
        elif op == "flip" and blob:
            at = draw(st.integers(0, len(blob) - 1))
            blob = blob[:at] + bytes([blob[at] ^ draw(st.integers(1, 255))]) + blob[at + 1 :]
        elif op == "cut":
            blob = blob[: draw(st.integers(0, len(blob)))]
        done.append(op)
    return blob, done


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


# duplicate member names and other pickle protocols are written on purpose (zipfile and torch warn on them)
@pytest.mark.filterwarnings("ignore:Duplicate name:UserWarning")
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_archive_is_read_as_torch_reads_it_or_refused_naming_the_file(workdir, data):
    marker = workdir / "payload-ran"
    blob, done = data.draw(checkpoints(marker))
    path = workdir / "ckpt.bin"
    path.write_bytes(blob)
    try:
        obj, facts = checkpoint_pickle.load_checkpoint_file(path)
    except CheckpointError as err:
        event(str(err).split(": ", 2)[-1][:40])  # the kinds of refusal reached (pytest --hypothesis-show-statistics)
        assert str(path) in str(err), (done, str(err))
        assert "Traceback" not in str(err)
    else:
        assert set(facts["globals"]) <= checkpoint_pickle.ALLOWED_GLOBALS, done
        assert isinstance(obj, dict)
        if facts["format"] == "zip":  # the readers agree on every member, all stored
            with zipfile.ZipFile(path) as archive:
                infos = archive.infolist()
                assert all(info.compress_type == zipfile.ZIP_STORED for info in infos), done
                pkl = next(info for info in infos if info.filename.endswith("/data.pkl"))
                reader = torch._C.PyTorchFileReader(str(path))
                assert reader.get_record("data.pkl") == archive.read(pkl), done
                assert sorted(reader.get_all_records()) == sorted(i.filename.split("/", 1)[1] for i in infos), done
    assert not marker.exists(), done
