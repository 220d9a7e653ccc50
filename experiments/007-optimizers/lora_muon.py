"""Validation losses of lora_muon.sh's runs: steps 0, 10, 20, 30, one row per run."""
import json
import os
import sys

out = sys.argv[1]
print("| run | val loss @0 | @10 | @20 | @30 |")
print("|---|---|---|---|---|")
for r in sorted(os.listdir(out)):
    path = os.path.join(out, r, "metrics.jsonl")
    if not os.path.exists(path):
        continue
    vals = [json.loads(l) for l in open(path)]
    vals = [x for x in vals if x["split"] == "val"]
    cells = " | ".join(f"{x['loss']:.3f}" for x in vals)
    print(f"| {r} | {cells} |")
