"""Per-step loss differences between the qwen-burn run and the HF/PyTorch run.

    python compare.py OURS/metrics.jsonl PYTORCH/metrics.jsonl [--control PYTORCH_1THREAD/metrics.jsonl]
                      [--table diffs.jsonl]

The control is the same PyTorch run with another thread count: it changes only the order of
floating-point additions inside PyTorch, so its drift against the 2-thread run measures how fast
rounding differences alone grow in this training run.
"""
import argparse
import json


def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("split") == "train":
            out[r["step"]] = r["loss"]
    return out


def report(name, a, b, rows):
    steps = sorted(set(a) & set(b))
    diffs = {s: abs(a[s] - b[s]) for s in steps}
    for s in steps:
        rows.append({"pair": name, "step": s, "abs_diff": max(diffs[s], 1e-9)})
    worst = max(diffs, key=diffs.get)
    first10 = max(diffs[s] for s in steps if s <= 10)
    last = [s for s in steps if s > steps[-1] - 50]
    mean_last = sum(diffs[s] for s in last) / len(last)
    print(f"{name}: {len(steps)} steps; largest |diff| over steps 1-10 {first10:.2e}; "
          f"largest overall {diffs[worst]:.2e} (step {worst}); mean |diff| over the last 50 steps {mean_last:.2e}; "
          f"mean loss over the last 50 steps {sum(a[s] for s in last) / len(last):.4f} vs {sum(b[s] for s in last) / len(last):.4f}")
    return diffs


ap = argparse.ArgumentParser()
ap.add_argument("ours")
ap.add_argument("pytorch")
ap.add_argument("--control")
ap.add_argument("--table")
args = ap.parse_args()
ours, theirs = losses(args.ours), losses(args.pytorch)
rows = []
d = report("qwen-burn vs pytorch", ours, theirs, rows)
for s in [1, 2, 5, 10, 20, 30, 50, 100, 150, 200, 250]:
    if s in d:
        print(f"  step {s:4d}: qwen-burn {ours[s]:.6f}  pytorch {theirs[s]:.6f}  diff {d[s]:.2e}")
if args.control:
    report("pytorch 2 threads vs pytorch 1 thread (control)", theirs, losses(args.control), rows)
if args.table:
    with open(args.table, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
