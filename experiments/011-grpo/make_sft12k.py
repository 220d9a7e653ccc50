"""Write OUT/sft12k.jsonl: the SFT's 4000 worked answers (datasets/arith/small/sft.jsonl) and
worked answers to the 8000 questions of fresh.jsonl, shuffled with a fixed seed: three times
the SFT data, for experiment 011 round 3 (does more SFT data make the SFT's end less
seed-dependent?). Usage (from the repository root): python3 experiments/011-grpo/make_sft12k.py OUT"""
import json
import os
import random
import sys

out = sys.argv[1]
small = "datasets/arith/small"
rows = [json.loads(l) for l in open(f"{small}/sft.jsonl", encoding="utf-8")]
for line in open(f"{small}/fresh.jsonl", encoding="utf-8"):
    r = json.loads(line)
    q = r["prompt"][0]["content"]
    a, op, b = q[len("What is "):-1].split()
    n = r["answer"]
    rows.append({"messages": [{"role": "user", "content": q},
                              {"role": "assistant", "content": f"{a} {op} {b} = {n}\n#### {n}"}]})
random.Random(5).shuffle(rows)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "sft12k.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
print(len(rows))
