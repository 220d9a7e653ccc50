#!/usr/bin/env bash
# configs/dpo.toml on two binaries, alternating (OLD first), STEPS steps a run, ROUNDS rounds,
# each alone on every thread (benches/README.md, 2026-11-27, twelfth session): the run's
# seconds, its last logged tokens/s and peak RSS, and its step-1 loss and gradient norm.
#   bash benches/dpo_binaries_ab.sh OLD_BIN NEW_BIN START_MODEL OUT_DIR [STEPS] [ROUNDS] [--set k=v ...]
set -euo pipefail
OLD=$1; NEW=$2; FROM=$3; OUT=$4; STEPS=${5:-40}; ROUNDS=${6:-3}; shift 6 || shift $#
rm -rf "$OUT"; mkdir -p "$OUT"
lscpu | grep -E "Model name|^Model:|CPU family"
for round in $(seq 1 "$ROUNDS"); do
  for side in old new; do
    bin=$OLD; [ "$side" = new ] && bin=$NEW
    run="$OUT/$side-$round"
    start=$(date +%s.%N)
    /usr/bin/time -v "$bin" train --config configs/dpo.toml --run-dir "$run" \
      --set "model.from=\"$FROM\"" --set training.max_steps="$STEPS" --set training.eval_interval=100000 \
      --set logging.interval=1 "$@" > "$run.log" 2>&1
    end=$(date +%s.%N)
    python3 - "$run" "$side" "$round" "$start" "$end" <<'PY'
import json, re, sys
run, side, rnd, start, end = sys.argv[1:]
train = [r for r in map(json.loads, open(f"{run}/metrics.jsonl")) if r["split"] == "train"]
steps = [b["elapsed_secs"] - a["elapsed_secs"] for a, b in zip(train, train[1:])]
steps.sort()
rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{run}.log").read())
print(f"round {rnd} {side}: median step {1000 * steps[len(steps) // 2]:.1f} ms over steps 2..,"
      f" process {float(end) - float(start):.1f} s, peak RSS {int(rss.group(1)) / 1e6:.2f} GB,"
      f" step-1 loss {train[0]['loss']:.9g}, grad norm {train[0]['grad_norm']:.9g}")
PY
  done
done
