"""A synthetic KB of UMLS's size and shape, for scale measurements (seeded).

UMLS cannot be downloaded here, so this script makes a KB that looks like it
where size matters: English UMLS has about 4M concepts and 10M+ names, a
skewed number of synonyms per concept, and names whose words are ordinary
biomedical words with a long tail of chemical-looking tokens. Two steps:

``fit``: read real vocabularies (MeSH descriptors and supplementary records,
CTD diseases: ``../shared/data/vocab`` or ``$GENBIOEL_DATA``) and record

* the distribution of names per concept and of words per name (MeSH + CTD:
  2.46 names per concept, close to UMLS's ~2.5);
* the frequency of every word seen at least 3 times (the frequent words);
* the share of word tokens that are rare (seen once or twice: 23% of tokens,
  mostly chemical and gene names, each used 1.1 times on average), and an order-3 character Markov chain
  fitted on those rare words, which invents new words of the same make-up
  (``4-benzoxazolecarboxylic``-like strings), so a BPE tokenizer splits the
  synthetic names into pieces like the real ones;
* how often a synonym's word also occurs in the concept's first name
  (synonyms share words: "breast cancer" / "cancer of the breast");
* the share of concepts with a definition.

``generate``: sample concepts until ``--names`` names are written, as the
project's JSONL (``{"id": "C0000001", "names": [...], "types": ["T047"],
"definition": ...}``): synonyms per concept and words per name from the fitted
distributions, each word copied from the first name (synonym sharing),
invented by the Markov chain (rare words), or drawn by frequency. The output
is a pure function of the statistics file, ``--names`` and ``--seed``::

    python bench/synth_kb.py fit --out bench_out/umls_like.json
    python bench/synth_kb.py generate --stats bench_out/umls_like.json --names 1000000 --seed 0 --out kb_1m.jsonl

The statistics file is derived data (frequencies, not the vocabularies), and
stays out of the repository like the vocabularies themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

FORMAT = "genbioel.synth_kb_stats.v1"
ORDER = 3  # characters of context in the rare-word Markov chain
BOUNDARY = "\x02"  # start and end of a word in the chain
MAX_WORD_CHARS = 60
N_TYPES = 127  # UMLS semantic types (TUIs)


# -- fitting -------------------------------------------------------------------------------------------------------
def default_sources(data: Path) -> List[Tuple[str, Path]]:
    vocab = data / "vocab"
    return [
        ("mesh-tsv", vocab / "mesh" / "mesh_id_label_mappings.tsv"),
        ("mesh-tsv", vocab / "mesh" / "mesh_supp_id_label_mappings.tsv"),
        ("ctd", vocab / "CTD_diseases_2017.tsv.gz"),
    ]


def read_concepts(sources: Sequence[Tuple[str, Path]]) -> Iterator[Tuple[List[str], bool]]:
    """(raw names, has a definition) per concept, through the project's readers."""
    from spacy_genbioel.kb.build import get_reader

    for fmt, path in sources:
        for concept in get_reader(fmt)(path):
            yield list(concept.names), bool(concept.definition)


def fit(concepts: Iterable[Tuple[List[str], bool]], min_count: int = 3) -> Dict:
    """The statistics ``generate`` samples from (see the module docstring)."""
    synonyms: Counter = Counter()
    lengths: Counter = Counter()
    words: Counter = Counter()
    shared = tokens_after_first = n_concepts = n_definitions = 0
    for names, has_definition in concepts:
        if not names:
            continue
        n_concepts += 1
        n_definitions += has_definition
        synonyms[len(names)] += 1
        first = {w.lower() for w in names[0].split()}
        for i, name in enumerate(names):
            split = name.split()
            lengths[max(1, len(split))] += 1
            words.update(split)
            if i:
                tokens_after_first += len(split)
                shared += sum(w.lower() in first for w in split)
    if not n_concepts:
        raise ValueError("no concept with a name to fit on")
    frequent = [(w, c) for w, c in words.most_common() if c >= min_count]
    rare = [w for w, c in words.items() if c < min_count]
    n_tokens = sum(words.values())
    return {
        "format": FORMAT,
        "concepts": n_concepts,
        "synonyms": _pmf(synonyms),
        "words_per_name": _pmf(lengths),
        "frequent_words": [w for w, _ in frequent],
        "frequent_counts": [c for _, c in frequent],
        "rare_token_share": sum(words[w] for w in rare) / n_tokens,
        "rare_word_uses": sum(words[w] for w in rare) / max(1, len(rare)),
        "shared_word_share": shared / max(1, tokens_after_first),
        "definition_share": n_definitions / n_concepts,
        "markov": fit_markov(rare),
    }


