#!/usr/bin/env bash
# Experiment 004: RoPE scaling. Train at T=64, evaluate perplexity on held-out Persuasion at
# T, 2T and 4T with no scaling, linear, dynamic NTK and YaRN. From the repository root:
#   bash experiments/004-rope-scaling/run.sh
set -euo pipefail
D=experiments/004-rope-scaling
OUT=runs/exp004
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
TEXT=datasets/austen/austen_persuasion.txt.gz
rm -rf $OUT && mkdir -p $OUT
$QB train --config $D/config.toml --run-dir $OUT/run
$QB export --checkpoint $OUT/run --out $OUT/hf
: > $OUT/results.jsonl
for ctx in 64 128 256; do
  for method in none linear dynamic yarn; do
    dir=$OUT/variants/$method-$ctx
    mkdir -p $dir && cp $OUT/hf/* $dir/
    python3 $D/set_rope.py $dir/config.json $method $ctx 64
    result=$($QB eval --model $dir --text $TEXT --context $ctx --max-tokens 65536)
    echo "{\"method\": \"$method\", \"context\": $ctx, \"result\": $result}" | python3 -c \
      'import json,sys; r=json.load(sys.stdin); print(json.dumps({"method": r["method"], "context": r["context"], "perplexity": r["result"]["perplexity"], "loss": r["result"]["loss"]}))' >> $OUT/results.jsonl
    tail -1 $OUT/results.jsonl
  done
done
cp $OUT/results.jsonl $D/results.jsonl
$QB plot --table $D/results.jsonl --x context --y perplexity --series method --log-y \
  --out $D/plots/perplexity_vs_context.png --title "held-out perplexity vs context (trained at 64)"
$QB plot $OUT/run --out $D/plots/training
