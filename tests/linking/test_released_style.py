"""The released input styles write what GenBioEL's preprocessing wrote: lower-cased whole
documents cut at 384 words, `` START `` / `` END `` markers, the mention as BioSyn or
GenBioEL wrote it, a leading space before the encoder text and the prompt, and a decoder
prefix without ``<s>``; ``genbioel.v1`` stays as it was."""

import pytest
import spacy
from conftest import random_kb

import spacy_genbioel  # noqa: F401  (registers the factory)
from spacy_genbioel.linking.inputs.builder import InputBuilder, PromptTokenizer, SourceEncoder
from spacy_genbioel.linking.inputs.released_style import (
    biosyn_clean,
    cut_context,
    expand_short_forms,
    split_bc5cdr_composite,
    split_composite,
)
from spacy_genbioel.linking.inputs.short_forms import find_short_forms, read_ab3p_output
from spacy_genbioel.linking.settings import DEFAULT_CONFIG, LinkerSettings
from spacy_genbioel.models import save_model
from spacy_genbioel.ty import Mention

NCBI = InputBuilder(style="genbioel-released-ncbi.v1")
BC5CDR = InputBuilder(style="genbioel-released-bc5cdr.v1")


def mention_in(text, mention, ids=("D1",), at=None):
    start = text.index(mention) if at is None else at
    end = start + len(mention)
    return Mention(mention, ids, left=text[:start], right=text[end:], start=start, end=end)


def test_default_style_is_unchanged():
    m = mention_in("The  Renal   Failure was acute .", "Renal   Failure")
    assert InputBuilder().style == "genbioel.v1" and DEFAULT_CONFIG["inputs"]["style"] == "genbioel.v1"
    assert InputBuilder().source(m) == "the START renal failure END was acute ."
    assert InputBuilder().prompt(m) == "renal failure is"
    assert (InputBuilder().window_words, NCBI.window_words) == (64, 384)  # what a caller gives on each side
    assert LinkerSettings.from_config({"inputs": {"style": "genbioel-released-ncbi.v1"}}).inputs.released is not None


def test_unknown_style_and_document_mode_are_refused():
    with pytest.raises(ValueError, match="style must be one of"):
        InputBuilder(style="genbioel.v2")
    with pytest.raises(ValueError, match="one input per mention"):
        InputBuilder(style="genbioel-released-ncbi.v1", input_mode="document")


def test_lower_case_marker_spacing_and_whitespace_kept():
    text = "A  Hereditary  Tumour &amp; X (HTX) in Men."
    m = mention_in(text, "Tumour &amp; X")
    # the document keeps its double spaces; the sides lose their outer spaces only
    assert BC5CDR.source(m) == "a  hereditary START tumour & x END (htx) in men."
    # BioSyn's cleanup: spelling list, punctuation to word breaks
    assert NCBI.source(m) == "a  hereditary START tumor amp x END (htx) in men."
    at_start = mention_in("Wilms tumour is rare.", "Wilms tumour")
    assert NCBI.source(at_start) == "START wilms tumor END is rare."
    at_end = mention_in("A case of Wilms tumour", "Wilms tumour")
    assert NCBI.source(at_end) == "a case of START wilms tumor END"


def test_prompt_is_the_written_mention_and_is():
    m = mention_in("A case of Non-Asbestos Tumours.", "Non-Asbestos Tumours")
    assert NCBI.prompt(m) == "non asbestos tumors is"
    assert BC5CDR.prompt(m) == "non-asbestos tumours is"
    assert InputBuilder(style="genbioel-released-ncbi.v1", decoder_prompt=False).prompt(m) == ""


def test_cut_at_384_words():
    words = [f"w{i}" for i in range(500)]
    # a document of at most 384 words is kept whole
    assert cut_context("a b ", " c", 384) == ("a b", "c")
    # short left side: kept whole, the right side gets the rest of the 384 words
    left, right = cut_context(" ".join(words[:10]) + " ", " " + " ".join(words[11:]), 500)
    assert left.split(" ") == words[:10] and right.split(" ") == words[11 : 11 + 374]
    # an empty left side counts as one word
    left, right = cut_context("", " " + " ".join(words[1:]), 500)
    assert left == "" and len(right.split(" ")) == 383
    # short right side: kept whole, the left side keeps its last 384 - len(right) words
    left, right = cut_context(" ".join(words[:490]) + " ", " " + " ".join(words[491:]), 500)
    assert right.split(" ") == words[491:] and left.split(" ") == words[490 - 375 : 490]
    # both long: 192 words each side
    left, right = cut_context(" ".join(words[:250]) + " ", " " + " ".join(words[251:]), 500)
    assert left.split(" ") == words[58:250] and right.split(" ") == words[251:443]


