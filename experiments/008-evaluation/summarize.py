"""Markdown table of the task and validation records of runs (experiments/008-evaluation)."""
import json
import sys

print("| run | step | val loss | val bpb | acc | acc_norm |")
print("|---|---:|---:|---:|---:|---:|")
for run in sys.argv[1:]:
    records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    val = {r["step"]: r for r in records if r["split"] == "val"}
    for r in records:
        if r["split"] != "task":
            continue
        v = val.get(r["step"], {})
        print(f"| {run.rsplit('/', 1)[-1]} | {r['step']} | {v.get('loss', float('nan')):.4f} | "
              f"{v.get('bpb', float('nan')):.4f} | {r['acc']:.3f} ± {r['acc_stderr']:.3f} | "
              f"{r['acc_norm']:.3f} ± {r['acc_norm_stderr']:.3f} |")
