#!/usr/bin/env bash
# Experiment 009, round 3: RPO (DPO plus preference.sft_weight: 1, TRL's suggested rpo_alpha,
# and 0.1) against DPO on the style pairs from the README's tiny run (configs/dpo.toml), two
# seeds each, through sweep.sh (held-out preference accuracy, Persuasion bits per byte, the
# cloze task; one JSON line per run in OUT/results.jsonl).
# Usage: experiments/009-dpo/round3.sh BIN OUT   (from the repository root, runs/tiny present)
set -euo pipefail
exec "$(dirname "$0")/sweep.sh" "$1" "$2" \
  "sigmoid-b0.1|preference.loss=\"sigmoid\" preference.beta=0.1" \
  "rpo-b0.1-w1|preference.loss=\"sigmoid\" preference.beta=0.1 preference.sft_weight=1.0" \
  "rpo-b0.1-w0.1|preference.loss=\"sigmoid\" preference.beta=0.1 preference.sft_weight=0.1"
