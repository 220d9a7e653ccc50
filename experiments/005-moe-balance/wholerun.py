"""Summarise run_wholerun.sh: per run, over every logged step from step 30 on, the worst layer's
whole-step max/mean expert load, the steps with any layer above 1.5, the steps with an idle
expert, the uncapped router's worst figure (runs with a capacity), and the final validation
loss. Writes worst_layer.jsonl and val.jsonl for the plots."""
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
runs = sorted(r for r in os.listdir(out) if os.path.exists(os.path.join(out, r, "metrics.jsonl")))
worst_rows, val_rows = [], []
print("| run | seed | worst layer max/mean, steps >= 30 (max) | mean of the worst layer, steps >= 30 | steps >= 30 with a layer > 1.5 | steps >= 30 with an idle expert | uncapped router, worst at the last step | val loss @150 |")
print("|---|---|---|---|---|---|---|---|")
for r in runs:
    recs = [old_names(json.loads(l)) for l in open(os.path.join(out, r, "metrics.jsonl"))]
    name, seed = r.rsplit("_seed", 1)
    vals = [x for x in recs if x["split"] == "val"]
    for x in vals:
        val_rows.append({"run": r, "step": x["step"], "loss": x["loss"]})
    moe = [x for x in recs if x["split"] == "train" and "moe" in x]
    late = [x for x in moe if x["step"] >= 30]
    worst = [max(m["max_over_mean_load"] for m in x["moe"]) for x in late]
    for x in moe:
        worst_rows.append({"run": r, "step": x["step"], "max_over_mean_load": max(m["max_over_mean_load"] for m in x["moe"])})
    over = sum(w > 1.5 for w in worst)
    dead = sum(any(m["dead_expert_fraction"] > 0 for m in x["moe"]) for x in late)
    unc = moe[-1].get("moe_worst", {}).get("uncapped_max_over_mean_load")
    print(f"| {name} | {seed} | {max(worst):.2f} | {sum(worst) / len(worst):.2f} | {over} / {len(late)} | {dead} / {len(late)} | {'-' if unc is None else f'{unc:.2f}'} | {vals[-1]['loss']:.4f} |")
for name, rows in [("worst_layer.jsonl", worst_rows), ("val.jsonl", val_rows)]:
    with open(os.path.join(out, name), "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in rows)
