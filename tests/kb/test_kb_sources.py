"""Tests for the KB source readers, on small files written here."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spacy_genbioel.kb import (
    FORMATS,
    KnowledgeBase,
    apply_crosswalk,
    augment_kb,
    build_kb,
    compare_with_target_kb,
    normalize_id,
    parse_source,
    read_crosswalk,
    read_ctd,
    read_genbioel_target_kb,
    read_jsonl,
    read_medic,
    read_mesh_tsv,
    read_mesh_xml,
    read_obo,
    read_scispacy_jsonl,
    read_umls,
    split_ids,
)
from spacy_genbioel.kb.base import Concept, KBFormatError
from spacy_genbioel.ty import Mention


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf8")
    return path


def write_gz(path: Path, text: str) -> Path:
    with gzip.open(path, "wt", encoding="utf8") as out:
        out.write(text)
    return path


# -- IDs ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw, expected",
    [
        ("D001", "D001"),
        (" D015862", "D015862"),
        ("MESH:D001 ", "D001"),
        ("OMIM:123456", "123456"),
        ("123456", "123456"),
        ("MESH:OMIM:1", "1"),
        ("DOID:1234", "DOID:1234"),
        ("-1", "-1"),
        ("", ""),
    ],
)
def test_normalize_id(raw: str, expected: str) -> None:
    assert normalize_id(raw) == expected


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.text(max_size=30),
        st.builds(
            lambda pre, body, pad: pad + pre + body + pad,
            st.sampled_from(["", "MESH:", "OMIM:", "MESH: ", "mesh:", "OMIM:MESH:", "DOID:"]),
            st.text(alphabet="DCMESHOIM:0123456789 ", max_size=12),
            st.sampled_from(["", " ", "\t"]),
        ),
    )
)
def test_normalize_id_idempotent(raw: str) -> None:
    once = normalize_id(raw)
    assert normalize_id(once) == once
    assert not any(ch.isspace() for ch in once)


def test_split_ids() -> None:
    assert split_ids("D001|D002") == (("D001", "D002"), True, False)
    assert split_ids("D014527+D012492") == (("D014527", "D012492"), True, False)
    assert split_ids("-1") == ((), False, True)
    assert split_ids("D002544|-1") == (("D002544",), True, False)
    assert split_ids(" MESH:D1|OMIM:2") == (("D1", "2"), True, False)
    assert split_ids("") == ((), False, True)


# -- MEDIC ----------------------------------------------------------------------------
MEDIC = (
    "C565588||Epidermolysis Bullosa With Diaphragmatic Hernia\n"
    "C567755|613097||Tooth Agenesis, Selective, 6|STHAG6\n"
    "D017092|263700||Porphyria, Erythropoietic|Gunther&apos;s Disease|Conradi-H&#252;nermann\n"
    "\n"
)


def test_read_medic_one_concept_per_id(tmp_path: Path) -> None:
    concepts = list(read_medic(write(tmp_path / "medic.txt", MEDIC)))
    assert [c.id for c in concepts] == ["C565588", "C567755", "613097", "D017092", "263700"]
    by_id = {c.id: c for c in concepts}
    assert by_id["C567755"].names == by_id["613097"].names == ["Tooth Agenesis, Selective, 6", "STHAG6"]
    assert by_id["D017092"].names[1:] == ["Gunther's Disease", "Conradi-Hünermann"]


def test_read_medic_escaped_names_kept_on_request(tmp_path: Path) -> None:
    concepts = list(read_medic(write(tmp_path / "medic.txt", MEDIC), unescape=False))
    assert "Gunther&apos;s Disease" in concepts[3].names


def test_read_medic_gz(tmp_path: Path) -> None:
    assert len(list(read_medic(write_gz(tmp_path / "medic.txt.gz", MEDIC)))) == 5
    # gzip found by magic bytes even without the suffix
    assert len(list(read_medic(write_gz(tmp_path / "medic_gz.txt", MEDIC)))) == 5


@pytest.mark.parametrize(
    "bad, line, reason",
    [("D001|Name only\n", 2, "no '||'"), ("||Name\n", 2, "no concept ID"), ("D002||\n", 2, "no names")],
)
def test_read_medic_errors(tmp_path: Path, bad: str, line: int, reason: str) -> None:
    path = write(tmp_path / "medic.txt", "D000||Fine\n" + bad)
    with pytest.raises(KBFormatError, match=rf"medic\.txt:{line}: .*{reason}"):
        list(read_medic(path))


def test_read_medic_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "medic.txt"
    path.write_bytes(b"D1||ok\nD2||Sj\xf6gren\n")
    with pytest.raises(KBFormatError, match=r"medic\.txt:2: not UTF-8"):
        list(read_medic(path))


def test_missing_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        list(read_medic(tmp_path / "nope.txt"))


# -- CTD ---------------------------------------------------------------------------------
CTD_DISEASES = (
    "# The Comparative Toxicogenomics Database (CTD)\n"
    "#\n"
    "# Fields:\n"
    "# DiseaseName\tDiseaseID\tAltDiseaseIDs\tDefinition\tParentIDs\tTreeNumbers\tParentTreeNumbers"
    "\tSynonyms\tSlimMappings\n"
    "#\n"
    "17-Hydroxysteroid Dehydrogenase Deficiency\tMESH:C537805\tOMIM:264300|DO:DOID:123\t\tMESH:D006177\t"
    "C12.706/C537805|C16.131/C537805\tC12.706\t17-Ksr Deficiency|Male pseudohermaphroditism\tMetabolic disease\n"
    "22q11 Deletion Syndrome\tMESH:D058165\t\tCondition with a variable constellation.\tMESH:D000015\t"
    "C05.660.207.103|F03.1\tC05.660.207\t22q11 Deletion Syndromes\tCongenital abnormality\n"
)


def test_read_ctd_diseases(tmp_path: Path) -> None:
    concepts = list(read_ctd(write_gz(tmp_path / "CTD_diseases.tsv.gz", CTD_DISEASES)))
    assert [c.id for c in concepts] == ["C537805", "264300", "D058165"]
    first, omim, second = concepts
    assert first.names == [
        "17-Hydroxysteroid Dehydrogenase Deficiency",
        "17-Ksr Deficiency",
        "Male pseudohermaphroditism",
    ]
    assert omim.names == first.names
    assert second.definition == "Condition with a variable constellation."
    assert second.types == ["C", "F"]
    assert [c.id for c in read_ctd(tmp_path / "CTD_diseases.tsv.gz", alt_id_prefixes=())] == ["C537805", "D058165"]


def test_read_ctd_chemicals_without_header(tmp_path: Path) -> None:
    text = (
        "# CTD chemicals\n"
        "10,10-bis(4-pyridinylmethyl)-9(10H)-anthracenone\tMESH:C112297\t\t\tMESH:D000873\tD03.633/C112297"
        "\tD03.633\tDMP 543\n"
        "Aspirin\tMESH:D001241\t50-78-2\tThe prototypical analgesic.\t\tD02.241"
        "\t\tAcetylsalicylic Acid|2-(Acetyloxy)benzoic Acid\n"
    )
    concepts = list(read_ctd(write(tmp_path / "CTD_chemicals.tsv", text)))
    assert [c.id for c in concepts] == ["C112297", "D001241"]
    assert concepts[1].names == ["Aspirin", "Acetylsalicylic Acid", "2-(Acetyloxy)benzoic Acid"]
    assert concepts[1].definition == "The prototypical analgesic."
    assert concepts[1].types == ["D"]


def test_read_ctd_error(tmp_path: Path) -> None:
    path = write(tmp_path / "ctd.tsv", CTD_DISEASES + "Broken\t\t\n")
    with pytest.raises(KBFormatError, match=r"ctd\.tsv:8: .*no concept ID"):
        list(read_ctd(path))


# -- MeSH TSV -----------------------------------------------------------------------------------
def test_read_mesh_tsv_descriptors_and_supplementary(tmp_path: Path) -> None:
    desc = write(
        tmp_path / "mesh.tsv",
        "D000002\tTemefos\tTemephos\tD02.705.400.625.800|D02.886.300\t\n"
        "D005260\tFemale\tFemales\t\t\n"
        "D000003\tAbattoirs\tAbattoir|Slaughter Houses\tJ01.576.423|J03.540.020\t\n",
    )
    concepts = list(read_mesh_tsv(desc))
    assert concepts[0] == Concept("D000002", ["Temefos", "Temephos"], None, ["D"])
    assert concepts[1].types == []
    assert concepts[2].types == ["J"]
    supp = write(
        tmp_path / "supp.tsv",
        "C000002\tbevonium\t2-(hydroxymethyl)piperidinium benzilate\tD001561\n"
        'C483025\tAckr1 protein mouse\t"Dfy protein, mouse|ID: 13349 ims'
        "\tDARC antigen, mouse|Darc protein\tD004375,D011956\n"
        "C000009\tnaked name\n",
    )
    concepts = list(read_mesh_tsv(supp))
    assert concepts[0].types == []  # the 4th column is mapped descriptors, not tree numbers
    assert concepts[1].names == [
        "Ackr1 protein mouse",
        '"Dfy protein, mouse',
        "ID: 13349 ims",
        "DARC antigen, mouse",
        "Darc protein",
    ]
    assert concepts[2].names == ["naked name"]


def test_read_mesh_tsv_error(tmp_path: Path) -> None:
    path = write(tmp_path / "mesh.tsv", "D1\tOne\t\t\t\nD2\n")
    with pytest.raises(KBFormatError, match=r"mesh\.tsv:2: "):
        list(read_mesh_tsv(path))
    path = write(tmp_path / "mesh2.tsv", "D1\t\tsyn\t\t\n")
    with pytest.raises(KBFormatError, match=r"mesh2\.tsv:1: .*no name"):
        list(read_mesh_tsv(path))


# -- MeSH XML -------------------------------------------------------------------------------------
DESC_XML = """<?xml version="1.0"?>
<!DOCTYPE DescriptorRecordSet SYSTEM "https://www.nlm.nih.gov/databases/dtd/nlmdescriptorrecordset_20240101.dtd">
<DescriptorRecordSet LanguageCode = "eng">
<DescriptorRecord DescriptorClass = "1">
  <DescriptorUI>D000001</DescriptorUI>
  <DescriptorName><String>Calcimycin</String></DescriptorName>
  <PharmacologicalActionList>
    <PharmacologicalAction>
      <DescriptorReferredTo><DescriptorUI>D000900</DescriptorUI>\
