"""Timing of a GRPO run from its metrics.jsonl (benches/README.md, 2026-11-26): steps per
minute, the share of a step spent in the rollout and in decoding alone, and the decoding's
tokens per second, over the logged steps after the first (which carries the step-0
validation). Usage: python3 benches/grpo_timing.py RUN_DIR"""
import json
import statistics
import sys

records = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
train = [r for r in records if r["split"] == "train"]
steps = [(r["step"], r["elapsed_secs"], r["figures"]) for r in train]
pairs = list(zip(steps, steps[1:]))
secs_per_step = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in pairs]
rollout = [b[2]["rollout/secs"] for _, b in pairs]
decode = [b[2]["rollout/generation_secs"] for _, b in pairs]
tps = [b[2]["rollout/generation_tokens_per_sec"] for _, b in pairs]
step = statistics.median(secs_per_step)
print(f"steps logged: {[s for s, _, _ in steps]}")
print(f"seconds per step (median over logged intervals): {step:.2f} -> {60 / step:.1f} steps/min")
print(f"rollout: {statistics.median(rollout):.2f} s ({statistics.median(rollout) / step:.0%} of a step), "
      f"decoding alone {statistics.median(decode):.2f} s ({statistics.median(decode) / step:.0%})")
print(f"decoding: {statistics.median(tps):.0f} tokens/s (median), completions "
      f"{statistics.median(b[2]['completions/mean_length'] for _, b in pairs):.1f} tokens long")
