#!/usr/bin/env bash
# The 8-task downstream suite of the MaxText OLMo 3 write-up, through `olmax eval tasks`:
# mmlu (5-shot), hellaswag, arc_easy, arc_challenge, openbookqa, piqa, boolq, winogrande (lm-eval's
# default shots). Accuracy with lm-eval's stderr per task and the macro average, as a markdown table
# (OUT/tasks.md) and JSON (OUT/tasks.json). Needs the `eval` extra.
#
#   scripts/task_suite.sh CKPT OUT [DATA_DIR]
#
# CKPT: an olmax checkpoint directory (run/checkpoints; STEP picks a step, default the latest).
# DATA_DIR: local copies of the datasets (HF arrow or jsonl, e.g. evals/); without it
# lm-eval downloads them. Environment: STEP, LIMIT (documents per task, and per MMLU subject: a
# smoke run; unset = all), BATCH (default 8), DTYPE (compute dtype override), OLMAX (default `olmax`).
set -euo pipefail
if [[ $# -lt 2 || $# -gt 3 ]]; then
  sed -n '2,14p' "$0" >&2
  exit 2
fi
ckpt=$1 out=$2 data_dir=${3:-}
args=(eval tasks --ckpt "$ckpt" --batch "${BATCH:-8}" --json "$out/tasks.json"
      --tasks mmlu,hellaswag,arc_easy,arc_challenge,openbookqa,piqa,boolq,winogrande)
[[ -n $data_dir ]] && args+=(--data-dir "$data_dir")
[[ -n ${STEP:-} ]] && args+=(--step "$STEP")
[[ -n ${LIMIT:-} ]] && args+=(--limit "$LIMIT")
[[ -n ${DTYPE:-} ]] && args+=(--dtype "$DTYPE")
mkdir -p "$out"
start=$(date +%s)
"${OLMAX:-olmax}" "${args[@]}" | tee "$out/tasks.md"
echo "8-task suite: $(( $(date +%s) - start )) s; $out/tasks.md, $out/tasks.json" >&2
