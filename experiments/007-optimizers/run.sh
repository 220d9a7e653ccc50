#!/usr/bin/env bash
# Experiment 007: AdamW against Muon, cosine against warmup-stable-decay, on the README's tiny
# model (configs/tiny.toml: 500 steps of 16 x 128 tokens of the shipped corpus).
#  1. Muon (configs/tiny_muon.toml: Muon + WSD) at Muon learning rates 0.01, 0.02, 0.04, seed
#     1337; the chosen rate (0.02, the config's) also at seed 7.
#  2. AdamW with WSD (configs/tiny.toml with schedule.decay = "wsd"), seed 1337.
#  3. The AdamW + cosine baseline (configs/tiny.toml) at seeds 1337 and 7 is experiment 008's
#     pair of runs (runs/exp008/seed1337, seed7), the same config and code.
# From the repository root:
#   bash experiments/007-optimizers/run.sh
set -euo pipefail
D=experiments/007-optimizers
OUT=${OUT:-runs/exp007}
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
mkdir -p "$OUT"
for lr in 0.02 0.01 0.04; do
  $QB train --config configs/tiny_muon.toml --set optimizer.muon.lr=$lr --run-dir "$OUT/muon_lr$lr"
done
$QB train --config configs/tiny_muon.toml --set training.seed=7 --run-dir "$OUT/muon_seed7"
$QB train --config configs/tiny.toml --set schedule.decay=wsd --set schedule.decay_fraction=0.2 \
  --run-dir "$OUT/adamw_wsd"
for seed in 1337 7; do
  [ -d "runs/exp008/seed$seed" ] || \
    $QB train --config configs/tiny.toml --set training.seed=$seed --run-dir "runs/exp008/seed$seed"
done
python3 "$D/summarize.py" runs/exp008/seed1337 runs/exp008/seed7 "$OUT"/adamw_wsd \
  "$OUT"/muon_lr0.01 "$OUT"/muon_lr0.02 "$OUT"/muon_lr0.04 "$OUT"/muon_seed7 > "$D/results.md"
$QB plot runs/exp008/seed1337 "$OUT/adamw_wsd" "$OUT/muon_lr0.02" "$OUT/muon_seed7" --out "$D/plots"
$QB plot "$OUT/muon_lr0.01" "$OUT/muon_lr0.02" "$OUT/muon_lr0.04" --out "$D/plots/muon_lr"
