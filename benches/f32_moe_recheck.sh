#!/bin/bash
# bench-moe and bench-dense (f32) of two binaries, alternating, four rounds of 10 timed steps
# after 2 warm-up steps: tokens/s, median step ms and the final loss.
# Usage: benches/f32_moe_recheck.sh OLD_BIN NEW_BIN  (from anywhere)
cd "$(dirname "$0")/.."
OLD=${1:?old binary}; NEW=${2:?new binary}
fig() { python3 -c "import json,sys
for l in sys.stdin:
    l=l.strip()
    if l.startswith('{'):
        d=json.loads(l); print(round(d['tokens_per_sec']), round(d['step_ms_median'],1), d['final_loss'])"; }
for round in 1 2 3 4; do
  for side in old new; do
    bin=$OLD; [ "$side" = new ] && bin=$NEW
    for cfg in bench-moe bench-dense; do
      echo "round $round $side $cfg: $("$bin" bench train --config configs/$cfg.toml --steps 10 --warmup 2 --json 2>/dev/null | fig)"
    done
  done
done
