#!/usr/bin/env bash
# Experiment 009, round 2: DPO, IPO, SimPO and ORPO on the style pairs from the README's tiny
# run (configs/dpo.toml with the loss and beta changed), two seeds each. For each run: the
# held-out preference accuracy (eval --pairs, no reference), Persuasion bits per byte and the
# cloze task (the alignment tax). Appends one JSON line per run to OUT/results.jsonl.
# Usage: experiments/009-dpo/sweep.sh BIN OUT [SPEC...]   (from the repository root, runs/tiny
# present); a SPEC is "name|key=value key=value" (default: round 2's runs below).
set -euo pipefail
BIN=$1
OUT=$2
shift 2
mkdir -p "$OUT"
VAL=datasets/preference/austen_style_val.jsonl
# name | --set overrides
RUNS=(
  "sigmoid-b0.1|preference.loss=\"sigmoid\" preference.beta=0.1"
  "sigmoid-b0.5|preference.loss=\"sigmoid\" preference.beta=0.5"
  "ipo-b0.1|preference.loss=\"ipo\" preference.beta=0.1"
  "ipo-b0.5|preference.loss=\"ipo\" preference.beta=0.5"
  "simpo-b0.1-g0.5|preference.loss=\"simpo\" preference.beta=0.1"
  "simpo-b2-g1|preference.loss=\"simpo\" preference.beta=2.0 preference.gamma=1.0"
  "orpo-b0.1|preference.loss=\"orpo\" preference.beta=0.1"
)
if [ $# -gt 0 ]; then RUNS=("$@"); fi
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
