"""Summarise experiment 003: final validation loss, final and mean expert-load imbalance per run
and per layer; write the per-run tables that run.sh plots."""
import json
import os
import sys


def old_names(x):
    """Records written after 2026-11-26 name the routings (moe_router, moe_capped) and say
    idle_expert_fraction; this script reads the earlier names: `moe` was the selection the
    experts trained on (the capped one under a capacity) and the uncapped figure sat in
    moe_worst."""
    if "moe" not in x and "moe_router" in x:
        x["moe"] = x.get("moe_capped") or x["moe_router"]
        if "moe_capped" in x:
            x.setdefault("moe_worst", {})["uncapped_max_over_mean_load"] = max(
                m["max_over_mean_load"] for m in x["moe_router"])
    for m in x.get("moe", []):
        m.setdefault("dead_expert_fraction", m.get("idle_expert_fraction", 0.0))
    return x

out = sys.argv[1]
runs = sorted(os.listdir(out))
imb, val = [], []
print("| run | final val loss | max/mean load at end (per layer) | mean max/mean over training | dead experts at end |")
print("|---|---|---|---|---|")
for r in runs:
    path = os.path.join(out, r, "metrics.jsonl")
    if not os.path.exists(path):
        continue
    recs = [old_names(json.loads(l)) for l in open(path)]
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
