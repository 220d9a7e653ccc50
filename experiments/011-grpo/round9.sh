#!/usr/bin/env bash
# Round 9 (twelfth session, the same Zen 3 as rounds 7-8): configs/grpo.toml as shipped, whose
# steps now leave zero-advantage rows out of the update (rl.skip_zero_advantage_rows unset), from
# round 7's 600-step columns SFT runs (OUT/cols600-s1337, OUT/cols600-s2): the whole run against
# round 8's stage t06, the same settings on every row.
#   bash experiments/011-grpo/round9.sh BIN OUT     # OUT: round 7's directory
# Each run on one thread, the two side by side; its 25-step checkpoints evaluated greedily on all
# 500 held-out prompts afterwards.
set -euo pipefail
BIN=$1; OUT=$2; CHECKPOINT_INTERVAL=25
source experiments/011-grpo/common.sh
source experiments/011-grpo/columns.sh
for seed in 1337 2; do
  (grpo "skip-s$seed" "$OUT/cols600-s$seed" $seed --set checkpoint.keep_last=10 \
     && cols_eval "skip-s$seed" "$OUT/skip-s$seed" --samples 8 && trajectory "skip-s$seed") &
done
wait
