#!/usr/bin/env bash
# Cross-fitted predictions for score fusion, now the package's command `python -m spacy_genbioel crossfit`
# (spacy_genbioel/training/crossfit.py; docs/training.md): this wrapper keeps the script's arguments and
# environment for the commands in docs/benchmarks.md.
#
#   bash bench/crossfit.sh ncbi train [DATA] [PRESET] [SECONDS] [RESCNN_SECONDS]   # fold models (one process per fold, in parallel)
#   bash bench/crossfit.sh ncbi score [DATA] [PRESET] [- - BEAMS]   # held-out predictions: genbioel, tfidf, dense, plain and + train KBs
#   bash bench/crossfit.sh ncbi fit [DATA] [PRESET] [- - BEAMS]     # fit-fusion on them: OUT/fusion_{plain,aug}.json, OUT/cascade_{plain,aug}.json
#
# Arguments / environment (`crossfit --help` says more): DATA (--data-dir), PRESET (--preset), K (--k),
# PRETRAINED (--pretrained), CONFIG (--config), SECONDS_PER_FOLD (--seconds), OUT (--out), VARIANTS (--variants),
# RESCNN_SECONDS (--rescnn-seconds), FOLD (--fold, one or more), FORCED (0: --no-forced), RESCNN_MODEL
# (--rescnn-model), BEAMS (the 7th argument: --beams), ANCHOR (--anchor), L2 (--l2). "-" for an argument: its default.
set -euo pipefail
CORPUS=${1:?usage: bench/crossfit.sh ncbi|bc5cdr train|score|fit}
STAGE=${2:?usage: bench/crossfit.sh ncbi|bc5cdr train|score|fit}
G=${G:-python -m spacy_genbioel}  # the CLI (a test puts a recorder here)
ARGS=()
arg() { [ -z "${2:-}" ] || [ "$2" = - ] || ARGS+=("$1" "$2"); }
arg --data-dir "${3:-${DATA:-}}"
arg --preset "${4:-${PRESET:-}}"
arg --seconds "${5:-${SECONDS_PER_FOLD:-}}"
arg --rescnn-seconds "${6:-${RESCNN_SECONDS:-}}"
arg --beams "${7:-${BEAMS:-}}"
arg --k "${K:-}"
arg --pretrained "${PRETRAINED:-}"
arg --config "${CONFIG:-}"
arg --out "${OUT:-}"
arg --variants "${VARIANTS:-}"
arg --rescnn-model "${RESCNN_MODEL:-}"
arg --anchor "${ANCHOR:-}"
arg --l2 "${L2:-}"
for fold in ${FOLD:-}; do ARGS+=(--fold "$fold"); done
[ "${FORCED:-1}" != 0 ] || ARGS+=(--no-forced)
exec $G crossfit "$STAGE" --corpus "$CORPUS" "${ARGS[@]}"
