#!/usr/bin/env bash
# Experiment 006: packed rows with and without document masking.
#  1. SFT (configs/finetune.toml, LoRA on the README's tiny model): packing with the document
#     mask (the default), packing without it, and one conversation a row (pack = false); two
#     seeds. Every variant's final adapters are also scored one conversation a row (the step-0
#     validation of a padded run from the exported model), so all are judged on the same rows.
#  2. Text pretraining (configs/tiny.toml, 500 steps): data.document_mask true / false, two
#     seeds.
# From the repository root:
#   bash experiments/006-packing/run.sh
set -euo pipefail
D=experiments/006-packing
OUT=${OUT:-runs/exp006}
QB=${QB:-"cargo run --release --quiet --"}   # or QB=path/to/qwen-burn
rm -rf "$OUT"
mkdir -p "$OUT"

# 0. The base model of the fine-tuning runs: the README's main job.
$QB train --config configs/tiny.toml --run-dir "$OUT/base"

# 1. SFT variants x seeds.
variant_args() {
  case "$1" in
    masked) echo "--set data.pack=true" ;;
    leaky) echo "--set data.pack=true --set data.document_mask=false" ;;
    padded) echo "--set data.pack=false" ;;
  esac
}
for seed in 7 8; do
  for v in masked leaky padded; do
    run="$OUT/sft_${v}_seed$seed"
    # shellcheck disable=SC2046
    $QB train --config configs/finetune.toml --run-dir "$run" --set "model.from=\"$OUT/base\"" \
      --set training.seed=$seed $(variant_args $v)
    $QB export --checkpoint "$run" --out "$OUT/hf_${v}_seed$seed"
    # Step-0 validation one conversation a row (fresh zero adapters change nothing).
    $QB train --config configs/finetune.toml --run-dir "$OUT/eval_${v}_seed$seed" \
      --set "model.from=\"$OUT/hf_${v}_seed$seed\"" --set data.pack=false --max-steps 1 \
      --set checkpoint.interval=0
  done
done
# The padding share of each layout's batches (150 steps of the same data).
for v in masked padded; do
  # shellcheck disable=SC2046
  $QB batches --config configs/finetune.toml --set "model.from=\"$OUT/base\"" $(variant_args $v) \
    --steps 150 --out "$OUT/batches_$v.jsonl"
done

# 2. Text pretraining with and without the document mask.
for seed in 1337 2; do
  for mask in true false; do
    $QB train --config configs/tiny.toml --run-dir "$OUT/text_mask_${mask}_seed$seed" \
      --set training.seed=$seed --set data.document_mask=$mask
  done
done

python3 $D/summarize.py "$OUT" > $D/results.md
$QB plot --table "$OUT/sft_val.jsonl" --x step --y loss --series run --out $D/plots/sft_val_loss.png \
  --title "SFT validation loss (each variant's own rows)"
$QB plot --table "$OUT/text_val.jsonl" --x step --y loss --series run \
  --out $D/plots/text_val_loss.png --title "text pretraining: validation loss"
