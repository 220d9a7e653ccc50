#!/usr/bin/env bash
# Muon on LoRA adapters (issue "Hostile input, round two", item 7): LoRA SFT of a tiny base with
# AdamW, and with Muon as it treated the adapters before (every adapter factor a "hidden
# matrix"), at ranks 1, 2, 4 and 8, two seeds, 30 steps, validation every 10. From the repository
# root, with a trained tiny base (BASE, default runs/tiny):
#   bash experiments/007-optimizers/lora_muon.sh
set -euo pipefail
QB=${QB:-"cargo run --release --quiet --"}
BASE=${BASE:-runs/tiny}
OUT=${OUT:-runs/exp007-lora-muon}
D=experiments/007-optimizers
mkdir -p "$OUT"
for kind in ${KINDS:-adamw muon}; do
  for rank in ${RANKS:-1 2 4 8}; do
    for seed in 7 8; do
      name=${kind}_r${rank}_seed$seed
      rm -rf "$OUT/$name"
      $QB train --config configs/finetune.toml --run-dir "$OUT/$name" \
        --set "model.from=\"$BASE\"" --set "optimizer.kind=\"$kind\"" --set lora.rank=$rank \
        --set lora.alpha=$((2 * rank)).0 --set training.seed=$seed --max-steps 30 \
        --set training.eval_interval=10 --set training.sample_interval=0 \
        --set checkpoint.interval=0 ${EXTRA:-} > "$OUT/$name.log" 2>&1 || echo "$name failed"
    done
  done
done
python3 $D/lora_muon.py "$OUT"
