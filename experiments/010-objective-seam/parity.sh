#!/usr/bin/env bash
# Issue 37's "Done when": the metrics of configs/tiny.toml, tiny_moe.toml and finetune.toml are
# bit-identical before and after the training crate's reorganisation (the objective seam).
#   parity.sh BINARY OUT_DIR     runs the three configs (and two variants) with BINARY into OUT_DIR
#   parity.py OUT_A OUT_B        compares two such directories, timing fields aside
# finetune.toml starts from runs/tiny; both binaries read the same runs/tiny.
set -euo pipefail
bin=$1; out=$2
mkdir -p "$out"
cd "$(dirname "$0")/../.."
run() { name=$1; shift; "$bin" train --run-dir "$out/$name" "$@" >"$out/$name.log" 2>&1; }
run tiny --config configs/tiny.toml
run tiny_moe --config configs/tiny_moe.toml
run finetune --config configs/finetune.toml
# The per-run options that left process-wide statics: activation checkpointing and fused kernels.
run moe_ckpt --config configs/tiny_moe.toml --max-steps 30 --set training.activation_checkpointing="layers"
run tiny_composed --config configs/tiny.toml --max-steps 30 --set training.fused_kernels=false
