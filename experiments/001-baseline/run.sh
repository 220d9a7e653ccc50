#!/usr/bin/env bash
# Baseline: the README's main job, then its plots. From the repository root:
#   bash experiments/001-baseline/run.sh
set -euo pipefail
D=experiments/001-baseline
rm -rf runs/tiny
${QB:-cargo run --release --} train --config configs/tiny.toml 2>&1 | tee $D/train.log
${QB:-cargo run --release --} plot runs/tiny --out $D/plots
cp runs/tiny/samples.jsonl $D/samples.jsonl
