#!/bin/bash
# f32 paths of two binaries, alternating: benches/f32_before_after.sh OLD_BIN NEW_BIN [ROUNDS]
# The jobs of compare_pytorch.py at f32: bench-dense and bench-moe training, LoRA on the 0.6B
# shape (f32 base), and the 0.6B shape's prefill and decode. Each line: round, binary, job, figures.
cd "$(dirname "$0")/.."
OLD=${1:?old binary}; NEW=${2:?new binary}; ROUNDS=${3:-2}
for r in $(seq 1 "$ROUNDS"); do
  for bin in "$OLD" "$NEW"; do
    for c in configs/bench-dense.toml configs/bench-moe.toml configs/bench-lora-0.6b.toml; do
      $bin bench train --config $c --steps 5 --warmup 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print('round $r', '$bin', '$c', 'train tok/s', round(d['tokens_per_sec']), 'final_loss', d['final_loss'])"
    done
    $bin bench generate --config configs/bench-lora-0.6b.toml --prompt-len 128 --new-tokens 32 --repeats 3 --json 2>/dev/null | python3 -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print('round $r', '$bin', '0.6b f32 prefill', round(d['prompt_tokens_per_sec'],1), 'decode', round(d['decode_tokens_per_sec'],1))"
  done
done