def test_cut_counts_the_whole_document():
    text = " ".join(f"w{i}" for i in range(400)) + " Renal Failure ."
    m = mention_in(text, "Renal Failure")
    left, start, mention, end, right = NCBI.parts(m)
    assert (start, mention, end, right) == ("START", "renal failure", "END", ".")
    assert len(left.split(" ")) == 384 - 1  # the right side (".") is kept whole


def test_biosyn_mention_rules():
    assert biosyn_clean("Leukaemia, (Tumour)") == "leukaemia tumour"  # spelling applies to whole words only
    assert biosyn_clean("Tumour  X-linked") == "tumor x linked"
    assert expand_short_forms("DM, type 1", {"DM": "dystrophia myotonica"}) == "dystrophia myotonica, type 1"
    assert expand_short_forms("DM/CMT", {"DM": "dm long", "CMT": "cmt long"}) == "dm long/cmt long"
    assert expand_short_forms("A", {"A": "A b"}) == "A b b b b b b b b"  # bounded
    assert split_composite("breast and ovarian cancer", ("D1", "D2")) == (
        ["breast cancer", "ovarian cancer"],
        ("D1", "D2"),
    )
    assert split_composite("C6 or C7 deficiency", ("1", "2"))[0] == ["C6 deficiency", "C7 deficiency"]
    assert split_composite("cancer of the breast or ovary", ("D1", "D2"))[0] == ["cancer of breast", "cancer of ovary"]
    assert split_composite("renal hamartomas", ("D1", "123"))[0] == ["renal hamartomas"]  # OMIM dropped beside MeSH
    assert split_composite("renal hamartomas", ("D1", "D2"))[0] == ["renal", "hamartomas"]
    m = mention_in("Families with breast and ovarian cancer.", "breast and ovarian cancer", ids=("D1", "D2"))
    assert NCBI.source(m) == "families with START breast cancer END ."
    assert BC5CDR.source(m) == "families with START breast and ovarian cancer END ."


def test_bc5cdr_composite_parts():
    assert split_bc5cdr_composite(10, "A B", ("D1", "D2"), ("A", "B")) == [(10, 11, "A", "D1"), (12, 13, "B", "D2")]
    assert split_bc5cdr_composite(0, "x and y", ("D1", "D2"), ("x", "yy")) == [(0, 1, "x", "D1"), (6, 7, "y", "D2")]
    assert split_bc5cdr_composite(0, "x, y, z", ("D1", "D2", "D3"), ("x", "w", "z")) == []


def test_short_forms():
    text = (
        "Atm, defective in ataxia-telangiectasia (A-T), is known. The Schwartz-Jampel syndrome (SJS; "
        "chondrodystrophic myotonia; McK 255, 800) is rare. An attenuated adenomatous polyposis coli (AAPC) "
        "case. The Atm (ataxia telangiectasia (AT) -mutated) gene. Cancer (not an abbreviation here)."
    )
    assert find_short_forms(text) == {
        "A-T": "ataxia-telangiectasia",
        "SJS": "Schwartz-Jampel syndrome",
        "AAPC": "attenuated adenomatous polyposis coli",
        "AT": "ataxia telangiectasia",
    }


def test_read_ab3p_output(tmp_path):
    path = tmp_path / "ab3p.out"
    path.write_text(
        "123| Some text (ST).\n  ST|Some text|0.99\nFailed to find sentence\n456| none\n  DM|diabetes|0.9\n"
    )
    assert read_ab3p_output(path) == {"123": {"ST": "Some text"}, "456": {"DM": "diabetes"}}


