#!/usr/bin/env bash
# Experiment 009, round 3: RPO (DPO plus preference.sft_weight = 1, TRL's suggested
# rpo_alpha) against DPO on the style pairs from the README's tiny run (configs/dpo.toml), two
# seeds each. For each run: the
# held-out preference accuracy (eval --pairs, no reference), Persuasion bits per byte and the
# cloze task (the alignment tax). Appends one JSON line per run to OUT/results.jsonl.
# Usage: experiments/009-dpo/round3.sh BIN OUT   (from the repository root, runs/tiny present)
set -euo pipefail
BIN=$1
OUT=$2
mkdir -p "$OUT"
VAL=datasets/preference/austen_style_val.jsonl
# name | --set overrides
RUNS=(
  "sigmoid-b0.1|preference.loss=\"sigmoid\" preference.beta=0.1"
  "rpo-b0.1-w1|preference.loss=\"sigmoid\" preference.beta=0.1 preference.sft_weight=1.0"
)
evaluate() { # model -> one JSON object of the held-out figures
  local pairs text task
  pairs=$("$BIN" eval --model "$1" --pairs "$VAL")
  text=$("$BIN" eval --model "$1" --text datasets/austen/austen_persuasion.txt.gz --max-tokens 30000 --context 128 | tail -1)
  task=$("$BIN" eval --model "$1" --task datasets/tasks/austen_cloze.jsonl --json)
  python3 -c 'import json,sys; p,t,k=(json.loads(a) for a in sys.argv[1:4]); print(json.dumps({"preference_accuracy":p["preference_accuracy"],"bpb":t["bpb"],"cloze_acc_norm":k["acc_norm"]}))' "$pairs" "$text" "$task"
}
if [ ! -f "$OUT/start.json" ]; then evaluate runs/tiny > "$OUT/start.json"; fi
for seed in 1337 2; do
  for spec in "${RUNS[@]}"; do
    name=${spec%%|*}
    run="$OUT/$name-s$seed"
    if grep -q "\"run\": \"$name-s$seed\"" "$OUT/results.jsonl" 2>/dev/null; then continue; fi
    sets=()
    for kv in ${spec#*|}; do sets+=(--set "$kv"); done
    start=$(date +%s)
    "$BIN" train --config configs/dpo.toml --run-dir "$run" --set training.seed=$seed "${sets[@]}" > "$run.log" 2>&1
    secs=$(( $(date +%s) - start ))
    figures=$(evaluate "$run")
    python3 -c 'import json,sys; f=json.loads(sys.argv[3]); f.update(run=sys.argv[1], train_secs=int(sys.argv[2])); print(json.dumps(f))' "$name-s$seed" "$secs" "$figures" >> "$OUT/results.jsonl"
    rm -rf "$run/checkpoints"
  done
done