<DescriptorName><String>Anti-Bacterial Agents</String></DescriptorName></DescriptorReferredTo>
    </PharmacologicalAction>
  </PharmacologicalActionList>
  <TreeNumberList><TreeNumber>D03.633.100.221.173</TreeNumber><TreeNumber>D04.345</TreeNumber></TreeNumberList>
  <ConceptList>
    <Concept PreferredConceptYN="N">
      <ConceptUI>M0000002</ConceptUI><ConceptName><String>A-23187</String></ConceptName>
      <ScopeNote>A non-preferred note.</ScopeNote>
      <TermList><Term><TermUI>T1</TermUI><String>A-23187</String></Term><Term><String>A 23187</String></Term></TermList>
    </Concept>
    <Concept PreferredConceptYN="Y">
      <ConceptUI>M0000001</ConceptUI><ConceptName><String>Calcimycin</String></ConceptName>
      <ScopeNote>An ionophorous, polyether antibiotic.
      </ScopeNote>
      <TermList><Term><String>Calcimycin</String></Term></TermList>
    </Concept>
  </ConceptList>
</DescriptorRecord>
<DescriptorRecord DescriptorClass = "1">
  <DescriptorUI>D000002</DescriptorUI>
  <DescriptorName><String>Temefos</String></DescriptorName>
  <TreeNumberList><TreeNumber>G02.705</TreeNumber></TreeNumberList>
  <ConceptList><Concept PreferredConceptYN="Y">\
