"""bench/synth_kb.py: the UMLS-like KB generator is seeded and keeps the fitted distributions;
bench/kb_scale.py's table reads its runs."""

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import kb_scale  # noqa: E402
import synth_kb  # noqa: E402


def vocabulary(seed=0, n=3000):
    """MeSH-like concepts: frequent words, rare chemical-like words, synonyms sharing words."""
    rng = random.Random(seed)
    common = [
        "acute",
        "chronic",
        "renal",
        "failure",
        "cancer",
        "syndrome",
        "disease",
        "of",
        "the",
        "type",
        "protein",
        "receptor",
        "human",
        "cell",
        "deficiency",
        "lung",
        "heart",
        "liver",
    ]

    pieces = [
        "meth",
        "yl",
        "eth",
        "amino",
        "benz",
        "ol",
        "ine",
        "ox",
        "hydro",
        "chlor",
        "ide",
        "ase",
        "phen",
        "2-",
        "4-",
        "n-",
    ]

    def rare():  # a chemical-like word, most of them seen once
        return "".join(rng.choice(pieces) for _ in range(rng.randint(3, 6)))

    concepts = []
    for _ in range(n):
        first = [
            rng.choice(common) if rng.random() < 0.75 else rare() for _ in range(rng.choice([1, 1, 2, 2, 2, 3, 4]))
        ]
        names = [" ".join(first)]
        for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 5])):
            names.append(
                " ".join(
                    rng.choice(first) if rng.random() < 0.4 else rng.choice(common) for _ in range(rng.randint(1, 4))
                )
            )
        concepts.append((names, rng.random() < 0.1))
    return concepts


@pytest.fixture(scope="module")
def stats():
    return synth_kb.fit(vocabulary())


def _read(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf8").splitlines()]


def test_fit_records_the_distributions(stats):
    assert stats["format"] == synth_kb.FORMAT and stats["concepts"] == 3000
    assert abs(sum(stats["synonyms"].values()) - 1) < 1e-9 and abs(sum(stats["words_per_name"].values()) - 1) < 1e-9
    assert (
        "renal" in stats["frequent_words"] and 0.05 < stats["rare_token_share"] < 0.5 and stats["rare_word_uses"] >= 1
    )
    assert 0.02 < stats["definition_share"] < 0.2 and stats["markov"]


def test_the_output_is_a_function_of_stats_size_and_seed(stats, tmp_path):
    a = synth_kb.generate(stats, 3000, 7, tmp_path / "a.jsonl")
    synth_kb.generate(stats, 3000, 7, tmp_path / "b.jsonl")
    synth_kb.generate(stats, 3000, 8, tmp_path / "c.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert (tmp_path / "a.jsonl").read_bytes() != (tmp_path / "c.jsonl").read_bytes()
    records = _read(tmp_path / "a.jsonl")
    assert a["names"] == sum(len(r["names"]) for r in records) == 3000 and a["concepts"] == len(records)
    assert [r["id"] for r in records] == [f"C{i:07d}" for i in range(1, len(records) + 1)]
    assert all(len({n.lower() for n in r["names"]}) == len(r["names"]) for r in records)  # no name twice in a concept


def test_a_small_kb_keeps_the_fitted_shape(stats, tmp_path):
    synth_kb.generate(stats, 20_000, 0, tmp_path / "kb.jsonl")
    records = _read(tmp_path / "kb.jsonl")
    refit = synth_kb.fit((r["names"], "definition" in r) for r in records)

    def mean(pmf):
        return sum(int(k) * p for k, p in pmf.items())

    assert mean(refit["synonyms"]) == pytest.approx(mean(stats["synonyms"]), rel=0.1)
    # lengthened duplicates add a little to the words per name
    assert mean(refit["words_per_name"]) == pytest.approx(mean(stats["words_per_name"]), rel=0.1)
    assert refit["definition_share"] == pytest.approx(stats["definition_share"], abs=0.02)
    assert refit["shared_word_share"] == pytest.approx(stats["shared_word_share"], abs=0.08)
    assert refit["rare_token_share"] > 0.4 * stats["rare_token_share"]  # synonyms copying rare words make some frequent
    from spacy_genbioel.kb.base import KnowledgeBase

    kb = KnowledgeBase.load(tmp_path / "kb.jsonl")
    assert 0.4 * 20_000 < kb.n_names <= 20_000 and all(c.types for c in kb)  # 18 common words: many shared names


def test_invented_words_follow_the_chain():
    markov = synth_kb.fit_markov(["abcab", "abcabc", "cab"])
    words = synth_kb.MarkovWords(markov).words(np.random.default_rng(0), 200)
    assert set("".join(words)) <= set("abc") and all(0 < len(w) <= synth_kb.MAX_WORD_CHARS for w in words)
    assert words == synth_kb.MarkovWords(markov).words(np.random.default_rng(0), 200)
    # every three-character window was seen in the training words
    seen = {w[i : i + 3] for w in ["abcab", "abcabc", "cab"] for i in range(len(w) - 2)}
    assert all(w[i : i + 3] in seen for w in words for i in range(len(w) - 2))


def test_fitting_reads_the_project_readers(tmp_path):
    (tmp_path / "mesh.tsv").write_text(
        "D1\tRenal Failure\tKidney Failure|Renal Insufficiency\tC12.1\t\nD2\tLung Cancer\t\tC04\t\n", encoding="utf8"
    )
    concepts = list(synth_kb.read_concepts([("mesh-tsv", tmp_path / "mesh.tsv")]))
    assert concepts == [(["Renal Failure", "Kidney Failure", "Renal Insufficiency"], False), (["Lung Cancer"], False)]
    assert synth_kb.fit(concepts, min_count=1)["synonyms"] == {"1": 0.5, "3": 0.5}


def test_the_scale_table_lists_each_run():
    runs = [
        {
            "names_generated": 100_000,
            "kb_format": "safetensors",
            "build_kb": {"wall_s": 3.5, "peak_rss_mb": 120.0},
            "load": {"load_s": 0.4},
        },
        {"names_generated": 1_000_000, "kb_format": "jsonl", "build_kb": {"wall_s": 30.0, "peak_rss_mb": 900.0}},
    ]
    table = kb_scale.table(runs).splitlines()
    assert table[0] == "| figure | 100k (safetensors) | 1m (jsonl) |"
    assert "| `build-kb` wall time | 3.5 s | 30.0 s |" in table
    assert "| pipeline load, `spacy.load` (wall) | 0.4 s | - |" in table
    assert not any("scispacy" in line for line in table)
