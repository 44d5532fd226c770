#!/usr/bin/env bash
# AskAPatient (social-media phrases -> SNOMED CT / AMT, 1,036 concepts, mentions
# without context) over its 10 folds, every linker on the same folds.
#
#   bash bench/aap.sh prepare [DATA]   # KB, tokenizer, model, KB-guided pre-training: once, shared by every fold (they share the KB)
#   bash bench/aap.sh folds     # per fold: corpus, fine-tuning from the shared pre-training; the peers and the
#                               # generator score the fold's validation split (plain KB and KB + the fold's training mentions)
#   bash bench/aap.sh fusion    # per fold: score fusion fitted on the *other* folds' validation predictions (cross-fitting:
#                               # each made by a model that never saw them), minus any mention/concept pair of this
#                               # fold's validation split, then evaluated on this fold through the component
#   bash bench/aap.sh cascade   # per fold: the cascade (issue 28) with the workflow's settings: a fusion over the
#                               # generator's 2-beam lists and the retrievers the other folds prefer (tfidf with dense,
#                               # rescnn or both), cross-fitted like `fusion`; then bench/cascade.py on the fold: the
#                               # generator, `fusion`'s fusion and the cascade side by side (metrics/cascade_aap_fold<k>_<kb>.json)
#   python bench/folds_report.py training/aap/tiny/folds   # mean and spread per linker and KB
#
# Environment: DATA (../shared/data), OUT (training/aap/tiny), FOLDS ("0 1 2 3 4 5 6 7 8 9"), JOBS (2 folds at a
# time), PRETRAIN_STEPS (1500) / PRETRAIN_SECONDS (900), FINETUNE_STEPS (1500) / FINETUNE_SECONDS (1800): step
# budgets, so that folds trained side by side get the same training whatever else runs; the seconds are a cap.
# RESCNN_SECONDS (1200): the ResCNN retriever's training budget per fold. SEED (0). METRICS (metrics): where `cascade`
# writes. MAX_RECALL_LOSS (0.002: 0.2 points): `cascade` also fits thresholds for that recall budget (fit-fusion
# --max-recall-loss) and benches them beside the precision-targeted cascade (metrics/cascade_aap_fold<k>_<kb>_loss.json;
# bench/cascade_folds.py sums them up). Empty: the precision-targeted cascade alone (metrics/cascade_aap_fold<k>_<kb>.json).
# EXTRA_ROWS (unset): more bench/cascade.py rows for `cascade`'s benches, after a comma (",cascade_grouped_loss").
# Steps whose outputs exist are skipped.
set -euo pipefail
STAGE=${1:?usage: bench/aap.sh prepare|folds|fusion|cascade}
DATA=${2:-${DATA:-../shared/data}}
AAP=$DATA/askapatient
OUT=${OUT:-training/aap/tiny}
FOLDS=${FOLDS:-0 1 2 3 4 5 6 7 8 9}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
G=${G:-python -m spacy_genbioel}  # the CLI (a test puts a recorder here)
METRICS=${METRICS:-metrics}  # where `cascade` writes its tables
EXTRA_ROWS=${EXTRA_ROWS:-}
MAX_RECALL_LOSS=${MAX_RECALL_LOSS-0.002}  # AskAPatient's ten folds fit thresholds that hold it (docs/benchmarks.md)
MAX_RECALL_LOSS=${MAX_RECALL_LOSS:-}
join() { local IFS=,; echo "$*"; }
KB=$OUT/kb.jsonl

prepare() {
  mkdir -p "$OUT"
  [ -f "$KB" ] || $G build-kb "$AAP/askapatient.json" --format askapatient --no-dedup --out "$KB"
  # the tokenizer learns the KB names only: no fold's mentions
  [ -f "$OUT/tokenizer/tokenizer.json" ] || $G tokenizer --kb "$KB" --preset tiny --out "$OUT/tokenizer"
  [ -d "$OUT/init" ] || $G init-model --tokenizer "$OUT/tokenizer" --preset tiny --seed "${SEED:-0}" --out "$OUT/init"
  [ -f "$OUT/pretrain/result.json" ] || $G pretrain --model "$OUT/init" --kb "$KB" --config configs/pretrain_tiny.cfg \
      --out "$OUT/pretrain" --device cpu --training.max_steps "${PRETRAIN_STEPS:-1500}" \
      --training.max_seconds "${PRETRAIN_SECONDS:-900}" --training.seed "${SEED:-0}" \
      --training.eval_every 100000
}

