#!/usr/bin/env bash
# Cross-fitted predictions for score fusion: the training split cut into K
# folds of whole documents (`folds`); per fold, a generative model fine-tuned
# on the other folds (from the same pre-trained checkpoint as the final model)
# and the retrievers, with a dictionary of the other folds only, score the
# held-out fold. `fit-fusion` then fits the fusion on those predictions, never
# on dev.
#
#   bash bench/crossfit.sh ncbi train [DATA] [PRESET] [SECONDS] [RESCNN_SECONDS]   # fold models (one process per fold, in parallel)
#   bash bench/crossfit.sh ncbi score [DATA] [PRESET] [- - BEAMS]   # held-out predictions: genbioel, tfidf, dense, plain and + train KBs
#   bash bench/crossfit.sh ncbi fit [DATA] [PRESET] [- - BEAMS]     # fit-fusion on them: OUT/fusion_{plain,aug}.json, OUT/cascade_{plain,aug}.json
#
# Arguments / environment:
#   DATA        shared data folder (../shared/data)
#   PRESET      model preset (tiny)
#   K           folds (2)
#   PRETRAINED  checkpoint the fold models start from (training/<corpus>/tiny/pretrain/model)
#   CONFIG      fine-tuning config (configs/finetune_tiny.cfg)
#   SECONDS_PER_FOLD  fine-tuning budget of each fold model (1200, as the final model's)
#   OUT         output folder (training/<corpus>/<preset>/crossfit)
#   VARIANTS    fold KBs to score and fit ("plain aug")
#   RESCNN_SECONDS  also train a ResCNN retriever per fold for this long (0: none); score and fit then use the
#               fold ResCNNs (found by themselves once trained), and fit keeps the retrievers (tfidf+dense,
#               tfidf+rescnn or all three) whose fusion links the held-out folds best
#   FOLD        score: this fold only (run one per core side by side)
#   FORCED      0: no forced-score rows and no forced-score cascade (cascade_<variant>.json); the packages' cascade
#               (fusion_<variant>.json, fitted on beam lists) needs only the beam lists (1)
#   RESCNN_MODEL    the ResCNN the fitted fusion links with (training/<corpus>/rescnn/model, train-rescnn's)
#   BEAMS       (7th argument) the fold generators' beam width and top-k (null: the model config's); the fusion
#               file records it and pipelines linking with it search at that width, since the fusion reads the
#               generator's lists as they were made (held-out files *_genbioel_b<N>.jsonl)
# Steps whose outputs exist are skipped: rerun after a crash to finish.
set -euo pipefail
CORPUS=${1:?usage: bench/crossfit.sh ncbi|bc5cdr train|score}
STAGE=${2:?usage: bench/crossfit.sh ncbi|bc5cdr train|score}
DATA=${3:-${DATA:-../shared/data}}
PRESET=${4:-${PRESET:-tiny}}
K=${K:-2}
PRETRAINED=${PRETRAINED:-training/$CORPUS/$PRESET/pretrain/model}
CONFIG=${CONFIG:-configs/finetune_$PRESET.cfg}
SECONDS_PER_FOLD=${5:-${SECONDS_PER_FOLD:-1200}}; [ "$SECONDS_PER_FOLD" != - ] || SECONDS_PER_FOLD=1200
OUT=${OUT:-training/$CORPUS/$PRESET/crossfit}
VARIANTS=${VARIANTS:-plain aug}  # the fold KBs scored and fitted: plain, aug (+ the fold's training mentions)
RESCNN_SECONDS=${6:-${RESCNN_SECONDS:-0}}; [ "$RESCNN_SECONDS" != - ] || RESCNN_SECONDS=0
RESCNN_MODEL=${RESCNN_MODEL:-training/$CORPUS/rescnn/model}
BEAMS=${7:-${BEAMS:-null}}
FORCED=${FORCED:-1}
GEN=genbioel WIDTH=()  # the generator's held-out files, and their width when BEAMS sets one
FIT_WIDTH=()  # recorded in the fusion file: pipelines linking with it search at that width
[ "$BEAMS" = null ] || { GEN=genbioel_b$BEAMS; WIDTH=(--decoding.num_beams "$BEAMS" --decoding.top_k "$BEAMS"); FIT_WIDTH=(--generator-beams "$BEAMS"); }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
G="python -m spacy_genbioel"
join() { local IFS=,; echo "$*"; }
case $CORPUS in
  ncbi)
    TRAIN=$DATA/ncbi_disease/NCBItrainset_corpus.txt
    DEV=corpus/ncbi/dev.jsonl
    build_kb() { $G build-kb "$DATA/vocab/medic_06Jul2012.txt" --format medic --no-dedup "$@"; }
    WALK=()
    POOL=0
    ;;
  bc5cdr)
    TRAIN=$DATA/bc5cdr/CDR_TrainingSet.PubTator.txt
    DEV=corpus/bc5cdr/dev.jsonl
    WALK=(--crosswalk "$DATA/vocab/bc5cdr_legacy_id_crosswalk.tsv")
    POOL=50  # train-rescnn's refresh pool on the 788k-name KB (configs/corpora/bc5cdr.vars)
    build_kb() { $G build-kb --format ctd "$DATA/vocab/CTD_diseases_2017.tsv.gz" \
        mesh-tsv:"$DATA/vocab/mesh/mesh_id_label_mappings.tsv" mesh-tsv:"$DATA/vocab/mesh/mesh_supp_id_label_mappings.tsv" \
        "${WALK[@]}" --no-dedup "$@"; }
    ;;
  *) echo "unknown corpus $CORPUS (ncbi | bc5cdr)" >&2; exit 2 ;;
