"""Integration checks on the real benchmark data (``$GENBIOEL_DATA``, default ``<repo>/../shared/data``).

Run with ``python -m pytest tests/test_data_integration.py -m slow``; skipped
when the data folder is absent. Expected counts come from the data README.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest

from spacy_genbioel.corpus import PubTatorDocument, mentions_from_pubtator, read_askapatient, read_pubtator
from spacy_genbioel.kb import build_kb, compare_with_target_kb, read_crosswalk, read_ctd, read_medic, read_mesh_tsv

DATA = Path(os.environ.get("GENBIOEL_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not DATA.is_dir(), reason=f"benchmark data not found at {DATA} (set GENBIOEL_DATA)"),
]


def need(relative: str) -> Path:
    path = DATA / relative
    if not path.exists():
        pytest.skip(f"{path} not found")
    return path


def docs(relative: str) -> List[PubTatorDocument]:
    return list(read_pubtator(need(relative)))


@pytest.mark.parametrize(
    "relative, n_docs, n_mentions",
    [
        ("ncbi_disease/NCBIdevelopset_corpus.txt", 100, 787),
        ("ncbi_disease/NCBItrainset_corpus.txt", 593, 5145),
        ("bc5cdr/CDR_TrainingSet.PubTator.txt", 500, 9385),
        ("bc5cdr/CDR_DevelopmentSet.PubTator.txt", 500, 9591),
    ],
)
def test_corpus_counts(relative: str, n_docs: int, n_mentions: int) -> None:
    documents = docs(relative)
    assert len(documents) == n_docs
    assert sum(len(d.annotations) for d in documents) == n_mentions
    assert sum(1 for _ in mentions_from_pubtator(need(relative))) == n_mentions


def test_ncbi_train_quirks() -> None:
    documents = docs("ncbi_disease/NCBItrainset_corpus.txt")
    twice = [d for d in documents if d.pmid == "8528200"]
    assert len(twice) == 2 and twice[0] == twice[1]
    # IDs are clean: no spaces, no prefixes
    ids = {i for d in documents for a in d.annotations for i in a.ids}
    assert not any(" " in i or i.startswith(("MESH:", "OMIM:")) for i in ids)


def test_bc5cdr_relations_and_nil() -> None:
    documents = docs("bc5cdr/CDR_TrainingSet.PubTator.txt")
    assert sum(len(d.relations) for d in documents) == 1038
    assert sum(a.nil for d in documents for a in d.annotations) > 0
    assert {a.type for d in documents for a in d.annotations} == {"Chemical", "Disease"}


def test_askapatient_fold0() -> None:
    assert sum(1 for _ in read_askapatient(need("askapatient/AskAPatient.fold-0.validation.txt"))) == 845
    assert sum(1 for _ in read_askapatient(need("askapatient/AskAPatient.fold-0.train.txt"))) == 15612


def test_medic_counts_and_ncbi_coverage() -> None:
    medic = need("vocab/medic_06Jul2012.txt")
    concepts = list(read_medic(medic))
    # 11,915 lines -> 14,943 concepts (one per ID); OMIM 260350 sits on two lines
    assert len(concepts) == 14943
    assert len({c.id for c in concepts}) == 14942
    kb = build_kb("medic", medic, dedup=False)
    assert len(kb) == 14942
    # 76,237 names counted once per line, as the README's "76k"
    lines = [line for line in medic.read_text(encoding="utf8").splitlines() if line.strip()]
    assert len(lines) == 11915
    assert sum(len([n for n in line.split("||", 1)[1].split("|") if n.strip()]) for line in lines) == 76237
    for corpus in ("NCBItrainset_corpus.txt", "NCBIdevelopset_corpus.txt"):
        for mention in mentions_from_pubtator(need(f"ncbi_disease/{corpus}"), skip_nil=True):
            assert all(cid in kb for cid in mention.ids), mention


def test_target_kb_reproduction() -> None:
    kb = build_kb("medic", need("vocab/medic_06Jul2012.txt"), dedup=False)
    report = compare_with_target_kb(kb, need("genbioel_reference/ncbi/target_kb.json"))
    assert report["target_raw_ids"] == 14944
    assert report["ours_in_target_frac"] >= 0.995, report
    # after ID clean-up (' D015862' -> 'D015862') every target ID is ours, and no more
    assert report["missing_ids"] == []
    assert report["extra_ids"] == []
    assert set(report["cleaned_target_ids"]) == {" D008661", " D015862"}
    # target_kb.json also holds names that are not in this MEDIC file (see the report)
    assert report["target_in_ours_frac"] > 0.85


def test_ctd_and_mesh_cover_bc5cdr() -> None:
    ctd_ids = {c.id for c in read_ctd(need("vocab/CTD_diseases_2017.tsv.gz"), alt_id_prefixes=())}
    assert len(ctd_ids) == 11865
    desc = {c.id for c in read_mesh_tsv(need("vocab/mesh/mesh_id_label_mappings.tsv"))}
    supp = {c.id for c in read_mesh_tsv(need("vocab/mesh/mesh_supp_id_label_mappings.tsv"))}
    assert (len(desc), len(supp)) == (30764, 323304)
    crosswalk = read_crosswalk(need("vocab/bc5cdr_legacy_id_crosswalk.tsv"))
    assert len(crosswalk) == 46
    known = ctd_ids | desc | supp
    for corpus in ("CDR_TrainingSet.PubTator.txt", "CDR_DevelopmentSet.PubTator.txt"):
        mentions = list(mentions_from_pubtator(need(f"bc5cdr/{corpus}"), skip_nil=True, crosswalk=crosswalk))
        diseases = [m for m in mentions if m.label == "Disease"]
        chemicals = [m for m in mentions if m.label == "Chemical"]
        assert all(all(cid in ctd_ids for cid in m.ids) for m in diseases)
        covered = sum(all(cid in known for cid in m.ids) for m in chemicals) / len(chemicals)
        assert covered >= 0.98
