#!/usr/bin/env bash
# Experiment 011, round 4 (seventh session, issue 39's +0.10 for two seeds): 64 prompts a step
# at lr 2e-4 from round 2's 2500-step SFT models, and an SFT with weight decay (0.1 and 1.0;
# the shipped SFT has none) followed by the same GRPO from the 0.1 models (the 1.0 models
# were weaker than the shipped SFT's, so no GRPO ran from them). Each run on one thread, four
# to six at a time on the 2-core EPYC (Zen 4); four 64-prompt GRPO runs at once (~5.8 GB each)
# overran the 24 GiB: the kernel killed sft2500-b64lr2e4-s1337 after step 95, and it was
# resumed from its step-75 checkpoint (`train --resume`, bit-exact). Usage: experiments/011-grpo/round4.sh BIN ROUND2_OUT OUT
# (from the repository root; ROUND2_OUT holds round 2's sft2500-s1337 and sft2500-s2).
# Appends one JSON line per model to OUT/results.jsonl.
set -euo pipefail
BIN=$1
R2=$2
OUT=$3
mkdir -p "$OUT"
CHECKPOINT_INTERVAL=25
source "$(dirname "$0")/common.sh"
sft_wd() { # name seed weight_decay
  RAYON_NUM_THREADS=1 "$BIN" train --config configs/arith_sft.toml --run-dir "$OUT/$1" \
    --set training.seed="$2" --set optimizer.weight_decay="$3" --set checkpoint.interval=250 \
    --set checkpoint.keep_last=10 > "$OUT/$1.log" 2>&1 && evaluate "$1" "$OUT/$1"
}
for seed in 1337 2; do
  b64 "sft2500-b64lr2e4-s$seed" "$R2/sft2500-s$seed" $seed &
  (sft_wd "sftwd-s$seed" $seed 0.1 && b64 "sftwd-b64lr2e4-s$seed" "$OUT/sftwd-s$seed" $seed) &
  sft_wd "sftwd1-s$seed" $seed 1.0 &
done
wait
# The same GRPO for 150 steps (the cosine schedule over 150) from the weight-decay SFT models:
# at 100 steps seed 1337 gained +0.086 with its validation accuracy still climbing.
for seed in 1337 2; do
  b64 "sftwd-b64lr2e4-150-s$seed" "$OUT/sftwd-s$seed" $seed --set training.max_steps=150 &
done
wait
# Two more seeds of the weight-decay SFT (run alone on the machine; the figures reported are
# their greedy accuracy). The by-kind tables came from
#   "$BIN" eval --model M --generate $SMALL/heldout.jsonl --max-new-tokens 32 --records R.jsonl
# and by_kind.py NAME=R.jsonl ...
for seed in 3 4; do
  sft_wd "sftwd-s$seed" $seed 0.1 &
done
wait
