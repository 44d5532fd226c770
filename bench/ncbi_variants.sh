#!/usr/bin/env bash
# Issue 7 table on NCBI-disease dev: peers and generative variants on the same
# MEDIC KB and the same abbreviation-expanded dev mentions, with and without
# the BioSyn/GenBioEL dictionary augmentation (training mentions added as names).
#
#   bash bench/ncbi_variants.sh [DATA_DIR] [OUT_DIR] [MODEL_DIR]
#
# MODEL_DIR: a trained model (default training/ncbi/tiny/finetune/model, from
# `spacy project run ncbi`). Extra linkers: DENSE_MODEL=dir adds the dense
# retriever (peer and candidate generator). One thread per process, so it can
# share the machine with a training run.
set -euo pipefail
DATA=${1:-../shared/data}
OUT=${2:-bench_out/ncbi_variants}
MODEL=${3:-training/ncbi/tiny/finetune/model}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
TRAIN=$DATA/ncbi_disease/NCBItrainset_corpus.txt
DEV=$DATA/ncbi_disease/NCBIdevelopset_corpus.txt
G="python -m spacy_genbioel"

for variant in plain aug; do
  extra=""
  [ "$variant" = aug ] && extra="--augment-pubtator $TRAIN"
  [ -f "$OUT/kb_$variant.jsonl" ] || $G build-kb "$DATA/vocab/medic_06Jul2012.txt" --format medic --no-dedup \
      --prior-pubtator "$TRAIN" $extra --out "$OUT/kb_$variant.jsonl"
  [ -d "$OUT/pipeline_$variant" ] || $G package --model "$MODEL" --kb "$OUT/kb_$variant.jsonl" \
      --config configs/finetune_tiny.cfg --out "$OUT/pipeline_$variant" --entity-label Disease
  E="$G evaluate --corpus $DEV --abbreviations --device cpu"
  for peer in exact tfidf; do
    [ -f "$OUT/${variant}_$peer.json" ] || $E --linker $peer --kb "$OUT/kb_$variant.jsonl" --json "$OUT/${variant}_$peer.json"
  done
  P="$E --linker genbioel --pipeline $OUT/pipeline_$variant"
  run() { local name=$1; shift; [ -f "$OUT/${variant}_$name.json" ] || $P "$@" --json "$OUT/${variant}_$name.json"; }
  run genbioel --candidates none --no-exact-match
  run genbioel_exact --candidates none --exact-match
  for k in 10 20 50; do
    run genbioel_tfidf$k --candidates tfidf --num-candidates $k --no-exact-match
  done
  run genbioel_tfidf20_exact --candidates tfidf --num-candidates 20 --exact-match
done
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| KB | linker | recall@1 | recall@5 | mentions/s |")
print("|---|---|---|---|---|")
for path in sorted(out.glob("*.json")):
    report = json.loads(path.read_text())
    kb, _, name = path.stem.partition("_")
    r = report["recall"]["recall"]
    print(f"| {kb} | {name} | {r['recall@1']:.4f} | {r['recall@5']:.4f} | {report['mentions_per_second']:.1f} |")
PY
