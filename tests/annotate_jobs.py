"""Shared by the tests of the Ray engine (test_annotate_units.py, test_annotate_ray.py): a job's
input, the local engine's output as the reference, and what "the same output" means."""
import contextlib
import json
import random
from pathlib import Path

import torch

from conftest import WORDS
from spacy_genbioel.annotate import annotate

PHRASES = WORDS + ["renal failure", "cystic fibrosis", "liver", "the", "of", "patients"]
RUN = dict(chunk_size=6, batch_size=4, progress=False)  # annotate()'s options: 10 units of the 60 documents
CPU = {"device": "cpu"}  # its genbioel settings
N_DOCS = 60


def job_input(path: Path, n: int = N_DOCS, seed: int = 0) -> Path:
    """``n`` JSONL documents ``d0``... in order, with a duplicate of ``d3`` and a line that is not JSON among them."""
    rng = random.Random(seed)
    lines = [json.dumps({"id": f"d{i}", "text": " ".join(rng.choices(PHRASES, k=rng.randint(4, 14)))}) for i in range(n)]
    lines.insert(n // 2, json.dumps({"id": "d3", "text": "renal failure, again"}))
    lines.insert(2 * n // 3, "{not json")
    path.write_text("\n".join(lines) + "\n", encoding="utf8")
    return path


@contextlib.contextmanager
def one_thread():
    """torch on one thread, as in a Ray CPU worker: the same kernels, so the same bytes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def local_run(docs: Path, pipeline: Path, out: Path, **options):
    with one_thread():
        return annotate([docs], pipeline, out, {**RUN, **options}, CPU)


def output(out: Path) -> dict:
    """What two runs of a job must agree on: the chunk files byte for byte, the checkpoint, the
    errors file's entries, and the summary's totals."""
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    return {
        "chunks": {p.name: p.read_bytes() for p in sorted(out.glob("part-*"))},
        "checkpoint": (out / "checkpoint.jsonl").read_text(),
        "errors": sorted((out / "errors.jsonl").read_text().splitlines()),
        "summary": {k: v for k, v in summary.items() if k not in ("this_run", "out", "errors_file")},
        "leftovers": sorted(p.name for p in out.glob(".*.tmp")),
    }


def assert_same_output(out: Path, reference: Path) -> None:
    got, want = output(out), output(reference)
    assert list(got["chunks"]) == list(want["chunks"])
    for name in want["chunks"]:
        assert got["chunks"][name] == want["chunks"][name], f"{name} differs"
    assert got == want


def written_ids(out: Path) -> list:
    """Document IDs of the chunk files in chunk order."""
    return [json.loads(line)["id"] for p in sorted(Path(out).glob("part-*.jsonl")) for line in p.read_text().splitlines()]
