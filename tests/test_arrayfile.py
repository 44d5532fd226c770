"""The safetensors array reader (spacy_genbioel.arrayfile): a damaged header or array is refused with a
ValueError naming the file and the array, never a RecursionError, an IndexError or other results."""

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spacy_genbioel.arrayfile import MAX_HEADER_DEPTH, ArraySpec, check_arrays, read_arrays, write_arrays


def raw_file(path, header, data: bytes = b""):
    """A safetensors file of ``header`` (a dict, or the header's bytes as they are) and ``data``."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode("utf8")
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def good_file(path):
    write_arrays(
        path,
        {"vectors": np.arange(12, dtype=np.int8).reshape(4, 3), "scales": np.full(4, 0.5, np.float32)},
        {"kb": "toy"},
    )
    return path


def test_a_written_file_reads_back(tmp_path):
    arrays, meta = read_arrays(good_file(tmp_path / "a.safetensors"))
    assert meta == {"kb": "toy"} and arrays["vectors"].shape == (4, 3) and arrays["scales"].dtype == np.float32


@pytest.mark.parametrize("depth", [5, 50, 100_000])
def test_a_deeply_nested_header_is_refused_naming_the_file(tmp_path, depth):
    nested = "[" * depth + "]" * depth
    text = ('{"x": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0], "extra": ' + nested + "}}").encode()
    path = raw_file(tmp_path / "deep.safetensors", text)
    with pytest.raises(ValueError, match=r"deep\.safetensors.*nest"):
        read_arrays(path)


def test_a_header_at_the_depth_limit_reads(tmp_path):
    path = raw_file(
        tmp_path / "ok.safetensors", {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
    )
    assert MAX_HEADER_DEPTH == 3 and read_arrays(path)[0]["x"].shape == (1,)


def test_overlapping_or_gapped_tensors_are_refused_naming_the_tensor(tmp_path):
    overlap = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    with pytest.raises(ValueError, match=r"o\.safetensors: tensor 'b' .*overlaps"):
        read_arrays(raw_file(tmp_path / "o.safetensors", overlap, b"\0" * 12))
    gap = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}
    with pytest.raises(ValueError, match=r"g\.safetensors: tensor 'a' .*unused"):
        read_arrays(raw_file(tmp_path / "g.safetensors", gap, b"\0" * 8))


def test_a_header_longer_than_the_limit_is_refused(tmp_path):
    path = tmp_path / "big.safetensors"
    path.write_bytes(struct.pack("<Q", 200_000_000) + b"{}")
    with pytest.raises(ValueError, match=r"big\.safetensors.*at most"):
        read_arrays(path)


SPECS = {"vectors": ArraySpec(("|i1",), (4, 3)), "scales": ArraySpec(("<f4",), (4,), finite=True, positive=True)}


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda a: {**a, "scales": a["scales"][:3]}, r"'scales' has shape 3, not 4"),
        (lambda a: {**a, "scales": np.array([0.5, np.nan, 0.5, 0.5], np.float32)}, r"'scales' holds nan at \[1\]"),
        (lambda a: {**a, "scales": np.array([0.5, 0.5, np.inf, 0.5], np.float32)}, r"'scales' holds inf at \[2\]"),
        (lambda a: {**a, "scales": np.array([0.5, 0.5, 0.5, 0.0], np.float32)}, r"'scales' holds 0.0 at \[3\]"),
        (lambda a: {**a, "scales": a["scales"].astype(np.float16)}, r"'scales' holds float16, not <f4"),
        (lambda a: {**a, "vectors": a["vectors"].astype(np.float32)}, r"'vectors' holds float32, not \|i1"),
        (lambda a: {"vectors": a["vectors"]}, r"'scales' is missing"),
        (lambda a: {**a, "extra": a["scales"]}, r"'extra' is not one this file holds"),
    ],
)
def test_check_arrays_names_the_file_and_the_array(tmp_path, change, words):
    arrays, _ = read_arrays(good_file(tmp_path / "index.safetensors"))
    check_arrays("index.safetensors", arrays, SPECS)
    with pytest.raises(ValueError, match=r"index\.safetensors: array " + words + r".*delete it"):
        check_arrays("index.safetensors", change(arrays), SPECS, remedy="delete it")


def test_a_nan_deep_in_a_large_array_is_found_chunk_by_chunk(tmp_path):
    big = np.ones((3000, 2000), np.float16)
    big[2999, 1999] = np.nan
    with pytest.raises(ValueError, match=r"holds nan at \[2999, 1999\]"):
        check_arrays("f", {"v": big}, {"v": ArraySpec(("<f2",), (None, 2000), finite=True)})


# -- fuzz: any damage to a valid file is read or refused naming the file, nothing else ---------------------------
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
    st.none() | st.integers(0, 400),
)
def test_fuzz_damaged_files_are_refused_naming_them(tmp_path, edits, cut):
    data = bytearray(good_file(tmp_path / "a.safetensors").read_bytes())
    for at, byte in edits:
        data[at % len(data)] = byte
    if cut is not None:
        data = data[:cut]
    path = tmp_path / "damaged.safetensors"
    path.write_bytes(bytes(data))
    try:
        arrays, _ = read_arrays(path)
    except ValueError as err:
        assert "damaged.safetensors" in str(err)
        return
    try:
        check_arrays(path, arrays, SPECS)
    except ValueError as err:
        assert "damaged.safetensors" in str(err) and "array" in str(err)
        return
    assert arrays["vectors"].shape == (4, 3) and bool((arrays["scales"] > 0).all())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers(-3, 2**70) | st.text(max_size=4),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=12,
    )
)
def test_fuzz_any_json_header_is_read_or_refused(tmp_path, header):
    path = raw_file(tmp_path / "h.safetensors", json.dumps(header).encode("utf8"))
    try:
        read_arrays(path)
    except ValueError as err:
        assert "h.safetensors" in str(err)
