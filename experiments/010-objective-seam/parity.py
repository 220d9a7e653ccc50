#!/usr/bin/env python3
"""Compare two parity.sh output directories: every record of metrics.jsonl and samples.jsonl
must be equal, field for field and bit for bit, except the fields that measure time."""
import json
import sys
from pathlib import Path

TIMING = {"tokens_per_sec", "mfu", "elapsed_secs"}


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def strip(record):
    return {k: v for k, v in record.items() if k not in TIMING}


def main(a, b):
    a, b = Path(a), Path(b)
    failures = 0
    for run in sorted(p.name for p in a.iterdir() if p.is_dir()):
        for name in ("metrics.jsonl", "samples.jsonl"):
            ra, rb = records(a / run / name), records(b / run / name)
            same = len(ra) == len(rb) and all(strip(x) == strip(y) for x, y in zip(ra, rb))
            print(f"{run:14} {name:14} {len(ra):3} vs {len(rb):3} records: "
                  f"{'bit-identical' if same else 'DIFFERENT'}")
            if not same:
                failures += 1
                for x, y in zip(ra, rb):
                    if strip(x) != strip(y):
                        print("  first difference:\n   ", strip(x), "\n   ", strip(y))
                        break
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(*sys.argv[1:3])
