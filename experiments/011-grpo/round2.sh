#!/usr/bin/env bash
# Experiment 011, round 2 (issue 39's +0.10 target): GRPO's learning rate and length from the
# round-1 SFT runs, and a longer SFT. Each run on one thread (two at a time on the 2-core EPYC).
# Usage: experiments/011-grpo/round2.sh BIN ROUND1_OUT OUT   (from the repository root; ROUND1_OUT
# holds round 1's sft-s1337 and sft-s2). Appends one JSON line per model to OUT/results.jsonl.
set -euo pipefail
BIN=$1
R1=$2
OUT=$3
mkdir -p "$OUT"
CHECKPOINT_INTERVAL=200
source "$(dirname "$0")/common.sh"
for seed in 1337 2; do
  # lr 1e-4 for 200 steps (the shipped schedule stretched).
  (grpo "lr1e4-200-s$seed" "$R1/sft-s$seed" $seed --set optimizer.lr=1e-4 --set training.max_steps=200 \
    && evaluate "lr1e4-200-s$seed" "$OUT/lr1e4-200-s$seed") &
done
wait
# Negative, stopped at step 100 by hand (validation accuracy in their metrics.jsonl): lr 3e-4
# (min_lr 3e-5), and lr 1e-4 at temperature 0.7.
#   grpo lr3e4-200-s$seed ... --set optimizer.lr=3e-4 --set schedule.min_lr=3e-5 --set training.max_steps=200
#   grpo t07-200-s$seed ... --set optimizer.lr=1e-4 --set rl.temperature=0.7 --set training.max_steps=200
# A longer SFT (2500 steps), then GRPO at lr 1e-4 for 200 steps.
for seed in 1337 2; do
  (RAYON_NUM_THREADS=1 "$BIN" train --config configs/arith_sft.toml --run-dir "$OUT/sft2500-s$seed" \
      --set training.seed=$seed --set training.max_steps=2500 --set checkpoint.interval=2500 \
      --set training.eval_interval=500 > "$OUT/sft2500-s$seed.log" 2>&1 \
    && evaluate "sft2500-s$seed" "$OUT/sft2500-s$seed" \
    && grpo "sft2500-lr1e4-200-s$seed" "$OUT/sft2500-s$seed" $seed --set optimizer.lr=1e-4 \
        --set training.max_steps=200 \
    && evaluate "sft2500-lr1e4-200-s$seed" "$OUT/sft2500-lr1e4-200-s$seed") &
done
wait
# Then, from round 1's SFT runs: two updates per rollout.
for seed in 1337 2; do
  (grpo "it2-200-s$seed" "$R1/sft-s$seed" $seed --set optimizer.lr=1e-4 --set rl.num_iterations=2 \
      --set training.max_steps=200 \
    && evaluate "it2-200-s$seed" "$OUT/it2-200-s$seed") &
done
wait
