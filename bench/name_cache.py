"""The retrievers' name cache across KBs that share names: the name index of a KB built from an
empty cache, beside the same for a KB that adds a few names (the KB + training mentions) once the
first KB's entry is cached. One process, one torch thread, process CPU time.

    python bench/name_cache.py --base corpus/ncbi/kb.jsonl \\
        --derived-train ../shared/data/ncbi_disease/NCBItrainset_corpus.txt --out metrics/name_cache_ncbi.json

Rows, per retriever (``--linkers``: MiniLM as installed, ``dense``; ``rescnn`` with ``--rescnn-model``):

* ``base``: the base KB's index in an empty cache folder: every name encoded;
* ``derived``: the derived KB's (``--derived KB``, or the base KB with the training mentions of
  ``--derived-train`` added as names of their gold concepts, as ``build-kb --augment-pubtator`` does),
  with the base's entry in the folder: only the names it adds are encoded;
* with ``--full``, ``derived_full``: the derived KB's index in an empty folder, for the side-by-side
  cost of what the cache saves.

``--cache-dir DIR`` takes the base's entry from DIR when it is there (a 788k-name KB whose matrix
took 2,812 CPU s; the ``base`` row then says ``from_cache``). The derived index is always built in a
temporary folder that holds the base's entry alone, never in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

os.environ.setdefault("OMP_NUM_THREADS", "1")


def build(name: str, kb, folder: Path, rescnn_model: Optional[str]) -> Dict[str, Any]:
    """Build one retriever's index over ``kb`` with its cache in ``folder``: the timings, the reuse, the entry."""
    from spacy_genbioel.retrieval.registry import get_retriever

    settings: Dict[str, Any] = (
        {"cache_dir": str(folder)} if name == "dense" else {"index_dir": str(folder), "model": rescnn_model}
    )
    wall, cpu = time.monotonic(), time.process_time()
    linker = get_retriever(name, kb, **settings)
    cache = linker.cache
    return {
        "names": len(kb.names),
        "wall_s": round(time.monotonic() - wall, 2),
        "cpu_s": round(time.process_time() - cpu, 2),
        "from_cache": linker.from_cache,
        "rows_reused": cache.reused if cache is not None else 0,
        "rows_encoded": 0 if linker.from_cache else len(kb.names) - (cache.reused if cache is not None else 0),
        "entry": str(cache.path) if cache is not None else None,
    }


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--base", type=Path, required=True, help="the KB whose entry is cached first (build-kb's JSONL)"
    )
    parser.add_argument("--derived", type=Path, help="a KB sharing most of the base's names")
    parser.add_argument("--derived-train", type=Path, help="or: the base KB + these PubTator training mentions")
    parser.add_argument("--crosswalk", type=Path, help="legacy ID crosswalk for --derived-train (BC5CDR)")
    parser.add_argument("--linkers", default="dense", help="comma-separated: dense, rescnn")
    parser.add_argument("--rescnn-model", help="train-rescnn's model directory (for rescnn)")
    parser.add_argument("--cache-dir", type=Path, help="take the base's entries from this cache folder (never written)")
    parser.add_argument("--full", action="store_true", help="also build the derived KB's index in an empty folder")
    parser.add_argument("--out", type=Path, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    if (args.derived is None) == (args.derived_train is None):
        parser.error("give one of --derived and --derived-train")
    import torch

    from spacy_genbioel.kb.base import KnowledgeBase

    torch.set_num_threads(1)
    base = KnowledgeBase.load(args.base)
    if args.derived is not None:
        derived = KnowledgeBase.load(args.derived)
    else:
        from spacy_genbioel.corpus.load import load_corpus
        from spacy_genbioel.kb.build import augment_kb

        derived = augment_kb(base, augment_mentions=load_corpus(args.derived_train, "pubtator", args.crosswalk)[0])[0]
        derived.name = f"{base.name}+train"
    shared = len(set(base.names) & set(derived.names))
    result: Dict[str, Any] = {
        "machine": platform.node(),
        "date": time.strftime("%Y-%m-%d"),
        "torch_threads": 1,
        "base": str(args.base),
        "derived": str(args.derived or args.derived_train),
        "base_names": len(base.names),
        "derived_names": len(derived.names),
        "shared_names": shared,
        "rows": {},
    }
    for name in [n.strip() for n in args.linkers.split(",") if n.strip()]:
        rows: Dict[str, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            rows["base"] = build(name, base, args.cache_dir or Path(tmp) / "base", args.rescnn_model)
            folder = Path(tmp) / "derived"  # the base's entry alone, so that it is the one lending rows
            folder.mkdir()
            entry = Path(rows["base"]["entry"])
            try:
                os.link(entry, folder / entry.name)
            except OSError:  # another file system
                shutil.copy2(entry, folder / entry.name)
            rows["derived"] = build(name, derived, folder, args.rescnn_model)
            if args.full:
                rows["derived_full"] = build(name, derived, Path(tmp) / "empty", args.rescnn_model)
        result["rows"][name] = rows
        print(name, json.dumps(rows), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2), encoding="utf8")
    return result


if __name__ == "__main__":
    main()
