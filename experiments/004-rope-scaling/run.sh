#!/usr/bin/env bash
# Experiment 004: RoPE scaling. Train at T=64, evaluate perplexity on held-out Persuasion at
# T, 2T and 4T with no scaling, linear, dynamic NTK and YaRN. From the repository root:
#   bash experiments/004-rope-scaling/run.sh
set -euo pipefail
D=experiments/004-rope-scaling
OUT=runs/exp004
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
TEXT=datasets/austen/austen_persuasion.txt.gz
if [ "${EVAL_ONLY:-0}" != 1 ]; then   # EVAL_ONLY=1 re-evaluates an existing $OUT/hf
  rm -rf $OUT && mkdir -p $OUT
  $QB train --config $D/config.toml --run-dir $OUT/run
  $QB export --checkpoint $OUT/run --out $OUT/hf
fi
rm -rf $OUT/variants
: > $OUT/results.jsonl
: > $OUT/positions.jsonl
for ctx in 64 128 256; do
  for method in none linear dynamic yarn; do
    dir=$OUT/variants/$method-$ctx
    mkdir -p $dir && cp $OUT/hf/* $dir/
    python3 $D/set_rope.py $dir/config.json $method $ctx 64
    # Loss by position in buckets of 32: positions past 64 were never seen in training.
    $QB eval --model $dir --text $TEXT --context $ctx --max-tokens 65536 --bucket 32 > $dir/eval.json
    python3 - "$method" "$ctx" "$dir/eval.json" "$OUT" <<'PY'
import json, sys
method, ctx, path, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
r = json.load(open(path))
with open(f"{out}/results.jsonl", "a") as f:
    f.write(json.dumps({"method": method, "context": ctx, "perplexity": r["perplexity"], "loss": r["loss"]}) + "\n")
with open(f"{out}/positions.jsonl", "a") as f:
    for b in r["loss_by_position"]:
        f.write(json.dumps({"method": method, "context": ctx, "position": b["to"], "loss": b["loss"]}) + "\n")
PY
    tail -1 $OUT/results.jsonl
  done
done
grep '"context": 256' $OUT/positions.jsonl > $OUT/positions-256.jsonl
cp $OUT/results.jsonl $OUT/positions.jsonl $D/
$QB plot --table $D/results.jsonl --x context --y perplexity --series method --log-y \
  --out $D/plots/perplexity_vs_context.png --title "held-out perplexity vs context (trained at 64)"
$QB plot --table $OUT/positions-256.jsonl --x position --y loss --series method \
  --out $D/plots/loss_by_position_256.png --title "loss by position, windows of 256 (trained at 64)"
$QB plot $OUT/run --out $D/plots/training
