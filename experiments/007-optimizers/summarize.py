"""Markdown table of runs (experiments/007-optimizers): validation loss at every evaluation
and the final one, bits per byte, the shipped task's accuracy, wall time."""
import json
import sys

print("| run | val loss @100 | @200 | @300 | @400 | final val loss | final bpb | cloze acc_norm | train s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for run in sys.argv[1:]:
    records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    val = {r["step"]: r for r in records if r["split"] == "val"}
    task = [r for r in records if r["split"] == "task"]
    train = [r for r in records if r["split"] == "train"]
    last = max(val)
    at = lambda s: f"{val[s]['loss']:.4f}" if s in val else "-"
    print(f"| {run.rstrip('/').rsplit('/', 1)[-1]} ({run.rstrip('/').rsplit('/', 2)[-2]}) | "
          f"{at(100)} | {at(200)} | {at(300)} | {at(400)} | {val[last]['loss']:.4f} | "
          f"{val[last].get('bpb', float('nan')):.4f} | "
          f"{task[-1]['acc_norm']:.3f} | {train[-1]['elapsed_secs']:.0f} |")
