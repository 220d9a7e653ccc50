#!/bin/bash
# DPO rows padded to training.seq_len (binary A) against rows padded to the micro-batch's
# longest sequence (binary B), alternating, three rounds: configs/dpo.toml for 40 steps, no
# evaluation or checkpoint inside, from MODEL (an HF directory with tokenizer.json, e.g.
# `qwen-burn init --config configs/tiny.toml --out MODEL` plus the shipped tokenizer).
# Usage: benches/dpo_longest_ab.sh A_BIN B_BIN MODEL  (from the repository root)
set -u
A=$1 B=$2 MODEL=$3
TMP=$(mktemp -d)
for round in 1 2 3; do
  for side in A B; do
    bin=$A; [ "$side" = B ] && bin=$B
    out=$("$bin" train --config configs/dpo.toml --run-dir "$TMP/run-$side" \
      --set "model.from=\"$MODEL\"" --set training.eval_interval=1000 \
      --set checkpoint.interval=1000 --max-steps 40 2>&1 | tail -1)
    echo "round $round $side: $out"
    rm -rf "$TMP/run-$side"
  done
done
rm -rf "$TMP"
