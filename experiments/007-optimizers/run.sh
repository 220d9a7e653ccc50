#!/usr/bin/env bash
# Experiment 007: AdamW against Muon, cosine against warmup-stable-decay, on the README's tiny
# model (configs/tiny.toml: 500 steps of 16 x 128 tokens of the shipped corpus), equal steps and
# tokens for every run.
#  1. AdamW + cosine (configs/tiny.toml) at peak lr 1.5e-3, 3e-3 (the config's), 6e-3, 1.2e-2.
#  2. Muon + WSD (configs/tiny_muon.toml) at Muon peak lr 0.0025, 0.005, 0.01, 0.02 (the
#     config's), 0.04; the AdamW group (embeddings, norms) at the config's 3e-3.
#  3. The schedule alone: AdamW + WSD and Muon + cosine at the default rates.
#  4. Second seed (7) for the four default-rate runs: AdamW/Muon x cosine/WSD.
# From the repository root (a finished run directory is kept, so the script can be re-run):
#   bash experiments/007-optimizers/run.sh
set -euo pipefail
D=experiments/007-optimizers
OUT=${OUT:-runs/exp007}
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
mkdir -p "$OUT"
# Muon with the cosine schedule: tiny_muon.toml without its WSD keys.
sed -e 's/^decay = "wsd".*/decay = "cosine"/' -e '/^decay_fraction/d' -e '/^decay_shape/d' \
  configs/tiny_muon.toml > "$OUT/tiny_muon_cosine.toml"

run() { # name config overrides...
  local name=$1 config=$2
  shift 2
  if [ -f "$OUT/$name/checkpoints/step-00000500/state.json" ]; then return; fi
  rm -rf "${OUT:?}/$name"
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  $QB train --config "$config" "${sets[@]}" --run-dir "$OUT/$name" > "$OUT/$name.log" 2>&1
  tail -n 2 "$OUT/$name.log"
}

for seed in 1337 7; do
  run adamw_cosine_s$seed configs/tiny.toml training.seed=$seed
  run muon_wsd_s$seed configs/tiny_muon.toml training.seed=$seed
  run adamw_wsd_s$seed configs/tiny.toml training.seed=$seed schedule.decay=wsd schedule.decay_fraction=0.2
  run muon_cosine_s$seed "$OUT/tiny_muon_cosine.toml" training.seed=$seed
done
for lr in 1.5e-3 6e-3 1.2e-2; do
  run adamw_cosine_lr${lr}_s1337 configs/tiny.toml optimizer.lr=$lr
done
for lr in 0.0025 0.005 0.01 0.04; do
  run muon_wsd_lr${lr}_s1337 configs/tiny_muon.toml optimizer.muon.lr=$lr
done

runs=()
for r in adamw_cosine adamw_wsd muon_cosine muon_wsd; do runs+=("$OUT/${r}_s1337" "$OUT/${r}_s7"); done
sweep=("$OUT/adamw_cosine_lr1.5e-3_s1337" "$OUT/adamw_cosine_s1337" "$OUT/adamw_cosine_lr6e-3_s1337"
  "$OUT/adamw_cosine_lr1.2e-2_s1337" "$OUT/muon_wsd_lr0.0025_s1337" "$OUT/muon_wsd_lr0.005_s1337" "$OUT/muon_wsd_lr0.01_s1337"
  "$OUT/muon_wsd_s1337" "$OUT/muon_wsd_lr0.04_s1337")
python3 "$D/summarize.py" "${runs[@]}" "${sweep[@]}" > "$D/results.md"
$QB plot "$OUT/adamw_cosine_s1337" "$OUT/adamw_wsd_s1337" "$OUT/muon_cosine_s1337" \
  "$OUT/muon_wsd_s1337" --out "$D/plots"
$QB plot "$OUT/adamw_cosine_s7" "$OUT/adamw_wsd_s7" "$OUT/muon_cosine_s7" "$OUT/muon_wsd_s7" \
  --out "$D/plots/seed7"
$QB plot "${sweep[@]}" --out "$D/plots/lr_sweep"