fold() {
  local i=$1 F=$OUT/folds/fold-$1
  local train=$AAP/AskAPatient.fold-$i.train.txt valid=$AAP/AskAPatient.fold-$i.validation.txt
  mkdir -p "$F"
  [ -f "$F/kb_plain.jsonl" ] || $G build-kb "$AAP/askapatient.json" --format askapatient --no-dedup \
      --prior-pubtator "$train" --mentions-format askapatient --out "$F/kb_plain.jsonl"
  [ -f "$F/kb_aug.jsonl" ] || $G build-kb "$AAP/askapatient.json" --format askapatient --no-dedup \
      --prior-pubtator "$train" --augment-pubtator "$train" --mentions-format askapatient --out "$F/kb_aug.jsonl"
  [ -f "$F/corpus/train.jsonl" ] || $G corpus --format askapatient --train "$train" --dev "$valid" --kb "$F/kb_plain.jsonl" --out "$F/corpus"
  [ -f "$F/finetune/result.json" ] || $G finetune --model "$OUT/pretrain/model" --train "$F/corpus/train.jsonl" \
      --dev "$F/corpus/dev.jsonl" --kb "$F/kb_plain.jsonl" --config configs/finetune_tiny.cfg --out "$F/finetune" --device cpu \
      --training.max_steps "${FINETUNE_STEPS:-1500}" --training.max_seconds "${FINETUNE_SECONDS:-1800}" \
      --training.seed "${SEED:-0}" --training.eval_every 100000
  # the tiny ResCNN retriever (issue 29) on the fold's training mentions and KB synonyms
  [ -f "$F/rescnn/result.json" ] || $G train-rescnn --kb "$F/kb_plain.jsonl" --train "$F/corpus/train.jsonl" --config configs/rescnn.cfg \
      --out "$F/rescnn" --no-index --training.max_seconds "${RESCNN_SECONDS:-1200}" --training.seed "${SEED:-0}" --training.progress false
  for variant in plain aug; do
    local kb=$F/kb_$variant.jsonl
    [ -d "$F/pipeline_$variant" ] || $G package --model "$F/finetune/model" --kb "$kb" --config "$F/finetune/config.cfg" \
        --out "$F/pipeline_$variant" --no-entity-ruler --no-abbreviations
    E=($G evaluate --corpus "$valid" --format askapatient)
    row() { local name=$1; shift; [ -f "$F/${variant}_$name.json" ] || "${E[@]}" "$@" \
        --json "$F/${variant}_$name.json" --predictions "$F/${variant}_$name.jsonl"; }
    row exact --linker exact --kb "$kb"
    row tfidf --linker tfidf --kb "$kb"
    row dense --linker dense --kb "$kb"
    row rescnn --linker rescnn --kb "$kb" --model "$F/rescnn/model"
    row genbioel --linker genbioel --pipeline "$F/pipeline_$variant" --device cpu --candidates.retriever none --decoding.exact_match false
    # the 2-beam lists the cascade's fusion is fitted on (bench/crossfit.sh's BEAMS)
    row genbioel_b2 --linker genbioel --pipeline "$F/pipeline_$variant" --device cpu --candidates.retriever none --decoding.exact_match false \
        --decoding.num_beams 2 --decoding.top_k 2
  done
}

