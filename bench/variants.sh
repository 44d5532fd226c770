#!/usr/bin/env bash
# Issue 7 table: peers and generative variants on the same KB and the same
# abbreviation-expanded dev mentions, with and without the BioSyn/GenBioEL
# dictionary augmentation (training mentions added as names of their gold
# concepts, used identically by the trie and by every peer).
#
#   bash bench/variants.sh ncbi|bc5cdr [OUT_DIR]
#
# Environment:
#   DATA         shared data folder (../shared/data)
#   MODEL        trained model (default training/<corpus>/tiny/finetune/model)
#   CONFIG       its fine-tuning config, for the encoder-input settings (configs/finetune_tiny.cfg)
#   TAG          prefix of the generative rows' JSON files (genbioel); another
#                MODEL into the same OUT_DIR needs another TAG
#   KS           TF-IDF candidate counts to try (NCBI "10 20 50", BC5CDR "20")
#   DENSE        1: dense peer (all-MiniLM-L6-v2) and dense candidates (DENSE_KS, "5 20")
#   DENSE_MODEL  a SapBERT-style encoder (train-dense output) instead of MiniLM as shipped
#   SCISPACY     1: scispacy's CandidateGenerator peer (14 min on BC5CDR's 788k names)
#   QUICK        1: generative rows free + TF-IDF K=20 only (for slow models such as minilm)
#   VARIANTS     KBs to run ("plain aug"); one each in two processes uses both cores
#   FUSION_DIR   a folder with fusion_plain.json / fusion_aug.json (bench/crossfit.sh fit): adds the
#                generator + cross-fitted score fusion row (_fusion) per KB
# Each row writes its JSON report and per-mention candidates (JSONL); price
# every shortcut threshold from them with
#   python bench/shortcut_sweep.py OUT/plain_tfidf.jsonl OUT/plain_genbioel.jsonl
# One thread per process, so it can share the machine with a training run.
# Every row is skipped when its JSON exists: rerun after a crash to finish.
set -euo pipefail
CORPUS=${1:?usage: bench/variants.sh ncbi|bc5cdr [OUT_DIR]}
OUT=${2:-bench_out/${CORPUS}_variants}
DATA=${DATA:-../shared/data}
MODEL=${MODEL:-training/$CORPUS/tiny/finetune/model}
CONFIG=${CONFIG:-configs/finetune_tiny.cfg}
TAG=${TAG:-genbioel}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
G="python -m spacy_genbioel"
case $CORPUS in
  ncbi)
    TRAIN=$DATA/ncbi_disease/NCBItrainset_corpus.txt
    DEV=$DATA/ncbi_disease/NCBIdevelopset_corpus.txt
    KS=${KS:-10 20 50}
    build_kb() { $G build-kb "$DATA/vocab/medic_06Jul2012.txt" --format medic --no-dedup --prior-pubtator "$TRAIN" "$@"; }
    EVAL_EXTRA=()
    LABEL=Disease
    ;;
  bc5cdr)
    TRAIN=$DATA/bc5cdr/CDR_TrainingSet.PubTator.txt
    DEV=$DATA/bc5cdr/CDR_DevelopmentSet.PubTator.txt
    WALK=$DATA/vocab/bc5cdr_legacy_id_crosswalk.tsv
    KS=${KS:-20}
    # the bc5cdr workflow's KB: CTD diseases + MeSH descriptors and supplementary concepts
    build_kb() { $G build-kb --format ctd "$DATA/vocab/CTD_diseases_2017.tsv.gz" \
        mesh-tsv:"$DATA/vocab/mesh/mesh_id_label_mappings.tsv" mesh-tsv:"$DATA/vocab/mesh/mesh_supp_id_label_mappings.tsv" \
        --crosswalk "$WALK" --no-dedup --prior-pubtator "$TRAIN" "$@"; }
    EVAL_EXTRA=(--crosswalk "$WALK")
    LABEL=""
    ;;
  *) echo "unknown corpus $CORPUS (ncbi | bc5cdr)" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
DENSE_ARGS=()
[ -n "${DENSE_MODEL:-}" ] && DENSE_ARGS=(--model "$DENSE_MODEL")

for variant in ${VARIANTS:-plain aug}; do
  extra=()
  [ "$variant" = aug ] && extra=(--augment-pubtator "$TRAIN")
  kb=$OUT/kb_$variant.jsonl
  [ -f "$kb" ] || build_kb "${extra[@]}" --out "$kb"
  pipeline=$OUT/pipeline_${TAG}_$variant
  [ -d "$pipeline" ] || $G package --model "$MODEL" --kb "$kb" --config "$CONFIG" --out "$pipeline" \
      ${LABEL:+--entity-label $LABEL}
  E=($G evaluate --corpus "$DEV" "${EVAL_EXTRA[@]}" --abbreviations --device cpu)
  # every row also writes its per-mention candidates (.jsonl) for bench/shortcut_sweep.py
  peer() { local name=$1; shift; [ -f "$OUT/${variant}_$name.json" ] || "${E[@]}" --kb "$kb" "$@" \
      --json "$OUT/${variant}_$name.json" --predictions "$OUT/${variant}_$name.jsonl"; }
  peer exact --linker exact
  peer tfidf --linker tfidf
  [ "${SCISPACY:-0}" = 1 ] && peer scispacy --linker scispacy
  [ "${DENSE:-0}" = 1 ] && peer dense --linker dense "${DENSE_ARGS[@]}"
  run() { local name=$1; shift; [ -f "$OUT/${variant}_${TAG}$name.json" ] || "${E[@]}" --linker genbioel --pipeline "$pipeline" "$@" \
      --json "$OUT/${variant}_${TAG}$name.json" --predictions "$OUT/${variant}_${TAG}$name.jsonl"; }
  run "" --candidates.retriever none --decoding.exact_match false
  if [ -n "${FUSION_DIR:-}" ]; then
    run _fusion --candidates.retriever none --decoding.exact_match false --fusion "$FUSION_DIR/fusion_$variant.json"
  fi
  run _tfidf20 --candidates.retriever tfidf --candidates.num_candidates 20 --decoding.exact_match false
  [ "${QUICK:-0}" = 1 ] && continue
  run _exact --candidates.retriever none --decoding.exact_match true
  for k in $KS; do
    [ "$k" = 20 ] || run _tfidf$k --candidates.retriever tfidf --candidates.num_candidates "$k" --decoding.exact_match false
  done
  run _tfidf20_exact --candidates.retriever tfidf --candidates.num_candidates 20 --decoding.exact_match true
  # retrieve the easy mentions, generate the rest (the bc5cdr packages' setting)
  run _exact_shortcut95 --candidates.retriever tfidf --candidates.restrict_to_candidates false --candidates.shortcut_threshold 0.95 --decoding.exact_match true
  if [ "${DENSE:-0}" = 1 ]; then
    for k in ${DENSE_KS:-5 20}; do
      run _dense$k --candidates.retriever dense --candidates.num_candidates "$k" --decoding.exact_match false "${DENSE_ARGS[@]}"
    done
  fi
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
