#!/usr/bin/env bash
# Experiment 003: dense vs MoE at equal active / equal total parameters, router aux-loss sweep
# and aux-loss-free balancing. From the repository root:
#   bash experiments/003-moe/run.sh
set -euo pipefail
D=experiments/003-moe
OUT=runs/exp003
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
rm -rf $OUT
$QB train --config $D/dense.toml --run-dir $OUT/dense_active
$QB train --config $D/dense.toml --run-dir $OUT/dense_total --set model.intermediate_size=1024
$QB train --config $D/moe.toml --run-dir $OUT/moe_aux0 --set model.router_aux_loss_coef=0.0
$QB train --config $D/moe.toml --run-dir $OUT/moe_aux1e-3 --set model.router_aux_loss_coef=0.001
$QB train --config $D/moe.toml --run-dir $OUT/moe_aux1e-2 --set model.router_aux_loss_coef=0.01
$QB train --config $D/moe.toml --run-dir $OUT/moe_auxfree --set model.router_aux_loss_coef=0.0 --set model.router_bias_update_rate=0.001
python3 $D/summarize.py $OUT > $D/results.md
for r in moe_aux0 moe_aux1e-3 moe_aux1e-2 moe_auxfree; do
  $QB plot $OUT/$r --out $D/plots/$r
done
$QB plot $OUT/dense_active $OUT/dense_total $OUT/moe_aux1e-2 --out $D/plots/dense_vs_moe
$QB plot --table $OUT/imbalance.jsonl --x step --y max_over_mean_load --series run --out $D/plots/imbalance_sweep.png \
  --title "expert load imbalance (max/mean, mean over layers)"
$QB plot --table $OUT/val.jsonl --x step --y loss --series run --out $D/plots/val_loss.png --title "validation loss"