fusion() {
  local i=$1 F=$OUT/folds/fold-$1
  for variant in plain aug; do
    local gen=() tfidf=() dense=() kbs=()
    for j in $FOLDS_FIT; do
      [ "$j" = "$i" ] && continue
      local O=$OUT/folds/fold-$j
      gen+=("$O/${variant}_genbioel.jsonl"); tfidf+=("$O/${variant}_tfidf.jsonl"); dense+=("$O/${variant}_dense.jsonl")
      kbs+=(--kb "$O/kb_$variant.jsonl")
    done
    [ -f "$F/fusion_$variant.json" ] || $G fit-fusion --source "genbioel=$(join "${gen[@]}")" --source "tfidf=$(join "${tfidf[@]}")" \
        --source "dense=$(join "${dense[@]}")" "${kbs[@]}" --exclude "$F/${variant}_genbioel.jsonl" --out "$F/fusion_$variant.json"
    [ -f "$F/${variant}_fusion.json" ] || $G evaluate --corpus "$AAP/AskAPatient.fold-$i.validation.txt" --format askapatient \
        --device cpu --linker genbioel --pipeline "$F/pipeline_$variant" --candidates.retriever none --decoding.exact_match false \
        --fusion "$F/fusion_$variant.json" --json "$F/${variant}_fusion.json" --predictions "$F/${variant}_fusion.jsonl"
  done
}

cascade() {
  local i=$1 F=$OUT/folds/fold-$1
  for variant in plain aug; do
    local gen=() kbs=() sources=()
    for j in $FOLDS_FIT; do
      [ "$j" = "$i" ] && continue
      gen+=("$OUT/folds/fold-$j/${variant}_genbioel_b2.jsonl"); kbs+=(--kb "$OUT/folds/fold-$j/kb_$variant.jsonl")
    done
    for name in tfidf dense rescnn; do sources+=(--source "$name=$(join "${gen[@]/_genbioel_b2.jsonl/_$name.jsonl}")"); done
    fit() { local out=$1; shift; [ -f "$out" ] || $G fit-fusion --source "genbioel=$(join "${gen[@]}")" "${sources[@]}" "${kbs[@]}" \
        --retriever-model "rescnn=$F/rescnn/model" --alternative tfidf,dense --alternative tfidf,rescnn \
        --alternative tfidf,dense,rescnn --generator-beams 2 --cascade --defer dense --exclude "$F/${variant}_genbioel.jsonl" \
        "$@" --out "$out"; }
    local cascade=$F/beamcascade_b2_$variant.json
    fit "$cascade"
    local E=(python bench/cascade.py --pipeline "$F/pipeline_$variant" --corpus "$AAP/AskAPatient.fold-$i.validation.txt"
       --format askapatient --no-abbreviations --fusion "$F/fusion_$variant.json" --cascade "$cascade" --variant "b2=$cascade,$cascade,2")
    if [ -z "$MAX_RECALL_LOSS" ]; then
      [ -f "$METRICS/cascade_aap_fold${i}_$variant.json" ] || "${E[@]}" \
          --rows generator,fusion,fusion_b2,cascade_b2,cascade_int8_b2$EXTRA_ROWS --out "$METRICS/cascade_aap_fold${i}_$variant.json"
      continue
    fi
    # thresholds for a recall budget: as many settled mentions as keep the cross-fitted recall@1 within it
    local budget=$F/beamcascade_b2_${variant}_loss.json
    fit "$budget" --max-recall-loss "$MAX_RECALL_LOSS"
    [ -f "$METRICS/cascade_aap_fold${i}_${variant}_loss.json" ] || "${E[@]}" --variant "loss=$budget,$budget,2" \
        --rows generator,fusion,cascade_b2,cascade_loss,cascade_int8_loss$EXTRA_ROWS --out "$METRICS/cascade_aap_fold${i}_${variant}_loss.json"
  done
}

case $STAGE in
  prepare) prepare ;;
  folds) export -f fold; export OUT AAP G KB; printf '%s\n' $FOLDS | xargs -P "${JOBS:-2}" -I{} bash -c 'set -euo pipefail; fold {}' ;;
  # FOLDS_FIT: the folds whose predictions fit each fold's fusion or cascade (default: every fold; FOLDS picks the
  # folds fitted and scored, so that two processes can share the folds: FOLDS="0 2 4 6 8" and FOLDS="1 3 5 7 9")
  fusion) FOLDS_FIT=${FOLDS_FIT:-0 1 2 3 4 5 6 7 8 9}; for i in $FOLDS; do fusion "$i"; done ;;
  cascade) FOLDS_FIT=${FOLDS_FIT:-0 1 2 3 4 5 6 7 8 9}; for i in $FOLDS; do cascade "$i"; done ;;
  *) echo "unknown stage $STAGE (prepare | folds | fusion | cascade)" >&2; exit 2 ;;
esac