def _pmf(counts: Counter) -> Dict[str, float]:
    total = sum(counts.values())
    return {str(k): counts[k] / total for k in sorted(counts)}


def fit_markov(words: Iterable[str]) -> Dict[str, Dict[str, int]]:
    """Order-3 character transitions ``{context: {next char: count}}`` (``BOUNDARY`` pads and ends words)."""
    table: Dict[str, Counter] = {}
    for word in words:
        padded = BOUNDARY * ORDER + word[:MAX_WORD_CHARS] + BOUNDARY
        for i in range(ORDER, len(padded)):
            table.setdefault(padded[i - ORDER : i], Counter())[padded[i]] += 1
    return {ctx: dict(nxt) for ctx, nxt in table.items()}


# -- sampling ------------------------------------------------------------------------------------------------------
class _Sampler:
    """Vectorized draws from a pmf given as ``{value: probability}``."""

    def __init__(self, pmf: Dict[str, float]) -> None:
        self.values = np.array([int(k) for k in pmf], dtype=np.int64)
        cum = np.cumsum(np.array(list(pmf.values()), dtype=np.float64))
        self.cum = cum / cum[-1]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        pos = np.minimum(np.searchsorted(self.cum, rng.random(n), side="right"), len(self.values) - 1)
        return self.values[pos]

    @property
    def mean(self) -> float:
        return float(np.dot(self.values, np.diff(np.concatenate([[0.0], self.cum]))))


class MarkovWords:
    """Invents words with the fitted character chain, many at a time.

    Contexts are coded as integers; every row's cumulative probabilities are
    offset by the row number, so one ``searchsorted`` over the whole table
    draws the next character of every word at once.
    """

    def __init__(self, markov: Dict[str, Dict[str, int]]) -> None:
        chars = sorted({c for ctx, nxt in markov.items() for c in ctx + "".join(nxt)})
        self.alphabet = chars
        self.code = {c: i for i, c in enumerate(chars)}
        self.size = len(chars)
        self.end = self.code[BOUNDARY]
        rows = sorted(markov, key=self._context_code)
        self.context_codes = np.array([self._context_code(c) for c in rows], dtype=np.int64)
        cum, nxt, last = [], [], []
        for row, ctx in enumerate(rows):
            counts = np.array(list(markov[ctx].values()), dtype=np.float64)
            row_cum = row + np.cumsum(counts) / counts.sum()
            row_cum[-1] = row + 1.0
            cum.extend(row_cum)
            nxt.extend(self.code[c] for c in markov[ctx])
            last.append(len(cum) - 1)
        self.cum = np.array(cum)
        self.next = np.array(nxt, dtype=np.int64)
        self.row_last = np.array(last, dtype=np.int64)

    def _context_code(self, ctx: str) -> int:
        code = 0
        for c in ctx:
            code = code * self.size + self.code[c]
        return code

    def words(self, rng: np.random.Generator, n: int) -> List[str]:
        out = np.full((n, MAX_WORD_CHARS), -1, dtype=np.int32)
        ctx = np.full(n, self._context_code(BOUNDARY * ORDER), dtype=np.int64)
        live = np.arange(n)
        modulus = self.size ** (ORDER - 1)
        for step in range(MAX_WORD_CHARS):
            if not len(live):
                break
            rows = np.searchsorted(self.context_codes, ctx[live])
            # rounding can push row + u onto row + 1: clamp to the row's last entry
            pos = np.minimum(np.searchsorted(self.cum, rows + rng.random(len(live)), side="right"), self.row_last[rows])
            char = self.next[pos]
            going = char != self.end
            out[live[going], step] = char[going]
            ctx[live] = (ctx[live] % modulus) * self.size + char
            live = live[going]
        alphabet = self.alphabet
        return ["".join(alphabet[c] for c in row if c >= 0) or "x" for row in out.tolist()]


