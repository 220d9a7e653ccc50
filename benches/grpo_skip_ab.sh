#!/usr/bin/env bash
# configs/grpo.toml with its zero-advantage rows left out of the update (the default) and with
# every row trained on (rl.skip_zero_advantage_rows = false), alternating, STEPS steps a run,
# ROUNDS rounds, alone on every thread (benches/README.md, 2026-11-27, twelfth session); then
# benches/grpo_skip_ab.py on the runs.
#   bash benches/grpo_skip_ab.sh BIN SFT_RUN OUT_DIR [STEPS] [ROUNDS]
set -euo pipefail
BIN=$1; SFT=$2; OUT=$3; STEPS=${4:-12}; ROUNDS=${5:-2}
rm -rf "$OUT"; mkdir -p "$OUT"
lscpu | grep -E "Model name|^Model:|CPU family"
for round in $(seq 1 "$ROUNDS"); do
  for mode in skip all; do
    set_skip=()
    [ "$mode" = all ] && set_skip=(--set rl.skip_zero_advantage_rows=false)
    run="$OUT/$mode-$round"
    echo "round $round, $mode: $(uptime)"
    /usr/bin/time -v "$BIN" train --config configs/grpo.toml --run-dir "$run" \
      --set "model.from=\"$SFT\"" --set training.max_steps="$STEPS" --set logging.interval=1 \
      "${set_skip[@]}" > "$run.log" 2>&1
    grep -E "Maximum resident" "$run.log"
  done
done
python3 benches/grpo_skip_ab.py "$OUT"
