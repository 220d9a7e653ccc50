"""Greedy accuracy by kind of question (additions without and with a carry from the units,
subtractions with a result >= 0 and < 0) from `eval --generate --records` files of the
arithmetic task. Usage: python3 experiments/011-grpo/by_kind.py NAME=RECORDS.jsonl ..."""
import json
import re
import sys

KINDS = ["add_nocarry", "add_carry", "sub_pos", "sub_neg"]


def kind(prompt):
    a, op, b = re.search(r"What is (\d+) ([+-]) (\d+)\?", prompt).groups()
    a, b = int(a), int(b)
    if op == "+":
        return "add_carry" if a % 10 + b % 10 >= 10 else "add_nocarry"
    return "sub_neg" if a < b else "sub_pos"


print("| model | " + " | ".join(KINDS) + " | all |")
print("|---" * (len(KINDS) + 2) + "|")
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    tally = {k: [0, 0] for k in KINDS}
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        t = tally[kind(r["prompt"])]
        t[0] += r["correct"]
        t[1] += 1
    right = sum(t[0] for t in tally.values())
    total = sum(t[1] for t in tally.values())
    cells = [f"{t[0] / t[1]:.3f} ({t[1]})" for t in tally.values()]
    print(f"| {name} | " + " | ".join(cells) + f" | {right / total:.3f} |")
