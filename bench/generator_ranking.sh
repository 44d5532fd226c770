#!/usr/bin/env bash
# The generator trained for the cascade's question, against today's training and retrieval alone, on a labelled
# split cut into two halves of whole documents (fit on one half, measure on the other, then swap).
#
#   FT=MODEL_DIR CFG=its config.cfg KB=kb.jsonl TRAIN=corpus/train.jsonl FOLDS=two-fold dir (`folds DEV --k 2`) \
#   RETRIEVAL=pipeline of `package --kb KB` OUT=work dir bash bench/generator_ranking.sh [train] [measure]
#
# train: ANGEL from FT with beam mining (configs/angel_tiny.cfg), forced mining (configs/angel_rank_tiny.cfg),
# forced mining with the ranking loss (configs/angel_margin_tiny.cfg) and with the listwise loss
# (configs/angel_listwise_tiny.cfg), alone or fused with retrieval's ranking (configs/angel_fused_tiny.cfg), the
# same CPU budget, one thread each, no dev
# (both halves stay unseen); MODELS="ft margin" (say) limits both stages to those.
# measure: per model and half, fit-fusion --model (forced-score cascade, MiniLM deferred) on one half, then
# bench/cascade.py on the other: the forced ranking alone, the cascade, retrieval only, the retrieval pipeline.
# python bench/generator_ranking_report.py OUT/metrics pools the halves. CROSSWALK=TSV (BC5CDR's legacy IDs) maps
# the gold IDs of fit and measure alike. FIT_EXTRA="--anchor genbioel:retrieval --l2 0.1" (say) is added to every
# fit-fusion call (use another OUT: finished files are reused).
# fitted: cascades fitted elsewhere (`crossfit`'s, on the training folds), FITTED="NAME=FUSION.json,CASCADE.json ...",
# measured on both halves with FT's pipeline: the forced-score cascade (CASCADE: forced ranking alone, cascade,
# retrieval only, the retrieval pipeline) -> half<i>_NAME.json, the beam cascade the packages ship (FUSION: cascade,
# the beam fusion on every mention, retrieval only) -> half<i>_NAME_beam.json; the report sets them beside the rest.
set -euo pipefail
: "${FT:?}" "${CFG:?}" "${KB:?}" "${TRAIN:?}" "${FOLDS:?}" "${RETRIEVAL:?}" "${OUT:?}"
export OMP_NUM_THREADS=1
stages=("${@:-train measure}")
mkdir -p "$OUT/metrics"
# margin2x, listwise2x: those models at twice the budget (2,160 CPU seconds, up to 20 rounds: 10 take the 1,080)
declare -A DIR=([angel]=angel_tiny [rank]=angel_rank_tiny [margin]=angel_margin_tiny [margin2x]=angel_margin_tiny_2x
  [listwise]=angel_listwise_tiny [listwise2x]=angel_listwise_tiny_2x [fused]=angel_fused_tiny)
declare -A CONFIG=([angel]=angel_tiny [rank]=angel_rank_tiny [margin]=angel_margin_tiny [margin2x]=angel_margin_tiny
  [listwise]=angel_listwise_tiny [listwise2x]=angel_listwise_tiny [fused]=angel_fused_tiny)
declare -A EXTRA=([margin2x]="--training.max_seconds 2160 --angel.rounds 20"
  [listwise2x]="--training.max_seconds 2160 --angel.rounds 20")
declare -A MODEL=([ft]=$FT)
for m in "${!DIR[@]}"; do MODEL[$m]=$OUT/${DIR[$m]}/model; done
models=(${MODELS:-ft angel rank margin})
xwalk=(${CROSSWALK:+--crosswalk "$CROSSWALK"})
if [[ " ${stages[*]} " == *" train "* ]]; then
  for m in "${models[@]}"; do
    [ "$m" = ft ] && continue
    [ -d "$OUT/${DIR[$m]}/model" ] || python -m spacy_genbioel angel --model "$FT" --train "$TRAIN" --kb "$KB" \
        --config "configs/${CONFIG[$m]}.cfg" --out "$OUT/${DIR[$m]}" --device cpu --training.budget_clock cpu \
        --training.seed 0 ${EXTRA[$m]:-} > "$OUT/${DIR[$m]}.log" 2>&1 &
  done
  wait
fi
if [[ " ${stages[*]} " == *" measure "* ]]; then
  for m in "${models[@]}"; do
    [ -d "$OUT/pkg_$m" ] || python -m spacy_genbioel package --model "${MODEL[$m]}" --config "$CFG" --kb "$KB" \
        --out "$OUT/pkg_$m" --no-entity-ruler
    for i in 0 1; do
      C=$OUT/cascade_${m}_$i.json
      [ -f "$C" ] || python -m spacy_genbioel fit-fusion --model "${MODEL[$m]}" --config "$CFG" --kb "$KB" \
          --corpus "$FOLDS/fold-$i/train.txt" "${xwalk[@]}" --abbreviations --cascade --defer dense --generator forced \
          --predictions "$OUT/fit-$m-$i" --out "$C" ${FIT_EXTRA:-}
      python bench/cascade.py --pipeline "$OUT/pkg_$m" --corpus "$FOLDS/fold-$i/heldout.txt" "${xwalk[@]}" --fusion "$C" \
          --cascade "$C" --pipeline-row "retrieval_pipeline=$RETRIEVAL" \
          --rows forced_alone,cascade,retrieval_only,retrieval_pipeline --repeats 2 \
          --out "$OUT/metrics/half${i}_$m.json"
    done
  done
fi
if [[ " ${stages[*]} " == *" fitted "* ]]; then
  [ -d "$OUT/pkg_ft" ] || python -m spacy_genbioel package --model "$FT" --config "$CFG" --kb "$KB" \
      --out "$OUT/pkg_ft" --no-entity-ruler
  for spec in ${FITTED:?FITTED="NAME=FUSION.json,CASCADE.json ..."}; do
    name=${spec%%=*} files=${spec#*=}
    fusion=${files%%,*} cascade=${files#*,}
    for i in 0 1; do
      half=(--pipeline "$OUT/pkg_ft" --corpus "$FOLDS/fold-$i/heldout.txt" "${xwalk[@]}" --repeats 1)
      python bench/cascade.py "${half[@]}" --fusion "$fusion" --cascade "$cascade" \
          --pipeline-row "retrieval_pipeline=$RETRIEVAL" --rows forced_alone,cascade,retrieval_only,retrieval_pipeline \
          --out "$OUT/metrics/half${i}_$name.json"
      python bench/cascade.py "${half[@]}" --fusion "$fusion" --cascade "$fusion" --rows cascade,fusion,retrieval_only \
          --out "$OUT/metrics/half${i}_${name}_beam.json"
    done
  done
fi
