"""Build datasets/arith/: a verifiable-reward arithmetic task for GRPO, and SFT data for it.

Questions are "What is A + B?" or "What is A - B?" with A and B drawn uniformly from 0..999
(subtraction results may be negative); the answer is the integer as a string. Writes
  * train.jsonl    4000 rows {"prompt": [{"role": "user", "content": "What is 12 + 345?"}], "answer": "357"}
  * heldout.jsonl   500 rows, same layout, no (A, op, B) in common with train.jsonl
  * fresh.jsonl    8000 rows, same layout, no (A, op, B) in common with either: RL prompts the
                   SFT run never saw (configs/grpo.toml)
  * sft.jsonl      4000 rows, the questions of train.jsonl (same order) with worked answers:
                   {"messages": [{"role": "user", "content": "What is 12 + 345?"},
                                 {"role": "assistant", "content": "12 + 345 = 357\\n#### 357"}]}
  * sft_columns.jsonl  the same questions with answers worked column by column, units first
                   (`columns` below): "7+8+0=15\\n4+3+1=8\\n#### 85" for "What is 47 + 38?"
Each file has exactly half additions and half subtractions. Seeded and deterministic.
With `--max 99` the operands run over 0..99 and the files go to datasets/arith/small/ (the same
layout): a task the README's 3M-parameter model can partly learn by SFT, which leaves GRPO a
signal to work with (experiments/011-grpo).
Run from the repository root:  python3 datasets/arith/make_arith.py [--max 99]
Uses only the Python standard library.
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = 20240611
N_TRAIN, N_HELDOUT, N_FRESH = 4000, 500, 8000
MAX = int(sys.argv[sys.argv.index("--max") + 1]) if "--max" in sys.argv else 999
OUT = HERE if MAX == 999 else os.path.join(HERE, "small")


def draw(rng, n_per_op, taken):
    """n_per_op additions and n_per_op subtractions, none in `taken` (updated), shuffled."""
    rows = []
    for op in ("+", "-"):
        count = 0
        while count < n_per_op:
            triple = (rng.randint(0, MAX), op, rng.randint(0, MAX))
            if triple in taken:
                continue
            taken.add(triple)
            rows.append(triple)
            count += 1
    rng.shuffle(rows)
    return rows


def question(a, op, b):
    return f"What is {a} {op} {b}?"


def result(a, op, b):
    return a + b if op == "+" else a - b


def columns(a, op, b):
    """A worked answer column by column, units first, each line one column's digit sum (carry
    in) or difference (borrow in), then the result: "47 + 38" -> "7+8+0=15\n4+3+1=8\n#### 85";
    "52 - 38" -> "12-8-0=4\n5-3-1=1\n#### 14" (a borrow shows as the 1 before the digit);
    "23 - 84" -> "-(84-23)\n4-3-0=1\n8-2-0=6\n#### -61"."""
    n = result(a, op, b)
    lines = []
    if op == "-" and a < b:
        lines.append(f"-({b}-{a})")
        a, b = b, a
    width = max(len(str(a)), len(str(b)))
    da, db = str(a).zfill(width)[::-1], str(b).zfill(width)[::-1]
    carry = 0
    for x, y in zip(map(int, da), map(int, db)):
        if op == "+":
            s = x + y + carry
            lines.append(f"{x}+{y}+{carry}={s}")
            carry = s // 10
        else:
            borrow = 1 if x - y - carry < 0 else 0
            lines.append(f"{x + 10 * borrow}-{y}-{carry}={x + 10 * borrow - y - carry}")
            carry = borrow
    lines.append(f"#### {n}")
    return "\n".join(lines)


def write(name, rows):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, name), "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def main():
    rng = random.Random(SEED)
    taken = set()
    train = draw(rng, N_TRAIN // 2, taken)
    heldout = draw(rng, N_HELDOUT // 2, taken)
    # Drawn last, so that the files above keep their bytes.
    fresh = draw(rng, N_FRESH // 2, taken)
    assert not set(train) & set(heldout)
    assert not (set(train) | set(heldout)) & set(fresh)
    for name, triples in (("train.jsonl", train), ("heldout.jsonl", heldout),
                          ("fresh.jsonl", fresh)):
        write(name, [{"prompt": [{"role": "user", "content": question(*t)}], "answer": str(result(*t))}
                    for t in triples])
    sft = []
    for a, op, b in train:
        n = result(a, op, b)
        worked = f"{a} {op} {b} = {n}\n#### {n}"
        sft.append({"messages": [{"role": "user", "content": question(a, op, b)},
                                 {"role": "assistant", "content": worked}]})
    write("sft.jsonl", sft)
    write("sft_columns.jsonl", [
        {"messages": [{"role": "user", "content": question(*t)},
                      {"role": "assistant", "content": columns(*t)}]} for t in train])
    print(f"wrote train.jsonl ({len(train)}), heldout.jsonl ({len(heldout)}), "
          f"fresh.jsonl ({len(fresh)}), sft.jsonl ({len(sft)}) in {OUT}")


if __name__ == "__main__":
    main()
