"""Summarise experiment 003: final validation loss, final and mean expert-load imbalance per run
and per layer; write the per-run tables that run.sh plots."""
import json
import os
import sys

out = sys.argv[1]
runs = sorted(os.listdir(out))
imb, val = [], []
print("| run | final val loss | max/mean load at end (per layer) | mean max/mean over training | dead experts at end |")
print("|---|---|---|---|---|")
for r in runs:
    path = os.path.join(out, r, "metrics.jsonl")
    if not os.path.exists(path):
        continue
    recs = [json.loads(l) for l in open(path)]
    vals = [x for x in recs if x["split"] == "val"]
    trains = [x for x in recs if x["split"] == "train"]
    for x in vals:
        val.append({"run": r, "step": x["step"], "loss": x["loss"]})
    moe = [x for x in trains if "moe" in x]
    if moe:
        for x in moe:
            layers = [m["max_over_mean_load"] for m in x["moe"]]
            imb.append({"run": r, "step": x["step"], "max_over_mean_load": sum(layers) / len(layers)})
        last = moe[-1]["moe"]
        per_layer = ", ".join(f"{m['max_over_mean_load']:.2f}" for m in last)
        mean_all = sum(sum(m["max_over_mean_load"] for m in x["moe"]) / len(x["moe"]) for x in moe) / len(moe)
        dead = ", ".join(f"{m['dead_expert_fraction']:.2f}" for m in last)
        print(f"| {r} | {vals[-1]['loss']:.4f} | {per_layer} | {mean_all:.2f} | {dead} |")
    else:
        print(f"| {r} | {vals[-1]['loss']:.4f} | - | - | - |")
with open(os.path.join(out, "imbalance.jsonl"), "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in imb)
with open(os.path.join(out, "val.jsonl"), "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in val)