esac
FOLDS=$OUT/folds
mkdir -p "$OUT"
# the ResCNN is a source: fold ResCNNs are being trained, or were
rescnn_on() { [ "$RESCNN_SECONDS" != 0 ] || [ -d "$OUT/models/fold-0/rescnn/model" ]; }
[ -f "$FOLDS/folds.json" ] || $G folds "$TRAIN" --out "$FOLDS" --k "$K"

fold_train() {
  local i=$1 F=$FOLDS/fold-$1
  # the fold's KB: concept priors from its own training documents only
  [ -f "$F/kb_plain.jsonl" ] || build_kb --prior-pubtator "$F/train.txt" --out "$F/kb_plain.jsonl"
  [ -f "$F/corpus/train.jsonl" ] || $G corpus --train "$F/train.txt" --dev "$F/heldout.txt" --kb "$F/kb_plain.jsonl" \
      --out "$F/corpus" "${WALK[@]}" --abbreviations
  [ -f "$OUT/models/fold-$i/result.json" ] || $G finetune --model "$PRETRAINED" --train "$F/corpus/train.jsonl" --dev "$DEV" \
      --kb "$F/kb_plain.jsonl" --config "$CONFIG" --out "$OUT/models/fold-$i" --device cpu \
      --training.max_seconds "$SECONDS_PER_FOLD" --training.seed "$i"
  [ "$RESCNN_SECONDS" = 0 ] || [ -d "$OUT/models/fold-$i/rescnn/model" ] || $G train-rescnn --kb "$F/kb_plain.jsonl" \
      --train "$F/corpus/train.jsonl" --config configs/rescnn.cfg --out "$OUT/models/fold-$i/rescnn" \
      --training.max_seconds "$RESCNN_SECONDS" --training.seed "$i" --data.refresh_pool "$POOL"
}

# the retriever sets a fusion may read ("+"-joined), and the row of forced scores over each one's candidates
retriever_sets() { echo tfidf+dense; ! rescnn_on || echo tfidf+rescnn tfidf+dense+rescnn; }
forced_row() { case $1 in tfidf+dense) echo forced ;; *) echo "forced_${1//+/_}" ;; esac; }

