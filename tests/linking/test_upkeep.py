"""Upkeep (issue 30 item 6): the decoder is on the KV-cache API transformers keeps
(``cache=``; ``past_key_values=`` is deprecated, its removal announced), the
transformers range setup.cfg declares holds the installed one and has an upper bound,
and the README documents the CPU and the GPU install with extras that exist."""

import configparser
import functools
import importlib.metadata
import inspect
import re
import warnings
from pathlib import Path

from conftest import mentions_for
from packaging.requirements import Requirement

from spacy_genbioel.linking.decoding.decoder import DecodingSettings, GenerativeLinker

ROOT = Path(__file__).resolve().parents[2]


def requirement(name: str) -> Requirement:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf8")
    lines = [line.strip() for line in config["options"]["install_requires"].splitlines()]
    found = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return next(r for r in found if r.name == name)


def test_the_decoder_passes_the_cache_as_the_model_names_it(micro_model, word_tokenizer, small_kb, monkeypatch):
    takes = inspect.signature(micro_model.forward).parameters
    expected = "cache" if "cache" in takes else "past_key_values"
    seen = set()
    forward = micro_model.forward

    @functools.wraps(forward)  # the decoder reads the signature to choose the keyword
    def recording(*args, **kwargs):
        seen.update(key for key in ("cache", "past_key_values") if kwargs.get(key) is not None)
        return forward(*args, **kwargs)

    monkeypatch.setattr(micro_model, "forward", recording)
    linker = GenerativeLinker(micro_model, word_tokenizer, small_kb, decoding=DecodingSettings(num_beams=3, top_k=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecation (FutureWarning, DeprecationWarning) would fail here
        results = linker.link(mentions_for(small_kb, 6), top_k=3)
    assert len(results) == 6 and all(results)
    assert seen == {expected}


def test_setup_cfg_bounds_transformers_and_holds_the_installed_one():
    transformers = requirement("transformers")
    assert any(spec.operator == "<" for spec in transformers.specifier), "transformers needs an upper bound"
    assert transformers.specifier.contains(importlib.metadata.version("transformers"), prereleases=True)


def test_the_readme_documents_the_cpu_and_the_gpu_install():
    readme = (ROOT / "README.md").read_text(encoding="utf8")
    install = readme[readme.index("## Install") :]
    install = install[: install.index("\n## ", 4)]
    assert "--index-url https://download.pytorch.org/whl/cpu" in install and "cuda.is_available()" in install
    # the extras it names exist: this package's and spaCy's GPU one
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf8")
    ours = set(config["options.extras_require"])
    named = {extra for group in re.findall(r'-e "\.\[([a-z,-]+)\]"', install) for extra in group.split(",")}
    assert named and named <= ours
    spacy_extras = set(importlib.metadata.metadata("spacy").get_all("Provides-Extra"))
    assert set(re.findall(r'"spacy\[([a-z0-9-]+)\]"', install)) <= spacy_extras
    assert "cuda12x" in re.findall(r'"spacy\[([a-z0-9-]+)\]"', install)
    listed = re.search(r"# extras: ([a-z -]+)", install).group(1).split()
    assert set(listed) == ours
