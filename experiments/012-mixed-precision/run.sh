#!/usr/bin/env bash
# Experiment 012 (issue 41): mixed precision (`training.precision = "bf16"`) against f32 on the
# shipped tiny dense and MoE configs, two seeds each, whole runs. One run at a time on all cores.
# Usage: experiments/012-mixed-precision/run.sh BIN OUT [CONFIGS]   (from the repository root;
# CONFIGS default "tiny tiny_moe"). Appends one JSON line per run (config, seed, precision, final
# validation loss, its curve, tokens/s) to OUT/results.jsonl.
set -euo pipefail
BIN=$1
OUT=$2
CONFIGS=${3:-tiny tiny_moe}
mkdir -p "$OUT"
for config in $CONFIGS; do
  for seed in 1337 7; do
    for precision in f32 bf16; do
      name="$config-$precision-s$seed"
      "$BIN" train --config "configs/$config.toml" --run-dir "$OUT/$name" \
        --set training.seed=$seed --set "training.precision=\"$precision\"" > "$OUT/$name.log" 2>&1
      python3 - "$OUT/$name" "$config" "$seed" "$precision" >> "$OUT/results.jsonl" <<'PY'
import json, sys
run, config, seed, precision = sys.argv[1:]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
val = [r for r in rows if r.get("split") == "val"]
train = [r for r in rows if r.get("split") == "train"]
tps = [r["tokens_per_sec"] for r in train if r.get("tokens_per_sec")]
print(json.dumps({"config": config, "seed": int(seed), "precision": precision,
                  "steps": train[-1]["step"], "final_val_loss": val[-1]["loss"],
                  "val_curve": [[r["step"], round(r["loss"], 4)] for r in val],
                  "final_train_loss": train[-1]["loss"],
                  "median_tokens_per_sec": sorted(tps)[len(tps) // 2] if tps else None}))
PY
    done
  done
done
