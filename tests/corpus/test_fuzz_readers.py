"""Malformed files fed to every KB reader, ``KnowledgeBase.load``, every corpus
reader and ``build-kb``: each works or raises the project's error naming the
file (the cases and the oracle are in ``fuzz_readers.py``, also a script)."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import pytest
from fuzz_readers import SAMPLES, Case, cases, run_case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CASES = cases(seed=0)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.target}|{c.kind}" for c in CASES])
def test_malformed_input_is_read_or_refused_with_the_file(case: Case, tmp_path: Path) -> None:
    outcome, detail = run_case(case, tmp_path)
    assert outcome == "ok", f"{case.target}, {case.kind} (expected: {case.expect}): {outcome}: {detail}"


def test_every_reader_and_mutation_is_covered() -> None:
    targets = {c.target for c in CASES}
    assert targets == set(SAMPLES)
    kinds = {c.kind.split(" at ")[0].split(" on line ")[0] for c in CASES}
    for kind in (
        "gzip truncated",
        "bad UTF-8",
        "UTF-8 BOM",
        "CR-only line ends",
        "empty file",
        "2 MB line",
        "NUL bytes",
        "100000 nested brackets",
        "types: 5",
        "id: NaN",
    ):
        assert kind in kinds
    assert len(CASES) >= 800


def _mutate(data: bytes, draw) -> bytes:
    """Random byte-level damage: cut, insert, delete, overwrite; maybe gzip it, maybe cut the gzip."""
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["cut", "insert", "delete", "overwrite"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "cut":
            data = data[:at]
        elif op == "insert":
            data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
        elif op == "delete":
            data = data[:at] + data[at + draw(st.integers(1, 40)) :]
        else:
            data = data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at + 4 :]
    if draw(st.booleans()):
        data = gzip.compress(data, mtime=0)
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    return data


READ_TARGETS = sorted(t for t in SAMPLES if not t.startswith("cli:"))


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_damage_never_escapes_as_another_exception(data) -> None:
    target = data.draw(st.sampled_from(READ_TARGETS))
    damaged = _mutate(SAMPLES[target][1].encode("utf8"), data.draw)
    with tempfile.TemporaryDirectory() as tmp:
        outcome, detail = run_case(Case(target, "random damage", damaged, "either"), Path(tmp))
    assert outcome == "ok", f"{target}: {outcome}: {detail}"


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_damage_to_build_kb_exits_cleanly(data) -> None:
    target = data.draw(st.sampled_from(sorted(t for t in SAMPLES if t.startswith("cli:"))))
    damaged = _mutate(SAMPLES[target][1].encode("utf8"), data.draw)
    with tempfile.TemporaryDirectory() as tmp:
        outcome, detail = run_case(Case(target, "random damage", damaged, "either"), Path(tmp))
    assert outcome == "ok", f"{target}: {outcome}: {detail}"


def _compact_kb_bytes() -> bytes:
    from spacy_genbioel.kb.base import Concept
    from spacy_genbioel.kb.compact import CompactKB

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kb.safetensors"
        CompactKB.build([Concept(f"D{i}", [f"name {i}", f"alias {i}"], prior=float(i)) for i in range(6)]).save(path)
        return path.read_bytes()


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_random_damage_to_a_compact_kb_is_refused_naming_it(data) -> None:
    """The safetensors array reader under kb.safetensors: damage reads as the KB or is a KBFormatError
    naming the file (never a RecursionError, IndexError or another exception)."""
    from spacy_genbioel.kb.base import KBFormatError, KnowledgeBase

    damaged = _mutate(_compact_kb_bytes(), data.draw)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kb.safetensors"
        path.write_bytes(damaged)
        try:
            kb = KnowledgeBase.load(path)
            list(kb.names)
        except KBFormatError as err:
            assert "kb.safetensors" in str(err)
