#!/usr/bin/env bash
# configs/grpo.toml on two binaries, alternating (OLD first), STEPS steps a run, ROUNDS rounds,
# each alone on every thread (benches/README.md, 2026-11-27, twelfth session); then
# benches/grpo_skip_ab.py on the runs (OUT/old-N, OUT/new-N).
#   bash benches/grpo_binaries_ab.sh OLD_BIN NEW_BIN SFT_RUN OUT_DIR [STEPS] [ROUNDS]
set -euo pipefail
OLD=$1; NEW=$2; SFT=$3; OUT=$4; STEPS=${5:-12}; ROUNDS=${6:-2}
rm -rf "$OUT"; mkdir -p "$OUT"
lscpu | grep -E "Model name|^Model:|CPU family"
for round in $(seq 1 "$ROUNDS"); do
  for side in old new; do
    bin=$OLD; [ "$side" = new ] && bin=$NEW
    run="$OUT/$side-$round"
    echo "round $round, $side ($bin): $(uptime)"
    /usr/bin/time -v "$bin" train --config configs/grpo.toml --run-dir "$run" \
      --set "model.from=\"$SFT\"" --set training.max_steps="$STEPS" --set logging.interval=1 \
      > "$run.log" 2>&1
    grep -E "Maximum resident" "$run.log"
  done
done
python3 benches/grpo_skip_ab.py "$OUT"
