#!/usr/bin/env bash
# Peers on the same KB and the same dev mentions (issue: data and evaluation).
# Usage: bash bench/peers.sh [DATA_DIR] [OUT_DIR]; figures go to OUT_DIR/*.json and *.txt
set -euo pipefail
D=${1:-${GENBIOEL_DATA:-../shared/data}}
OUT=${2:-bench_out}
mkdir -p "$OUT"
run() { local name=$1; shift; /usr/bin/time -f "$name wall %e s, peak RSS %M KB" python -m spacy_genbioel "$@" > "$OUT/$name.txt" 2>> "$OUT/times.txt"; }

python -m spacy_genbioel build-kb -f medic "$D/vocab/medic_06Jul2012.txt" --no-dedup --out "$OUT/medic.jsonl"
run build_kb_bc5cdr build-kb -f ctd "$D/vocab/CTD_diseases_2017.tsv.gz" \
  "mesh-tsv:$D/vocab/mesh/mesh_id_label_mappings.tsv" "mesh-tsv:$D/vocab/mesh/mesh_supp_id_label_mappings.tsv" \
  --crosswalk "$D/vocab/bc5cdr_legacy_id_crosswalk.tsv" --no-dedup --out "$OUT/bc5cdr_kb.jsonl"

NCBI_DEV="$D/ncbi_disease/NCBIdevelopset_corpus.txt"; NCBI_TRAIN="$D/ncbi_disease/NCBItrainset_corpus.txt"
CDR_DEV="$D/bc5cdr/CDR_DevelopmentSet.PubTator.txt"; CDR_TRAIN="$D/bc5cdr/CDR_TrainingSet.PubTator.txt"
XW="$D/vocab/bc5cdr_legacy_id_crosswalk.tsv"
for linker in ${LINKERS:-exact tfidf scispacy}; do
  run "ncbi_$linker" evaluate --corpus "$NCBI_DEV" --train "$NCBI_TRAIN" --linker "$linker" --kb "$OUT/medic.jsonl" \
    --json "$OUT/ncbi_$linker.json" --plots "$OUT/plots_ncbi"
  run "bc5cdr_$linker" evaluate --corpus "$CDR_DEV" --train "$CDR_TRAIN" --linker "$linker" --kb "$OUT/bc5cdr_kb.jsonl" \
    --crosswalk "$XW" --json "$OUT/bc5cdr_$linker.json" --plots "$OUT/plots_bc5cdr"
done
# the effect of abbreviation expansion (scispacy's detector) on the TF-IDF peer
run ncbi_tfidf_abbr evaluate --corpus "$NCBI_DEV" --linker tfidf --kb "$OUT/medic.jsonl" --abbreviations --json "$OUT/ncbi_tfidf_abbr.json"
run bc5cdr_tfidf_abbr evaluate --corpus "$CDR_DEV" --linker tfidf --kb "$OUT/bc5cdr_kb.jsonl" --crosswalk "$XW" --abbreviations --json "$OUT/bc5cdr_tfidf_abbr.json"
cat "$OUT/times.txt"
