# Shared by round2.sh and round3.sh (sourced after BIN, OUT and CHECKPOINT_INTERVAL are set):
# evaluate NAME MODEL appends the model's eval --generate line (all 500 held-out prompts,
# pass@1..8; greedy NAME MODEL: greedy only) to OUT/results.jsonl; grpo NAME SFT SEED
# [--set k=v ...] runs configs/grpo.toml from SFT on one thread; b64 runs it at rounds 3-5's
# setting and evaluates.
SMALL=datasets/arith/small
record() { # name json: the eval line, tagged with the run's name, appended to OUT/results.jsonl
  python3 -c 'import json,sys; e=json.loads(sys.argv[2]); e["run"]=sys.argv[1]; print(json.dumps(e))' "$1" "$2" >> "$OUT/results.jsonl"
}
evaluate() { # name model
  local e
  e=$(RAYON_NUM_THREADS=1 "$BIN" eval --model "$2" --generate $SMALL/heldout.jsonl --max-new-tokens 32 --samples 8 --json)
  record "$1" "$e"
}
greedy() { # name model: greedy accuracy only
  local e
  e=$(RAYON_NUM_THREADS=1 "$BIN" eval --model "$2" --generate $SMALL/heldout.jsonl --max-new-tokens 32 --json)
  record "$1" "$e"
}
grpo() { # name sft seed [--set k=v ...]
  local name=$1 sft=$2 seed=$3
  shift 3
  RAYON_NUM_THREADS=1 "$BIN" train --config configs/grpo.toml --run-dir "$OUT/$name" \
    --set training.seed=$seed --set "model.from=\"$sft\"" \
    --set checkpoint.interval=$CHECKPOINT_INTERVAL "$@" > "$OUT/$name.log" 2>&1
}
b64() { # name sft seed [--set k=v ...]: grpo at 64 prompts a step, lr 2e-4 (min_lr 2e-5), then
  # evaluate; the caller's --sets come last, so they override these
  grpo "$1" "$2" "$3" --set training.batch_size=64 --set optimizer.lr=2e-4 \
    --set schedule.min_lr=2e-5 --set checkpoint.keep_last=10 "${@:4}" && evaluate "$1" "$OUT/$1"
}
