"""Summarise experiment 005: final validation loss; per-layer max/mean expert load and dead
experts at the last logged step (whole-step statistics, all micro-batches and replicas); the
worst layer over the last 50 steps; the pooled (all layers together) figure HF's loss sees.
Writes the JSONL tables that run.sh plots."""
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
order = ["dense_active"] + [f"{k}_{c}" for k in ["hf", "per_layer", "sequence", "global_batch"]
                            for c in ["0.01", "0.1"]] + ["auxfree_1e-3"]
found = sorted(r for r in os.listdir(out) if os.path.exists(os.path.join(out, r, "metrics.jsonl")))
runs = [r for r in order if r in found] + [r for r in found if r not in order]
worst_rows, val_rows = [], []
print("| run | val loss @150 | max/mean load per layer @150 | worst layer, max over steps 101-150 | dead experts @150 (per layer) | pooled max/mean @150 | aux loss @150 |")
print("|---|---|---|---|---|---|---|")
for r in runs:
    recs = [old_names(json.loads(l)) for l in open(os.path.join(out, r, "metrics.jsonl"))]
    vals = [x for x in recs if x["split"] == "val"]
    for x in vals:
        val_rows.append({"run": r, "step": x["step"], "loss": x["loss"]})
    moe = [x for x in recs if x["split"] == "train" and "moe" in x]
    if not moe:
        print(f"| {r} | {vals[-1]['loss']:.4f} | - | - | - | - | - |")
        continue
    layer_rows = []
    for x in moe:
        loads = [m["max_over_mean_load"] for m in x["moe"]]
        worst_rows.append({"run": r, "step": x["step"], "max_over_mean_load": max(loads)})
        for i, v in enumerate(loads):
            layer_rows.append({"layer": f"layer {i}", "step": x["step"], "max_over_mean_load": v})
    with open(os.path.join(out, f"per_layer_{r}.jsonl"), "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in layer_rows)
    last = moe[-1]
    per_layer = ", ".join(f"{m['max_over_mean_load']:.2f}" for m in last["moe"])
    dead = ", ".join(str(round(m["dead_expert_fraction"] * len(m["tokens_per_expert"]))) for m in last["moe"])
    late = max(max(m["max_over_mean_load"] for m in x["moe"]) for x in moe if x["step"] > 100)
    pooled = last.get("moe_pooled", {}).get("max_over_mean_load", float("nan"))
    print(f"| {r} | {vals[-1]['loss']:.4f} | {per_layer} | {late:.2f} | {dead} | {pooled:.2f} | {last['aux_loss']:.3f} |")
with open(os.path.join(out, "worst_layer.jsonl"), "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in worst_rows)
with open(os.path.join(out, "val.jsonl"), "w") as f:
    f.writelines(json.dumps(x) + "\n" for x in val_rows)
