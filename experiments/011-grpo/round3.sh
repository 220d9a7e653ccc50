#!/usr/bin/env bash
# Experiment 011, round 3 (sixth session, issue 39's +0.10 target): the SFT's final learning
# rate, more prompts a step at a higher learning rate, and RL prompts the SFT run never saw
# (datasets/arith/small/fresh.jsonl). Each run on one thread, two or three at a time on the
# 2-core EPYC (Zen 4). Usage: experiments/011-grpo/round3.sh BIN ROUND1_OUT OUT (from the
# repository root; ROUND1_OUT holds round 1's sft-s1337 and sft-s2, 1500 steps of
# configs/arith_sft.toml). Appends one JSON line per model to OUT/results.jsonl.
set -euo pipefail
BIN=$1
R1=$2
OUT=$3
mkdir -p "$OUT"
CHECKPOINT_INTERVAL=1000
source "$(dirname "$0")/common.sh"
# The SFT decayed to a tenth of the shipped final learning rate (min_lr 2e-5 against 2e-4).
for seed in 1337 2; do
  (RAYON_NUM_THREADS=1 "$BIN" train --config configs/arith_sft.toml --run-dir "$OUT/sftlo-s$seed" \
      --set training.seed=$seed --set schedule.min_lr=2e-5 --set checkpoint.interval=250 \
      --set checkpoint.keep_last=10 > "$OUT/sftlo-s$seed.log" 2>&1 \
    && evaluate "sftlo-s$seed" "$OUT/sftlo-s$seed") &
done
wait
# 64 prompts a step at lr 2e-4 (min_lr 2e-5), 100 steps, from round 1's SFT runs.
for seed in 1337 2; do
  (grpo "b64lr2e4-s$seed" "$R1/sft-s$seed" $seed --set training.batch_size=64 \
      --set optimizer.lr=2e-4 --set schedule.min_lr=2e-5 \
    && evaluate "b64lr2e4-s$seed" "$OUT/b64lr2e4-s$seed") &
done
wait
# RL prompts the SFT run never saw, lr 1e-4 for 200 steps (round 2's best schedule); stopped by
# hand near step 80, behind round 2's runs on train.jsonl at every validation.
for seed in 1337 2; do
  (grpo "fresh-lr1e4-s$seed" "$R1/sft-s$seed" $seed \
      --set "data.inputs=[\"$SMALL/fresh.jsonl\"]" --set optimizer.lr=1e-4 \
      --set training.max_steps=200) &
done
wait
# A constant SFT learning rate (min_lr = lr = 2e-3; its step-K checkpoint is then the K-step
# run's model, checked bit for bit at K = 250); greedy accuracy of its checkpoints; stopped
# after step 1000.
for seed in 1337 2; do
  (RAYON_NUM_THREADS=1 "$BIN" train --config configs/arith_sft.toml --run-dir "$OUT/sftconst-s$seed" \
      --set training.seed=$seed --set schedule.min_lr=2e-3 --set checkpoint.interval=250 \
      --set checkpoint.keep_last=10 --set training.max_steps=1000 > "$OUT/sftconst-s$seed.log" 2>&1) &
done
wait
# A 2000-step SFT (the shipped schedule stretched), then 64 prompts a step at lr 2e-4 from it.
for seed in 1337 2; do
  (RAYON_NUM_THREADS=1 "$BIN" train --config configs/arith_sft.toml --run-dir "$OUT/sft2000-s$seed" \
      --set training.seed=$seed --set training.max_steps=2000 --set checkpoint.interval=500 \
      --set checkpoint.keep_last=10 > "$OUT/sft2000-s$seed.log" 2>&1 \
    && evaluate "sft2000-s$seed" "$OUT/sft2000-s$seed" \
    && grpo "sft2000-b64lr2e4-s$seed" "$OUT/sft2000-s$seed" $seed --set training.batch_size=64 \
        --set optimizer.lr=2e-4 --set schedule.min_lr=2e-5 \
    && evaluate "sft2000-b64lr2e4-s$seed" "$OUT/sft2000-b64lr2e4-s$seed") &
done
wait
# Greedy accuracy of intermediate checkpoints (round3_results.jsonl, `run@step`), e.g.
#   "$BIN" eval --model "$OUT/sft2000-s2/checkpoints/step-00001500" --generate $SMALL/heldout.jsonl --json
# and by kind of question (additions with and without a carry, subtractions with a positive
# and a negative result): split_heldout.py OUT, then eval --generate on each OUT/h_<kind>.jsonl.
# Three times the SFT data (the 4000 worked answers and 8000 more for fresh.jsonl's questions,
# make_sft12k.py), 1500 steps, then 64 prompts a step at lr 2e-4 on train.jsonl.
python3 experiments/011-grpo/make_sft12k.py "$OUT"
for seed in 1337 2; do
  (RAYON_NUM_THREADS=1 "$BIN" train --config configs/arith_sft.toml --run-dir "$OUT/sft12k-s$seed" \
      --set training.seed=$seed --set "data.inputs=[\"$OUT/sft12k.jsonl\"]" \
      > "$OUT/sft12k-s$seed.log" 2>&1 \
    && evaluate "sft12k-s$seed" "$OUT/sft12k-s$seed" \
    && grpo "sft12k-b64lr2e4-s$seed" "$OUT/sft12k-s$seed" $seed --set training.batch_size=64 \
        --set optimizer.lr=2e-4 --set schedule.min_lr=2e-5 \
    && evaluate "sft12k-b64lr2e4-s$seed" "$OUT/sft12k-b64lr2e4-s$seed") &
done
wait
