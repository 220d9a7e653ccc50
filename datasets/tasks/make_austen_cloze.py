#!/usr/bin/env python3
"""Build datasets/tasks/austen_cloze.jsonl: a 4-way "which three words come next" task.

Run from anywhere:  python3 datasets/tasks/make_austen_cloze.py
Standard library only; the output is byte-identical on every run (fixed seed, sorted inputs).

Source: the six novels in datasets/austen/*.txt.gz, held-out text only. The training pipeline
(crates/data/src/prepare.rs) puts the last `val_fraction` (1% in the shipped configs) of each
source file's tokens in the validation split; this script reads the last 0.9% of each novel's
characters, a margin that keeps the region inside the token tail (checked: 79-314 tokens
inside it). Trailing editorial matter that is not Austen's ("A NOTE ON THE TEXT" in Northanger
Abbey) is dropped.

Each item, one JSON object per line (the "plain" layout `qwen-burn eval --task` reads):
{"context": str, "choices": [4 str], "gold": int}
- context: the CONTEXT_WORDS words of held-out text before a cut point, whitespace
  normalised to single spaces;
- choices: the CHOICE_WORDS words that follow the cut, plus three spans of CHOICE_WORDS words
  from the held-out text of the other five novels (so they are unseen too), in an order
  shuffled by random.Random(SEED); gold is the index of the true one.
Cut points are every STRIDE words, so contexts overlap: an item's answer can be in the next
item's context. Score this task zero-shot.
"""

import gzip
import json
import random
import sys
import unicodedata
from pathlib import Path

SEED = 20261125
HELD_OUT_FRACTION = 0.009  # of each novel's characters, taken from its end
TRAILING_NOTES = ("A NOTE ON THE TEXT",)  # editorial matter: dropped from here on
CONTEXT_WORDS = 40
CHOICE_WORDS = 3
STRIDE = 20
N_CHOICES = 4

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "austen"
OUT = HERE / "austen_cloze.jsonl"


def held_out_words(text):
    """The words of the last HELD_OUT_FRACTION of the characters, from the first word that
    follows a sentence end (the region starts mid-sentence), without editorial notes."""
    tail = text[len(text) - int(len(text) * HELD_OUT_FRACTION):]
    for marker in TRAILING_NOTES:
        at = tail.find(marker)
        if at >= 0:
            tail = tail[:at]
    words = tail.split()
    first = next(i for i, w in enumerate(words) if w.endswith((".", "!", "?")))
    return words[first + 1:]


def main():
    files = sorted(CORPUS.glob("*.txt.gz"))
    if not files:
        sys.exit(f"no *.txt.gz under {CORPUS}")
    novels = {}
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            novels[path.name.removesuffix(".txt.gz")] = held_out_words(
                unicodedata.normalize("NFC", f.read())
            )
    rng = random.Random(SEED)
    items, counts = [], {}
    for name, words in novels.items():
        others = [(n, w) for n, w in novels.items() if n != name]
        for cut in range(CONTEXT_WORDS, len(words) - CHOICE_WORDS + 1, STRIDE):
            answer = " ".join(words[cut:cut + CHOICE_WORDS])
            choices = [answer]
            while len(choices) < N_CHOICES:
                _, pool = rng.choice(others)
                start = rng.randrange(len(pool) - CHOICE_WORDS + 1)
                span = " ".join(pool[start:start + CHOICE_WORDS])
                if span not in choices:
                    choices.append(span)
            rng.shuffle(choices)
            items.append({
                "context": " ".join(words[cut - CONTEXT_WORDS:cut]),
                "choices": choices,
                "gold": choices.index(answer),
            })
            counts[name] = counts.get(name, 0) + 1
    with open(OUT, "w", encoding="utf-8") as f:
        for item in items:
            f.write(json.dumps(item, ensure_ascii=False) + "\n")
    for name, n in counts.items():
        print(f"{name}: {n}")
    print(f"total: {len(items)} items -> {OUT}")


if __name__ == "__main__":
    main()
