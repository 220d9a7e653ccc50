#!/usr/bin/env bash
# Experiment 008: does the shipped multiple-choice task tell a trained model from an untrained
# one, over the whole run, and what do validation loss and bits per byte say beside it?
#  1. The README's main job (configs/tiny.toml, which scores datasets/tasks/austen_cloze.jsonl
#     at step 0, every 100 steps and at the end) with seeds 1337 (the config's) and 7.
#  2. The final models of both seeds and the step-0 model scored from the command line, and the
#     time to score 1136 questions (the task four times over).
# From the repository root:
#   bash experiments/008-evaluation/run.sh
set -euo pipefail
D=experiments/008-evaluation
OUT=${OUT:-runs/exp008}
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
rm -rf "$OUT"
mkdir -p "$OUT"
for seed in 1337 7; do
  $QB train --config configs/tiny.toml --set training.seed=$seed --run-dir "$OUT/seed$seed"
done
$QB plot "$OUT/seed1337" "$OUT/seed7" --out "$D/plots"
python3 "$D/summarize.py" "$OUT/seed1337" "$OUT/seed7" > "$D/results.md"
for r in 1 2; do cat datasets/tasks/austen_cloze.jsonl datasets/tasks/austen_cloze.jsonl; done \
  > "$OUT/cloze1136.jsonl"
$QB eval --model "$OUT/seed1337" --task "$OUT/cloze1136.jsonl"
# Batched prompts (the default, 32 questions a forward) against one question at a time.
if command -v farm-bench >/dev/null; then
  QBIN=${QBIN:-target/release/qwen-burn}
  farm-bench -n 4 --timeout 300 \
    --vs "$QBIN eval --model $OUT/seed1337 --task $OUT/cloze1136.jsonl --batch-questions 1" \
    -- $QBIN eval --model "$OUT/seed1337" --task "$OUT/cloze1136.jsonl"
fi
