#!/usr/bin/env bash
# Round 7 (tenth session): the README's flow rebuilt on another CPU (a 2-core AMD EPYC, Zen 3,
# AVX2 only: other kernels than rounds 1-6's Zen 4, so other float rounding and other SFT
# ends), then SFT on answers worked column by column (datasets/arith/small/sft_columns.jsonl)
# and GRPO from it.
#   bash experiments/011-grpo/round7.sh BIN OUT STAGE
# STAGE: sft (configs/tiny.toml, then configs/arith_sft.toml from it, seeds 1337 and 2 side
# by side, each evaluated), cols, cols500, cols500-lr5e5, cols700, cols600, shipped (below).
# Every run on one thread, the two seeds side by side; the GRPO runs of cols500, cols500-lr5e5
# and cols700 were stopped early (the README's round-7 section says where).
set -euo pipefail
BIN=$1; OUT=$2; STAGE=$3; CHECKPOINT_INTERVAL=25
mkdir -p "$OUT"
source experiments/011-grpo/common.sh
source experiments/011-grpo/columns.sh
case $STAGE in
  sft)
    "$BIN" train --config configs/tiny.toml --run-dir "$OUT/tiny" > "$OUT/tiny.log" 2>&1
    for seed in 1337 2; do
      (RAYON_NUM_THREADS=1 "$BIN" train --config configs/arith_sft.toml --run-dir "$OUT/sft-s$seed" \
        --set training.seed=$seed --set "model.from=\"$OUT/tiny\"" > "$OUT/sft-s$seed.log" 2>&1 \
        && evaluate "sft-s$seed" "$OUT/sft-s$seed") &
    done
    wait ;;
  cols)  # SFT on worked answers column by column (sft_columns.jsonl), greedy accuracy of every
    # 250-step checkpoint (completions up to 48 tokens: the worked answers are longer)
    for seed in 1337 2; do
      (cols_sft "cols-s$seed" $seed --set checkpoint.interval=250 --set checkpoint.keep_last=10
       for ck in "$OUT/cols-s$seed"/checkpoints/step-*; do
         cols_eval "cols-s$seed@$((10#${ck##*step-}))" "$ck"
       done) &
    done
    wait ;;
  cols500)  # the same SFT in 500 steps (the schedule over 500), evaluated; then GRPO from it at
    # the shipped setting with completions of up to 40 tokens
    for seed in 1337 2; do
      (cols_sft "cols500-s$seed" $seed --set training.max_steps=500
       cols_eval "cols500-s$seed" "$OUT/cols500-s$seed" --samples 8
       cols_grpo "cols500-grpo-s$seed" "$OUT/cols500-s$seed" $seed) &
    done
    wait ;;
  cols500-lr5e5)  # GRPO from the cols500 SFT runs at lr 5e-5 (to 5e-6): at the shipped 2e-4
    # the training reward fell from 0.25 to 0.09 (s1337) and 0.10 to 0.02 (s2) in 15 steps
    for seed in 1337 2; do
      cols_grpo "cols500-lr5e5-s$seed" "$OUT/cols500-s$seed" $seed --set optimizer.lr=5e-5 \
        --set schedule.min_lr=5e-6 &
    done
    wait ;;
  cols700)  # the columns SFT in 700 steps (both seeds past the steep stretch of the 1500-step
    # runs: 0.44 / 0.27 at step 500, 0.76 / 0.71 at 750), then GRPO at lr 5e-5 as cols500-lr5e5
    for seed in 1337 2; do cols_run 700 $seed & done
    wait ;;
  cols600)  # the columns SFT in 600 steps (500 left seed 2 at 0.338, 700 left seed 1337 at
    # 0.868, past where +0.10 fits under its pass@8), then GRPO at lr 5e-5 as cols700
    for seed in 1337 2; do cols_run 600 $seed & done
    wait ;;
  shipped)  # the shipped configs/grpo.toml from the sft stage's runs (the control on this CPU)
    for seed in 1337 2; do
      b64 "shipped-s$seed" "$OUT/sft-s$seed" $seed &
    done
    wait ;;
  *) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
