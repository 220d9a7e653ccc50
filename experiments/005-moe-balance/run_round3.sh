#!/usr/bin/env bash
# Experiment 005, third round (issue "MoE routers that balance on their own"): the router's own
# choice (how validation, eval, generate and an export route), judged over the whole run, two
# seeds each, configs/tiny_moe.toml (one flex device, 4 micro-batches of 4 x 128 tokens, 150
# steps, logged every 10). From the repository root:
#   bash experiments/005-moe-balance/run_round3.sh [variant ...]
set -euo pipefail
D=experiments/005-moe-balance
OUT=${OUT:-runs/exp005-round3}
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
SEEDS=${SEEDS:-"1337 2"}
mkdir -p "$OUT"
variant() { # name, then --set overrides
  local name=$1; shift
  for seed in $SEEDS; do
    rm -rf "$OUT/${name}_seed$seed"
    $QB train --config configs/tiny_moe.toml --run-dir "$OUT/${name}_seed$seed" \
      --set training.seed=$seed --set checkpoint.interval=0 --set training.sample_interval=0 "$@" \
      > "$OUT/${name}_seed$seed.log" 2>&1
  done
}
run() {
  case $1 in
    # The configuration as shipped.
    shipped) variant shipped ;;
    # Round two's default: no centring, no assignment loss.
    capacity) variant capacity --set model.router_centering=false --set model.router_capacity_factor=1.1 \
      --set model.router_assignment_loss_coef=0 ;;
    # Centring with the loss and the bias, no capacity.
    center_gb_bias) variant center_gb_bias --set model.router_centering=true --set model.router_capacity_factor=0 --set model.router_assignment_loss_coef=0 ;;
    # Centring with the loss only.
    center_gb) variant center_gb --set model.router_centering=true --set model.router_capacity_factor=0 --set model.router_assignment_loss_coef=0 \
      --set model.router_bias_update_rate=0 ;;
    # Centring alone: no loss in the objective, no bias, no capacity.
    center_only) variant center_only --set model.router_centering=true --set model.router_capacity_factor=0 --set model.router_assignment_loss_coef=0 \
      --set model.router_bias_update_rate=0 --set model.router_aux_loss_coef=0 ;;
    # Neither centring nor capacity: loss + bias (the collapsing setting of round two).
    gb_bias) variant gb_bias --set model.router_centering=false --set model.router_capacity_factor=0 --set model.router_assignment_loss_coef=0 ;;
    # Centring with a faster sign-rule bias.
    center_gb_bias3e-3) variant center_gb_bias3e-3 --set model.router_centering=true --set model.router_capacity_factor=0 --set model.router_assignment_loss_coef=0 \
      --set model.router_bias_update_rate=0.003 ;;
    center_gb_bias1e-2) variant center_gb_bias1e-2 --set model.router_centering=true --set model.router_capacity_factor=0 --set model.router_assignment_loss_coef=0 \
      --set model.router_bias_update_rate=0.01 ;;
    # Faster bias without centring (control for the above).
    gb_bias1e-2) variant gb_bias1e-2 --set model.router_centering=false --set model.router_capacity_factor=0 --set model.router_assignment_loss_coef=0 \
      --set model.router_bias_update_rate=0.01 ;;
    # Centring with the capacity of round two.
    center_capacity) variant center_capacity --set model.router_centering=true --set model.router_capacity_factor=1.1 \
      --set model.router_assignment_loss_coef=0 ;;
    # The assignment loss: the router trained toward the capped assignment (with centring,
    # capacity, loss and bias as shipped), at several weights, and without centring.
    assign0.1|assign0.3|assign0.5|assign1.0|assign2.0)
      variant $1 --set model.router_centering=true --set model.router_capacity_factor=1.1 \
        --set model.router_assignment_loss_coef=${1#assign} ;;
    assign1.0_nocenter) variant $1 --set model.router_centering=false --set model.router_capacity_factor=1.1 \
      --set model.router_assignment_loss_coef=1.0 ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}
for v in "${@:-shipped}"; do run "$v"; done
python3 $D/round3.py "$OUT" > $D/results_round3.md
