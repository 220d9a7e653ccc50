# Shared by round2.sh and round3.sh (sourced after BIN, OUT and CHECKPOINT_INTERVAL are set):
# evaluate NAME MODEL appends the model's eval --generate line (all 500 held-out prompts,
# pass@1..8) to OUT/results.jsonl; grpo NAME SFT SEED [--set k=v ...] runs configs/grpo.toml
# from SFT on one thread.
SMALL=datasets/arith/small
evaluate() { # name model
  local e
  e=$(RAYON_NUM_THREADS=1 "$BIN" eval --model "$2" --generate $SMALL/heldout.jsonl --max-new-tokens 32 --samples 8 --json)
  python3 -c 'import json,sys; e=json.loads(sys.argv[2]); e["run"]=sys.argv[1]; print(json.dumps(e))' "$1" "$e" >> "$OUT/results.jsonl"
}
grpo() { # name sft seed [--set k=v ...]
  local name=$1 sft=$2 seed=$3
  shift 3
  RAYON_NUM_THREADS=1 "$BIN" train --config configs/grpo.toml --run-dir "$OUT/$name" \
    --set training.seed=$seed --set "model.from=\"$sft\"" \
    --set checkpoint.interval=$CHECKPOINT_INTERVAL "$@" > "$OUT/$name.log" 2>&1
}
