"""Build datasets/chat/shakespeare_chat.jsonl: small synthetic chat SFT data from the shipped plays.

Two kinds of conversation, 50/50, seeded and deterministic:
  * "Which play is this line from? <line>"         -> "<Play title>."
  * "Continue this line from <Play>: <first half>" -> "<second half>"
Run from the repository root:  python3 datasets/chat/make_chat.py
Uses only the Python standard library and the gzipped plays in datasets/shakespeare/.
"""
import glob
import gzip
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
PLAYS = os.path.join(HERE, "..", "shakespeare")
N_TRAIN, N_VAL = 600, 60


def title_of(path):
    name = os.path.basename(path).replace("_gut.txt.gz", "")
    return " ".join(w.capitalize() if w not in ("of", "and", "the") else w for w in name.split("_"))


def lines_of(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            words = line.split()
            # Verse-like lines: 6-14 words, mostly letters, not stage directions or headings.
            if 6 <= len(words) <= 14 and not line.isupper() and not line.startswith(("[", "Enter", "Exit", "ACT", "SCENE")):
                yield line


def main():
    rng = random.Random(1616)
    pool = []
    for path in sorted(glob.glob(os.path.join(PLAYS, "*.txt.gz"))):
        title = title_of(path)
        lines = list(lines_of(path))
        for line in rng.sample(lines, min(40, len(lines))):
            pool.append((title, line))
    rng.shuffle(pool)
    convs = []
    for i, (title, line) in enumerate(pool[: N_TRAIN + N_VAL]):
        if i % 2 == 0:
            msgs = [{"role": "user", "content": f"Which play is this line from? {line}"},
                    {"role": "assistant", "content": f"{title}."}]
        else:
            words = line.split()
            cut = len(words) // 2
            msgs = [{"role": "user", "content": f"Continue this line from {title}: {' '.join(words[:cut])}"},
                    {"role": "assistant", "content": " ".join(words[cut:])}]
        convs.append({"messages": msgs})
    for name, part in (("shakespeare_chat.jsonl", convs[:N_TRAIN]), ("shakespeare_chat_val.jsonl", convs[N_TRAIN:])):
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            for c in part:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        print(f"wrote {name}: {len(part)} conversations")


if __name__ == "__main__":
    main()
