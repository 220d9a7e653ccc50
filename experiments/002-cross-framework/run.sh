#!/usr/bin/env bash
# Cross-framework training check. From the repository root:
#   bash experiments/002-cross-framework/run.sh [PYTHON]
# PYTHON defaults to /root/venv-hf/bin/python (torch + transformers; see ../../crates/model/tests/fixtures/README.md).
set -euo pipefail
PY=${1:-/root/venv-hf/bin/python}
D=experiments/002-cross-framework
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
OUT=runs/exp002
rm -rf "$OUT" && mkdir -p "$OUT"
$QB init --config $D/config.toml --out $OUT/init_hf                      # step-0 weights, HF format
$QB batches --config $D/config.toml --steps 250 --out $OUT/batches.jsonl # the exact batch order
$QB train --config $D/config.toml --run-dir $OUT/qwen-burn               # our run
$PY $D/train_hf.py --config $D/config.toml --init $OUT/init_hf --batches $OUT/batches.jsonl --out $OUT/pytorch
# Control: the same PyTorch run on 1 thread (only the order of float additions changes).
$PY $D/train_hf.py --config $D/config.toml --init $OUT/init_hf --batches $OUT/batches.jsonl --out $OUT/pytorch_1thread --threads 1
$PY $D/compare.py $OUT/qwen-burn/metrics.jsonl $OUT/pytorch/metrics.jsonl \
  --control $OUT/pytorch_1thread/metrics.jsonl --table $OUT/diffs.jsonl | tee $D/result.txt
$QB plot $OUT/qwen-burn $OUT/pytorch --out $D/plots
$QB plot --table $OUT/diffs.jsonl --x step --y abs_diff --series pair --log-y --out $D/plots/loss_diff.png \
  --title "per-step |loss difference|"

