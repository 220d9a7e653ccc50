#!/usr/bin/env bash
# configs/grpo.toml on two sides, alternating (A first), STEPS steps a run, ROUNDS rounds, each
# alone on every thread (benches/README.md, 2026-11-27, twelfth session); the --sets after the
# sides apply to side B only. Then benches/grpo_ab.py on the runs (OUT/A-N, OUT/B-N).
#   bash benches/grpo_ab.sh A_NAME A_BIN B_NAME B_BIN SFT_RUN OUT_DIR STEPS ROUNDS [--set k=v ...]
# Leaving zero-advantage rows out (the default) against every row, and two binaries:
#   bash benches/grpo_ab.sh skip BIN all BIN SFT OUT 12 2 --set rl.skip_zero_advantage_rows=false
#   bash benches/grpo_ab.sh old OLD_BIN new NEW_BIN SFT OUT 12 2
set -euo pipefail
A=$1; A_BIN=$2; B=$3; B_BIN=$4; SFT=$5; OUT=$6; STEPS=$7; ROUNDS=$8
shift 8
rm -rf "$OUT"; mkdir -p "$OUT"
lscpu | grep -E "Model name|^Model:|CPU family"
for round in $(seq 1 "$ROUNDS"); do
  for side in "$A" "$B"; do
    bin=$A_BIN; sets=()
    if [ "$side" = "$B" ]; then bin=$B_BIN; sets=("$@"); fi
    run="$OUT/$side-$round"
    echo "round $round, $side ($bin): $(uptime)"
    /usr/bin/time -v "$bin" train --config configs/grpo.toml --run-dir "$run" \
      --set "model.from=\"$SFT\"" --set training.max_steps="$STEPS" --set logging.interval=1 \
      "${sets[@]}" > "$run.log" 2>&1
    grep -E "Maximum resident" "$run.log"
  done
done
python3 benches/grpo_ab.py "$OUT"
