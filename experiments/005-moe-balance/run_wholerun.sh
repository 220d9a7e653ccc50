#!/usr/bin/env bash
# Experiment 005, second round (issue "MoE balance that holds for the whole run"): the balancing
# settings judged over the whole run, two seeds each, with configs/tiny_moe.toml as shipped
# (one flex device, 4 micro-batches of 4 x 128 tokens, 150 steps). Every logged step's
# per-layer whole-step load counts, not only the last one. From the repository root:
#   bash experiments/005-moe-balance/run_wholerun.sh
set -euo pipefail
D=experiments/005-moe-balance
OUT=${OUT:-runs/exp005-wholerun}
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
rm -rf "$OUT"
variant() { # name, then --set overrides
  local name=$1; shift
  for seed in 1337 2; do
    $QB train --config configs/tiny_moe.toml --run-dir "$OUT/${name}_seed$seed" \
      --set training.seed=$seed --set checkpoint.interval=0 --set training.sample_interval=0 "$@"
  done
}
# The shipped default: global-batch loss 0.1, aux-loss-free bias 1e-3, capacity 1.1.
variant default
# The previous default (no capacity).
variant gb0.1_bias1e-3 --set model.router_capacity_factor=0
# The capacity alone, no balancing loss and no bias.
variant capacity1.1_only --set model.router_aux_loss_coef=0 --set model.router_bias_update_rate=0
# A looser capacity.
variant capacity1.25 --set model.router_capacity_factor=1.25
# Per-layer loss 0.1 and HF's pooled loss 0.01 (HF's own setting), without capacity or bias.
variant per_layer0.1 --set model.router_capacity_factor=0 --set model.router_bias_update_rate=0 \
  --set 'model.router_aux_loss_type="per_layer"'
variant hf0.01 --set model.router_capacity_factor=0 --set model.router_bias_update_rate=0 \
  --set 'model.router_aux_loss_type="hf"' --set model.router_aux_loss_coef=0.01
python3 $D/wholerun.py "$OUT" > $D/results_wholerun.md
$QB plot --table "$OUT/worst_layer.jsonl" --x step --y max_over_mean_load --series run \
  --out $D/plots/wholerun_worst_layer.png --title "worst MoE layer over the whole run: max/mean load"
$QB plot --table "$OUT/val.jsonl" --x step --y loss --series run --out $D/plots/wholerun_val_loss.png \
  --title "validation loss (routing without capacity)"
