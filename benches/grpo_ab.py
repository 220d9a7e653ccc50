"""Summary of the runs of benches/grpo_ab.sh (OUT/A-N, OUT/B-N): per run, the median seconds a
step over steps 2.. (step 1 carries the step-0 validation), the rollout's seconds, the share of
rows left out, peak RSS; and step 1's loss and gradient norm, which both sides compute on the
same rollout; then each side's median. Usage: python3 benches/grpo_ab.py OUT_DIR"""
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1]
rows = []
for run in sorted(glob.glob(f"{out}/*-[0-9]*")):
    if not os.path.isdir(run):
        continue
    train = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
    train = [r for r in train if r["split"] == "train"]
    secs = [b["elapsed_secs"] - a["elapsed_secs"] for a, b in zip(train, train[1:])]
    f = [r["figures"] for r in train[1:]]
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{run}.log").read())
    rows.append((os.path.basename(run), statistics.median(secs),
                 statistics.median(x["rollout/secs"] for x in f),
                 statistics.mean(x.get("rollout/frac_rows_left_out", 0.0) for x in f),
                 int(rss.group(1)) / 1e6 if rss else float("nan"),
                 train[0]["loss"], train[0]["grad_norm"]))
print("run | s/step (median, steps 2..) | rollout s | rows left out | peak RSS GB | step-1 loss | step-1 grad norm")
for r in rows:
    print(f"{r[0]} | {r[1]:.2f} | {r[2]:.2f} | {r[3]:.3f} | {r[4]:.2f} | {r[5]:.9g} | {r[6]:.9g}")
for side in sorted({r[0].rsplit("-", 1)[0] for r in rows}):
    m = [r[1] for r in rows if r[0].rsplit("-", 1)[0] == side]
    print(f"{side}: median s/step over its runs {statistics.median(m):.2f}")
