#!/usr/bin/env bash
# 25 steps of configs/grpo.toml, alone and on every thread, then benches/grpo_timing.py on them
# (benches/README.md, 2026-11-27, eleventh session): the CPU, the load average each minute, the
# run's peak RSS, steps per minute, the rollout's share and the decoding's tokens/s.
#   bash benches/grpo_timing_run.sh BIN SFT_RUN OUT_DIR
set -euo pipefail
BIN=$1; SFT=$2; OUT=$3
rm -rf "$OUT"
lscpu | grep -E "Model name|^Model:|CPU family"
uptime
/usr/bin/time -v "$BIN" train --config configs/grpo.toml --run-dir "$OUT" \
  --set "model.from=\"$SFT\"" --set training.max_steps=25 > "$OUT.log" 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do uptime; sleep 60; done
wait $pid
grep -E "done:|Maximum resident" "$OUT.log"
python3 benches/grpo_timing.py "$OUT"