<TermList><Term><String>Temephos</String></Term></TermList></Concept></ConceptList>
</DescriptorRecord>
</DescriptorRecordSet>
"""

SUPP_XML = """<?xml version="1.0"?>
<SupplementalRecordSet LanguageCode = "eng">
<SupplementalRecord SCRClass = "1">
  <SupplementalRecordUI>C000002</SupplementalRecordUI>
  <SupplementalRecordName><String>bevonium</String></SupplementalRecordName>
  <Note>structure given in first source</Note>
  <HeadingMappedToList><HeadingMappedTo><DescriptorReferredTo><DescriptorUI>*D001561</DescriptorUI></DescriptorReferredTo></HeadingMappedTo></HeadingMappedToList>
  <ConceptList><Concept PreferredConceptYN="Y"><TermList>
    <Term><String>bevonium</String></Term><Term><String>bevonium methyl sulfate</String></Term>
  </TermList></Concept></ConceptList>
</SupplementalRecord>
</SupplementalRecordSet>
"""


def test_read_mesh_xml_descriptors(tmp_path: Path) -> None:
    concepts = list(read_mesh_xml(write(tmp_path / "desc2024.xml", DESC_XML)))
    assert [c.id for c in concepts] == ["D000001", "D000002"]
    first = concepts[0]
    assert first.names == ["Calcimycin", "A-23187", "A 23187"]
    assert first.definition == "An ionophorous, polyether antibiotic."
    assert first.types == ["D"]
    assert concepts[1].names == ["Temefos", "Temephos"] and concepts[1].types == ["G"]


def test_read_mesh_xml_supplementary_gz(tmp_path: Path) -> None:
    concepts = list(read_mesh_xml(write_gz(tmp_path / "supp2024.xml.gz", SUPP_XML)))
    assert concepts == [
        Concept("C000002", ["bevonium", "bevonium methyl sulfate"], "structure given in first source", [])
    ]


def test_read_mesh_xml_errors(tmp_path: Path) -> None:
    broken = DESC_XML.replace(
        "</DescriptorName>\n  <TreeNumberList><TreeNumber>G02", "\n  <TreeNumberList><TreeNumber>G02"
    )
    with pytest.raises(KBFormatError, match=r"desc\.xml:\d+: XML parse error"):
        list(read_mesh_xml(write(tmp_path / "desc.xml", broken)))
    no_ui = DESC_XML.replace("<DescriptorUI>D000002</DescriptorUI>", "")
    with pytest.raises(KBFormatError, match=r"desc2\.xml:27: DescriptorRecord without DescriptorUI"):
        list(read_mesh_xml(write(tmp_path / "desc2.xml", no_ui)))


# -- UMLS ---------------------------------------------------------------------------------------------
MRCONSO = (
    "\n".join(
        [
            "C0000005|ENG|S|L0000005|PF|S0007492|Y|A26634265||M0019694|D012711|MSH|PEP|D012711|"
            "(131)I-Macroaggregated Albumin|0|N|256|",
            "C0000005|ENG|P|L0270109|PF|S0007491|Y|A26634266||M0019694|D012711|MSH|MH|D012711|(131)I-MAA|0|N|256|",
            "C0000005|FRE|P|L0270110|PF|S0007493|Y|A26634267||M0019694|D012711|MSHFRE|EN|D012711|MAA-131I|3|N||",
            "C0000039|ENG|P|L0000039|PF|S0007564|N|A0016515||M0023172|D015060|MSH|MH|D015060|1,2-Dipalmitoylphosphatidylcholine|0|N|256|",
            "C0000039|ENG|P|L0000039|VO|S1357296|Y|A1317687||M0023172|D015060|RXNORM|SY|D015060|"
            "Dipalmitoylphosphatidylcholine|0|N|256|",
            "C0000039|ENG|S|L0000035|PF|S0007560|Y|A0016511||M0023172|D015060|MSH|EP|D015060|"
            "old suppressed name|0|O|256|",
            "C0000052|ENG|P|L0000052|PF|S0007586|Y|A0016549||M0023325|D000479|MSH|MH|D000479|"
            "1,4-alpha-Glucan Branching Enzyme|0|N|256|",
        ]
    )
    + "\n"
)
MRDEF = (
    "C0000039|A0016515|AT38152019||MSH|Synthetic phospholipid used in liposomes.|N||\n"
    "C0000052|A0016549|AT1234||MSH|Suppressed definition.|O||\n"
    "C0000052|A0016550|AT1235||CSP|In glycogen synthesis.|N||\n"
)
MRSTY = (
    "C0000005|T116|A1.4.1.2.1.7|Amino Acid, Peptide, or Protein|AT17648347|256|\n"
    "C0000005|T121|A1.4.1.1.1|Pharmacologic Substance|AT17575038|256|\n"
    "C0000039|T109|A1.4.1.2.1|Organic Chemical|AT45562015|256|\n"
    "C0000052|T126|A1.4.1.1.3.3|Enzyme|AT17634323|256|\n"
)


@pytest.fixture
def umls(tmp_path: Path):
    return (
        write(tmp_path / "MRCONSO.RRF", MRCONSO),
        write(tmp_path / "MRDEF.RRF", MRDEF),
        write(tmp_path / "MRSTY.RRF", MRSTY),
    )


def test_read_umls(umls) -> None:
    mrconso, mrdef, mrsty = umls
    concepts = {c.id: c for c in read_umls(mrconso, mrdef, mrsty)}
    assert list(concepts) == ["C0000005", "C0000039", "C0000052"]
    # preferred (TS=P, STT=PF, ISPREF=Y) first; French and suppressed names out
    assert concepts["C0000005"].names == ["(131)I-MAA", "(131)I-Macroaggregated Albumin"]
    assert concepts["C0000005"].types == ["T116", "T121"]
    assert concepts["C0000039"].names == ["1,2-Dipalmitoylphosphatidylcholine", "Dipalmitoylphosphatidylcholine"]
    assert concepts["C0000039"].definition == "Synthetic phospholipid used in liposomes."
    assert concepts["C0000052"].definition == "In glycogen synthesis."


def test_read_umls_filters(umls) -> None:
    mrconso, mrdef, mrsty = umls
    assert [c.id for c in read_umls(mrconso, mrsty=mrsty, semantic_types=["T126", "T109"])] == ["C0000039", "C0000052"]
    rx = list(read_umls(mrconso, sabs=["RXNORM"]))
    assert [(c.id, c.names) for c in rx] == [("C0000039", ["Dipalmitoylphosphatidylcholine"])]
    everything = {c.id: c for c in read_umls(mrconso, languages=None, include_suppressed=True)}
    assert "MAA-131I" in everything["C0000005"].names
    assert "old suppressed name" in everything["C0000039"].names
    with pytest.raises(ValueError, match="MRSTY"):
        list(read_umls(mrconso, semantic_types=["T109"]))


def test_read_umls_error(tmp_path: Path) -> None:
    path = write(tmp_path / "MRCONSO.RRF", MRCONSO + "C0000099|ENG|P\n")
    with pytest.raises(KBFormatError, match=r"MRCONSO\.RRF:8: .*fields"):
        list(read_umls(path))


# -- OBO -------------------------------------------------------------------------------------------------
OBO = r"""format-version: 1.2
ontology: doid

