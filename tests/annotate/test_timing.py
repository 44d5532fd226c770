"""Where an annotation job's time and memory go (spacy_genbioel/annotate/timing.py): stage clocks
around the reader and each component, the groups summary.json reports, each process's memory."""

import os

import pytest
import spacy
from fuzz_annotate import build_pipeline

from spacy_genbioel.annotate import annotate, timing
from spacy_genbioel.linking.decoding import stages


@pytest.fixture(scope="module")
def annotate_pipeline(tmp_path_factory, micro_model, word_tokenizer):
    """entity_ruler + genbioel over the micro model, saved as a spaCy pipeline directory."""
    return build_pipeline(tmp_path_factory.mktemp("timing_pipeline"), micro_model, word_tokenizer)


class FakeTime:
    """perf_counter for StageClock: advances only when told."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def fake_time(monkeypatch):
    clock_time = FakeTime()
    monkeypatch.setattr(stages.time, "perf_counter", clock_time)
    return clock_time


def test_timed_counts_the_producer_not_the_consumer(fake_time):
    clock = timing.StageClock()

    def produce():
        for item in range(3):
            fake_time.now += 2.0  # producing each item
            yield item

    consumed = []
    for item in timing.timed(produce(), clock, "reading"):
        fake_time.now += 5.0  # the consumer's work
        consumed.append(item)
    assert consumed == [0, 1, 2]
    assert clock.seconds["reading"] == 6.0 and clock.calls["reading"] == 4  # the last call ends the stream


class Linker:
    """A component with use_clock, as genbioel has: its inner stages pause its own."""

    def __init__(self):
        self.fake_time = None
        self.clock = None

    def use_clock(self, clock):
        self.clock = clock

    def __call__(self, doc):
        self.fake_time.now += 1.0  # its own work
        with self.clock.stage("retrieval:tfidf"):
            self.fake_time.now += 3.0
        with self.clock.stage("encoder"):
            self.fake_time.now += 10.0
        return doc


@spacy.Language.factory("timing_test_linker")
def make_linker(nlp, name):
    return Linker()


def test_pipe_timed_gives_each_component_its_own_seconds_and_docs_as_nlp_pipe(fake_time):
    nlp = spacy.blank("en")
    ruler = nlp.add_pipe("entity_ruler")
    ruler.add_patterns([{"label": "Disease", "pattern": "asthma"}])
    texts = ["Asthma and asthma.", "No disease here."]
    expected = [[(e.text, e.label_) for e in doc.ents] for doc in nlp.pipe(texts)]
    clock = timing.StageClock()
    timing.use_clock(nlp, clock)  # no genbioel component: nothing to tell
    docs = timing.pipe_timed(nlp, texts, clock)
    assert [[(e.text, e.label_) for e in doc.ents] for doc in docs] == expected
    assert set(clock.seconds) == {"tokenizer", "entity_ruler"}

    # a component with use_clock (genbioel) is timed as linking:<name>, its inner stages apart
    linker = nlp.add_pipe("timing_test_linker", name="genbioel")
    linker.fake_time = fake_time
    clock = timing.StageClock()
    timing.use_clock(nlp, clock)
    assert linker.clock is clock
    timing.pipe_timed(nlp, texts, clock)
    assert clock.seconds["linking:genbioel"] == 2.0  # 1 s of its own per document
    assert clock.seconds["retrieval:tfidf"] == 6.0 and clock.seconds["encoder"] == 20.0
    groups = timing.stage_groups({**clock.seconds, "reading": 0.5, "writing": 0.25})
    assert groups == {"reading": 0.5, "ner": 0.0, "retrieval": 6.0, "generator": 20.0, "linking": 2.0, "writing": 0.25}
    timing.use_clock(nlp, None)
    assert linker.clock is None


def test_stage_groups_put_every_stage_somewhere():
    seconds = {
        "reading": 1,
        "tokenizer": 2,
        "ner": 3,
        "abbreviation_detector": 4,
        "linking:genbioel": 5,
        "retrieval:dense": 6,
        "retrieval:tfidf": 7,
        "tokenize": 8,
        "encoder": 9,
        "decoder": 10,
        "trie": 11,
        "beam": 12,
        "writing": 13,
    }
    groups = timing.stage_groups(seconds)
    assert groups == {"reading": 1, "ner": 9, "retrieval": 13, "generator": 50, "linking": 5, "writing": 13}
    assert sum(groups.values()) == sum(seconds.values())


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux's smaps_rollup")
def test_memory_now_reports_this_process():
    memory = timing.memory_now()
    assert memory["pid"] == os.getpid()
    assert 0 < memory["private_mb"] <= memory["rss_mb"] <= memory["peak_rss_mb"] + 1


def test_worker_memory_keeps_each_workers_largest_figures():
    reports = [
        {"pid": 7, "rss_mb": 10.0, "private_mb": 5.0, "peak_rss_mb": 12.0},
        {"pid": 3, "rss_mb": 9.0, "private_mb": None, "peak_rss_mb": 9.5},
        {"pid": 7, "rss_mb": 8.0, "private_mb": 6.0, "peak_rss_mb": 12.5},
    ]
    assert timing.worker_memory(reports) == [
        {"pid": 3, "rss_mb": 9.0, "private_mb": None, "peak_rss_mb": 9.5},
        {"pid": 7, "rss_mb": 10.0, "private_mb": 6.0, "peak_rss_mb": 12.5},
    ]
    on_gpu = [{"pid": 4, "rss_mb": 1.0, "gpu_peak_mb": 300.0}, {"pid": 4, "rss_mb": 2.0, "gpu_peak_mb": 250.0}]
    assert timing.worker_memory(on_gpu) == [
        {"pid": 4, "rss_mb": 2.0, "private_mb": None, "peak_rss_mb": None, "gpu_peak_mb": 300.0}
    ]


def test_memory_now_adds_the_gpu_peak_only_where_cuda_ran(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert "gpu_peak_mb" not in timing.memory_now()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 2**20)
    assert timing.memory_now()["gpu_peak_mb"] == 3.0


@pytest.mark.parametrize("n_process", [1, 2])
def test_the_summary_says_where_the_time_and_memory_went(tmp_path, annotate_pipeline, n_process):
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(f'{{"id": "d{i}", "text": "renal failure of the liver {i}"}}\n' for i in range(12)))
    summary = annotate(
        docs, annotate_pipeline, tmp_path / "out", dict(chunk_size=4, n_process=n_process, progress=False)
    )
    run = summary["this_run"]
    assert set(run["stages"]) == {"reading", "ner", "retrieval", "generator", "linking", "writing"}
    detail = run["stage_seconds"]
    assert {"reading", "tokenizer", "entity_ruler", "linking:genbioel", "writing"} <= set(detail)
    assert "encoder" in detail and "decoder" in detail  # the micro generator linked the mentions
    assert sum(run["paths"].values()) == summary["mentions"] > 0  # every mention linked by some path
    assert run["memory"]["driver"]["pid"] == os.getpid()
    workers = run["memory"]["workers"]
    if n_process == 1:
        assert workers == []
    else:  # each forked worker reported after its units, none of them this process
        assert 1 <= len(workers) <= 2 and all(w["pid"] != os.getpid() for w in workers)


def test_the_kernel_cache_is_bounded_unless_the_user_set_it(monkeypatch):
    from spacy_genbioel.annotate.options import KERNEL_CACHE, bound_kernel_cache

    ((name, value),) = KERNEL_CACHE.items()
    monkeypatch.delenv(name, raising=False)
    bound_kernel_cache()
    assert os.environ[name] == value
    monkeypatch.setenv(name, "512")
    bound_kernel_cache()
    assert os.environ[name] == "512"  # the user's choice stays
