#!/usr/bin/env python3
"""Build datasets/preference/austen_next_sentence{,_val}.jsonl: preference pairs in TRL's
explicit-prompt text layout, {"prompt": str, "chosen": str, "rejected": str}.

Run from anywhere:  python3 datasets/preference/make_preference.py
Standard library only; byte-identical output on every run (fixed seed, sorted inputs).

Two sets. `austen_next_sentence`: the true next sentence against another novel's. `austen_style`
(`austen_style{,_val}.jsonl`): the same prompts and chosen sentences against a line of
Shakespeare of the same length (held-out tails of the plays for the validation file).

Source: the six novels in datasets/austen/*.txt.gz (and the plays in datasets/shakespeare). Each pair: `prompt` = PROMPT_WORDS words of
a novel ending at a sentence end; `chosen` = the sentence that follows (at most
COMPLETION_WORDS words); `rejected` = a sentence of the same length class from another novel
(so both completions are Austen's prose; only the true one follows). Training pairs come from
the text before each novel's held-out tail; the validation file only from the tails (the last
0.9% of characters, inside the 1% validation split of the shipped configs, as
datasets/tasks/make_austen_cloze.py takes them), so neither its prompts nor its completions
were trained on.
"""

import gzip
import json
import random
import re
from pathlib import Path

SEED = 20261126
HELD_OUT_FRACTION = 0.009
PROMPT_WORDS = 40
COMPLETION_WORDS = 20
TRAIN_PAIRS_PER_NOVEL = 100

HERE = Path(__file__).resolve().parent
NOVELS = sorted((HERE.parent / "austen").glob("*.txt.gz"))


ABBREVIATIONS = ("Mr.", "Mrs.", "Dr.", "St.", "Col.", "Capt.", "Ms.", "Esq.")
BOUNDARY = r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\bCol\.)(?<!\bCapt\.)(?<!\bEsq\.)"


def sentences(text):
    words = " ".join(text.split())
    parts = re.split(BOUNDARY + r"(?<=[.!?])\s+(?=[A-Z\"'])", words)
    return [p for p in parts if 3 <= len(p.split()) <= COMPLETION_WORDS]


def pairs(regions, rng, per_novel):
    out = []
    for i, text in enumerate(regions):
        words = " ".join(text.split())
        cut_points = [m.end() for m in re.finditer(r"[.!?](?=\s+[A-Z\"'])", words)
                      if not words[:m.end()].endswith(ABBREVIATIONS)]
        others = [s for j, t in enumerate(regions) if j != i for s in sentences(t)]
        rng.shuffle(cut_points)
        made = 0
        for cut in sorted(cut_points):
            if per_novel is not None and made >= per_novel:
                break
            before = words[:cut].split()
            if len(before) < PROMPT_WORDS:
                continue
            nxt = sentences(words[cut:][:600])
            if not nxt or not words[cut:].lstrip().startswith(nxt[0]):
                continue
            chosen = nxt[0]
            # Same length (within a word): the summed log-probabilities compare content, not
            # length.
            n = len(chosen.split())
            alike = [o for o in others if abs(len(o.split()) - n) <= 1]
            if not alike:
                continue
            rejected = rng.choice(alike)
            if rejected == chosen:
                continue
            out.append({"prompt": " ".join(before[-PROMPT_WORDS:]), "chosen": " " + chosen,
                        "rejected": " " + rejected})
            made += 1
    return out


def style_pairs(regions, plays, rng, per_novel):
    """Like `pairs`, but `rejected` is a line of Shakespeare of the chosen sentence's length: a
    preference for the prompt's author's prose that DPO can learn."""
    verse = [s for t in plays for s in sentences(t)]
    out = []
    for row in pairs(regions, rng, per_novel):
        n = len(row["chosen"].split())
        alike = [v for v in verse if abs(len(v.split()) - n) <= 1]
        if alike:
            out.append({**row, "rejected": " " + rng.choice(alike)})
    return out


def main():
    rng = random.Random(SEED)
    heads, tails = [], []
    for path in NOVELS:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = f.read()
        cut = int(len(text) * (1 - HELD_OUT_FRACTION))
        heads.append(text[len(text) // 10:cut])  # past the front matter
        tails.append(text[cut:])
    # Training pairs: a sample of cut points over each novel's training text.
    train = pairs([h[: 200_000] for h in heads], rng, TRAIN_PAIRS_PER_NOVEL)
    val = pairs(tails, rng, None)
    plays = []
    for path in sorted((HERE.parent / "shakespeare").glob("*.txt.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = f.read()
        cut = int(len(text) * (1 - HELD_OUT_FRACTION))
        plays.append((text[len(text) // 10:cut], text[cut:]))
    style_train = style_pairs([h[: 200_000] for h in heads], [p[0][:100_000] for p in plays], rng,
                              TRAIN_PAIRS_PER_NOVEL)
    style_val = style_pairs(tails, [p[1] for p in plays], rng, None)
    for name, rows in (("austen_next_sentence.jsonl", train),
                       ("austen_next_sentence_val.jsonl", val),
                       ("austen_style.jsonl", style_train),
                       ("austen_style_val.jsonl", style_val)):
        with open(HERE / name, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(name, len(rows), "pairs")


if __name__ == "__main__":
    main()