def generate(stats: Dict, n_names: int, seed: int, out: Path, batch_concepts: int = 50_000) -> Dict:
    """Write concepts until ``n_names`` names are written; returns a summary."""
    if stats.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} statistics file (format {stats.get('format')!r})")
    rng = np.random.default_rng(seed)
    synonyms, lengths = _Sampler(stats["synonyms"]), _Sampler(stats["words_per_name"])
    frequent: List[str] = stats["frequent_words"]
    freq_cum = np.cumsum(np.array(stats["frequent_counts"], dtype=np.float64))
    freq_cum /= freq_cum[-1]
    p_rare, p_shared, p_def = stats["rare_token_share"], stats["shared_word_share"], stats["definition_share"]
    # invented words: a pool used as often per word as the rare words were (about 1.1 times)
    expected_tokens = int(n_names * lengths.mean) + 1
    invented = _invented(
        MarkovWords(stats["markov"]),
        rng,
        max(16, int(expected_tokens * p_rare / stats["rare_word_uses"])),
        set(frequent),
    )
    vocab = frequent + invented
    type_weights = 1.0 / np.arange(1, N_TYPES + 1)
    type_cum = np.cumsum(type_weights) / type_weights.sum()
    written = concepts = 0
    words_total = 0
    began = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf8") as handle:
        while written < n_names:
            n_syn = synonyms.draw(rng, batch_concepts)
            n_syn = _clip_total(n_syn, n_names - written)
            n_c = len(n_syn)
            name_concept = np.repeat(np.arange(n_c), n_syn)
            first_of = np.concatenate([[0], np.cumsum(n_syn)[:-1]])
            is_first = np.zeros(len(name_concept), dtype=bool)
            is_first[first_of] = True
            n_words = lengths.draw(rng, len(name_concept))
            word_name = np.repeat(np.arange(len(name_concept)), n_words)
            word_ids = np.searchsorted(freq_cum, rng.random(len(word_name)), side="right").clip(max=len(frequent) - 1)
            rare = rng.random(len(word_name)) < p_rare
            word_ids[rare] = len(frequent) + rng.integers(0, len(invented), int(rare.sum()))
            # synonyms copy words from their concept's first name
            name_start = np.concatenate([[0], np.cumsum(n_words)[:-1]])
            first_name = first_of[name_concept[word_name]]
            copy = (~is_first[word_name]) & (rng.random(len(word_name)) < p_shared)
            src = name_start[first_name[copy]] + rng.integers(0, n_words[first_name[copy]])
            word_ids[copy] = word_ids[src]
            words_total += len(word_name)
            has_def = rng.random(n_c) < p_def
            types = np.searchsorted(type_cum, rng.random(n_c), side="right").clip(max=N_TYPES - 1)
            ids = word_ids.tolist()
            bounds = np.concatenate([[0], np.cumsum(n_words)]).tolist()
            names = [" ".join([vocab[w] for w in ids[bounds[i] : bounds[i + 1]]]) for i in range(len(n_words))]
            extra = np.searchsorted(freq_cum, rng.random(len(names)), side="right").clip(max=len(frequent) - 1).tolist()
            lines = []
            cursor = 0
            for c in range(n_c):
                own = _distinct(names[cursor : cursor + int(n_syn[c])], extra[cursor:], frequent)
                record = {"id": f"C{concepts + c + 1:07d}", "names": own, "types": [f"T{int(types[c]) + 1:03d}"]}
                cursor += int(n_syn[c])
                if has_def[c]:
                    record["definition"] = _definition(rng, frequent, freq_cum)
                lines.append(json.dumps(record, ensure_ascii=False))
            handle.write("\n".join(lines) + "\n")
            written += len(names)
            concepts += n_c
    return {
        "names": written,
        "concepts": concepts,
        "seed": seed,
        "invented_words": len(invented),
        "names_per_concept": round(written / concepts, 4),
        "words_per_name": round(words_total / written, 4),
        "seconds": round(time.monotonic() - began, 1),
    }


