#!/usr/bin/env bash
# GenBioEL's Table 4 at the tiny preset on NCBI-disease dev: one fine-tuning
# run per variant, the same number of steps for every row, scored on all 787
# dev mentions by the trainer's final evaluation (recall@1/@5, same KB, same
# beams). Variants:
#   tfidf      synonyms-aware targets (char 3-gram TF-IDF), the default
#   shortest   the gold concept's shortest name as target
#   random     a random name of the gold concept (seed 0)
#   one-name   one name per concept (KB and trie): the N-to-1 trie ablated
#   no-prompt  decoder starts the name without "mention is"
#   no-pretrain        tfidf targets from the random init (no KB-guided pre-training)
#   no-pretrain-no-prompt   both: the prompt ablation free of the pre-training confound
# The pre-trained start is training/ncbi/tiny/pretrain/model (its pre-training
# used the prompt, so "no-prompt" also measures a prompt mismatch; compare
# no-pretrain with no-pretrain-no-prompt for the clean effect).
#
# Usage (after `spacy project run corpus/tokenizer/init-model/pretrain .`):
#   bash bench/ablations.sh prepare          # corpora and the one-name KB
#   bash bench/ablations.sh run tfidf        # one variant (run two at once on 2 cores)
#   bash bench/ablations.sh table            # markdown table of what has run
# Environment: DATA (../shared/data), STEPS (400), OUT (bench_out/ablations),
# SEED (0): the training seed (example order, dropout); runs with another seed
# go to run_<variant>_seed<SEED>, so a second seed prices the noise of a row.
set -euo pipefail
DATA=${DATA:-../shared/data}
STEPS=${STEPS:-400}
OUT=${OUT:-bench_out/ablations}
SEED=${SEED:-0}
TRAIN=$DATA/ncbi_disease/NCBItrainset_corpus.txt
DEV=$DATA/ncbi_disease/NCBIdevelopset_corpus.txt
PRE=training/ncbi/tiny/pretrain/model
INIT=training/ncbi/tiny/init
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PY="python -m spacy_genbioel"

corpus() {  # name kb targets
  [ -f "$OUT/corpus_$1/train.jsonl" ] || $PY corpus --train "$TRAIN" --dev "$DEV" --kb "$2" --out "$OUT/corpus_$1" --targets "$3" --abbreviations
}

case "${1:-}" in
  prepare)
    mkdir -p "$OUT"
    [ -f "$OUT/kb_one_name.jsonl" ] || $PY build-kb corpus/ncbi/kb.jsonl --format jsonl --no-dedup --first-names-only --out "$OUT/kb_one_name.jsonl"
    corpus tfidf corpus/ncbi/kb.jsonl tfidf
    corpus shortest corpus/ncbi/kb.jsonl shortest
    corpus random corpus/ncbi/kb.jsonl random
    corpus one_name "$OUT/kb_one_name.jsonl" tfidf
    ;;
  run)
    name=$2 kb=corpus/ncbi/kb.jsonl start=$PRE corpus=tfidf extra=() suffix=""
    [ "$SEED" = 0 ] || suffix="_seed$SEED"
    case $name in
      tfidf) ;;
      shortest|random) corpus=$name ;;
      one-name) corpus=one_name kb=$OUT/kb_one_name.jsonl ;;
      no-prompt) extra=(--inputs.decoder_prompt false) ;;
      no-pretrain) start=$INIT ;;
      no-pretrain-no-prompt) start=$INIT extra=(--inputs.decoder_prompt false) ;;
      *) echo "unknown variant $name" >&2; exit 2 ;;
    esac
    $PY finetune --model "$start" --train "$OUT/corpus_$corpus/train.jsonl" --dev "$OUT/corpus_$corpus/dev.jsonl" \
      --kb "$kb" --config configs/finetune_tiny.cfg --out "$OUT/run_$name${suffix}" --device cpu --no-resume \
      --training.max_steps "$STEPS" --training.max_seconds 36000 --training.eval_every "$STEPS" \
      --training.save_every "$STEPS" --training.seed "$SEED" "${extra[@]}"
    ;;
  table)
    python - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = ["tfidf", "shortest", "random", "one-name", "no-prompt", "no-pretrain", "no-pretrain-no-prompt"]
print("| variant | seed | steps | recall@1 | recall@5 | seconds |")
print("|---|---:|---:|---:|---:|---:|")
for name in rows:
    runs = [(0, out / f"run_{name}")]
    runs += sorted((int(p.name.rsplit("_seed", 1)[1]), p) for p in out.glob(f"run_{name}_seed*") if p.name.rsplit("_seed", 1)[1].isdigit())
    for seed, run in runs:
        path = run / "result.json"
        if not path.exists():
            continue
        r = json.loads(path.read_text())
        last = r["evaluations"][-1]["eval"]
        print(f"| {name} | {seed} | {r['step']} | {last['recall@1']:.4f} | {last['recall@5']:.4f} | {r['seconds']:.0f} |")
EOF
    ;;
  *) sed -n 2,24p "$0"; exit 2 ;;
esac
