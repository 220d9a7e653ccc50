#!/usr/bin/env bash
# Experiment 005: MoE load-balancing losses (hf, per_layer, sequence, global_batch) x two
# coefficients, aux-loss-free balancing, and the dense twin at equal active parameters; then a
# second seed for the candidates and a few stronger settings. Every run: configs/tiny_moe.toml
# (or its dense twin), 150 steps of 16 x 128 tokens laid out as 4 micro-batches of 4 sequences
# on two replicas (flex,flex), so the global batch (16 sequences) is larger than a micro-batch
# (4). From the repository root:
#   bash experiments/005-moe-balance/run.sh
set -euo pipefail
D=experiments/005-moe-balance
OUT=${OUT:-runs/exp005}
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
COMMON=(--max-steps 150 --device flex,flex --set training.batch_size=4 --set training.grad_accum=4)
moe() { # run-dir kind coef bias-rate seed
  $QB train --config configs/tiny_moe.toml --run-dir "$1" "${COMMON[@]}" --set training.seed=$5 \
    --set model.router_aux_loss_type="\"$2\"" --set model.router_aux_loss_coef=$3 \
    --set model.router_bias_update_rate=$4
}
rm -rf "$OUT" "$OUT-seed2" "$OUT-extra"
# 1. The sweep, seed 1337.
$QB train --config $D/dense.toml --run-dir "$OUT/dense_active" "${COMMON[@]}"
for kind in hf per_layer sequence global_batch; do
  for coef in 0.01 0.1; do
    moe "$OUT/${kind}_${coef}" $kind $coef 0.0 1337
  done
done
moe "$OUT/auxfree_1e-3" hf 0.0 0.001 1337
# 2. Seed 2 for the candidates.
for spec in hf:0.01 per_layer:0.01 per_layer:0.1 sequence:0.1 global_batch:0.1; do
  moe "$OUT-seed2/${spec%%:*}_${spec##*:}" ${spec%%:*} ${spec##*:} 0.0 2
done
# 3. Stronger settings, both seeds: global_batch at 0.3; global_batch 0.1 plus the bias.
for seed in 1337 2; do
  moe "$OUT-extra/global_batch_0.3_seed$seed" global_batch 0.3 0.0 $seed
  moe "$OUT-extra/global_batch_0.1_bias0.001_seed$seed" global_batch 0.1 0.001 $seed
  moe "$OUT-extra/global_batch_0.1_bias0.01_seed$seed" global_batch 0.1 0.01 $seed
done
python3 $D/summarize.py "$OUT" > $D/results.md
python3 $D/summarize.py "$OUT-seed2" > $D/results_seed2.md
python3 $D/summarize.py "$OUT-extra" > $D/results_extra.md
$QB plot --table "$OUT/worst_layer.jsonl" --x step --y max_over_mean_load --series run \
  --out $D/plots/worst_layer_imbalance.png --title "worst MoE layer: max/mean expert load (whole step)"
$QB plot --table "$OUT/val.jsonl" --x step --y loss --series run --out $D/plots/val_loss.png \
  --title "validation loss"
for r in hf_0.01 per_layer_0.1 global_batch_0.1; do
  $QB plot --table "$OUT/per_layer_$r.jsonl" --x step --y max_over_mean_load --series layer \
    --out $D/plots/layers_$r.png --title "$r: max/mean load per layer"
done
$QB plot --table "$OUT-extra/per_layer_global_batch_0.1_bias0.001_seed1337.jsonl" --x step \
  --y max_over_mean_load --series layer --out $D/plots/layers_default.png \
  --title "configs/tiny_moe.toml default: max/mean load per layer"
