#!/usr/bin/env bash
# Round 6 (ninth session): GRPO's learning-rate schedule, from round 4's weight-decay SFT runs
# (seeds 1337 and 2).
#   bash experiments/011-grpo/round6.sh BIN ROUND4_OUT OUT STAGE   (STAGE: const or lr3)
# Each stage runs its two seeds side by side, one thread each, then evaluates them as
# common.sh does. The base is round 4's (`b64`): 64 prompts a step, lr 2e-4 decayed to 2e-5 over
# 100 steps; round 5's 200-step run was still gaining at its end, with the rate decayed.
set -euo pipefail
BIN=$1; R4=$2; OUT=$3; STAGE=$4; CHECKPOINT_INTERVAL=25
mkdir -p "$OUT"
source experiments/011-grpo/common.sh
case $STAGE in
  const) extra=(--set schedule.min_lr=2e-4) ;;  # lr 2e-4 held after the warm-up
  lr3) extra=(--set optimizer.lr=3e-4 --set schedule.min_lr=3e-5) ;;
  *) echo "unknown stage $STAGE" >&2; exit 2 ;;
esac
for seed in 1337 2; do
  name="sftwd-$STAGE-s$seed"
  b64 "$name" "$R4/sftwd-s$seed" $seed "${extra[@]}" &
done
wait
