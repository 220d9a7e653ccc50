#!/usr/bin/env bash
# Round 5 (eighth session): GRPO variants from round 4's weight-decay SFT runs (seeds 1337 and 2).
#   bash experiments/011-grpo/round5.sh BIN ROUND4_OUT OUT STAGE   (STAGE: t07, s200, g16, s34 or avg)
# Each stage runs its two seeds side by side, one thread each, then evaluates them as
# common.sh does. The GRPO base is round 4's (`b64`): 64 prompts a step, lr 2e-4 decayed to 2e-5.
set -euo pipefail
BIN=$1; R4=$2; OUT=$3; STAGE=$4; CHECKPOINT_INTERVAL=25
mkdir -p "$OUT"
source experiments/011-grpo/common.sh
if [ "$STAGE" = avg ]; then
  # Weights averaged over round 4's GRPO checkpoints (steps 75-100 and 50-100), greedy only.
  for seed in 1337 2; do
    for step in 050 075 100; do
      "$BIN" export --checkpoint "$R4/sftwd-b64lr2e4-s$seed/checkpoints/step-00000$step" \
        --out "$OUT/x-s$seed-$step" > /dev/null
    done
    python experiments/011-grpo/average_checkpoints.py "$OUT/avg2-s$seed" "$OUT"/x-s$seed-{075,100}
    python experiments/011-grpo/average_checkpoints.py "$OUT/avg3-s$seed" "$OUT"/x-s$seed-{050,075,100}
    for m in "avg2-s$seed" "avg3-s$seed" "x-s$seed-075"; do greedy "$m" "$OUT/$m"; done
  done
  exit 0
fi
case $STAGE in
  t07) extra=(--set rl.temperature=0.7) ;;
  s200) extra=(--set training.max_steps=200) ;;
  g16) extra=(--set rl.group_size=16 --set training.batch_size=32) ;;  # the same 512 rows a step
  s34) extra=(); SEEDS="3 4" ;;  # the shipped setting from round 4's seeds 3 and 4
  *) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
for seed in ${SEEDS:-1337 2}; do
  name="sftwd-$STAGE-s$seed"
  b64 "$name" "$R4/sftwd-s$seed" $seed "${extra[@]}" &
done
wait
