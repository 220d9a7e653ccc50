# Shared by round7.sh, round8.sh and round9.sh (sourced after common.sh): the SFT on answers
# worked column by column (datasets/arith/small/sft_columns.jsonl) and GRPO from it, with room
# for the longer answers; trajectory evaluates a run's checkpoints.
COLS='data.inputs=["datasets/arith/small/sft_columns.jsonl"]'
cols_sft() { # name seed [--set k=v ...]: arith_sft.toml on the columns answers from OUT/tiny
  local name=$1 seed=$2
  shift 2
  RAYON_NUM_THREADS=1 "$BIN" train --config configs/arith_sft.toml --run-dir "$OUT/$name" \
    --set training.seed=$seed --set "model.from=\"$OUT/tiny\"" --set "$COLS" "$@" \
    > "$OUT/$name.log" 2>&1
}
cols_eval() { # name model [--samples K]: eval --generate with room for the worked answers
  local e
  e=$(RAYON_NUM_THREADS=1 "$BIN" eval --model "$2" --generate $SMALL/heldout.jsonl \
    --max-new-tokens 48 "${@:3}" --json)
  record "$1" "$e"
}
cols_grpo() { # name sft seed [--set k=v ...]: grpo.toml with completions of up to 40 tokens in
  # rows of 80, then evaluated with 8 samples
  grpo "$1" "$2" "$3" --set rl.max_new_tokens=40 --set training.seq_len=80 \
    --set checkpoint.keep_last=10 "${@:4}" && cols_eval "$1" "$OUT/$1" --samples 8
}
cols_run() { # steps seed: the columns SFT in STEPS steps, evaluated, then GRPO at lr 5e-5
  local sft="cols$1-s$2"
  cols_sft "$sft" "$2" --set training.max_steps="$1"
  cols_eval "$sft" "$OUT/$sft" --samples 8
  cols_grpo "cols$1-lr5e5-s$2" "$OUT/$sft" "$2" --set optimizer.lr=5e-5 --set schedule.min_lr=5e-6
}
trajectory() { # name: greedy accuracy of each of the run's checkpoints before its last
  local cks=("$OUT/$1"/checkpoints/step-*) ck
  for ck in "${cks[@]:0:${#cks[@]}-1}"; do cols_eval "$1@$((10#${ck##*step-}))" "$ck"; done
}