def _invented(chain: "MarkovWords", rng: np.random.Generator, n: int, known: set) -> List[str]:
    """``n`` distinct invented words that are not frequent words (fewer if the chain cannot make them)."""
    pool: Dict[str, None] = {}
    for _ in range(8):
        wanted = 2 * (n - len(pool)) + 16
        for begin in range(0, wanted, 250_000):  # chunks: each word takes MAX_WORD_CHARS ints while it grows
            for word in chain.words(rng, min(250_000, wanted - begin)):
                if word not in known:
                    pool.setdefault(word, None)
            if len(pool) >= n:
                break
        if len(pool) >= n:
            break
    return list(pool)[:n] or ["x"]


def _distinct(names: List[str], extra: List[int], frequent: List[str]) -> List[str]:
    """A concept's names with a repeated one lengthened by a frequent word (a concept lists each name once)."""
    seen = set()
    out = []
    for name, word in zip(names, extra):
        key = name.lower()
        while key in seen:
            name = f"{name} {frequent[word]}"
            key = name.lower()
            word = (word * 31 + 7) % len(frequent)
        seen.add(key)
        out.append(name)
    return out


def _clip_total(n_syn: np.ndarray, remaining: int) -> np.ndarray:
    """The concepts of a batch that fit in ``remaining`` names (the last one cut to fit)."""
    total = np.cumsum(n_syn)
    if total[-1] <= remaining:
        return n_syn
    keep = int(np.searchsorted(total, remaining))
    out = n_syn[: keep + 1].copy()
    out[-1] -= int(total[keep] - remaining)
    return out[out > 0]


def _definition(rng: np.random.Generator, frequent: List[str], freq_cum: np.ndarray) -> str:
    picks = np.searchsorted(freq_cum, rng.random(int(rng.integers(8, 30))), side="right").clip(max=len(frequent) - 1)
    return " ".join(frequent[i] for i in picks.tolist()) + "."


# -- command line --------------------------------------------------------------------------------------------------
def data_dir(given: Optional[str]) -> Path:
    path = Path(given or os.environ.get("GENBIOEL_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
    if not (path / "vocab").is_dir():
        raise SystemExit(f"no vocabularies under {path}/vocab: pass --data or set GENBIOEL_DATA")
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fit = sub.add_parser("fit", help="fit the statistics on MeSH and CTD")
    p_fit.add_argument("--data", help="the data folder (default: $GENBIOEL_DATA or ../shared/data)")
    p_fit.add_argument("--out", required=True, type=Path)
    p_gen = sub.add_parser("generate", help="write a synthetic KB as JSONL")
    p_gen.add_argument("--stats", required=True, type=Path)
    p_gen.add_argument("--names", required=True, type=int)
    p_gen.add_argument("--seed", type=int, default=0)
    p_gen.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.command == "fit":
        stats = fit(read_concepts(default_sources(data_dir(args.data))))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(stats, ensure_ascii=False), encoding="utf8")
        print(
            json.dumps(
                {
                    k: v
                    for k, v in stats.items()
                    if k not in ("frequent_words", "frequent_counts", "markov", "synonyms", "words_per_name")
                }
            )
        )
        return 0
    summary = generate(json.loads(args.stats.read_text(encoding="utf8")), args.names, args.seed, args.out)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
