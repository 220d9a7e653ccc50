"""Per-step loss differences between the qwen-burn run and the HF/PyTorch run."""
import json
import sys


def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("split") == "train":
            out[r["step"]] = r["loss"]
    return out


ours, theirs = losses(sys.argv[1]), losses(sys.argv[2])
steps = sorted(set(ours) & set(theirs))
diffs = [(s, abs(ours[s] - theirs[s])) for s in steps]
worst = max(diffs, key=lambda x: x[1])
print(f"steps compared: {len(steps)}")
for s in [1, 2, 5, 10, 50, 100, 150, 200, 250]:
    if s in ours and s in theirs:
        print(f"  step {s:4d}: qwen-burn {ours[s]:.6f}  pytorch {theirs[s]:.6f}  diff {abs(ours[s] - theirs[s]):.2e}")
first10 = max(d for s, d in diffs if s <= 10)
print(f"largest diff over steps 1-10: {first10:.2e}")
print(f"largest diff overall: {worst[1]:.2e} at step {worst[0]}")
mean_last = sum(d for s, d in diffs if s > steps[-1] - 50) / 50
print(f"mean |diff| over the last 50 steps: {mean_last:.2e}")
