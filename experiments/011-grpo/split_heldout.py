"""Split datasets/arith/small/heldout.jsonl by kind of question into OUT/h_<kind>.jsonl:
additions without and with a carry from the units, subtractions with a result >= 0 and < 0.
Usage (from the repository root): python3 experiments/011-grpo/split_heldout.py OUT"""
import json
import os
import sys

out = sys.argv[1]
kinds = {"add_nocarry": [], "add_carry": [], "sub_pos": [], "sub_neg": []}
for line in open("datasets/arith/small/heldout.jsonl", encoding="utf-8"):
    row = json.loads(line)
    a, op, b = row["prompt"][0]["content"][len("What is "):-1].split()
    a, b = int(a), int(b)
    if op == "+":
        kinds["add_carry" if a % 10 + b % 10 >= 10 else "add_nocarry"].append(row)
    else:
        kinds["sub_neg" if a < b else "sub_pos"].append(row)
os.makedirs(out, exist_ok=True)
for kind, rows in kinds.items():
    with open(os.path.join(out, f"h_{kind}.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(kind, len(rows))
