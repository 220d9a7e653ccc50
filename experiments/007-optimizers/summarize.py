"""Markdown tables of runs (experiments/007-optimizers): validation loss at every evaluation and
the final one, bits per byte, the shipped task's accuracy, wall time; then the final validation
loss of each setting over its seeds."""
import json
import sys
from collections import defaultdict

print("| run | val loss @100 | @200 | @300 | @400 | final val loss | final bpb | cloze acc_norm | train s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
finals = defaultdict(dict)
seen = set()
for run in sys.argv[1:]:
    name = run.rstrip("/").rsplit("/", 1)[-1]
    records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    val = {r["step"]: r for r in records if r["split"] == "val"}
    task = [r for r in records if r["split"] == "task"]
    train = [r for r in records if r["split"] == "train"]
    last = max(val)
    setting, seed = name.rsplit("_s", 1)
    finals[setting][seed] = val[last]["loss"]
    if name in seen:
        continue
    seen.add(name)
    at = lambda s: f"{val[s]['loss']:.4f}" if s in val else "-"
    print(f"| {name} | {at(100)} | {at(200)} | {at(300)} | {at(400)} | {val[last]['loss']:.4f} | "
          f"{val[last].get('bpb', float('nan')):.4f} | "
          f"{task[-1]['acc_norm']:.3f} | {train[-1]['elapsed_secs']:.0f} |")

print()
print("| setting | final val loss by seed | mean |")
print("|---|---|---:|")
for setting, by_seed in finals.items():
    seeds = ", ".join(f"{v:.4f} (seed {s})" for s, v in sorted(by_seed.items()))
    print(f"| {setting} | {seeds} | {sum(by_seed.values()) / len(by_seed):.4f} |")
