"""Summarise run_round3.sh: per run, over every logged step from step 50 on, the worst layer's
max/mean load of the router's own choice (moe_router) and of the capped assignment where a
capacity acts (moe_capped), the steps with a layer above 1.5 or an idle expert, the routing
bias's share of choices on validation tokens, and the validation loss at the last step. Writes
worst_router.jsonl and val.jsonl for the plots."""
import json
import os
import sys

out = sys.argv[1]
runs = sorted(r for r in os.listdir(out) if os.path.exists(os.path.join(out, r, "metrics.jsonl")))
worst_rows, val_rows = [], []
print("| run | seed | router's own: worst layer max/mean, steps >= 50 (max) | steps >= 50 with a layer > 1.5 | steps >= 50 with an idle expert | router's own, steps 1-40 (max) | capped assignment, steps >= 50 (max) | bias-decided choices @150 | val loss @150 |")
print("|---|---|---|---|---|---|---|---|---|")
for r in runs:
    recs = [json.loads(l) for l in open(os.path.join(out, r, "metrics.jsonl"))]
    name, seed = r.rsplit("_seed", 1)
    vals = [x for x in recs if x["split"] == "val"]
    for x in vals:
        val_rows.append({"run": r, "step": x["step"], "loss": x["loss"]})
    moe = [x for x in recs if x["split"] == "train" and "moe_router" in x]
    for x in moe:
        worst_rows.append({"run": r, "step": x["step"], "max_over_mean_load": max(m["max_over_mean_load"] for m in x["moe_router"])})
        if "moe_capped" in x:
            worst_rows.append({"run": r + " (capped)", "step": x["step"], "max_over_mean_load": max(m["max_over_mean_load"] for m in x["moe_capped"])})
    late = [x for x in moe if x["step"] >= 50]
    early = [x for x in moe if x["step"] < 50]
    worst = [max(m["max_over_mean_load"] for m in x["moe_router"]) for x in late]
    over = sum(w > 1.5 for w in worst)
    dead = sum(any(m["idle_expert_fraction"] > 0 for m in x["moe_router"]) for x in late)
    e = max(max(m["max_over_mean_load"] for m in x["moe_router"]) for x in early)
    capped = [max(m["max_over_mean_load"] for m in x["moe_capped"]) for x in late if "moe_capped" in x]
    bias = vals[-1].get("moe_bias_changed_choices")
    print(f"| {name} | {seed} | {max(worst):.2f} | {over} / {len(late)} | {dead} / {len(late)} | {e:.2f} | {'-' if not capped else f'{max(capped):.2f}'} | {'-' if bias is None else f'{bias * 100:.1f}%'} | {vals[-1]['loss']:.4f} |")
for name, rows in [("worst_router.jsonl", worst_rows), ("val.jsonl", val_rows)]:
    with open(os.path.join(out, name), "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in rows)
