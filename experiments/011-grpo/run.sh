#!/usr/bin/env bash
# Experiment 011: SFT then GRPO on the arithmetic task (datasets/arith/small, operands 0-99),
# from the README's tiny run, two seeds. For each seed: the SFT run (configs/arith_sft.toml on
# the small task, 1500 steps), then from it GRPO (configs/grpo.toml), REINFORCE, Dr. GRPO and
# GRPO with beta 0.04. Each model's held-out greedy accuracy and pass@8 on all 500 held-out
# prompts (eval --generate); the runs' own validation accuracy (64 prompts) over their steps is
# in their metrics.jsonl. Appends one JSON line per model to OUT/results.jsonl.
# Usage: experiments/011-grpo/run.sh BIN OUT SEED [all|grpo]   (from the repository root, runs/tiny
# present; `grpo` runs the SFT and GRPO only, `all` the variants too)
set -euo pipefail
BIN=$1
OUT=$2
SEEDS=$3
WHICH=${4:-all}
mkdir -p "$OUT"
SMALL=datasets/arith/small
evaluate() { # name model
  local e
  e=$("$BIN" eval --model "$2" --generate $SMALL/heldout.jsonl --max-new-tokens 32 --samples 8 --json)
  python3 -c 'import json,sys; e=json.loads(sys.argv[2]); e["run"]=sys.argv[1]; print(json.dumps(e))' "$1" "$e" >> "$OUT/results.jsonl"
}
done_already() { grep -q "\"run\": \"$1\"" "$OUT/results.jsonl" 2>/dev/null; }
# name | --set overrides of configs/grpo.toml
VARIANTS=(
  "grpo|"
  "reinforce|rl.algorithm=\"reinforce\""
  "dr_grpo|rl.loss_type=\"dr_grpo\" rl.scale_rewards=\"none\""
  "grpo-beta0.04|rl.beta=0.04"
)
for seed in $SEEDS; do
  sft="$OUT/sft-s$seed"
  if ! done_already "sft-s$seed"; then
    if [ ! -d "$sft/checkpoints" ]; then
      "$BIN" train --config configs/arith_sft.toml --run-dir "$sft" --set training.seed=$seed > "$sft.log" 2>&1
    fi
    evaluate "sft-s$seed" "$sft"
  fi
  for spec in "${VARIANTS[@]}"; do
    name="${spec%%|*}-s$seed"
    if done_already "$name"; then continue; fi
    if [ "$WHICH" = grpo ] && [ "${spec%%|*}" != grpo ]; then continue; fi
    sets=()
    for kv in ${spec#*|}; do sets+=(--set "$kv"); done
    start=$(date +%s)
    "$BIN" train --config configs/grpo.toml --run-dir "$OUT/$name" --set training.seed=$seed \
      --set "model.from=\"$sft\"" "${sets[@]}" > "$OUT/$name.log" 2>&1
    echo "$name: $(( $(date +%s) - start )) s" >> "$OUT/times.txt"
    evaluate "$name" "$OUT/$name"
  done
done
