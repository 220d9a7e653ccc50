#!/usr/bin/env bash
# Experiment 005: MoE load-balancing losses (hf, per_layer, sequence, global_batch) x two
# coefficients, aux-loss-free balancing, and the dense twin at equal active parameters.
# Every run: configs/tiny_moe.toml (or its dense twin), 150 steps of 16 x 128 tokens laid out
# as 4 micro-batches of 4 sequences on two replicas (flex,flex), so the global batch (16
# sequences) is larger than a micro-batch (4). From the repository root:
#   bash experiments/005-moe-balance/run.sh
set -euo pipefail
D=experiments/005-moe-balance
OUT=${OUT:-runs/exp005}
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
COMMON=(--max-steps 150 --device flex,flex --set training.batch_size=4 --set training.grad_accum=4)
rm -rf "$OUT"
$QB train --config $D/dense.toml --run-dir "$OUT/dense_active" "${COMMON[@]}"
for kind in hf per_layer sequence global_batch; do
  for coef in 0.01 0.1; do
    $QB train --config configs/tiny_moe.toml --run-dir "$OUT/${kind}_${coef}" "${COMMON[@]}" \
      --set model.router_aux_loss_type="\"$kind\"" --set model.router_aux_loss_coef=$coef
  done
done
$QB train --config configs/tiny_moe.toml --run-dir "$OUT/auxfree_1e-3" "${COMMON[@]}" \
  --set model.router_aux_loss_coef=0.0 --set model.router_bias_update_rate=0.001
python3 $D/summarize.py "$OUT" > $D/results.md
$QB plot --table "$OUT/worst_layer.jsonl" --x step --y max_over_mean_load --series run \
  --out $D/plots/worst_layer_imbalance.png --title "worst MoE layer: max/mean expert load (whole step)"
$QB plot --table "$OUT/val.jsonl" --x step --y loss --series run --out $D/plots/val_loss.png \
  --title "validation loss"
for r in hf_0.01 per_layer_0.1 global_batch_0.1; do
  $QB plot --table "$OUT/per_layer_$r.jsonl" --x step --y max_over_mean_load --series layer \
    --out $D/plots/layers_$r.png --title "$r: max/mean load per layer"
done
