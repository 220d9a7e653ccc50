#!/bin/bash
# Mixed-precision bench-dense at two vocabularies, two binaries alternating (three rounds):
#   benches/head_packed_once.sh OLD_BIN NEW_BIN
# Output: benches/head_packed_once_2026-11-28.txt (OLD = 3e36f68's binary, NEW = 1223e2c's).
cd "$(dirname "$0")/.."
OLD=${1:?old binary}; NEW=${2:?new binary}
for r in 1 2 3; do
  for b in "$OLD" "$NEW"; do
    for v in 8192 151936; do
      echo -n "round $r $b vocab $v: "
      $b bench train --config configs/bench-dense.toml --set training.precision=bf16 \
        --set model.vocab_size=$v --steps 5 --warmup 2 --json 2>/dev/null | tail -1 |
        python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print(round(d['tokens_per_sec']), 'tok/s', 'loss', d['final_loss'], 'rss', round(d['peak_rss_mb']))"
    done
  done
done