def test_encoder_and_prompt_tokens(word_tokenizer):
    m = mention_in("Acute renal failure .", "renal failure")
    ids = SourceEncoder(word_tokenizer).ids([m], NCBI, 64)[0]
    assert ids == word_tokenizer(" acute START renal failure END .")["input_ids"]
    assert (
        SourceEncoder(word_tokenizer).ids([m], InputBuilder(), 64)[0]
        == word_tokenizer("acute START renal failure END .")["input_ids"]
    )
    # trimmed inputs keep the leading space too
    long = mention_in("acute " * 80 + "renal failure", "renal failure", at=480)
    trimmed = SourceEncoder(word_tokenizer).ids([long], NCBI, 16)[0]
    assert len(trimmed) == 16 and trimmed[1] == word_tokenizer(" acute", add_special_tokens=False)["input_ids"][0]
    start, eos = 2, word_tokenizer.eos_token_id
    released = PromptTokenizer(word_tokenizer, start, eos, inputs=NCBI)
    assert released.prefix == [start]
    assert (
        released.prompts([NCBI.prompt(m)])[0]
        == [start] + word_tokenizer(" renal failure is", add_special_tokens=False)["input_ids"]
    )
    # the trie root: " is" with a prompt, the start token alone without one
    assert released.root_token_id("is") == word_tokenizer(" is", add_special_tokens=False)["input_ids"][-1]
    assert released.root_token_id(None) == start
    assert PromptTokenizer(word_tokenizer, start, eos).prefix == [start, word_tokenizer.bos_token_id]


def test_component_builds_released_sources(tmp_path, micro_model, word_tokenizer, monkeypatch):
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    random_kb(1, n_concepts=30).to_jsonl(tmp_path / "kb.jsonl")
    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": "Renal - Failure"}])
    nlp.add_pipe(
        "genbioel",
        config={
            "model": str(tmp_path / "model"),
            "kb": str(tmp_path / "kb.jsonl"),
            "device": "cpu",
            "inputs": {"style": "genbioel-released-ncbi.v1"},
            "decoding": {"num_beams": 2, "top_k": 2},
        },
    )
    linker = nlp.get_pipe("genbioel").linker
    seen = []
    encode = linker.encode_sources
    monkeypatch.setattr(linker, "encode_sources", lambda mentions: seen.extend(encode(mentions)) or encode(mentions))
    nlp("The  patient had Renal - Failure and more .")
    assert seen == [word_tokenizer(" the  patient had START renal failure END and more .")["input_ids"]]
    # the decoder prompts as the released models were trained: </s> then " mention is" (no <s>)
    start = linker.prompt_tokens.decoder_start_token_id
    prompt = linker.prompt_tokens.prompts([linker.inputs.prompt(mention_in("Renal - Failure", "Renal - Failure"))])[0]
    assert prompt == [start] + word_tokenizer(" renal failure is", add_special_tokens=False)["input_ids"]


def test_released_window_reaches_the_cut():
    # the component hands the released style enough document for its own 384-word cut
    nlp = spacy.blank("en")
    pipe = nlp.add_pipe("genbioel", config={"inputs": {"style": "genbioel-released-bc5cdr.v1"}})
    assert pipe.inputs.window_words >= 384 and InputBuilder().window_words == 64


def test_the_ncbi_style_expands_short_forms_inside_mentions_in_a_pipeline(
    tmp_path, micro_model, word_tokenizer, monkeypatch
):
    save_model(micro_model, word_tokenizer, tmp_path / "model")
    random_kb(2, n_concepts=20).to_jsonl(tmp_path / "kb.jsonl")
    text = "Ataxia telangiectasia (AT) is rare . AT carriers were seen ."
    assert find_short_forms(text) == {"AT": "Ataxia telangiectasia"}
    seen = {}
    for style in ("genbioel-released-ncbi.v1", "genbioel-released-bc5cdr.v1"):
        nlp = spacy.blank("en")
        nlp.add_pipe("entity_ruler").add_patterns([{"label": "Disease", "pattern": "AT carriers"}])
        nlp.add_pipe(
            "genbioel",
            config={
                "model": str(tmp_path / "model"),
                "kb": str(tmp_path / "kb.jsonl"),
                "device": "cpu",
                "inputs": {"style": style},
                "decoding": {"num_beams": 2, "top_k": 2},
            },
        )
        linker = nlp.get_pipe("genbioel").linker

        def spy(mentions, *args, _style=style, _link=linker.link):
            seen[_style] = [m.text for m in mentions]
            return _link(mentions, *args)

        monkeypatch.setattr(linker, "link", spy)
        nlp(text)
    # BioSyn expanded the short form word by word inside the mention; the bc5cdr style keeps a mention as written
    assert seen == {
        "genbioel-released-ncbi.v1": ["Ataxia telangiectasia carriers"],
        "genbioel-released-bc5cdr.v1": ["AT carriers"],
    }
