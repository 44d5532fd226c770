#!/usr/bin/env bash
# AskAPatient (social-media phrases -> SNOMED CT / AMT, 1,036 concepts, mentions without context) over its
# 10 folds, every linker on the same folds: now the package's command `python -m spacy_genbioel crossfit-folds`
# (spacy_genbioel/training/crossfit.py; docs/training.md). This wrapper keeps the script's stages and
# environment for the commands in docs/benchmarks.md.
#
#   bash bench/aap.sh prepare [DATA]   # KB, tokenizer, model, KB-guided pre-training: once, shared by every fold
#   bash bench/aap.sh folds     # per fold: corpus, fine-tuning, ResCNN; every linker on the fold's validation split
#   bash bench/aap.sh fusion    # per fold: fusion fitted on the *other* folds' predictions minus this fold's pairs
#   bash bench/aap.sh cascade   # per fold: the cascade fitted the same way, benched on the fold (metrics/cascade_aap_fold<k>_<kb>*.json)
#   python -m spacy_genbioel folds-report training/aap/tiny/folds   # mean and spread per linker and KB
#
# Environment (`crossfit-folds --help` says more): DATA (--data-dir), OUT (--out), FOLDS (--folds), FOLDS_FIT
# (--folds-fit), JOBS (--jobs), PRETRAIN_STEPS / PRETRAIN_SECONDS, FINETUNE_STEPS / FINETUNE_SECONDS,
# RESCNN_SECONDS, SEED, METRICS (--metrics), MAX_RECALL_LOSS (--max-recall-loss; set but empty: none),
# EXTRA_ROWS (",cascade_grouped_loss": --extra-rows), ANCHOR and L2 (the fits' penalty: "genbioel:retrieval", "0.1").
set -euo pipefail
STAGE=${1:?usage: bench/aap.sh prepare|folds|fusion|cascade}
G=${G:-python -m spacy_genbioel}  # the CLI (a test puts a recorder here)
ARGS=()
arg() { [ -z "${2:-}" ] || ARGS+=("$1" "$2"); }
arg --data-dir "${2:-${DATA:-}}"
arg --out "${OUT:-}"
arg --folds "${FOLDS:-}"
arg --folds-fit "${FOLDS_FIT:-}"
arg --jobs "${JOBS:-}"
arg --pretrain-steps "${PRETRAIN_STEPS:-}"
arg --pretrain-seconds "${PRETRAIN_SECONDS:-}"
arg --finetune-steps "${FINETUNE_STEPS:-}"
arg --finetune-seconds "${FINETUNE_SECONDS:-}"
arg --rescnn-seconds "${RESCNN_SECONDS:-}"
arg --seed "${SEED:-}"
arg --metrics "${METRICS:-}"
arg --extra-rows "${EXTRA_ROWS:-}"
arg --anchor "${ANCHOR:-}"
arg --l2 "${L2:-}"
[ -z "${MAX_RECALL_LOSS+set}" ] || ARGS+=(--max-recall-loss "${MAX_RECALL_LOSS:-none}")
exec $G crossfit-folds "$STAGE" "${ARGS[@]}"
