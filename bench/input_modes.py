"""Dev recall@1/@5 of fine-tuning runs that differ in their encoder input
(per-mention vs per-document), each scored with the inputs and
``max_source_tokens`` of the config it was trained with, side by side in one run.

    python bench/input_modes.py --dev corpus/ncbi/dev.jsonl --kb corpus/ncbi/kb.jsonl \\
        training/ncbi/tiny/ft_mention_s0 training/ncbi/tiny/ft_document_s0 --json metrics/input_modes_ncbi.json

Each run directory is a ``finetune`` output (``config.cfg``, ``result.json``,
``model/``). The scorer is the training engine's own dev evaluator
(:func:`spacy_genbioel.training.evaluator.stage_evaluator`), on all dev
mentions unless ``--mentions`` is given, so the figures are the ones training
would log at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finetune output directories")
    parser.add_argument("--dev", type=Path, required=True)
    parser.add_argument("--kb", type=Path, required=True)
    parser.add_argument("--mentions", type=int, default=0, help="first N dev mentions (0: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from spacy_genbioel.kb.base import KnowledgeBase
    from spacy_genbioel.models import load_model
    from spacy_genbioel.training.evaluator import stage_evaluator
    from spacy_genbioel.training.settings import load_stage_config

    torch.set_num_threads(args.threads)
    kb = KnowledgeBase.load(args.kb)
    rows = []
    for run in args.runs:
        stage = load_stage_config(run / "config.cfg", {"data.eval_mentions": args.mentions})
        result = json.loads((run / "result.json").read_text(encoding="utf8")) if (run / "result.json").exists() else {}
        model, tokenizer = load_model(run / "model", device="cpu")
        evaluate = stage_evaluator(stage, kb, args.dev)
        began = time.perf_counter()
        scores = evaluate(model, tokenizer)
        rows.append(
            {
                "run": str(run),
                "input_mode": stage.inputs.input_mode,
                "context_words": stage.inputs.context_words,
                "max_source_tokens": stage.training.max_source_tokens,
                "seed": stage.training.seed,
                "steps": result.get("step"),
                "train_seconds": result.get("seconds"),
                **{k: round(v, 4) for k, v in scores.items()},
                "eval_seconds": round(time.perf_counter() - began, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "dev": str(args.dev),
        "rows": rows,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf8")


if __name__ == "__main__":
    main()
