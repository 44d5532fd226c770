"""Dynamic int8 quantization of the generative linker on CPU: speed and accuracy
side by side in one run (an input to issue 15's item 3; no component setting yet).

    python bench/int8_linker.py --pipeline packages/ncbi_tiny --json metrics/int8_linker_ncbi.json

Loads the pipeline's ``genbioel`` linker once, links the NCBI-disease dev
mentions (scispacy long forms, as ``evaluate --abbreviations``) with the fp32
model and with ``torch.ao.quantization.quantize_dynamic`` applied to the
``nn.Linear`` layers of the encoder and decoder (the tied output projection
stays fp32), on 1 and 2 torch threads, and reports recall@1/@5, mentions/s
and how many top-1 concepts the two agree on.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Dict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", type=Path, required=True)
    parser.add_argument(
        "--corpus", type=Path, default=None, help="default: NCBI-disease dev under $GENBIOEL_DATA or ../shared/data"
    )
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import spacy
    import torch

    from spacy_genbioel.evaluation.report import evaluate_linker
    from spacy_genbioel.evaluation.run import load_corpus
    from spacy_genbioel.linking.inputs.abbreviations import AbbreviationExpander

    data = Path(os.environ.get("GENBIOEL_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    corpus = args.corpus or data / "ncbi_disease" / "NCBIdevelopset_corpus.txt"
    if not corpus.exists():
        sys.exit(f"no corpus at {corpus}: give --corpus or set GENBIOEL_DATA")
    mentions, texts = load_corpus(corpus, "pubtator", None)
    mentions, _ = AbbreviationExpander().expand(mentions, texts)
    linker = spacy.load(args.pipeline).get_pipe("genbioel").linker
    kb = linker.kb
    fp32 = linker.model
    int8 = copy.deepcopy(fp32)
    int8.model = torch.ao.quantization.quantize_dynamic(int8.model, {torch.nn.Linear}, dtype=torch.qint8)
    rows = []
    top1: Dict[str, Any] = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name, model in (("fp32", fp32), ("int8", int8)):
            linker.model = model
            report = evaluate_linker(linker, mentions, top_k=5, kb=kb, bins=None, name=name)
            top1[name] = [p[0].ids if p else None for p in report.predictions]
            rows.append(
                {
                    "model": name,
                    "threads": threads,
                    "mentions": len(mentions),
                    "recall@1": round(report.recall[1], 4),
                    "recall@5": round(report.recall[5], 4),
                    "seconds": round(report.seconds, 2),
                    "mentions_per_s": round(len(mentions) / report.seconds, 1),
                    "load_average": [round(x, 2) for x in os.getloadavg()],
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    agree = sum(a == b for a, b in zip(top1["fp32"], top1["int8"]))
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": platform.platform(),
        "pipeline": str(args.pipeline),
        "corpus": str(corpus),
        "rows": rows,
        "top1_agreement": f"{agree}/{len(mentions)}",
    }
    print(json.dumps({"top1_agreement": result["top1_agreement"]}))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf8")


if __name__ == "__main__":
    main()