[Term]
id: DOID:0001816
name: angiosarcoma
def: "A vascular cancer that derives_from the cells that line the walls of blood vessels." [url:http\://en.wikipedia.org/wiki/Angiosarcoma]
synonym: "hemangiosarcoma" EXACT []
synonym: "malignant \"hemangioendothelioma\"" RELATED [ORDO:263413]
synonym: "vascular tumour" BROAD []
namespace: disease_ontology
is_a: DOID:175 ! vascular cancer

[Term]
id: DOID:0000000
name: obsolete thing
is_obsolete: true

[Term]
id: UBERON:0001
name: imported anatomy

[Typedef]
id: derives_from
name: derives from
"""


def test_read_obo(tmp_path: Path) -> None:
    path = write(tmp_path / "doid.obo", OBO)
    concepts = list(read_obo(path, prefix=None))  # every term; by default the ontology's own (DOID:)
    assert [c.id for c in concepts] == ["DOID:0001816", "UBERON:0001"]
    assert [c.id for c in read_obo(path)] == ["DOID:0001816"]
    first = concepts[0]
    assert first.names == ["angiosarcoma", "hemangiosarcoma", 'malignant "hemangioendothelioma"']
    assert first.definition.startswith("A vascular cancer")
    assert first.types == ["disease_ontology"]
    assert [c.id for c in read_obo(path, prefix="DOID")] == ["DOID:0001816"]
    broad = list(read_obo(path, synonym_scopes=("EXACT", "BROAD")))[0]
    assert broad.names == ["angiosarcoma", "hemangiosarcoma", "vascular tumour"]


def test_read_obo_errors(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.obo", "[Term]\nid: X:1\nname: x\nsynonym: unquoted EXACT []\n")
    with pytest.raises(KBFormatError, match=r"bad\.obo:4: expected a quoted string"):
        list(read_obo(path))
    path = write(tmp_path / "noid.obo", "[Term]\nname: x\n\n[Term]\nid: X:2\nname: y\n")
    with pytest.raises(KBFormatError, match=r"noid\.obo:1: \[Term\] without an id"):
        list(read_obo(path))


# -- JSON formats ------------------------------------------------------------------------------------------
def test_read_genbioel_target_kb(tmp_path: Path) -> None:
    path = write(tmp_path / "target_kb.json", json.dumps({"D015862": ["a"], " D015862": ["b"], "613097": ["c", ""]}))
    concepts = list(read_genbioel_target_kb(path))
    assert [(c.id, c.names) for c in concepts] == [("D015862", ["a"]), ("D015862", ["b"]), ("613097", ["c"])]
    assert [c.id for c in read_genbioel_target_kb(path, clean_ids=False)][1] == " D015862"
    kb = build_kb("genbioel", path, dedup=False)
    assert sorted(kb.names_of("D015862")) == ["a", "b"]
    bad = write(tmp_path / "bad.json", '{"D1": ["a"],\n "D2": [1]}')
    with pytest.raises(KBFormatError, match=r"bad\.json:2: concept 'D2'"):  # the line of the key
        list(read_genbioel_target_kb(bad))
    broken = write(tmp_path / "broken.json", '{"D1": ["a"],\n "D2" ["b"]}')
    with pytest.raises(KBFormatError, match=r"broken\.json:2: not valid JSON"):
        list(read_genbioel_target_kb(broken))


def test_read_scispacy_and_project_jsonl(tmp_path: Path) -> None:
    sci = write(
        tmp_path / "umls_kb.jsonl",
        json.dumps(
            {
                "concept_id": "C001",
                "canonical_name": "Fever",
                "aliases": ["Pyrexia"],
                "types": ["T184"],
                "definition": "High temperature.",
            }
        )
        + "\n\n",
    )
    assert list(read_scispacy_jsonl(sci)) == [Concept("C001", ["Fever", "Pyrexia"], "High temperature.", ["T184"])]
    own = write_gz(tmp_path / "kb.jsonl.gz", json.dumps({"id": "D1", "names": ["x", "y"]}) + "\n")
    assert list(read_jsonl(own)) == [Concept("D1", ["x", "y"])]
    bad = write(tmp_path / "bad.jsonl", json.dumps({"concept_id": "C1", "canonical_name": "a"}) + "\n{oops\n")
    with pytest.raises(KBFormatError, match=r"bad\.jsonl:2: not valid JSON"):
        list(read_scispacy_jsonl(bad))
    noname = write(tmp_path / "noname.jsonl", json.dumps({"concept_id": "C1"}) + "\n")
    with pytest.raises(KBFormatError, match=r"noname\.jsonl:1: "):
        list(read_scispacy_jsonl(noname))


# -- crosswalk, build, compare ----------------------------------------------------------------------------
def test_crosswalk(tmp_path: Path) -> None:
    path = write(
        tmp_path / "crosswalk.tsv",
        "legacy_id\tcurrent_mesh_id_by_name_match\tcurrent_name_example\tmapped_using\tcorpus_or_genbioel_names\n"
        "C005435\tD000077553\tEdarabone\ttrain_dev_names\tedaravone\n"
        "MESH:C008281\tD000077222\tLimonene\ttrain_dev_names\tlimonene\n",
    )
    walk = read_crosswalk(path)
    assert walk == {"C005435": "D000077553", "C008281": "D000077222"}
    assert apply_crosswalk("C005435", walk) == "D000077553"
    assert apply_crosswalk(["C005435", "D1", "D000077553"], walk) == ("D000077553", "D1")
    assert apply_crosswalk(Concept("C008281", ["limonene"]), walk).id == "D000077222"
    assert apply_crosswalk(Mention("edaravone", ids=("C005435",)), walk).ids == ("D000077553",)
    bad = write(tmp_path / "bad.tsv", "C1\tD1\nC2\n")
    with pytest.raises(KBFormatError, match=r"bad\.tsv:2: "):
        read_crosswalk(bad)
    clash = write(tmp_path / "clash.tsv", "C1\tD1\nC1\tD2\n")
    with pytest.raises(KBFormatError, match=r"clash\.tsv:2: C1 maps to both"):
        read_crosswalk(clash)


def test_formats_registry() -> None:
    assert set(FORMATS) == {
        "medic",
        "ctd",
        "mesh-tsv",
        "mesh-xml",
        "umls",
        "rxnorm",
        "obo",
        "genbioel",
        "jsonl",
        "scispacy",
        "askapatient",
    }
    with pytest.raises(ValueError, match="Unknown KB format"):
        build_kb("nope", "x")


def test_build_kb_merges_sources(tmp_path: Path) -> None:
    medic = write(tmp_path / "medic.txt", MEDIC)
    extra = write(tmp_path / "extra.txt", "MESH:C565588|OMIM:999||EB with hernia\n")
    kb = build_kb("medic", [medic, extra], dedup=False)
    assert "C565588" in kb and "999" in kb
    assert kb.names_of("C565588") == ["epidermolysis bullosa with diaphragmatic hernia", "eb with hernia"]
    assert kb.name == "medic"
    # mixed formats with (format, path) sources, a crosswalk renaming IDs
    mesh = write(tmp_path / "mesh.tsv", "C005435\tEdarabone\tedaravone\t\n")
    kb = build_kb("medic", [medic, ("mesh-tsv", mesh)], crosswalk={"C005435": "D000077553"}, name="mix")
    assert "D000077553" in kb and "C005435" not in kb
    assert kb.ids_for_name("Edaravone") == ("D000077553",)
    assert kb.name == "mix"
    # dedup: a shared name stays on the concept with fewest names
    shared = write(tmp_path / "shared.txt", "D1||alpha|beta|gamma\nD2||alpha\n")
    assert build_kb("medic", shared, dedup=True).ids_for_name("alpha") == ("D2",)
    assert build_kb("medic", shared, dedup=False).ids_for_name("alpha") == ("D1", "D2")


def test_compare_with_target_kb(tmp_path: Path) -> None:
    medic = write(tmp_path / "medic.txt", MEDIC)
    kb = build_kb("medic", medic, dedup=False)
    target = {
        "C565588": ["epidermolysis bullosa with diaphragmatic hernia"],
        "C567755": ["tooth agenesis selective 6", "sthag6"],
        " 613097": ["tooth agenesis selective 6", "sthag6", "extra name"],
        "D017092": ["porphyria erythropoietic", "gunther apos s disease"],
        "999": ["missing concept"],
    }
    path = write(tmp_path / "target_kb.json", json.dumps(target))
    report = compare_with_target_kb(kb, path)
    assert report["target_pairs"] == 9
    assert report["ours_in_target"] == report["target_in_ours"] == 6
    assert report["missing_ids"] == ["999"]
    assert report["extra_ids"] == ["263700"]
    assert report["cleaned_target_ids"] == {" 613097": "613097"}
    assert ("D017092", "gunther apos s disease") in report["target_not_in_ours_examples"]
    assert report["ours_in_target_frac"] == pytest.approx(6 / report["ours_pairs"])


def test_parse_source() -> None:
    assert parse_source("medic:kb.txt") == ("medic", "kb.txt")
    assert parse_source("mesh-tsv:/data/a:b.tsv") == ("mesh-tsv", "/data/a:b.tsv")
    assert parse_source("C:/kb.txt") == "C:/kb.txt" and parse_source("kb.txt") == "kb.txt"


def test_augment_kb_steps() -> None:
    kb = KnowledgeBase([Concept("D1", ["alpha", "alfa"]), Concept("D2", ["beta"])])
    train = [Mention("Alpha-1", ("D1",)), Mention("a and b", ("D1", "D2"), composite=True), Mention("beta", ("D2",))]
    same, report = augment_kb(kb)
    assert same is kb and report.mentions_added is None and report.prior_ids is None
    more, report = augment_kb(kb, augment_mentions=iter(train), prior_mentions=iter(train))
    assert (report.mentions_added, report.new_names) == (2, 1)  # the composite mention adds no name
    assert more.ids_for_name("alpha 1") == ("D1",)
    assert (report.prior_ids, report.prior_concepts) == (4, 2) and more["D1"].prior == 2.0
    one, report = augment_kb(kb, first_names_only=True)
    assert report.names_before_first_only == 3 and one.names == ["alpha", "beta"]


# -- issue 16: damaged files and line ends in every reader ---------------------------------------------------------
def _samples() -> dict:
    return {
        "medic": MEDIC,
        "ctd": CTD_DISEASES,
        "mesh-xml": DESC_XML,
        "umls": MRCONSO,
        "rxnorm": MRCONSO,
        "obo": OBO,
        "genbioel": json.dumps({f"D{i}": [f"name {i}"] for i in range(40)}, indent=1),
        "jsonl": "".join(json.dumps({"id": f"D{i}", "names": [f"n{i}"]}) + "\n" for i in range(40)),
        "scispacy": "".join(json.dumps({"concept_id": f"C{i}", "canonical_name": f"n{i}"}) + "\n" for i in range(40)),
        "mesh-tsv": "".join(f"D{i:06d}\tName {i}\tSyn {i}\tC01.{i:03d}\t\n" for i in range(40)),
        "askapatient": json.dumps(
            {f"1000{i}": [["primary", f"name {i}"], ["synonym", f"syn {i}"]] for i in range(40)}, indent=1
        ),
    }


def test_every_reader_is_covered_here() -> None:
    assert set(_samples()) == set(FORMATS)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_truncated_or_corrupt_gzip_names_file_and_line(tmp_path: Path, fmt: str) -> None:
    data = gzip.compress(
        (_samples()[fmt] * (1 if fmt in ("genbioel", "mesh-xml", "askapatient") else 20)).encode("utf8")
    )
    cut = write_bytes(tmp_path / "source.gz", data[: len(data) * 2 // 3])
    with pytest.raises(KBFormatError, match=r"source\.gz:\d+: truncated or corrupt gzip data"):
        list(FORMATS[fmt](cut))
    bad = bytearray(data)
    bad[len(bad) // 2] ^= 0xFF
    flipped = write_bytes(tmp_path / "flipped.gz", bytes(bad))
    with pytest.raises(KBFormatError, match=r"flipped\.gz:\d+: "):
        list(FORMATS[fmt](flipped))


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_cr_only_crlf_and_bom_read_as_lf(tmp_path: Path, fmt: str) -> None:
    text = _samples()[fmt]
    expected = list(FORMATS[fmt](write(tmp_path / "lf", text)))
    assert expected
    for name, variant in (
        ("cr", text.replace("\n", "\r")),
        ("crlf", text.replace("\n", "\r\n")),
        ("bom", "\ufeff" + text),
    ):
        assert list(FORMATS[fmt](write_bytes(tmp_path / name, variant.encode("utf8")))) == expected, name


def test_cr_only_medic_gives_every_concept(tmp_path: Path) -> None:
    """An old Mac MEDIC file used to be one line: 1 concept instead of 25."""
    lines = [f"MESH:D{i:06d}||Disease {i}|Synonym {i}" for i in range(25)]
    from conftest import data_dir

    real = data_dir() / "vocab" / "medic_06Jul2012.txt" if data_dir() else None
    if real is not None and real.exists():
        lines = real.read_text(encoding="utf8").split("\n")[:25]
    path = write_bytes(tmp_path / "medic_mac.txt", "\r".join(lines).encode("utf8"))
    concepts = list(read_medic(path))
    assert len({c.id for c in concepts}) >= 25
    assert concepts == list(read_medic(write(tmp_path / "medic_unix.txt", "\n".join(lines))))


def test_a_stray_cr_inside_a_crlf_file_stays_in_its_field(tmp_path: Path) -> None:
    path = write_bytes(tmp_path / "medic.txt", b"D1||Alpha\rBeta|Gamma\r\nD2||Delta\r\n")
    # it does not end the line; inside the name it is a word break like any control character that separates words
    assert [(c.id, c.names) for c in read_medic(path)] == [("D1", ["Alpha Beta", "Gamma"]), ("D2", ["Delta"])]


def test_line_numbers_stay_exact_with_cr_only_ends(tmp_path: Path) -> None:
    path = write_bytes(tmp_path / "medic.txt", b"D1||a\rD2||b\r\rD3 no separator\r")
    with pytest.raises(KBFormatError, match=r"medic\.txt:4: expected"):
        list(read_medic(path))
    bad = write_bytes(tmp_path / "latin.txt", b"D1||a\rD2||Sj\xf6gren\r")
    with pytest.raises(KBFormatError, match=r"latin\.txt:2: not UTF-8"):
        list(read_medic(bad))


def test_util_readers_turn_damage_into_the_callers_error(tmp_path: Path) -> None:
    from spacy_genbioel.util import iter_json_lines, iter_lines, parse_json, read_text, text_lines

    class Mine(ValueError):
        pass

    data = gzip.compress(b"".join(b"line %d\n" % i for i in range(100000)))
    cut = write_bytes(tmp_path / "cut.gz", data[: len(data) // 2])
    with pytest.raises(Mine, match=r"cut\.gz:\d+: truncated or corrupt gzip"):
        list(iter_lines(cut, Mine))
    with pytest.raises(Mine, match=r"cut\.gz:\d+: truncated or corrupt gzip"):
        read_text(cut, Mine)
    latin = write_bytes(tmp_path / "latin.txt", b"ok\r\nSj\xf6gren\r\n")
    with pytest.raises(Mine, match=r"latin\.txt:2: not UTF-8 text \(invalid start byte at column 3\)"):
        read_text(latin, Mine)
    deep = write_bytes(tmp_path / "deep.jsonl", b'{"a": 1}\n' + b"[" * 100000 + b"\n")
    with pytest.raises(Mine, match=r"deep\.jsonl:2: JSON nested too deeply"):
        list(iter_json_lines(deep, Mine))
    with pytest.raises(Mine, match=r"f\.json:2: not valid JSON"):
        parse_json('{"a":\n}', "f.json", Mine)
    assert list(iter_lines(write_bytes(tmp_path / "mac.txt", b"\xef\xbb\xbfa\rb\r\rc"))) == [
        (1, "a"),
        (2, "b"),
        (3, ""),
        (4, "c"),
    ]
    assert text_lines("a\rb") == ["a", "b"] and text_lines("a\r\nb\rc\n") == ["a", "b\rc", ""]