fold_score() {
  local i=$1 F=$FOLDS/fold-$1
  [ -f "$F/kb_aug.jsonl" ] || build_kb --prior-pubtator "$F/train.txt" --augment-pubtator "$F/train.txt" --out "$F/kb_aug.jsonl"
  for variant in $VARIANTS; do
    local kb=$F/kb_$variant.jsonl P=$OUT/models/fold-$i/pipeline_$variant D=$OUT/fold-$i
    mkdir -p "$D"
    [ -d "$P" ] || $G package --model "$OUT/models/fold-$i/model" --kb "$kb" --config "$OUT/models/fold-$i/config.cfg" --out "$P" \
        --no-entity-ruler  # scored on gold mentions: no NER, and no ruler over 788k names to build
    E=($G evaluate --corpus "$F/heldout.txt" "${WALK[@]}" --abbreviations)
    row() { local name=$1; shift; [ -f "$D/${variant}_$name.jsonl" ] || "${E[@]}" "$@" \
        --json "$D/${variant}_$name.json" --predictions "$D/${variant}_$name.jsonl"; }
    row $GEN --linker genbioel --pipeline "$P" --device cpu --candidates.retriever none --decoding.exact_match false "${WIDTH[@]}"
    row tfidf --linker tfidf --kb "$kb"
    row dense --linker dense --kb "$kb"
    local R=$OUT/models/fold-$i/rescnn/model
    ! rescnn_on || row rescnn --linker rescnn --kb "$kb" --model "$R"
    # the generator's forced scores of the retrievers' candidates: what the cascade's fusion reads
    [ "$FORCED" = 0 ] || for set in $(retriever_sets); do
      row "$(forced_row "$set")" --linker genbioel --pipeline "$P" --device cpu --decoding.search forced --candidates.retriever "$set" \
          --candidates.model "rescnn=$R" --candidates.num_candidates 5 --decoding.exact_match false
    done
  done
}

fit() {
  for variant in $VARIANTS; do
    local gen=() kbs=() retrievers=() choose=()
    for i in $(seq 0 $((K - 1))); do
      gen+=("$OUT/fold-$i/${variant}_$GEN.jsonl"); kbs+=(--kb "$FOLDS/fold-$i/kb_$variant.jsonl")
    done
    for name in tfidf dense $(! rescnn_on || echo rescnn); do
      retrievers+=(--source "$name=$(join "${gen[@]/_$GEN.jsonl/_$name.jsonl}")")
    done
    if rescnn_on; then
      retrievers+=(--retriever-model "rescnn=$RESCNN_MODEL")
      for set in $(retriever_sets); do choose+=(--alternative "${set//+/,}"); done
    fi
    # the packages' fusion, with the cascade's retrieval-only weights and thresholds (reranker.cascade on: mentions
    # retrieval settles skip the generator, the rest get beam search and this fusion); MiniLM, the costly
    # retriever, runs only where the others do not settle (--defer dense: the early step)
    $G fit-fusion --source "genbioel=$(join "${gen[@]}")" "${retrievers[@]}" "${kbs[@]}" "${choose[@]}" "${FIT_WIDTH[@]}" --cascade \
        --defer dense --out "$OUT/fusion_$variant.json"
    # the cascade judged by forced scores: the fusion over forced scores of the chosen retrievers' candidates
    [ "$FORCED" != 0 ] || continue
    local set
    set=$(python -c 'import json, sys; print("+".join(json.load(open(sys.argv[1]))["sources"][1:]))' "$OUT/fusion_$variant.json")
    local forced=("${gen[@]/_$GEN.jsonl/_$(forced_row "$set").jsonl}")
    $G fit-fusion --source "genbioel=$(join "${forced[@]}")" "${retrievers[@]}" "${kbs[@]}" --alternative "${set//+/,}" \
        --generator forced --cascade --defer dense --out "$OUT/cascade_$variant.json"
  done
}

case $STAGE in
  train)
    for i in $(seq 0 $((K - 1))); do fold_train "$i" > "$OUT/train-fold-$i.log" 2>&1 & done
    wait ;;
  score) for i in ${FOLD:-$(seq 0 $((K - 1)))}; do fold_score "$i"; done ;;  # FOLD=i: that fold only (one process per core)
  fit) fit ;;
  *) echo "unknown stage $STAGE (train | score | fit)" >&2; exit 2 ;;
esac
