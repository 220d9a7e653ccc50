#!/usr/bin/env bash
# GRPO's step with two binaries, alternating (benches/README.md, "GRPO's rollouts batched"):
# configs/grpo.toml for 25 steps from an SFT run, each binary twice, A B A B, alone on the
# machine; benches/grpo_timing.py reads each run.
# Usage (from the repository root): benches/grpo_rollout_ab.sh BIN_A BIN_B SFT_RUN OUT
set -euo pipefail
A=$1
B=$2
SFT=$3
OUT=$4
mkdir -p "$OUT"
for round in 1 2; do
  for side in A B; do
    bin=$A
    [ "$side" = B ] && bin=$B
    dir="$OUT/$side-$round"
    rm -rf "$dir"
    "$bin" train --config configs/grpo.toml --run-dir "$dir" --set "model.from=\"$SFT\"" \
      --set training.max_steps=25 --set training.eval_interval=0 --set checkpoint.interval=1000 \
      > "$dir.log" 2>&1
    echo "== $side round $round ($bin)"
    python3 benches/grpo_timing.py "$dir"
  done
done
